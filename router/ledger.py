"""The ledger: the shared state store and this replica's fail-open share, as one object.

Every quota and lease call of the router goes through here: reserve,
commit, refund, release, heartbeat, snapshot. When the shared store cannot
be reached, ``on_state_error`` is applied in this one place: ``fail_closed``
raises `StateUnavailable`; ``fail_open`` serves from this replica's outage
ledger (`router.outage`: its share of what the fleet had left, journaled
and handed over when the store is back). Every state error is reported
here, as a ``state_error`` event.

A `Booking` remembers which of the two holds a lease, so its commit,
heartbeats and release go where its reservation went.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import secrets
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import UTC, datetime

from policies.breaker import Outcome
from policies.exhausted import Exhausted, ExhaustedPools
from policies.outcome import classify
from providers.base import Sandbox
from providers.errors import QuotaExceeded, RateLimited, StateUnavailable
from router.context import Context
from router.entries import Entry
from router.events import (
    BreakerTransition,
    CreateFailed,
    Refund,
    StateError,
    StateWarning,
    emit,
)
from router.lease import Held
from router.outage import Outage
from router.state import EntryRef, Reservation, Settlement, Snapshot, Spend, StateStore
from router.state.posted import posted, then
from router.state.warm import Claim

__all__ = ["RESERVE_GRACE", "Booking", "Denied", "Ledger"]

RESERVE_GRACE = 30.0  # a reservation outlives its create by this much before it expires


class Denied(Exception):
    """The ledger refused a reservation (breaker or quota); `Ledger.describe` says why."""

    def __init__(self, reservation: Reservation) -> None:
        super().__init__(reservation.reason)
        self.reservation = reservation


@dataclass(frozen=True, slots=True)
class Booking:
    """A reservation this router holds, and which ledger holds it.

    Attributes:
        ref: the entry as the holding store knows it (under fail-open, with
            the replica's share of the limits).
        shared: False when this replica's fail-open share holds it.
        budget: the seconds the create (or a session's reconnect) may take.
    """

    lease_id: str
    entry: str
    ref: EntryRef
    shared: bool
    budget: float = 0.0
    counted: bool = True  # took a session unit (False: a reconnect, or a warm claim)
    claimed: Claim | None = None  # the warm sandbox the reservation claimed

    def held(
        self,
        provider: str,
        sandbox: Sandbox,
        acquired_at: float,
        attempts: int,
        *,
        session: str | None = None,
        resumed: bool = False,
    ) -> Held:
        """The lease record for the sandbox this booking paid for."""
        return Held(
            self.lease_id,
            self.entry,
            provider,
            sandbox,
            acquired_at,
            attempts,
            store_kind="shared" if self.shared else "fallback",
            session=session,
            resumed=resumed,
        )


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
        self.exhausted = ExhaustedPools(recheck=ctx.config.fleet_heartbeat)
        self._why: dict[str, tuple[Exhausted, str]] = {}

    async def check(self) -> None:
        """Warn once about a store that would lose the ledger (no persistence)."""
        if self._checked:
            return
        self._checked = True
        try:
            problems = await self.store.warnings()
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
        abandoned: Callable[[Entry, Booking], None] | None = None,
    ) -> Booking:
        """Reserve what one create (or reconnect) needs before ``deadline``; raises `Denied`.

        ``new_session=False`` takes a slot only: reconnecting to a session's
        sandbox creates nothing. ``warm=True`` claims a ready warm sandbox of
        the entry in the same call when there is one (`Booking.claimed`, whose
        lease id the booking takes); only the shared store holds warm pools.
        Cancelled while the store answers, what it grants goes to
        ``abandoned`` (else it would hold its slot until the hold expires).
        """
        lease_id = "l-" + secrets.token_hex(8)
        budget = max(0.0, min(self._ctx.config.create_timeout, deadline - self._ctx.clock()))
        hold, now = budget + RESERVE_GRACE, self._ctx.clock()
        shared = not await self.outage.active(self.store)
        if shared and new_session:
            self._skip_exhausted(entry.ref, now)
        booking = Booking(lease_id, entry.name, entry.ref, shared, budget, new_session)
        if shared:
            try:
                await self.outage.keep_in_touch(self.store)  # owed outage spend lands first
                reserving = posted(
                    self.store.reserve(
                        entry.ref, self._breaker, lease_id, now, hold,
                        new_session=new_session, warm=warm,
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
                self.outage.answered = now
                self.state_error = None
            except StateUnavailable as exc:
                self.on_state_error("reserve", exc)
                shared = False
            else:
                self._remember(entry.ref, reservation, now)
        if not shared:
            booking = replace(booking, ref=self.outage.share(entry.ref), shared=False)
            reservation = await self.outage.store.reserve(
                booking.ref, self._breaker, lease_id, now, hold, new_session=new_session
            )
        return self._booked(entry, booking, reservation)

    def _booked(self, entry: Entry, booking: Booking, reservation: Reservation) -> Booking:
        """The booking a reservation makes; raises `Denied` for a refusal."""
        if reservation.transition:
            self.transition(entry.name, reservation.transition)
        if not reservation.granted:
            raise Denied(reservation)
        if (claimed := reservation.claimed) is not None:
            self.outage.spent(entry.ref.pool, "sandbox_seconds", claimed.metered)
            return replace(booking, lease_id=claimed.lease_id, counted=False, claimed=claimed)
        if booking.shared and booking.counted:
            self.outage.spent(entry.ref.pool, "sessions", 1)
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

    def _skip_exhausted(self, ref: EntryRef, now: float) -> None:
        """Raise `Denied` for a pool this replica knows is out of quota, asking nobody."""
        known = self.exhausted.lookup(ref.pool, ref.limits, now)
        if known is not None:
            raise Denied(_denial(known))

    def known_exhausted(self, entry: Entry) -> str | None:
        """Why ``entry`` is skipped without even a booking (this replica knows its pool is
        out of quota), or None. The reason's text is made once per remembered denial:
        a chain walks past the same exhausted entries on every acquire."""
        if self.outage.started is not None:
            return None
        known = self.exhausted.lookup(entry.ref.pool, entry.ref.limits, self._ctx.clock())
        if known is None:
            return None
        why = self._why.get(entry.ref.pool)
        if why is None or why[0] is not known:
            why = self._why[entry.ref.pool] = (known, self.describe(_denial(known)))
        return why[1]

    def _remember(self, ref: EntryRef, r: Reservation, now: float) -> None:
        if r.granted:
            self.exhausted.forget(ref.pool)
        elif r.reason == "quota":
            self.exhausted.note(
                ref.pool, ref.limits, r.unit, r.used, r.limit, r.until, r.version, now
            )

    def _observe(self, snap: Snapshot) -> Snapshot:
        """Let a pool status read anyway clear what this replica remembers of it."""
        for status in snap.pools.values():
            self.exhausted.observe(status.pool, status.version, status.used)
        return snap

    def booking(self, held: Held, ref: EntryRef) -> Booking:
        """The booking behind a lease (``ref``: its entry's)."""
        shared = held.store_kind == "shared" or self.outage.moved(held.lease_id)
        if shared:
            held.store_kind = "shared"  # handed over: the shared store meters it from now on
            return Booking(held.lease_id, held.entry, ref, True)
        return Booking(held.lease_id, held.entry, self.outage.share(ref), False)

    def _store(self, booking: Booking) -> StateStore:
        return self.store if booking.shared else self.outage.store

    def commit(
        self, booking: Booking, sandbox_id: str, now: float, *, ttl: float | None = None
    ) -> asyncio.Future[bool | None]:
        """Turn the reservation into a live lease (for ``ttl``, default ``lease_ttl``):
        False when it was lost, None when the store failed (reported).

        Started before this returns, its answer a future (`router.state.posted`):
        the upkeep commits a new lease without a task.
        """
        settling = self._store(booking).settle(
            booking.ref,
            self._breaker,
            booking.lease_id,
            now,
            outcome=Outcome.SUCCESS,
            ttl=self._ctx.config.lease_ttl if ttl is None else ttl,
            sandbox_id=sandbox_id,
        )
        return then(settling, functools.partial(self._committed, booking, sandbox_id))

    def _committed(
        self, booking: Booking, sandbox_id: str, settling: asyncio.Future[Settlement]
    ) -> bool | None:
        try:
            settled = settling.result()
        except StateUnavailable as exc:
            self.report("commit", exc)
            return None
        if settled.transition:
            self.transition(booking.entry, settled.transition)
        if settled.applied and not booking.shared:
            self.outage.granted(booking.lease_id, booking.ref, sandbox_id, counted=booking.counted)
        return settled.applied

    async def settle_failure(
        self, booking: Booking, exc: BaseException, attempt: int, started: float
    ) -> None:
        """Refund a failed create's reservation and record the failure on the breaker."""
        outcome, until = self._verdict(exc)
        try:
            settled = await asyncio.shield(
                self._store(booking).settle(
                    booking.ref,
                    self._breaker,
                    booking.lease_id,
                    self._ctx.clock(),
                    outcome=outcome,
                    detail=str(exc)[:200],
                    until=until,
                )
            )
        except StateUnavailable as state_exc:
            # The reservation expires by itself (its hold); nothing is leaked.
            self.report("refund", state_exc)
            return
        if settled.applied:
            self._ctx.emit(Refund(booking.entry, booking.lease_id, classify(exc).reason))
        if settled.transition:
            self.transition(booking.entry, settled.transition)
        if not isinstance(exc, asyncio.CancelledError):
            self._create_failed(booking, exc, attempt, started)

    async def record_failure(
        self, booking: Booking, exc: BaseException, attempt: int, started: float
    ) -> None:
        """Record a failed create on the breaker but keep its reservation: the create
        is still running and may yet make a sandbox (see `Upkeep.abandon`)."""
        outcome, until = self._verdict(exc)
        try:
            transition = await asyncio.shield(
                self._store(booking).record(
                    booking.ref,
                    self._breaker,
                    outcome,
                    self._ctx.clock(),
                    detail=str(exc)[:200],
                    until=until,
                )
            )
        except StateUnavailable as state_exc:
            self.report("record", state_exc)
        else:
            if transition:
                self.transition(booking.entry, transition)
        self._create_failed(booking, exc, attempt, started)

    async def refund(self, booking: Booking, reason: str) -> None:
        """Give back a reservation whose create made nothing (the breaker already knows)."""
        try:
            settled = await self._store(booking).settle(
                booking.ref,
                self._breaker,
                booking.lease_id,
                self._ctx.clock(),
                outcome=Outcome.NEUTRAL,
            )
        except StateUnavailable as exc:
            self.report("refund", exc)
            return
        if settled.applied:
            self._ctx.emit(Refund(booking.entry, booking.lease_id, reason))

    def _verdict(self, exc: BaseException) -> tuple[Outcome, float | None]:
        """What a failure tells the breaker, and until when a block it sets lasts."""
        if isinstance(exc, asyncio.CancelledError):
            return Outcome.NEUTRAL, None
        if isinstance(exc, QuotaExceeded) and exc.reset_at is not None:
            return classify(exc).outcome, exc.reset_at.timestamp()
        if isinstance(exc, RateLimited) and exc.retry_after is not None:
            return classify(exc).outcome, self._ctx.clock() + exc.retry_after
        return classify(exc).outcome, None

    def _create_failed(
        self, booking: Booking, exc: BaseException, attempt: int, started: float
    ) -> None:
        emit(
            self._ctx.hooks,
            CreateFailed(
                entry=booking.entry,
                reason=classify(exc).reason,
                error=str(exc)[:300],
                attempt=attempt,
                latency=self._ctx.clock() - started,
            ),
        )

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

    async def charge(self, booking: Booking, sandbox_id: str, seconds: float) -> None:
        """Meter a late create's sandbox, which no lease ever held, for ``seconds``."""
        if not booking.shared:
            self.outage.granted(booking.lease_id, booking.ref, sandbox_id, counted=False)
            self.outage.released(booking.lease_id, seconds)
            return
        spend = Spend(booking.ref, sandbox_seconds=seconds)
        try:  # the lease id makes it one charge, however often it is sent
            await self.store.reconcile("late-" + booking.lease_id, [spend], self._ctx.clock())
        except StateUnavailable as exc:
            self.report("charge", exc)

    async def heartbeat(self, booking: Booking, ttl: float) -> bool | None:
        """Extend a live lease: False when it had expired, None when the store failed."""
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
            return self._observe(await self.store.snapshot(refs, self._ctx.clock()))
        except StateUnavailable as exc:
            self.on_state_error("snapshot", exc)
            return await self.outage.store.snapshot(refs, self._ctx.clock())

    async def snapshot(self, refs: list[EntryRef]) -> tuple[Snapshot, str | None]:
        """Usage and health for status, and the store's error when only the fallback answered."""
        now = self._ctx.clock()
        try:
            return self._observe(await self.store.snapshot(refs, now)), None
        except StateUnavailable as exc:
            local = await self.outage.store.snapshot([self.outage.share(r) for r in refs], now)
            return self.outage.usage(local), str(exc)

    async def bind(
        self, held: Held, ttl: float, *, paused: bool = False, kept: bool = False
    ) -> bool:
        """Bind the lease's sticky session to its sandbox for ``ttl`` seconds; ``kept``:
        only while the session still names that sandbox (False when it names another)."""
        assert held.session is not None
        now = self._ctx.clock()
        return await self.store.bind_session(
            held.session, held.entry, held.sandbox.id, now + ttl, now, paused=paused, kept=kept
        )

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

    def describe(self, r: Reservation) -> str:
        """Why a reservation was denied, for `NoProviderAvailable`'s message."""
        if r.reason == "quota":
            return f"quota exhausted: {r.unit} {_num(r.used)}/{_num(r.limit)} until {_iso(r.until)}"
        if r.reason == "open":
            return f"breaker open for {max(0.0, r.until - self._ctx.clock()):.0f}s"
        if r.reason == "half_open":
            return "breaker half-open: a probe is in flight"
        if r.reason == "misconfigured":
            return f"misconfigured (credentials refused: {r.detail}); fix the config"
        if r.reason == "exhausted":
            return f"provider quota exhausted until {_iso(r.until)}"
        if r.reason == "rate_limited":
            return f"rate limited for {max(0.0, r.until - self._ctx.clock()):.0f}s"
        if r.reason == "capacity":
            return "provider concurrency cap reached"
        return r.reason

    async def close(self) -> None:
        await self.outage.close(self.store)
        await self.store.close()


def _denial(known: Exhausted) -> Reservation:
    """The quota denial a remembered exhaustion stands for."""
    return Reservation(
        False,
        reason="quota",
        unit=known.unit,
        used=known.used,
        limit=known.limit,
        until=known.until,
        version=known.version,
    )


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).isoformat()


def _num(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:.1f}"
