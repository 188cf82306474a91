"""The acquire path: walk the chain, reserve, create with retries, fail over.

For each entry in the order the policy gives::

    skip if unconfigured / lacks a required capability
    reserve  (one atomic ledger call: breaker admission + every quota unit)
    create   (bounded by min(create_timeout, what is left of the deadline))
    commit   (off the caller's path, by lease upkeep), or refund and record the failure
    on a transient error: back off (full jitter) and try the same entry again;
    on anything else, or when attempts run out: fail over to the next entry.

An entry with ``hedge`` races a slow create against the next eligible
entry's (`router.hedge`); a pool known to be out of quota is denied by the
ledger without a round trip (`policies.exhausted`).

Nothing is lost on the way: a failed create refunds its reservation; a
create the acquire stops waiting for, or that failed unanswered, keeps its
reservation, and upkeep counts and kills the sandbox it may still make (the
provider bills it), found by its lease label when no answer names it.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import NoReturn

import tenacity

from policies import order
from policies.ordering import Candidate
from policies.outcome import classify
from policies.quota import Meter, remaining_fraction
from providers.base import (
    LABEL_ENTRY,
    LABEL_LEASE,
    LABEL_ROUTER,
    LABEL_SESSION,
    LABEL_WARM,
    SandboxSpec,
    check_positive,
)
from providers.capabilities import Capability
from providers.errors import (
    ArgumentTypeError,
    InvalidArgument,
    NoProviderAvailable,
    ProviderError,
    StateUnavailable,
    Unavailable,
)
from router.booking import Booking, Denied, describe
from router.context import Context
from router.entries import Entry
from router.events import Acquired, AcquireFailed, Created, Failover, emit
from router.hedge import Hedger, Leg, Runner, Spare
from router.lease import Held
from router.ledger import Ledger
from router.pause import PAUSE_KEY
from router.sessions import Claim, Sessions
from router.spans import AcquireSpan, AttemptSpan, Phase
from router.state import TenantRef
from router.upkeep import Upkeep
from router.waits import until_done
from router.warm import WarmPools

__all__ = ["Acquirer", "check_acquire"]


class Acquirer:
    """One acquire, start to end: sessions first, then the chain with retries and failover."""

    def __init__(
        self,
        ledger: Ledger,
        upkeep: Upkeep,
        sessions: Sessions,
        ctx: Context,
        sleep: Callable[[float], Awaitable[None]],
        warm: WarmPools,
    ) -> None:
        self._ctx = ctx
        self._warm = warm
        self._ledger = ledger
        self._upkeep = upkeep
        self._sessions = sessions
        self._sleep = sleep
        self._retry = ctx.config.retry.policy()
        self._hedger = Hedger(ctx)
        # Only a pool with a concurrency limit can turn a session's resume away for a
        # slot this router is still freeing, so only its frees hold a resume back (a
        # create waits for them only when refused, see `book`).
        self._slot_pools = {
            e.ref.pool for e in ctx.entries.values() if e.ref.limits.concurrent is not None
        }

    async def acquire(
        self,
        spec: SandboxSpec | None,
        requires: Iterable[str],
        labels: Mapping[str, str] | None,
        session: str | None,
        timeout: float | None,
        tenant: str | None = None,
    ) -> Held:
        requires = tuple(requires)
        with self._ctx.spans(AcquireSpan(requires, session=session is not None)):
            return await self._acquire(
                spec, requires, labels, session, timeout, self._ledger.tenants.ref(tenant)
            )

    async def _acquire(
        self,
        spec: SandboxSpec | None,
        requires: tuple[str, ...],
        labels: Mapping[str, str] | None,
        session: str | None,
        timeout: float | None,
        tenant: TenantRef | None,
    ) -> Held:
        started = self._ctx.clock()
        deadline = started + (timeout if timeout is not None else self._ctx.config.acquire_timeout)
        spec = spec or SandboxSpec()
        await self._ledger.check()
        self._warm.start()
        if session is None:
            return await self._serve(spec, requires, labels, None, started, deadline, tenant)
        await self._upkeep.caught_up(self._slot_pools)
        claim = await self._sessions.claim(session, deadline)  # one holder at a time
        try:
            return await self._serve(spec, requires, labels, claim, started, deadline, tenant)
        finally:
            self._sessions.let_go(claim)  # unless a lease took it

    async def _serve(
        self,
        spec: SandboxSpec,
        requires: tuple[str, ...],
        labels: Mapping[str, str] | None,
        claim: Claim | None,
        started: float,
        deadline: float,
        tenant: TenantRef | None,
    ) -> Held:
        """The claimed session's sandbox, else a new one from the chain."""
        if claim is not None:
            resumed = await self._sessions.resume(claim, requires, deadline, tenant)
            if resumed is not None:
                resumed.spec = spec
                self._acquired(resumed, 0, started, resumed=True)
                return resumed
            labels = {**(labels or {}), LABEL_SESSION: claim.session}
        names, reasons = order(await self._candidates(spec), self._ctx.config.strategy, requires)
        failed: list[str] = []
        spare = Spare(names)
        for i, name in enumerate(names):
            entry = self._ctx.entries[name]
            spare.at = i
            if (known := self._ledger.known_exhausted(entry)) is not None:
                reasons[name] = known
                continue
            try:
                held = await self._try_entry(entry, spec, labels, deadline, spare, tenant)
            except Denied as denied:
                reasons[name] = describe(denied.reservation, self._ctx.clock())
                if _whole_tenant(denied):  # no other entry can serve it either
                    rest = names[i + 1 :]
                    reasons.update({n: f"not tried: {reasons[name]}" for n in rest})
                    break
                continue
            except StateUnavailable:
                raise
            except Exception as exc:
                verdict = classify(exc)
                if not verdict.fail_over:
                    raise
                reasons[name] = f"{verdict.reason}: {exc}"
                failed.append(name)
                emit(
                    self._ctx.hooks,
                    Failover(
                        from_entry=name,
                        to_entry=names[i + 1] if i + 1 < len(names) else "none",
                        reason=verdict.reason,
                    ),
                )
                if self._ctx.clock() >= deadline:
                    reasons.update(
                        {n: "not tried: acquire deadline passed" for n in names[i + 1 :]}
                    )
                    break
                continue
            held.failovers = failed
            held.spec = spec
            if claim is not None:
                try:
                    await self._sessions.bind(held, claim)
                except BaseException:  # cancelled, or the store is gone: nobody holds it
                    self._upkeep.spawn(self._upkeep.release(held))
                    raise
            self._acquired(held, len(failed), started)
            return held
        ordered = {e: reasons[e] for e in self._ctx.entries if e in reasons}
        self._ctx.emit(AcquireFailed(reasons=ordered, latency=self._ctx.clock() - started))
        raise NoProviderAvailable(ordered)

    def _acquired(
        self, held: Held, failovers: int, started: float, *, resumed: bool = False
    ) -> None:
        emit(
            self._ctx.hooks,
            Acquired(
                entry=held.entry,
                lease_id=held.lease_id,
                sandbox_id=held.sandbox.id,
                attempts=held.attempts,
                failovers=failovers,
                resumed=resumed,
                latency=self._ctx.clock() - started,
            ),
        )

    async def _candidates(self, spec: SandboxSpec) -> list[Candidate]:
        fractions: dict[str, float] = {}
        strategy = self._ctx.config.strategy
        if strategy == "balanced":
            snap = await self._ledger.usage([e.ref for e in self._ctx.entries.values()])
            for e in self._ctx.entries.values():
                used = snap.pools[e.ref.pool].committed()
                fractions[e.name] = remaining_fraction(used, e.ref.limits)
        return [
            Candidate(
                e.name,
                e.unusable(),
                e.capabilities,
                fractions.get(e.name, 1.0),
                e.estimate(spec) if strategy == "cheapest" else 0.0,
            )
            for e in self._ctx.entries.values()
        ]

    async def _try_entry(
        self,
        entry: Entry,
        spec: SandboxSpec,
        labels: Mapping[str, str] | None,
        deadline: float,
        spare: Spare,
        tenant: TenantRef | None,
    ) -> Held:
        try:
            return await self._attempt(entry, spec, labels, deadline, 1, spare, tenant)
        except Exception as exc:
            if not classify(exc).retry_same or self._retry.attempts == 1:
                raise
            first: Exception | None = exc
        # Only a failure pays for tenacity (~50 us a loop); it is handed the first
        # attempt's error as its own attempt 1, so it waits and stops as if it ran it.
        retrying = tenacity.AsyncRetrying(
            stop=self._retry.stop(deadline, self._ctx.clock),
            wait=self._retry.wait(),
            retry=tenacity.retry_if_exception(lambda e: classify(e).retry_same),
            sleep=self._sleep,
            reraise=True,
        )
        attempt_no = 1
        async for attempt in retrying:
            with attempt:
                if first is not None:
                    error, first = first, None
                    raise error
                attempt_no += 1
                return await self._attempt(entry, spec, labels, deadline, attempt_no, spare, tenant)
        raise AssertionError("unreachable: tenacity reraises the last error")  # pragma: no cover

    async def _attempt(
        self,
        entry: Entry,
        spec: SandboxSpec,
        labels: Mapping[str, str] | None,
        deadline: float,
        attempt: int,
        spare: Spare,
        tenant: TenantRef | None,
    ) -> Held:
        warm = self._warm.fits(entry, spec, labels or {})
        meter = entry.meter(spec)
        booking = await self._book(entry, deadline, attempt, warm, meter, tenant)
        while booking.claimed is not None:  # each claim that fails drops its sandbox
            with self._ctx.spans(AttemptSpan("warm_claim", entry.name, attempt)):
                held = await self._warm.claim(entry, booking, attempt)
            if held is not None:
                return held
            booking = await self._book(entry, deadline, attempt, True, meter, tenant)
        if warm:
            self._warm.missed(entry)
        legs = _Legs(
            self._ctx, self._upkeep, self._ledger, self._hedger, spec, labels, deadline, tenant
        )
        leg = legs.launch(entry, booking, attempt)
        delay = self._hedger.delay(entry, spare)
        if delay is not None and delay < leg.booking.budget:
            return await self._hedger.race(leg, delay, spare, legs)
        # The create runs as a task of its own: when the deadline passes or the caller
        # cancels, it is handed to upkeep (which counts and kills what it may yet
        # make) instead of being cut off while the provider goes on making it.
        try:
            await until_done(leg.create, leg.booking.budget)
        except asyncio.CancelledError:
            legs.abandon(leg)
            raise
        if not leg.create.done():
            await legs.timed_out(leg)
        return await legs.land(leg)

    async def _book(
        self,
        entry: Entry,
        deadline: float,
        attempt: int,
        warm: bool,
        meter: Meter | None,
        tenant: TenantRef | None,
    ) -> Booking:
        with self._ctx.spans(AttemptSpan("reserve", entry.name, attempt)):
            return await self._upkeep.book(entry, deadline, warm=warm, meter=meter, tenant=tenant)


