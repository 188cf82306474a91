"""Late creates: a create the acquire stopped waiting for, or that failed unanswered.

The provider may still make (and bill) its sandbox, so its reservation
stays while upkeep follows it: a sandbox the create answers with, late, is
counted and killed; a failure the vendor answered is refunded; a failure
without an answer sends upkeep to the vendor's list for the sandboxes
carrying the create's lease label, for as long as the create itself may
take. Whatever upkeep cannot tell stays counted, its slot freed, and the
janitor reaps its sandbox, if any, by its lease label.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import replace
from typing import Any

from providers.base import LABEL_LEASE, Sandbox, SandboxSpec
from providers.discards import CreateReport, Discarded, reporting
from providers.errors import StateUnavailable, Unavailable
from router.booking import RESERVE_GRACE, Booking
from router.context import Context
from router.entries import Entry
from router.events import LateCreate, TaskFailed
from router.kills import Kills
from router.ledger import Ledger
from router.state import Spend
from router.waits import until_done

__all__ = ["LateCreates", "unanswered"]

_LOOK_FOR = 1.0  # a late create's lookup by lease label lasts its budget, or this at least
_LOOK_EVERY = 1.0  # seconds between its lists


def unanswered(exc: BaseException) -> bool:
    """A create that raised ``exc`` may have made a sandbox nobody was told of: its
    request went out and no answer came back (an error naming its sandbox says the
    adapter knows what it made, and has dealt with it)."""
    if isinstance(exc, Unavailable):
        return exc.unanswered and exc.sandbox_id is None
    return isinstance(exc, TimeoutError)


class LateCreates:
    """The creates this router follows after nobody waits for them any more.

    ``spawn`` runs a follow-up as a task that closing the router waits for;
    ``owe`` keeps a free the store did not take, to be tried again
    (`router.upkeep.Upkeep`).
    """

    def __init__(
        self,
        ledger: Ledger,
        ctx: Context,
        kills: Kills,
        spawn: Callable[[Coroutine[Any, Any, None]], asyncio.Task[None]],
        owe: Callable[[Booking], None],
    ) -> None:
        self._ledger = ledger
        self._ctx = ctx
        self._kills = kills
        self._spawn = spawn
        self._owe = owe
        self._abandoned: set[asyncio.Future[Sandbox]] = set()
        self._reports: weakref.WeakKeyDictionary[asyncio.Future[Sandbox], CreateReport] = (
            weakref.WeakKeyDictionary()
        )
        self._closing = False  # lookups list once more, then stop

    def create(
        self,
        entry: Entry,
        spec: SandboxSpec,
        timeout: float,
        wrap: Callable[[Coroutine[Any, Any, Sandbox]], Coroutine[Any, Any, Sandbox]] | None = None,
    ) -> asyncio.Future[Sandbox]:
        """Start ``entry``'s create as a task of its own (in ``wrap``: a span), under a
        report of what its adapter discards if the router cancels it (`_follow`)."""
        report = CreateReport()
        creating = entry.provider.create(spec, timeout=timeout)
        task = asyncio.ensure_future(reporting(report, wrap(creating) if wrap else creating))
        self._reports[task] = report
        return task

    async def failed(
        self,
        create: asyncio.Future[Sandbox],
        booking: Booking,
        entry: Entry,
        exc: BaseException,
        attempt: int,
        started: float,
    ) -> None:
        """Settle a create that raised ``exc``: refund its reservation and tell the breaker.

        A create left unanswered (`unanswered`: the connection was lost or the
        request timed out after it went out) may have made a sandbox all the
        same: the breaker is told, and the reservation stays while upkeep
        looks it up (`abandon`).
        """
        if unanswered(exc):
            await self._ledger.record_failure(booking, exc, attempt, started)
            self.abandon(create, booking, entry)
        else:
            await self._ledger.settle_failure(booking, exc, attempt, started)

    def abandon(self, create: asyncio.Future[Sandbox], booking: Booking, entry: Entry) -> None:
        """Follow a create the acquire stopped waiting for, or that ended unanswered: the
        provider may still make (and bill) its sandbox, so its reservation stays until
        upkeep knows."""
        self._abandoned.add(create)
        create.add_done_callback(self._abandoned.discard)
        self._spawn(self._follow(create, booking, entry))

    async def _follow(
        self, create: asyncio.Future[Sandbox], booking: Booking, entry: Entry
    ) -> None:
        """Count and kill what the create makes; refund only when it surely made nothing.

        The adapter runs the vendor's create to the vendor's own request
        timeout, so its answer comes, late, or its failure does. A sandbox it
        answers with is counted (its session stays spent, its seconds
        charged) and killed at once. A failure the vendor answered is
        refunded. A failure without an answer sends upkeep to the vendor's
        list for the sandboxes carrying the create's lease label, for as long
        as the create itself may take (its budget): what it finds is counted
        and killed; when the lists found nothing the whole time, it is
        refunded. All of it is done while the reservation lasts (RESERVE_GRACE
        past its budget) or until the router closes; a create still running
        then is cut off, and what one last list finds is counted and killed.
        Whatever upkeep cannot tell stays counted, its slot freed, and the
        janitor reaps its sandbox, if any, by its lease label.
        """
        horizon = asyncio.get_running_loop().time() + RESERVE_GRACE - 2.0
        await until_done(create, RESERVE_GRACE - 2.0)
        ended = create.done() and not create.cancelled()
        error = create.exception() if ended else None
        if ended and error is None:
            sandbox = create.result()
            late = await self._charge(
                entry, booking, "killed", [sandbox.id], self._kills.kill(entry, sandbox)
            )
        elif error is not None and not unanswered(error):
            late = LateCreate(entry.name, booking.lease_id, "failed")
        else:
            create.cancel()  # still running when the reservation ends or the router closes
            await asyncio.wait([create])  # its adapter has seen the cancel
            report = self._reports.get(create)
            if report is not None and report.discarded is not None:
                late = await self._discarded(entry, booking, await report.discarded, horizon)
            else:
                late = await self._search(entry, booking, whole=error is not None, horizon=horizon)
        if late.outcome == "failed":
            await self._ledger.refund(booking, "late_create_failed")
        else:
            if booking.meter is not None:  # what the ledger charges: the fee and the seconds
                cost = booking.meter.cost(late.seconds, fee=booking.counted)
                late = replace(late, cost=cost, pool=entry.ref.pool)
            try:
                await self._ledger.release(booking)  # the slot is free; the session stays spent
            except StateUnavailable:
                self._owe(booking)
        self._ctx.emit(late)

    async def _charge(
        self,
        entry: Entry,
        booking: Booking,
        outcome: str,
        sandbox_ids: list[str],
        killing: Awaitable[object],
    ) -> LateCreate:
        """Meter the sandboxes a late create made until ``killing`` has killed them."""
        landed = self._ctx.clock()
        await killing
        seconds = (self._ctx.clock() - landed) * len(sandbox_ids)
        await self._meter(booking, sandbox_ids[0], seconds)
        return LateCreate(entry.name, booking.lease_id, outcome, ",".join(sandbox_ids), seconds)

    async def _discarded(
        self, entry: Entry, booking: Booking, discarded: Discarded, horizon: float
    ) -> LateCreate:
        """What the adapter of a create cancelled by the router made and killed, by its
        own report: its request ran on to the vendor's answer."""
        sandbox_id, error = discarded.sandbox_id, discarded.error
        if sandbox_id is not None:
            seconds = discarded.seconds
            if not discarded.killed:  # the adapter's kill failed: the router's retries
                landed = self._ctx.clock()
                await self._kills.kill_id(entry, sandbox_id)
                seconds += self._ctx.clock() - landed
            await self._meter(booking, sandbox_id, seconds)
            return LateCreate(entry.name, booking.lease_id, "killed", sandbox_id, seconds)
        if isinstance(error, Exception) and not unanswered(error):
            return LateCreate(entry.name, booking.lease_id, "failed")
        return await self._search(entry, booking, whole=True, horizon=horizon)

    async def _meter(self, booking: Booking, sandbox_id: str, seconds: float) -> None:
        """Meter a late create's sandbox, which no lease ever held, for ``seconds`` (their
        cost at its price; its fee is charged when its reservation is released)."""
        ledger = self._ledger
        if not booking.shared:
            rate_only = None if booking.meter is None else replace(booking.meter, fee=0.0)
            ledger.outage.granted(
                booking.lease_id, booking.ref, sandbox_id, counted=False, meter=rate_only
            )
            ledger.outage.released(booking.lease_id, seconds)
            return
        usd = 0.0 if booking.meter is None else booking.meter.cost(seconds, fee=False)
        spend = Spend(booking.ref, sandbox_seconds=seconds, usd=usd)
        try:  # the lease id makes it one charge, however often it is sent
            await ledger.store.reconcile("late-" + booking.lease_id, [spend], self._ctx.clock())
        except StateUnavailable as exc:
            ledger.report("charge", exc)

    async def _search(
        self, entry: Entry, booking: Booking, *, whole: bool, horizon: float
    ) -> LateCreate:
        """What a create without an answer made, by its lease label: listed for its
        budget when ``whole`` and the reservation lasts that long, else once (nothing
        found then proves nothing)."""
        until = asyncio.get_running_loop().time() + max(booking.budget, _LOOK_FOR)
        whole = whole and until <= horizon
        found = await self._look_up(entry, booking.lease_id, until if whole else 0.0)
        if found:
            killing = asyncio.gather(
                *(self._kills.kill_id(entry, sandbox_id) for sandbox_id in found)
            )
            return await self._charge(entry, booking, "found", found, killing)
        if found is not None and whole and not self._closing:
            return LateCreate(entry.name, booking.lease_id, "failed")
        return LateCreate(entry.name, booking.lease_id, "unanswered")

    async def _look_up(self, entry: Entry, lease_id: str, until: float) -> list[str] | None:
        """The ids of the entry's sandboxes labelled with ``lease_id``, listed every
        `_LOOK_EVERY` seconds until one is found or the loop's clock reaches ``until``
        (once the router closes, no list after the next); None when no list answered."""
        loop = asyncio.get_running_loop()
        failure: Exception | None = None
        answered = False
        while True:
            try:
                listed = await entry.provider.list({LABEL_LEASE: lease_id})
            except Exception as exc:  # the vendor is away: the next list may answer
                failure = exc
            else:
                answered = True
                if listed:
                    return [info.id for info in listed]
            left = until - loop.time()
            if left <= 0 or self._closing:
                break
            await asyncio.sleep(min(_LOOK_EVERY, left))
        if answered:
            return []
        if failure is not None:
            self._ctx.emit(TaskFailed("late create lookup", f"{type(failure).__name__}: {failure}"))
        return None

    def close(self) -> None:
        """Cut off the creates still running; the lookups list once more, then stop."""
        self._closing = True
        for create in self._abandoned:
            create.cancel()
