"""Lease upkeep: commits, heartbeats, releases, and every task the router leaves running.

After an acquire returns, the lease's commit, its heartbeats (one sweeper
task renews every live lease each ``lease_ttl / 3``) and, at the end, the
kill and the freeing of its slot all run here, off the caller's path. The
commit and the free are posted calls answered in callbacks
(`router.state.posted`), the rest are tasks; closing the router waits for
all of them (`Upkeep.spawn`, `Upkeep._track`). The frees a pool is still
waiting for are tracked so this router's status, and an acquire refused
for concurrency, read their own releases (`Upkeep.caught_up`).

Its kills go through `router.kills` (a failed one is tried again in the
background), and the creates nobody waits for any more through
`router.late_creates` (counted and killed if they land), and a sticky
session's sandbox is parked between uses by `router.parking`.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import Coroutine, Iterable
from typing import Any, TypeVar

from policies.quota import Meter, Renewal, ShortOf
from providers.errors import ProviderError, StateUnavailable
from router.booking import Booking, Denied
from router.context import Context
from router.entries import Entry
from router.events import BudgetExhausted, FreesOwed, LeaseLost, TaskFailed
from router.kills import Kills
from router.late_creates import LateCreates
from router.lease import Held
from router.ledger import Ledger
from router.parking import Parking
from router.spans import ReleaseSpan, untraced
from router.state import TenantRef
from router.state.posted import Posted, then
from router.waits import until_done

__all__ = ["Upkeep"]

T = TypeVar("T")
_END_LOOK = 0.5  # seconds between looks at the clock while a short lease's cover runs out


class Upkeep:
    """The leases this router holds and the background work they need."""

    def __init__(self, ledger: Ledger, ctx: Context) -> None:
        self._ctx = ctx
        self._ledger = ledger
        self.live: dict[str, Held] = {}
        self._sweeper: asyncio.Task[None] | None = None
        self._background: set[asyncio.Future[Any]] = set()
        self._freeing: dict[str, set[asyncio.Future[None]]] = {}  # pool -> slots being freed
        self._owed: dict[str, tuple[Booking, bool]] = {}  # lease id -> frees to try again
        self._retrier: asyncio.Task[None] | None = None
        self._released: asyncio.Event | None = None  # set (and dropped) when a session is let go
        self.kills = Kills(ctx)
        self._parking = Parking(ledger, ctx, self.kills)
        self.late = LateCreates(
            ledger, ctx, self.kills, self.spawn, functools.partial(self._owe, announce=False)
        )

    def spawn(self, work: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        """Run ``work`` as a task that closing the router waits for (see `_track`)."""
        task = asyncio.create_task(work)
        self._track(task, getattr(work, "__qualname__", task.get_name()))
        return task

    def _track(self, running: asyncio.Future[T], name: str) -> asyncio.Future[T]:
        """Closing the router waits for ``running``; an error it ends with is reported
        (a `TaskFailed` event), never left for nobody to see."""
        self._background.add(running)
        running.add_done_callback(functools.partial(self._ended, name))
        return running

    def _ended(self, name: str, running: asyncio.Future[Any]) -> None:
        self._background.discard(running)
        if not running.cancelled() and (exc := running.exception()) is not None:
            self._ctx.emit(TaskFailed(name, f"{type(exc).__name__}: {exc}"))

    def freeing(self, pool: str) -> bool:
        """This router is still freeing a slot in ``pool``."""
        return bool(self._freeing.get(pool))

    async def caught_up(self, pools: Iterable[str] | None = None) -> None:
        """Wait for the slots this router is still freeing in ``pools`` (default: all), so
        its callers read their own releases."""
        wanted = self._freeing if pools is None else pools
        pending = [task for pool in wanted for task in self._freeing.get(pool, ())]
        if pending:
            await asyncio.wait(pending)

    def start(self, held: Held, booking: Booking) -> None:
        """Commit a new lease off the caller's path, then keep it alive.

        The reservation holds every unit the lease needs, and it outlives the
        create by RESERVE_GRACE, so the commit is off the caller's path (one
        round trip less per acquire). Only lost state (Redis flushed or
        unreachable) makes it fail, and that is told as a heartbeat that
        finds its lease gone is told. Heartbeats and the release wait for it.
        It is posted, not a task (`router.state.posted`).
        """
        committing = self._ledger.commit(booking, held.sandbox.id, held.acquired_at)
        committed = then(committing, functools.partial(self._committed, held))
        held.committing = self._track(committed, "commit")
        self.keep(held)

    def _committed(self, held: Held, committing: asyncio.Future[Renewal | None]) -> Renewal | None:
        landed = committing.result()
        if landed is not None and not landed.alive:
            self._lost(held)
        elif landed is not None:
            self._covered(held, landed)
        return landed

    def keep(self, held: Held) -> None:
        """Heartbeat ``held`` until it is released (one sweeper task for all leases)."""
        self.live[held.lease_id] = held
        if self._sweeper is None or self._sweeper.done():
            self._sweeper = untraced(self._sweep())

    def _lost(self, held: Held) -> None:
        self.live.pop(held.lease_id, None)
        self._ctx.emit(LeaseLost(entry=held.entry, lease_id=held.lease_id))

    async def _sweep(self) -> None:
        """Every lease_ttl / 3, renew every live lease; ends when it finds none."""
        while True:
            await asyncio.sleep(self._ctx.config.lease_ttl / 3)
            if not self.live:
                return
            renewals = [self._heartbeat(h) for h in list(self.live.values())]
            for outcome in await asyncio.gather(*renewals, return_exceptions=True):
                if isinstance(outcome, Exception):  # one lease's bad luck stops no other
                    self._ledger.report("heartbeat", outcome)

    async def _booking(self, held: Held) -> Booking:
        """``held``'s booking, once its commit has landed (a heartbeat or a release never
        overtakes the commit)."""
        if held.committing is not None:
            await held.committing
        return self._booking_now(held)

    def _booking_now(self, held: Held) -> Booking:
        return self._ledger.booking(held, self._ctx.entries[held.entry].ref)

    async def _heartbeat(self, held: Held) -> None:
        ttl = self._ctx.config.lease_ttl
        alive = await self._ledger.heartbeat(await self._booking(held), ttl)
        if alive is None or held.released:
            return
        if not alive:
            self._lost(held)
            return
        self._covered(held, alive)
        if held.session is not None:  # only while the session names this lease
            with contextlib.suppress(StateUnavailable):
                await self._ledger.bindings.bind(held, ttl, kept=True)
        with contextlib.suppress(ProviderError):
            await held.sandbox.keepalive(ttl * 2)

    def _covered(self, held: Held, renewal: Renewal) -> None:
        """Follow a lease's usd cover: told once when the budget could not renew it
        (`BudgetExhausted`), ended at the cover's end under ``on_budget_end: kill``, and
        forgiven when a later renewal fits again."""
        if not renewal.short_at:
            held.budget_ends = held.budget_short = None
            return
        if held.budget_ends is not None:
            return
        short: ShortOf = renewal.short_of or "pool"
        held.budget_ends, held.budget_short = renewal.short_at, short
        entry = self._ctx.entries[held.entry]
        kill = entry.quota.on_budget_end == "kill"
        action = "kill" if kill else "warn"
        tenant = held.tenant.name if held.tenant is not None else None
        self._ctx.emit(
            BudgetExhausted(
                held.entry, held.lease_id, entry.ref.pool, renewal.short_at, action,
                short, tenant,
            )
        )  # fmt: skip
        if kill:
            self.spawn(self._end_at(held, renewal.short_at))

    async def _end_at(self, held: Held, ends: float) -> None:
        """Release ``held`` when its usd cover ends, unless a renewal covered it since.

        The router's clock is looked at every `_END_LOOK` seconds at most (a cover may
        run for a whole billing step: the clock, not a timer, says when it ends), and a
        later shortfall ending elsewhere is its own task's."""
        while held.budget_ends == ends and not held.released:
            left = ends - self._ctx.clock()
            if left <= 0:
                await self.release(held)
                return
            await asyncio.sleep(min(left, _END_LOOK))

    async def release(self, held: Held, *, kill: bool = True) -> None:
        """Dispose of the sandbox (``kill=False``: a paused one, left as it is); free the
        slot beside it, off the caller's path.

        The caller waits for the kill only. The slot's release is posted
        beside it (`_free_slot`); this router's status waits for it
        (`caught_up`), and so does an acquire the pool refuses for concurrency
        meanwhile (`Upkeep.book`): a program that releases and acquires
        again still finds its slot free. Closing the router waits for it too.
        """
        if held.released:
            return
        with self._ctx.spans(ReleaseSpan(held.entry, held.lease_id, held.sandbox.id)):
            await self._release(held, kill)

    async def _release(self, held: Held, kill: bool) -> None:
        held.released = True
        self.live.pop(held.lease_id, None)
        disposing = self.spawn(self._dispose(held)) if kill else None  # first: the caller awaits it
        freeing = self._track(self._free_slot(held), "free")
        in_pool = self._freeing.setdefault(self._ctx.entries[held.entry].ref.pool, set())
        in_pool.add(freeing)
        freeing.add_done_callback(in_pool.discard)
        if disposing is None:
            self.wake_sessions()  # a paused lease's session was let go before (`Pauses`)
            return
        await until_done(disposing)  # a cancelled release still kills the sandbox
        disposing.result()

    def wake_sessions(self) -> None:
        """A session was let go here: the acquires of this router waiting for one look
        again now (`session_released`)."""
        if self._released is not None:
            self._released.set()
            self._released = None

    async def session_released(self, timeout: float) -> None:
        """Wait until this router lets go of a session, ``timeout`` seconds at most."""
        if self._released is None:  # made on the loop that waits (an event binds to one)
            self._released = asyncio.Event()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._released.wait(), timeout)

    async def _dispose(self, held: Held) -> None:
        """Kill the sandbox, or keep a session's for its idle TTL (a task of its own)."""
        entry = self._ctx.entries[held.entry]
        if held.session is None:
            await self.kills.kill(entry, held.sandbox)
            return
        try:
            await self._parking.leave(entry, held)
        finally:
            self.wake_sessions()

    def _free_slot(self, held: Held) -> asyncio.Future[None]:
        """Free the slot once the commit has landed (a free never overtakes it), posted
        rather than a task (`router.state.posted`)."""
        committing = held.committing
        if committing is None or committing.done():
            return self._free_now(held)
        freed: Posted[None] = Posted(asyncio.Future.result, loop=asyncio.get_running_loop())

        def free(_: object) -> None:
            try:
                self._free_now(held).add_done_callback(freed.land)
            except Exception as exc:
                freed.set_exception(exc)

        committing.add_done_callback(free)
        return freed

    def _free_now(self, held: Held) -> asyncio.Future[None]:
        booking = self._booking_now(held)
        return then(self._ledger.release(booking), functools.partial(self._freed, held, booking))

    def _freed(self, held: Held, booking: Booking, releasing: asyncio.Future[float | None]) -> None:
        try:
            seconds = releasing.result()
        except StateUnavailable as exc:
            self._ledger.report("release", exc)
            self._owe(booking, announce=True)
            return
        entry = self._ctx.entries[held.entry]
        self._ctx.emit(entry.released(held.lease_id, seconds, held.spec, fee=held.counted))

    def _owe(self, booking: Booking, *, announce: bool) -> None:
        """Keep a free the store did not take; a retrier tries it again until it lands.

        ``announce``: a lease's free, told by a `Released` event when it lands.
        """
        self._owed[booking.lease_id] = (booking, announce)
        if self._retrier is None or self._retrier.done():
            self._retrier = untraced(self._retry_frees())

    async def _retry_frees(self) -> None:
        """Try the owed frees again, backing off from 0.5 s to 10 s while the store is down."""
        delay = 0.5
        while self._owed:
            await asyncio.sleep(delay)
            delay = min(delay * 2, 10.0)
            with contextlib.suppress(StateUnavailable):
                await self._pay_owed()

    async def _pay_owed(self) -> None:
        """One pass over the owed frees, in order; raises at the first the store refuses."""
        for lease_id, (booking, announce) in list(self._owed.items()):
            seconds = await self._ledger.release(booking)
            del self._owed[lease_id]
            if announce:
                entry = self._ctx.entries[booking.entry]
                self._ctx.emit(entry.released(lease_id, seconds, fee=booking.counted))

    async def book(
        self,
        entry: Entry,
        deadline: float,
        *,
        new_session: bool = True,
        warm: bool = False,
        meter: Meter | None = None,
        tenant: TenantRef | None = None,
    ) -> Booking:
        """`Ledger.book` for every caller (acquire, hedge, warm refill, session
        reconnect, resume): what the store grants a caller cancelled meanwhile is
        given back (`_unbook`), not held until its reservation expires; and a pool
        whose concurrency is full while this router is still freeing slots in it is
        asked again once those frees have landed, so a program that releases and
        books again finds its slot free (a pool with room waits for nothing).
        """
        try:
            return await self._book(entry, deadline, new_session, warm, meter, tenant)
        except Denied as denied:
            unit, reason = denied.reservation.unit, denied.reservation.reason
            # A tenant's leases span pools: its frees in any of them may make room.
            pools = None if reason == "tenant" else (entry.ref.pool,)
            freeing = any(map(self.freeing, self._freeing if pools is None else pools))
            if unit not in ("concurrent", "usd") or not freeing:
                raise
        await self.caught_up(pools)
        return await self._book(entry, deadline, new_session, warm, meter, tenant)

    async def _book(
        self,
        entry: Entry,
        deadline: float,
        new_session: bool,
        warm: bool,
        meter: Meter | None,
        tenant: TenantRef | None,
    ) -> Booking:
        return await self._ledger.book(
            entry, deadline, new_session=new_session, warm=warm, meter=meter, tenant=tenant,
            abandoned=self._unbook,
        )  # fmt: skip

    def _unbook(self, entry: Entry, booking: Booking) -> None:
        """Give back a booking nobody took: a claimed warm sandbox is killed and its lease
        freed; a reservation is refunded (no create ran)."""
        if booking.claimed is None:
            self.spawn(self._ledger.refund(booking, "acquire_cancelled"))
        else:
            self.spawn(self.give_back(entry, booking))

    async def give_back(self, entry: Entry, booking: Booking) -> None:
        """Free a warm claim nobody will use (its slot first: an acquire may need it), and
        kill its sandbox in the background (the session it was stays spent)."""
        assert booking.claimed is not None
        self.spawn(self.kills.kill_id(entry, booking.claimed.sandbox_id))
        try:
            await self._ledger.release(booking)
        except StateUnavailable as exc:
            self._ledger.report("release", exc)  # the reservation expires by itself

    async def close(self) -> None:
        """Stop the heartbeats, wait (10 s at most) for the tasks still running, try the
        failed kills once more (5 s at most: the reaper gets what is left) and the owed
        frees (5 s at most), and say how many are still owed."""
        if self._sweeper is not None:
            self._sweeper.cancel()
        self.late.close()
        if self._background:
            await asyncio.wait(self._background, timeout=10)
        await self.kills.close()
        if self._retrier is not None:
            self._retrier.cancel()
        if self._owed:
            with contextlib.suppress(StateUnavailable, TimeoutError):
                await asyncio.wait_for(self._pay_owed(), 5)
        if self._owed:
            self._ctx.emit(FreesOwed(len(self._owed)))
            self._owed.clear()
