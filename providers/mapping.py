"""How an adapter maps its SDK's exceptions (as httpx's ``map_httpcore_exceptions``).

Each adapter writes one ``to_error(exc, where)`` and wraps it in an
`ErrorMap`: every SDK call runs inside ``with sdk_errors(entry, sandbox_id):``,
which raises the router error ``from`` the SDK's, so no call site maps by
hand and none can forget the sandbox it concerns. The HTTP adapters
(Daytona, Runloop, E2B) share the status table (`from_status`) and the
``Retry-After`` reading (`retry_after`).
"""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from email.utils import parsedate_to_datetime
from typing import Any, TypeVar

from providers.errors import (
    AuthError,
    CapacityExceeded,
    NotFound,
    ProviderError,
    QuotaExceeded,
    RateLimited,
    SandboxError,
    Unavailable,
)

__all__ = ["ErrorMap", "Where", "causes", "from_status", "retry_after", "went_out"]

E = TypeVar("E", bound=ProviderError)


@dataclass(frozen=True, slots=True)
class Where:
    """Where an SDK call failed.

    Attributes:
        provider: the chain entry's name.
        sandbox_id: the sandbox concerned, when there is one.
        in_sandbox: the call was an operation inside a live sandbox (a
            command, a file, code), where a client error is the caller's
            (`SandboxError`) rather than the account's.
    """

    provider: str
    sandbox_id: str | None = None
    in_sandbox: bool = False

    def error(self, cls: type[E], message: str, **fields: Any) -> E:
        """A ``cls`` error naming this entry and sandbox."""
        return cls(message, provider=self.provider, sandbox_id=self.sandbox_id, **fields)


class ErrorMap:
    """One adapter's mapping of SDK exceptions, as a context manager.

    Args:
        to_error: the adapter's one mapping; router errors raised inside the
            block (the adapter's own) pass through untouched, and so do
            ``BaseException``s such as cancellation.
    """

    def __init__(self, to_error: Callable[[Exception, Where], ProviderError]) -> None:
        self.to_error = to_error

    @contextlib.contextmanager
    def __call__(
        self, provider: str, sandbox_id: str | None = None, *, in_sandbox: bool = False
    ) -> Iterator[None]:
        try:
            yield
        except ProviderError:
            raise
        except Exception as exc:
            raise self.to_error(exc, Where(provider, sandbox_id, in_sandbox)) from exc


def causes(exc: BaseException) -> Iterator[BaseException]:
    """``exc`` and what led to it, outermost first (``__cause__``, else ``__context__``)."""
    seen: set[int] = set()
    link: BaseException | None = exc
    while link is not None and id(link) not in seen:
        seen.add(id(link))
        yield link
        link = link.__cause__ or link.__context__


def went_out(exc: BaseException, *connect: type[BaseException]) -> bool:
    """Whether the request a transport failure ``exc`` ended may have reached the vendor:
    nothing that led to it is a failure to connect (a refusal, a name that does not
    resolve, or one of ``connect``, the client library's own), so it was sent and its
    answer lost (`providers.errors.Unavailable.unanswered`)."""
    unsent: tuple[type[BaseException], ...] = (ConnectionRefusedError, socket.gaierror, *connect)
    return not any(isinstance(link, unsent) for link in causes(exc))


def retry_after(headers: Mapping[str, Any]) -> float | None:
    """Seconds from ``retry-after-ms`` or ``Retry-After`` (seconds or an HTTP date), if any."""
    values = {str(k).lower(): v for k, v in headers.items()}
    with contextlib.suppress(TypeError, ValueError):
        if values.get("retry-after-ms") is not None:
            return max(float(values["retry-after-ms"]) / 1000, 0.0)
    value = values.get("retry-after")
    if value is None:
        return None
    try:
        return max(float(value), 0.0)
    except (TypeError, ValueError):
        pass
    with contextlib.suppress(TypeError, ValueError):
        when = parsedate_to_datetime(str(value))
        return max((when - datetime.now(UTC)).total_seconds(), 0.0)
    return None


def from_status(
    status: int,
    message: str,
    where: Where,
    *,
    retry_after: float | None = None,
    quota: bool = False,
    capacity: bool = False,
    missing: bool = False,
    callers: bool = False,
) -> ProviderError:
    """The router error of an HTTP error answer.

    What a status means depends on words each vendor puts in its message, so
    the adapter reads those and says what it found.

    Args:
        status: the HTTP status.
        message: the vendor's error message.
        where: the call that failed.
        retry_after: the answer's ``Retry-After`` in seconds (a 429's wait,
            a spent quota's reset).
        quota: the answer says the account's quota is spent.
        capacity: the answer speaks of the cap on what runs at once
            (sandboxes, or the CPU they hold), not of a rate or a quota: a
            release frees it.
        missing: the answer says what was asked for does not exist, whatever
            its status.
        callers: a 403 or 404 came from inside the sandbox (its own
            daemon), so it is the caller's, not the account's.
    """
    if status == 401:
        return where.error(AuthError, message, status=status)
    if capacity:
        return where.error(CapacityExceeded, message, status=status)
    if quota:
        reset_at = datetime.now(UTC) + timedelta(seconds=retry_after) if retry_after else None
        return where.error(QuotaExceeded, message, status=status, reset_at=reset_at)
    if status == 429:
        return where.error(RateLimited, message, status=status, retry_after=retry_after)
    if status == 403 and not callers:
        return where.error(AuthError, message, status=status)
    if missing or (status == 404 and not callers):
        return where.error(NotFound, message, status=status)
    if status in (408, 504) or status >= 500:
        return where.error(Unavailable, message, status=status)
    if where.in_sandbox:
        return where.error(SandboxError, message, status=status)
    return where.error(ProviderError, message, status=status)
