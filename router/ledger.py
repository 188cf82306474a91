"""The ledger: the shared state store and this replica's fail-open share, as one object.

Every quota and lease call of the router goes through here: reserve,
commit, refund, release, heartbeat, snapshot. When the shared store cannot
be reached, ``on_state_error`` is applied in this one place: ``fail_closed``
raises `StateUnavailable`; ``fail_open`` serves from this replica's outage
ledger (`router.outage`: its share of what the fleet had left, journaled
and handed over when the store is back). Every state error is reported
here, as a ``state_error`` event. What it books is a `router.booking.Booking`.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import secrets
from collections.abc import Callable
from dataclasses import replace

from policies.breaker import Outcome
from policies.outcome import classify
from policies.quota import Meter, Renewal
from providers.errors import StateUnavailable
from router.bindings import Bindings
from router.booking import RESERVE_GRACE, Booking, Denied
from router.context import Context
from router.entries import Entry
from router.events import BreakerTransition, Refund, StateError, StateWarning
from router.failures import create_failed, verdict
from router.known_exhausted import KnownExhausted
from router.lease import Held
from router.outage import Outage
from router.paused_storage import PausedStorage
from router.state import (
    EntryRef,
    Reservation,
    Settlement,
    Snapshot,
    StateStore,
    TenantRef,
)
from router.state.posted import posted, then
from router.tenants import Tenants

__all__ = ["Ledger"]


class Ledger:
    """Reservations, leases and usage, with the fail-open fallback and its reporting."""

    def __init__(self, store: StateStore, ctx: Context) -> None:
        self._ctx = ctx
        self.store = store
        self.state_error: str | None = None  # the last store failure, until a reserve succeeds
        self.outage = Outage(ctx)
        self._breaker = ctx.config.breaker_policy()
        self._checked = False
        # Pools seen out of quota: skipped with no round trip (policies/exhausted.py).
        self.exhausted = KnownExhausted(recheck=ctx.config.fleet_heartbeat)
        self.bindings = Bindings(store, ctx.clock)
        self.tenants = Tenants(ctx.config)  # each tenant's ref, made once per name
        self.storage = PausedStorage(store, ctx, self.tenants)

    async def check(self) -> None:
        """Warn once about a store that would lose the ledger (no persistence) or keeps
        it where this router does not read it (a Cluster's layout switched)."""
        if self._checked:
            return
        self._checked = True
        try:
            refs = [entry.ref for entry in self._ctx.entries.values()]
            problems = await self.store.warnings(refs, self._ctx.clock())
        except StateUnavailable:
            return  # the acquire that follows reports it, by on_state_error
        for problem in problems:
            self._ctx.emit(StateWarning(url=self.store.url, problem=problem))

    async def book(
        self,
        entry: Entry,
        deadline: float,
        *,
        new_session: bool = True,
        warm: bool = False,
        meter: Meter | None = None,
        tenant: TenantRef | None = None,
        abandoned: Callable[[Entry, Booking], None] | None = None,
    ) -> Booking:
        """Reserve what one create (or reconnect) needs before ``deadline``; raises `Denied`.

        ``new_session=False`` takes a slot only (a session's reconnect creates
        nothing). ``warm=True`` claims a ready warm sandbox in the same call
        (`Booking.claimed`, whose lease id the booking takes; only the shared store
        holds them). Cancelled while the store answers, what it grants goes to
        ``abandoned``. ``meter`` prices the lease (its cover held against the pool's
        ``usd``); ``tenant`` counts it to its tenant too, in the same call."""
        lease_id = "l-" + secrets.token_hex(8)
        budget = max(0.0, min(self._ctx.config.create_timeout, deadline - self._ctx.clock()))
        hold, now = budget + RESERVE_GRACE, self._ctx.clock()
        shared = not await self.outage.active(self.store)
        if shared and new_session:
            self.exhausted.skip(entry.ref, now)
        ref = entry.ref if tenant is None else replace(entry.ref, tenant=tenant)
        booking = Booking(lease_id, entry.name, ref, shared, budget, new_session, meter=meter)
        if shared:
            try:
                await self.outage.keep_in_touch(self.store)  # owed outage spend lands first
                reserving = posted(
                    self.store.reserve(
                        ref, self._breaker, lease_id, now, hold,
                        new_session=new_session, warm=warm, meter=meter,
                    )
                )  # fmt: skip
                try:
                    reservation = await reserving
                except asyncio.CancelledError:
                    if abandoned is not None:
                        reserving.after_cancel(
                            functools.partial(self._abandoned, entry, booking, abandoned)
                        )
                    raise
                self.state_error = None
            except StateUnavailable as exc:
                self.on_state_error("reserve", exc)
                self.outage.unanswered(lease_id, ref)
                shared = False
            else:
                self.exhausted.remember(entry.ref, reservation, now)
        if not shared:
            booking = replace(booking, ref=self.outage.share(ref), shared=False)
            reservation = await self.outage.store.reserve(
                booking.ref, self._breaker, lease_id, now, hold, new_session=new_session,
                meter=meter,
            )  # fmt: skip
        return self._booked(entry, booking, reservation)

    def _booked(self, entry: Entry, booking: Booking, reservation: Reservation) -> Booking:
        """The booking a reservation makes; raises `Denied` for a refusal."""
        if reservation.transition:
            self.transition(entry.name, reservation.transition)
        if not reservation.granted:
            if not booking.shared and reservation.reason == "quota":
                why = self.outage.denial(entry.ref.pool, reservation)
                reservation = replace(reservation, reason="outage", detail=why)
            raise Denied(reservation)
        if booking.shared:
            self.outage.spent(entry.ref.pool, "concurrent", 1)
        if (claimed := reservation.claimed) is not None:
            self.outage.spent(entry.ref.pool, "sandbox_seconds", claimed.metered)
            return replace(booking, lease_id=claimed.lease_id, counted=False, claimed=claimed)
        if booking.shared and booking.counted:
            self.outage.spent(entry.ref.pool, "sessions", 1)
        if booking.shared and booking.meter is not None:  # its hold: what it may spend
            self.outage.spent(entry.ref.pool, "usd", booking.meter.cost(booking.meter.first))
        return booking

    def _abandoned(
        self,
        entry: Entry,
        booking: Booking,
        abandoned: Callable[[Entry, Booking], None],
        reserving: asyncio.Future[Reservation],
    ) -> None:
        """Hand what the store granted a cancelled caller to ``abandoned``."""
        if reserving.cancelled() or reserving.exception() is not None:
            return
        with contextlib.suppress(Denied):
            abandoned(entry, self._booked(entry, booking, reserving.result()))

    def known_exhausted(self, entry: Entry) -> str | None:
        """Why ``entry`` is skipped without even a booking (this replica knows its pool is
        out of quota), or None; during an outage the share decides."""
        if self.outage.started is not None:
            return None
        return self.exhausted.why(entry.ref, self._ctx.clock())

    def booking(self, held: Held, ref: EntryRef) -> Booking:
        """The booking behind a lease (``ref``: its entry's)."""
        shared = held.store_kind == "shared" or self.outage.moved(held.lease_id)
        if held.tenant is not None:
            ref = replace(ref, tenant=held.tenant)
        if shared:
            held.store_kind = "shared"  # handed over: the shared store meters it from now on
            return Booking(held.lease_id, held.entry, ref, True, counted=held.counted)
        share = self.outage.share(ref)
        return Booking(held.lease_id, held.entry, share, False, counted=held.counted)

    def _store(self, booking: Booking) -> StateStore:
        return self.store if booking.shared else self.outage.store

    def commit(
        self, booking: Booking, sandbox_id: str, now: float, *, ttl: float | None = None
    ) -> asyncio.Future[Renewal | None]:
        """Turn the reservation into a live lease (for ``ttl``, default ``lease_ttl``):
        not alive when it was lost (``short_at`` when its usd budget could not cover
        the ttl), None when the store failed (reported).

        Started before this returns, its answer a future (`router.state.posted`):
        the upkeep commits a new lease without a task.
        """
        settling = self._store(booking).settle(
            booking.ref, self._breaker, booking.lease_id, now, outcome=Outcome.SUCCESS,
            ttl=self._ctx.config.lease_ttl if ttl is None else ttl, sandbox_id=sandbox_id,
        )  # fmt: skip
        return then(settling, functools.partial(self._committed, booking, sandbox_id))

    def _committed(
        self, booking: Booking, sandbox_id: str, settling: asyncio.Future[Settlement]
    ) -> Renewal | None:
        try:
            settled = settling.result()
        except StateUnavailable as exc:
            self.report("commit", exc)
            return None
        if settled.transition:
            self.transition(booking.entry, settled.transition)
        if settled.applied and not booking.shared:
            self.outage.granted(
                booking.lease_id, booking.ref, sandbox_id, counted=booking.counted,
                meter=booking.meter,
            )  # fmt: skip
        return Renewal(settled.applied, settled.short_at, settled.short_of)

    async def settle_failure(
        self, booking: Booking, exc: BaseException, attempt: int, started: float
    ) -> None:
        """Refund a failed create's reservation and record the failure on the breaker."""
        outcome, until = verdict(exc, self._ctx.clock())
        reason, detail = classify(exc).reason, str(exc)[:200]
        await asyncio.shield(self._give_back(booking, reason, outcome, detail, until))
        if not isinstance(exc, asyncio.CancelledError):
            self._ctx.emit(create_failed(booking.entry, exc, attempt, started, self._ctx.clock()))

    async def record_failure(
        self, booking: Booking, exc: BaseException, attempt: int, started: float
    ) -> None:
        """Record a failed create on the breaker but keep its reservation: the create
        is still running and may yet make a sandbox (see `LateCreates.abandon`)."""
        now = self._ctx.clock()
        outcome, until = verdict(exc, now)
        try:
            transition = await asyncio.shield(
                self._store(booking).record(
                    booking.ref, self._breaker, outcome, now, detail=str(exc)[:200], until=until
                )
            )
        except StateUnavailable as state_exc:
            self.report("record", state_exc)
        else:
            if transition:
                self.transition(booking.entry, transition)
        self._ctx.emit(create_failed(booking.entry, exc, attempt, started, self._ctx.clock()))

    async def refund(self, booking: Booking, reason: str) -> None:
        """Give back a reservation whose create made nothing (the breaker already knows)."""
        await self._give_back(booking, reason, Outcome.NEUTRAL)

    async def _give_back(
        self,
        booking: Booking,
        reason: str,
        outcome: Outcome,
        detail: str = "",
        until: float | None = None,
    ) -> None:
        try:
            settled = await self._store(booking).settle(
                booking.ref, self._breaker, booking.lease_id, self._ctx.clock(),
                outcome=outcome, detail=detail, until=until,
            )  # fmt: skip
        except StateUnavailable as exc:
            self.report("refund", exc)  # the reservation expires by itself (its hold)
            return
        if settled.applied:
            self._ctx.emit(Refund(booking.entry, booking.lease_id, reason))
        if settled.transition:
            self.transition(booking.entry, settled.transition)

    def release(self, booking: Booking) -> asyncio.Future[float | None]:
        """Free the slot and meter the seconds; raises `StateUnavailable` (not reported:
        the caller decides whether to try again). Started before this returns, as
        `commit` is."""
        releasing = self._store(booking).release(booking.ref, booking.lease_id, self._ctx.clock())
        return then(releasing, functools.partial(self._released, booking))

    def _released(self, booking: Booking, releasing: asyncio.Future[float | None]) -> float | None:
        seconds = releasing.result()
        if not booking.shared:
            self.outage.released(booking.lease_id, seconds or 0.0)
        elif seconds:
            self.outage.spent(booking.ref.pool, "sandbox_seconds", seconds)
        return seconds

    async def heartbeat(self, booking: Booking, ttl: float) -> Renewal | None:
        """Extend a live lease: not alive when it had expired (``short_at`` when its usd
        budget could not renew its cover), None when the store failed."""
        try:
            return await self._store(booking).heartbeat(
                booking.ref, booking.lease_id, self._ctx.clock(), ttl
            )
        except StateUnavailable as exc:
            self.report("heartbeat", exc)
            return None

    async def usage(self, refs: list[EntryRef]) -> Snapshot:
        """Usage for ordering: the fallback's under fail_open, raises under fail_closed."""
        try:
            return self.exhausted.observe(await self.store.snapshot(refs, self._ctx.clock()))
        except StateUnavailable as exc:
            self.on_state_error("snapshot", exc)
            return await self.outage.store.snapshot(refs, self._ctx.clock())

    async def snapshot(self, refs: list[EntryRef]) -> tuple[Snapshot, str | None]:
        """Usage and health for status, and the store's error when only the fallback answered."""
        now = self._ctx.clock()
        try:
            snap = await self.store.snapshot(refs, now)
            if await self.outage.adopt(self.store):  # what it handed over counts from now
                snap = await self.store.snapshot(refs, now)
            return self.exhausted.observe(snap), None
        except StateUnavailable as exc:
            local = await self.outage.store.snapshot([self.outage.share(r) for r in refs], now)
            return self.outage.usage(local), str(exc)

    def report(self, operation: str, exc: Exception) -> None:
        self._ctx.emit(
            StateError(operation=operation, error=str(exc), mode=self._ctx.config.on_state_error)
        )

    def on_state_error(self, operation: str, exc: StateUnavailable) -> None:
        """Record it; raise it under fail_closed (the caller falls back under fail_open)."""
        self.state_error = str(exc)
        self.report(operation, exc)
        if self._ctx.config.on_state_error == "fail_closed":
            raise exc

    def transition(self, entry: str, transition: tuple[str, str]) -> None:
        self._ctx.emit(
            BreakerTransition(entry=entry, from_state=transition[0], to_state=transition[1])
        )

    async def close(self) -> None:
        await self.outage.close(self.store)
        await self.store.close()
