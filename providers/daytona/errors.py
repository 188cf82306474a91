"""The one mapping of Daytona's errors to ``providers.errors``.

What fails is a generated client's ``ApiException`` (an HTTP error answer:
its status, headers and JSON body, which carries Daytona's message and, on
the toolbox, the error's ``source`` and ``code``), an ``aiohttp`` error or a
timeout; the adapter's own transfers and websockets raise the same
``ApiException`` for an error answer, and `StreamBroken` for a stream the
toolbox ended wrongly. `facts` reads the ``__cause__`` chain. Then: 401
`AuthError`; 400 or 403 saying "Total CPU (memory, disk, GPU) limit
exceeded" `CapacityExceeded` (the organization's cap on what its live
sandboxes hold: a release frees it), other "limit exceeded" or "quota"
`QuotaExceeded` (Daytona's limits: 403 before API v0.170, 400 since), other 403
`AuthError`; 429 `RateLimited` with ``Retry-After``; 404, and a 400 "not
found" or "is removing" on create (an unknown or deleted snapshot),
`NotFound`; 408, 5xx, connection errors and timeouts `Unavailable` (a
timeout, or a connection lost once the request went out, ``unanswered``). A
sandbox that fails to start, or a runner queue that times out, is the
create's own error (`providers.daytona.provider`). Inside a sandbox a client
error the daemon gave is the caller's (`SandboxError`, a missing file
included); one the proxy in front gave is `NotFound` when the API says the
sandbox no longer runs (`providers.daytona.handle`).
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Mapping
from typing import Any, NamedTuple

from providers.errors import ProviderError, SandboxError, Unavailable
from providers.mapping import ErrorMap, Where, from_status, retry_after, went_out

__all__ = ["DAEMON", "EXECUTION_TIMEOUT", "Facts", "StreamBroken", "facts", "sdk_errors"]

DAEMON = "DAYTONA_DAEMON"
EXECUTION_TIMEOUT = "PROCESS_EXECUTION_TIMEOUT"
_QUOTA_WORDS = ("limit exceeded", "quota")
_RESOURCE_CAP = re.compile(r"total (cpu|memory|disk|gpu) limit exceeded", re.IGNORECASE)
_SNAPSHOT_GONE = re.compile(r"Snapshot \S+ is removing")


class StreamBroken(ConnectionError):
    """A toolbox stream (a log, a terminal, the interpreter, a download) that ended other
    than cleanly: a transport failure, as a dropped connection is (`Unavailable`)."""


class Facts(NamedTuple):
    """What the exception chain of one failed call says."""

    message: str
    status: int | None
    source: str | None
    code: str | None
    headers: Mapping[str, Any]
    connection: bool


def _chain(exc: BaseException) -> list[BaseException]:
    """``exc`` and what caused it, outermost first."""
    found: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and all(current is not seen for seen in found):
        found.append(current)
        current = current.__cause__ or current.__context__
    return found


def _body(link: BaseException) -> dict[str, Any]:
    """The JSON error body an ``ApiException`` carries, if any."""
    body = getattr(link, "body", None)
    if isinstance(body, bytes | str):
        with contextlib.suppress(ValueError):
            parsed = json.loads(body)
            if isinstance(parsed, dict):
                return parsed
    return {}


def _message(link: BaseException, body: Mapping[str, Any]) -> str | None:
    """Daytona's message in an error answer: the body's ``message`` (else ``error``, else
    its ``errors``, as a bulk upload answers), else the body itself, else the HTTP reason."""
    for key in ("message", "error"):
        if isinstance(body.get(key), str):
            return str(body[key])
    errors = body.get("errors")
    if isinstance(errors, list) and errors:
        return ", ".join(map(str, errors))
    raw = getattr(link, "body", None)
    if isinstance(raw, bytes):
        raw = raw.decode(errors="replace")
    if isinstance(raw, str) and raw.strip():
        return raw.strip()
    reason = getattr(link, "reason", None)
    return reason if isinstance(reason, str) and reason else None


def facts(exc: BaseException) -> Facts:
    """Message, status, error source and code, headers and "connection failed", down the chain.

    An ``ApiException`` holds the HTTP facts (``status``, ``headers``, the body);
    the first link that knows a fact gives it.
    """
    import aiohttp

    message: str | None = None
    status: int | None = None
    source: str | None = None
    code: str | None = None
    headers: Mapping[str, Any] = {}
    connection = False
    for link in _chain(exc):
        answered = getattr(link, "status", None)
        if isinstance(answered, int) and not isinstance(answered, bool):
            body = _body(link)
            if message is None:
                message = _message(link, body)
            status = status if status is not None else answered
            if source is None and isinstance(body.get("source"), str):
                source = body["source"]
            for value in (body.get("code"), body.get("error_code")):
                if code is None and isinstance(value, str):
                    code = value
            link_headers = getattr(link, "headers", None)
            if not headers and isinstance(link_headers, Mapping) and link_headers:
                headers = link_headers
        if isinstance(link, aiohttp.ClientConnectionError | OSError):
            connection = True
    text = message or str(exc) or type(exc).__name__
    return Facts(text, status, source, code, headers, connection)


def _to_error(exc: Exception, where: Where) -> ProviderError:
    """The router error of a failed call to Daytona."""
    import aiohttp

    found = facts(exc)
    message = found.message
    if isinstance(exc, TimeoutError):
        return where.error(Unavailable, "Daytona did not answer in time", unanswered=True)
    if found.status is not None:
        lowered = message.lower()
        limit = found.status in (400, 403)
        return from_status(
            found.status,
            message,
            where,
            retry_after=retry_after(found.headers),
            capacity=limit and _RESOURCE_CAP.search(message) is not None,
            quota=limit and any(word in lowered for word in _QUOTA_WORDS),
            missing=found.status == 400
            and not where.in_sandbox
            and ("not found" in lowered or _SNAPSHOT_GONE.search(message) is not None),
            callers=where.in_sandbox and found.source == DAEMON,
        )
    if found.connection:
        sent = went_out(exc, aiohttp.ClientConnectorError)
        return where.error(Unavailable, message, unanswered=sent)
    if where.in_sandbox:
        return where.error(SandboxError, message)
    return where.error(ProviderError, f"{type(exc).__name__}: {message}")


sdk_errors = ErrorMap(_to_error)
