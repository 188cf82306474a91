"""The one mapping of Daytona SDK exceptions to ``providers.errors``.

The SDK hides statuses (a download error keeps it on an ``aiohttp`` error
two levels down; ``code_run`` raises the generated client's error
unwrapped), so `facts` reads the ``__cause__`` chain. Then: 401
`AuthError`; 400 or 403 saying "Total CPU (memory, disk, GPU) limit
exceeded" `CapacityExceeded` (the organization's cap on what its live
sandboxes hold: a release frees it), other "limit exceeded" or "quota"
`QuotaExceeded` (Daytona's limits: 403 before API v0.170, 400 since), other 403
`AuthError`; 429 `RateLimited` with ``Retry-After``; 404, and a 400 "not
found" or "is removing" on create (an unknown or deleted snapshot),
`NotFound`; 408, 5xx, connection errors, timeouts and a sandbox that failed
to start `Unavailable`; a runner queue timeout `CapacityExceeded`. Inside a
sandbox a client error the daemon gave is the caller's (`SandboxError`, a
missing file included); one the proxy in front gave is `NotFound` when the
API says the sandbox no longer runs (`providers.daytona.sandbox`).
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Mapping
from dataclasses import replace
from typing import Any, NamedTuple

from providers.errors import CapacityExceeded, ProviderError, SandboxError, Unavailable
from providers.mapping import ErrorMap, Where, from_status, retry_after

__all__ = ["DAEMON", "EXECUTION_TIMEOUT", "Facts", "facts", "sdk_errors"]

DAEMON = "DAYTONA_DAEMON"
EXECUTION_TIMEOUT = "PROCESS_EXECUTION_TIMEOUT"
_QUOTA_WORDS = ("limit exceeded", "quota")
_RESOURCE_CAP = re.compile(r"total (cpu|memory|disk|gpu) limit exceeded", re.IGNORECASE)
_ERROR_STATE = re.compile(r"Sandbox (\S+) entered error state")
_SNAPSHOT_GONE = re.compile(r"Snapshot \S+ is removing")


class Facts(NamedTuple):
    """What the exception chain of one SDK error says."""

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


def _created_id(exc: BaseException) -> str | None:
    """The sandbox a failed create left behind, when the SDK says which."""
    for link in _chain(exc):
        sandbox_id = getattr(link, "sandbox_id", None)
        if isinstance(sandbox_id, str) and sandbox_id:
            return sandbox_id
        found = _ERROR_STATE.search(str(link))
        if found:
            return found.group(1)
    return None


def _body(link: BaseException) -> dict[str, Any]:
    """The JSON error body a generated client's ``ApiException`` carries, if any."""
    body = getattr(link, "body", None)
    if isinstance(body, bytes | str):
        with contextlib.suppress(ValueError):
            parsed = json.loads(body)
            if isinstance(parsed, dict):
                return parsed
    return {}


def facts(exc: BaseException) -> Facts:
    """Message, status, error source and code, headers and "connection failed", down the chain.

    The SDK wraps the generated clients' errors (which hold the HTTP facts)
    in its own, and some calls (``code_run``, ``refresh_activity``) raise
    them unwrapped, so the first link that knows a fact gives it.
    """
    import aiohttp
    from daytona import DaytonaConnectionError, DaytonaError

    message: str | None = None
    status: int | None = None
    source: str | None = None
    code: str | None = None
    headers: Mapping[str, Any] = {}
    connection = False
    for link in _chain(exc):
        body = _body(link)
        if message is None:
            if isinstance(link, DaytonaError):
                message = link.message
            elif isinstance(body.get("message"), str):
                message = body["message"]
        for value in (getattr(link, "status_code", None), getattr(link, "status", None)):
            if status is None and isinstance(value, int) and not isinstance(value, bool):
                status = value
        for value in (getattr(link, "source", None), body.get("source")):
            if source is None and isinstance(value, str):
                source = value
        for value in (link.code if isinstance(link, DaytonaError) else None, body.get("code")):
            if code is None and isinstance(value, str):
                code = value
        link_headers = getattr(link, "headers", None)
        if not headers and isinstance(link_headers, Mapping) and link_headers:
            headers = link_headers
        if isinstance(link, DaytonaConnectionError | aiohttp.ClientConnectionError | OSError):
            connection = True
    text = message or str(exc) or type(exc).__name__
    return Facts(text, status, source, code, headers, connection)


def _to_error(exc: Exception, where: Where) -> ProviderError:
    """The router error of a Daytona SDK exception (naming the sandbox a failed create left)."""
    from daytona import DaytonaQueueTimeoutError, DaytonaTimeoutError

    where = replace(where, sandbox_id=where.sandbox_id or _created_id(exc))
    found = facts(exc)
    message = found.message
    if isinstance(exc, TimeoutError):
        return where.error(Unavailable, "Daytona did not answer in time")
    if isinstance(exc, DaytonaQueueTimeoutError):
        return where.error(CapacityExceeded, message)
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
    if isinstance(exc, DaytonaTimeoutError) or found.connection:
        return where.error(Unavailable, message)
    if _ERROR_STATE.search(message) or "build_failed" in message:
        return where.error(Unavailable, message)
    if where.in_sandbox:
        return where.error(SandboxError, message)
    return where.error(ProviderError, f"{type(exc).__name__}: {message}")


sdk_errors = ErrorMap(_to_error)
