"""Hedged creates: when an entry's create is slow, start the next eligible entry's beside it.

An entry with ``hedge: {after: ...}`` waits ``after`` seconds (or that
percentile of its recent creates on this replica, `policies.latency`) for
its create. If it has not finished by then, the next entry of the chain
that is granted a reservation (never past quota: the reserve decides, and
an entry known to be exhausted costs nothing) starts its create beside it.
The first create that makes a sandbox wins; the other is followed as a
late create (`LateCreates.abandon`): if it makes a sandbox anyway, that is
counted (its session stays spent, its seconds are charged) and killed at
once; if it fails unanswered, its sandbox is looked up by its lease label
(counted and killed when found); if it fails, it is refunded. At most one
extra create per acquire (`Spare.used`). A failure of one leg leaves the
other running; only when both fail does the acquire fail over, with the
first leg's error.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import NoReturn, Protocol

from policies.latency import LatencySketch, hedge_delay
from providers.base import Sandbox
from router.booking import Booking
from router.context import Context
from router.entries import Entry
from router.events import HedgeSettled, HedgeStarted
from router.lease import Held
from router.waits import until_done

__all__ = ["Hedger", "Leg", "Runner", "Spare"]


@dataclass(slots=True)
class Leg:
    """One create under way: its entry, its reservation and when it must be done."""

    entry: Entry
    booking: Booking
    create: asyncio.Future[Sandbox]
    started: float  # the router's clock, for latency and events
    attempt: int
    ends: float = field(default=0.0)  # the loop's clock: its budget after the start


@dataclass(slots=True)
class Spare:
    """The entries an acquire may hedge to (those after the one being tried)."""

    names: Sequence[str]
    at: int = 0
    used: bool = False

    def after(self) -> Sequence[str]:
        return self.names[self.at + 1 :]


class Runner(Protocol):
    """What the race needs from the acquire path."""

    async def spare(self, spare: Spare) -> Leg | None:
        """Reserve and start the next eligible entry's create; None when none is granted."""

    async def land(self, leg: Leg) -> Held:
        """The finished create's lease, or its error (refunded) raised."""

    async def timed_out(self, leg: Leg) -> NoReturn:
        """Give the create past its budget to upkeep, and raise the timeout."""

    def abandon(self, leg: Leg) -> None:
        """Let upkeep follow a create nobody waits for (counted and killed if it lands)."""


class Hedger:
    """This replica's recent create latency per entry, and the hedged race."""

    def __init__(self, ctx: Context) -> None:
        self._ctx = ctx
        self._sketches: dict[str, LatencySketch] = {}

    def sketch(self, entry: str) -> LatencySketch:
        """The entry's recent successful create latencies (seconds)."""
        return self._sketches.setdefault(entry, LatencySketch())

    def delay(self, entry: Entry, spare: Spare) -> float | None:
        """Seconds to wait before hedging this create; None: no hedge."""
        hedge = entry.cfg.hedge
        if hedge is None or spare.used or not spare.after():
            return None
        return hedge_delay(hedge.after, self.sketch(entry.name))

    async def race(self, first: Leg, delay: float, spare: Spare, runner: Runner) -> Held:
        """Wait ``delay`` for ``first``, then race it against a spare entry's create.

        Every leg it returns without is abandoned to upkeep, also when cancelled."""
        loop = asyncio.get_running_loop()
        try:
            await until_done(first.create, delay)
            second = None if first.create.done() else await runner.spare(spare)
        except asyncio.CancelledError:
            runner.abandon(first)
            raise
        if second is None:
            try:
                await until_done(first.create, max(0.0, first.ends - loop.time()))
            except asyncio.CancelledError:
                runner.abandon(first)
                raise
            if not first.create.done():
                await runner.timed_out(first)
            return await runner.land(first)
        names = (first.entry.name, second.entry.name)
        self._ctx.emit(HedgeStarted(entry=names[0], hedge_entry=names[1], after=delay))
        pending = [first, second]
        errors: dict[str, Exception] = {}
        try:
            while pending:
                timeout = max(0.0, min(leg.ends for leg in pending) - loop.time())
                await asyncio.wait(
                    [leg.create for leg in pending],
                    timeout=timeout,
                    return_when=asyncio.FIRST_COMPLETED,
                )
                for leg in list(pending):
                    if not leg.create.done() and loop.time() < leg.ends:
                        continue
                    pending.remove(leg)
                    try:
                        if not leg.create.done():
                            await runner.timed_out(leg)
                        held = await runner.land(leg)
                    except Exception as exc:
                        errors[leg.entry.name] = exc
                        continue
                    for other in pending:
                        runner.abandon(other)
                    pending.clear()
                    self._ctx.emit(HedgeSettled(*names, winner=leg.entry.name))
                    return held
        except asyncio.CancelledError:
            for leg in pending:
                runner.abandon(leg)
            raise
        self._ctx.emit(HedgeSettled(*names, winner="none"))
        raise errors[names[0]]
