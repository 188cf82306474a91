"""What a create went on to make after its caller cancelled it.

A vendor's answer to a create is the only place the new sandbox's id
appears, so an adapter whose create is cancelled lets the request finish in
the background and kills what it made (`Provider._made_or_discarded`,
`Provider._discard_later`). The vendor bills that sandbox all the same. A
caller that counts what the vendor bills (the router) runs the create under
a `CreateReport` (`reporting`) and learns from it what was discarded, and
how long it lived; a lookup by label cannot tell, since the sandbox may not
exist yet when it lists, or no longer.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any, TypeVar

__all__ = ["CreateReport", "Discarded", "reporting"]

S = TypeVar("S")

_REPORT: contextvars.ContextVar[CreateReport | None] = contextvars.ContextVar(
    "sandbox_router_create_report", default=None
)


@dataclass(frozen=True, slots=True)
class Discarded:
    """The outcome of a cancelled create's request, and of its discard.

    ``sandbox_id``: what the vendor made (None: the request failed, with
    ``error``). ``seconds``: from the vendor's answer until the kill returned.
    ``killed``: False when the kill failed (the sandbox may still run).
    """

    sandbox_id: str | None
    seconds: float = 0.0
    killed: bool = False
    error: BaseException | None = None


class CreateReport:
    """Told what one `Provider.create` made once its caller stopped waiting for it.

    ``discarded`` is None while the adapter follows nothing (the create ended, or
    it was cancelled before a request went out); else it resolves once the
    background request has answered and what it made is killed.
    """

    def __init__(self) -> None:
        self.discarded: asyncio.Future[Discarded] | None = None
        self._answered: dict[str, float] = {}

    def answered(self, sandbox_id: str) -> None:
        self._answered[sandbox_id] = asyncio.get_running_loop().time()

    def follow(self) -> Callable[[Discarded], None]:
        """A new discard to report; the setter resolves `discarded` (once)."""
        future: asyncio.Future[Discarded] = asyncio.get_running_loop().create_future()
        self.discarded = future

        def settle(outcome: Discarded) -> None:
            if not future.done():
                future.set_result(outcome)

        return settle

    def lived(self, sandbox_id: str) -> float:
        since = self._answered.get(sandbox_id)
        return 0.0 if since is None else asyncio.get_running_loop().time() - since


async def reporting(report: CreateReport, create: Awaitable[S]) -> S:
    """Await ``create`` (a `Provider.create`), its discards told to ``report``."""
    token = _REPORT.set(report)
    try:
        return await create
    finally:
        _REPORT.reset(token)


def answered(sandbox_id: str) -> None:
    """Tell the running create's report, if any, that the vendor answered with
    ``sandbox_id`` (its seconds run from now)."""
    report = _REPORT.get()
    if report is not None:
        report.answered(sandbox_id)


def when_made(
    request: asyncio.Future[S],
    ident: Callable[[S], str],
    discard: Callable[[str], Awaitable[object]],
) -> Coroutine[Any, Any, None]:
    """What discards what a cancelled create's request made, once it answers (its report
    told at once that a discard follows)."""
    report = _REPORT.get()
    return _when_made(request, ident, discard, report, report.follow() if report else None)


def later(
    sandbox_id: str, discard: Callable[[str], Awaitable[object]]
) -> Coroutine[Any, Any, None]:
    """What discards a sandbox a cancelled create made, its answer already in."""
    report = _REPORT.get()
    return _killed(sandbox_id, discard, report, report.follow() if report else None)


async def _when_made(
    request: asyncio.Future[S],
    ident: Callable[[S], str],
    discard: Callable[[str], Awaitable[object]],
    report: CreateReport | None,
    settle: Callable[[Discarded], None] | None,
) -> None:
    try:
        made = await request
    except BaseException as exc:  # it made nothing, or nothing that can be named
        if settle is not None:
            settle(Discarded(None, error=exc))
        return
    sandbox_id = ident(made)
    if report is not None:
        report.answered(sandbox_id)
    await _killed(sandbox_id, discard, report, settle)


async def _killed(
    sandbox_id: str,
    discard: Callable[[str], Awaitable[object]],
    report: CreateReport | None,
    settle: Callable[[Discarded], None] | None,
) -> None:
    killed = False
    try:
        with contextlib.suppress(Exception):
            await discard(sandbox_id)
            killed = True
    finally:
        if report is not None and settle is not None:
            settle(Discarded(sandbox_id, report.lived(sandbox_id), killed))