class _Legs(Runner):
    """The creates of one attempt (and of its hedge): start, land, time out, abandon."""

    def __init__(
        self,
        ctx: Context,
        upkeep: Upkeep,
        ledger: Ledger,
        hedger: Hedger,
        spec: SandboxSpec,
        labels: Mapping[str, str] | None,
        deadline: float,
        tenant: TenantRef | None,
    ) -> None:
        self._ctx, self._upkeep, self._ledger, self._hedger = ctx, upkeep, ledger, hedger
        self._spec = spec
        self._labels = labels
        self._deadline = deadline
        self._tenant = tenant

    def launch(self, entry: Entry, booking: Booking, attempt: int, phase: Phase = "create") -> Leg:
        labels = {
            **(self._labels or {}),
            LABEL_ROUTER: self._ctx.config.key_prefix,
            LABEL_ENTRY: entry.name,
            LABEL_LEASE: booking.lease_id,
        }
        spec = entry.create_spec(self._spec, labels)  # one copy: each one validates
        span = AttemptSpan(phase, entry.name, attempt)
        wrap = functools.partial(self._ctx.spans.wrap, span)
        create = self._upkeep.late.create(entry, spec, booking.budget, wrap)
        ends = asyncio.get_running_loop().time() + booking.budget
        return Leg(entry, booking, create, self._ctx.clock(), attempt, ends)

    async def spare(self, spare: Spare) -> Leg | None:
        for name in spare.after():
            entry = self._ctx.entries[name]
            try:
                with self._ctx.spans(AttemptSpan("reserve", entry.name, 1)):
                    booking = await self._upkeep.book(
                        entry, self._deadline, meter=entry.meter(self._spec), tenant=self._tenant
                    )
            except (Denied, StateUnavailable):
                continue
            spare.used = True
            return self.launch(entry, booking, 1, "hedge")
        return None

    async def timed_out(self, leg: Leg) -> NoReturn:
        budget, entry = leg.booking.budget, leg.entry
        timeout = Unavailable(f"create timed out after {budget:.1f}s", provider=entry.name)
        await self._ledger.record_failure(leg.booking, timeout, leg.attempt, leg.started)
        self.abandon(leg)
        raise timeout

    def abandon(self, leg: Leg) -> None:
        self._upkeep.late.abandon(leg.create, leg.booking, leg.entry)

    async def land(self, leg: Leg) -> Held:
        entry, booking = leg.entry, leg.booking
        try:
            sandbox = leg.create.result()
        except BaseException as exc:
            await self._upkeep.late.failed(
                leg.create, booking, entry, exc, leg.attempt, leg.started
            )
            if isinstance(exc, TimeoutError):
                raise Unavailable(
                    f"create timed out after {booking.budget:.1f}s", provider=entry.name
                ) from exc
            if isinstance(exc, ProviderError):
                exc.attempt = leg.attempt
                exc.provider = exc.provider or entry.name
            raise
        latency = self._ctx.clock() - leg.started
        self._hedger.sketch(entry.name).add(latency)
        self._ctx.emit(Created(entry=entry.name, latency=latency))
        held = booking.held(entry.provider.kind, sandbox, self._ctx.clock(), leg.attempt)
        self._upkeep.start(held, booking)
        return held


