"""Lease upkeep: commits, heartbeats, releases, and every task the router leaves running.

After an acquire returns, the lease's commit, its heartbeats (one sweeper
task renews every live lease each ``lease_ttl / 3``) and, at the end, the
kill and the freeing of its slot all run here, off the caller's path. The
commit and the free are posted calls answered in callbacks
(`router.state.posted`), the rest are tasks; closing the router waits for
all of them (`Upkeep.spawn`, `Upkeep._track`). The frees a pool is still
waiting for are tracked so this router's status, and an acquire refused
for concurrency, read their own releases (`Upkeep.caught_up`).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import Coroutine, Iterable
from typing import Any, TypeVar

from providers.base import Sandbox
from providers.capabilities import Capability
from providers.errors import ProviderError, StateUnavailable
from router.context import Context
from router.entries import Entry
from router.events import (
    FreesOwed,
    KillFailed,
    LateCreate,
    LeaseLost,
    Paused,
    Released,
    TaskFailed,
)
from router.lease import Held
from router.ledger import RESERVE_GRACE, Booking, Ledger
from router.state.posted import Posted, then
from router.waits import until_done

__all__ = ["Upkeep"]

T = TypeVar("T")


class Upkeep:
    """The leases this router holds and the background work they need."""

    def __init__(self, ledger: Ledger, ctx: Context) -> None:
        self._ctx = ctx
        self._ledger = ledger
        self.live: dict[str, Held] = {}
        self._sweeper: asyncio.Task[None] | None = None
        self._background: set[asyncio.Future[Any]] = set()
        self._freeing: dict[str, set[asyncio.Future[None]]] = {}  # pool -> slots being freed
        self._abandoned: set[asyncio.Future[Sandbox]] = set()
        self._owed: dict[str, tuple[Booking, bool]] = {}  # lease id -> frees to try again
        self._retrier: asyncio.Task[None] | None = None

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

    def _committed(self, held: Held, committing: asyncio.Future[bool | None]) -> bool | None:
        landed = committing.result()
        if landed is False:
            self._lost(held)
        return landed

    def keep(self, held: Held) -> None:
        """Heartbeat ``held`` until it is released (one sweeper task for all leases)."""
        self.live[held.lease_id] = held
        if self._sweeper is None or self._sweeper.done():
            self._sweeper = asyncio.create_task(self._sweep())

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
        if held.session is not None:
            with contextlib.suppress(StateUnavailable):
                await self._ledger.bind(held, ttl, kept=True)
        with contextlib.suppress(ProviderError):
            await held.sandbox.keepalive(ttl * 2)

    async def release(self, held: Held, *, kill: bool = True) -> None:
        """Dispose of the sandbox (``kill=False``: a paused one, left as it is); free the
        slot beside it, off the caller's path.

        The caller waits for the kill only. The slot's release is posted
        beside it (`_free_slot`); this router's status waits for it
        (`caught_up`), and so does an acquire the pool refuses for concurrency
        meanwhile (`Acquirer.book`): a program that releases and acquires
        again still finds its slot free. Closing the router waits for it too.
        """
        if held.released:
            return
        held.released = True
        self.live.pop(held.lease_id, None)
        disposing = self.spawn(self._dispose(held)) if kill else None  # first: the caller awaits it
        freeing = self._track(self._free_slot(held), "free")
        in_pool = self._freeing.setdefault(self._ctx.entries[held.entry].ref.pool, set())
        in_pool.add(freeing)
        freeing.add_done_callback(in_pool.discard)
        if disposing is not None:
            await until_done(disposing)  # a cancelled release still kills the sandbox
            disposing.result()

    async def _dispose(self, held: Held) -> None:
        """Kill the sandbox, or keep a session's for its idle TTL (a task of its own):
        paused where the entry can pause (its bill stops), else kept running."""
        entry = self._ctx.entries[held.entry]
        idle = self._ctx.config.session_idle_ttl
        if held.session is not None and idle > 0:
            # Bound as paused before the pause: should the pause fail, a resume of a
            # running sandbox is no error.
            pausing = self._ctx.config.session_pause and Capability.PAUSE in entry.capabilities
            try:
                kept = await self._ledger.bind(held, idle, paused=pausing, kept=True)
            except StateUnavailable:
                kept = False
            if not kept:  # the store is away, or the session names another lease's sandbox
                await self.kill(entry, held.sandbox)
                return
            if pausing:
                with contextlib.suppress(ProviderError):
                    await held.sandbox.pause()
                    self._ctx.emit(Paused(entry.name, held.lease_id, held.sandbox.id, held.session))
                    return
            with contextlib.suppress(ProviderError):
                await held.sandbox.keepalive(idle)
        else:
            await self.kill(entry, held.sandbox)

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
        self._ctx.emit(Released(entry=held.entry, lease_id=held.lease_id, seconds=seconds))

    def _owe(self, booking: Booking, *, announce: bool) -> None:
        """Keep a free the store did not take; a retrier tries it again until it lands.

        ``announce``: a lease's free, told by a `Released` event when it lands.
        """
        self._owed[booking.lease_id] = (booking, announce)
        if self._retrier is None or self._retrier.done():
            self._retrier = asyncio.create_task(self._retry_frees())

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
                self._ctx.emit(Released(booking.entry, lease_id, seconds))

    async def book(
        self, entry: Entry, deadline: float, *, new_session: bool = True, warm: bool = False
    ) -> Booking:
        """`Ledger.book`, where what the store grants a caller cancelled meanwhile is
        given back (`_unbook`), not held until its reservation expires."""
        return await self._ledger.book(
            entry, deadline, new_session=new_session, warm=warm, abandoned=self._unbook
        )

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
        self.spawn(self.kill_id(entry, booking.claimed.sandbox_id))
        try:
            await self._ledger.release(booking)
        except StateUnavailable as exc:
            self._ledger.report("release", exc)  # the reservation expires by itself

    def abandon(self, create: asyncio.Future[Sandbox], booking: Booking, entry: Entry) -> None:
        """Follow a create the acquire stopped waiting for: the provider may still make
        (and bill) its sandbox, so its reservation stays until the create ends."""
        self._abandoned.add(create)
        create.add_done_callback(self._abandoned.discard)
        self.spawn(self._follow(create, booking, entry))

    async def _follow(
        self, create: asyncio.Future[Sandbox], booking: Booking, entry: Entry
    ) -> None:
        """Count and kill what the create makes; refund only when it surely made nothing.

        It is followed while its reservation lasts (RESERVE_GRACE past its
        budget) or until the router closes. A create that has not answered by
        then stays counted (the provider may have made it) and its slot is
        freed; the janitor reaps its sandbox, if any, by its lease label.
        """
        await until_done(create, RESERVE_GRACE - 2.0)
        if create.done() and not create.cancelled() and create.exception() is not None:
            await self._ledger.refund(booking, "late_create_failed")
            self._ctx.emit(LateCreate(entry.name, booking.lease_id, "failed"))
            return
        if create.done() and not create.cancelled():
            sandbox = create.result()
            landed = self._ctx.clock()
            await self.kill(entry, sandbox)
            seconds = self._ctx.clock() - landed
            await self._ledger.charge(booking, sandbox.id, seconds)
            late = LateCreate(entry.name, booking.lease_id, "killed", sandbox.id, seconds)
        else:  # no answer while the reservation lasted, or the router is closing
            create.cancel()
            late = LateCreate(entry.name, booking.lease_id, "unanswered")
        try:
            await self._ledger.release(booking)  # the slot is free; the session stays spent
        except StateUnavailable:
            self._owe(booking, announce=False)
        self._ctx.emit(late)

    async def kill(self, entry: Entry, sandbox: Sandbox) -> None:
        """Kill; a failure is an event (the janitor gets it later), not the caller's error."""
        try:
            await sandbox.kill()
        except Exception as exc:
            self._ctx.emit(KillFailed(entry=entry.name, sandbox_id=sandbox.id, error=str(exc)))

    async def kill_id(self, entry: Entry, sandbox_id: str) -> None:
        """`kill` by id through the provider (a sandbox no handle was made for)."""
        try:
            await entry.provider.kill(sandbox_id)
        except Exception as exc:  # the janitor reaps it: unrecorded, unleased
            self._ctx.emit(KillFailed(entry=entry.name, sandbox_id=sandbox_id, error=str(exc)))

    async def close(self) -> None:
        """Stop the heartbeats, wait (10 s at most) for the tasks still running, then try
        the owed frees once more (5 s at most) and say how many are still owed."""
        if self._sweeper is not None:
            self._sweeper.cancel()
        for create in self._abandoned:
            create.cancel()
        if self._background:
            await asyncio.wait(self._background, timeout=10)
        if self._retrier is not None:
            self._retrier.cancel()
        if self._owed:
            with contextlib.suppress(StateUnavailable, TimeoutError):
                await asyncio.wait_for(self._pay_owed(), 5)
        if self._owed:
            self._ctx.emit(FreesOwed(len(self._owed)))
            self._owed.clear()