def _whole_tenant(denied: Denied) -> bool:
    """A tenant out of sessions or concurrent leases is out on every entry (its usd hold
    depends on the entry's price: a cheaper one may fit)."""
    r = denied.reservation
    return r.reason == "tenant" and r.unit != "usd"


_RESERVED_LABELS = frozenset({LABEL_ROUTER, LABEL_ENTRY, LABEL_LEASE, LABEL_SESSION, LABEL_WARM})


def check_acquire(
    spec: object,
    requires: Iterable[str],
    labels: Mapping[str, str] | None,
    session: str | None,
    timeout: float | None,
) -> tuple[str, ...]:
    """Reject bad arguments before anything is reserved, naming the argument."""
    if spec is not None and not isinstance(spec, SandboxSpec):
        raise ArgumentTypeError(
            f"acquire(spec=...): expected a SandboxSpec, got {type(spec).__name__}"
        )
    if isinstance(requires, str):
        named = str(requires)  # a Capability is a str too: its value, not its repr
        raise ArgumentTypeError(
            f"acquire(requires={named!r}): give a sequence of capabilities, "
            f"e.g. requires=({named!r},)"
        )
    needed = tuple(requires)
    for cap in needed:
        if not isinstance(cap, str) or not cap:
            raise ArgumentTypeError(
                f"acquire(requires=...): capabilities are non-empty strings, got {cap!r}"
            )
    for key, value in (labels or {}).items():
        if not isinstance(key, str) or not isinstance(value, str):
            raise ArgumentTypeError(
                f"acquire(labels=...): keys and values are strings, got {key!r}: {value!r}"
            )
        if key in _RESERVED_LABELS:
            raise InvalidArgument(f"acquire(labels=...): {key!r} is set by the router itself")
    if session is not None and (not isinstance(session, str) or not session.strip()):
        raise InvalidArgument(f"acquire(session={session!r}): a session key is a non-empty string")
    if session is not None and session.startswith(PAUSE_KEY):
        raise InvalidArgument(f"acquire(session=...): {PAUSE_KEY!r} keys are the pause tokens'")
    check_positive(timeout, "acquire", "timeout", optional=True)
    if spec is not None and spec.gpu and Capability.GPU not in needed:
        needed += (Capability.GPU,)  # an entry that ignores the gpu must not take the spec
    return needed
