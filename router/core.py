"""The Router: walk the chain, reserve, create with retries, fail over.

One async implementation (`Router._acquire`) serves both APIs: ``acquire``
runs it on the router's engine loop and waits, ``aacquire`` awaits it there
(see ``router.engine``). The decisions themselves are the pure policies:
ordering, the breaker (applied atomically by the state store), the error
verdicts and the tenacity backoff.

An acquire, for each entry in order::

    skip if unconfigured / lacks a required capability
    reserve  (one atomic store call: breaker admission + every quota unit)
    create   (bounded by min(create_timeout, what is left of the deadline))
    settle   (commit the lease, or refund and record the failure)
    on a transient error: back off (full jitter) and try the same entry again;
    on anything else, or when attempts run out: fail over to the next entry.

Nothing is lost on the way: a failed create refunds its reservation; a
sandbox created but not committed (the store failed, the caller cancelled)
is killed before the error propagates.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import structlog
import tenacity

from policies import order
from policies.breaker import Outcome
from policies.ordering import Candidate
from policies.outcome import classify
from policies.quota import UNITS, Limits, projected_exhaustion, remaining_fraction
from providers import missing_sdk, provider_class
from providers.base import (
    LABEL_ENTRY,
    LABEL_LEASE,
    LABEL_ROUTER,
    LABEL_SESSION,
    Provider,
    Sandbox,
    SandboxSpec,
)
from providers.errors import (
    NoProviderAvailable,
    ProviderError,
    QuotaExceeded,
    RateLimited,
    StateUnavailable,
    Unavailable,
)
from router import config as config_mod
from router.config import EntryConfig, RouterConfig
from router.engine import Engine
from router.events import Hook, emit, log_hook
from router.lease import AsyncLease, Held, Lease
from router.logs import configure_logging
from router.state import EntryRef, Reservation, StateStore, open_store
from router.state.base import SessionBinding
from router.state.memory import MemoryStore

__all__ = ["EntryView", "ReapReport", "Router", "RouterStatus"]

_RESERVE_GRACE = 30.0  # a reservation outlives its create by this much before it expires
_JANITOR_LOCK_TTL = 300.0


@dataclass(frozen=True, slots=True)
class _Entry:
    cfg: EntryConfig
    provider: Provider
    ref: EntryRef
    missing_sdk: str | None  # looked up once: a find_spec costs ~50 us per call

    @property
    def name(self) -> str:
        return self.cfg.name

    def unusable(self) -> str | None:
        """Why the entry cannot serve here (no SDK, no credentials), or None."""
        return self.missing_sdk or self.provider.unconfigured_reason()

    @property
    def capabilities(self) -> frozenset[str]:
        """The config's override, else what the provider declares."""
        if self.cfg.capabilities is not None:
            return frozenset(self.cfg.capabilities)
        return self.provider.capabilities


@dataclass(frozen=True, slots=True)
class EntryView:
    """One entry in `Router.status`.

    Attributes:
        state: ``closed``, ``open``, ``half_open``, or a block:
            ``misconfigured``, ``exhausted``, ``rate_limited``, ``capacity``;
            ``unconfigured`` when credentials are missing.
        until: when an open breaker or a block ends (None when it does not).
        used / limits: per unit, for the entry's pool.
        reset_at: when the pool's window resets.
        exhausted_at: when each limited unit runs out at this window's
            average rate so far (only units with usage).
    """

    name: str
    provider: str
    pool: str
    configured: bool
    unconfigured_reason: str | None
    state: str
    until: datetime | None
    detail: str
    used: dict[str, float]
    limits: dict[str, float | None]
    reset_at: datetime
    live_leases: int
    exhausted_at: dict[str, datetime]


@dataclass(frozen=True, slots=True)
class RouterStatus:
    entries: list[EntryView]
    state_url: str
    state_ok: bool
    state_error: str | None
    on_state_error: str


@dataclass(slots=True)
class ReapReport:
    """What `Router.reap` did: sandboxes killed, kept (leased or bound), entries skipped."""

    killed: list[tuple[str, str]] = field(default_factory=list)
    kept: int = 0
    skipped: dict[str, str] = field(default_factory=dict)


class _Denied(Exception):
    def __init__(self, reservation: Reservation) -> None:
        super().__init__(reservation.reason)
        self.reservation = reservation


class Router:
    """Hands out live sandboxes from the first entry of the chain that can serve.

    Build it with `Router.from_env` or `Router.from_config`; the constructor
    is for tests and embedding (``providers`` overrides the adapters built
    from the config, by entry name; ``clock`` and ``sleep`` replace time).
    """

    def __init__(
        self,
        config: RouterConfig,
        *,
        providers: Mapping[str, Provider] | None = None,
        store: StateStore | None = None,
        hooks: Sequence[Hook] = (log_hook,),
        clock: Callable[[], float] = time.time,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self.config = config
        self.hooks = list(hooks)
        if not structlog.is_configured():
            # An app that set structlog up keeps its setup; otherwise the config's
            # `log:` settings apply (stderr, JSON unless on a TTY, info and up).
            configure_logging(config.log.format, config.log.level)
        self._clock = clock
        self._sleep = sleep
        self._breaker = config.breaker_policy()
        self._retry = config.retry.policy()
        self._engine = Engine()
        self._store = store or open_store(config.resolved_state_url(), config.key_prefix)
        self._fallback = MemoryStore("memory://fail-open", config.key_prefix)
        self._state_error: str | None = None
        self._live: dict[str, Held] = {}
        self._sweeper: asyncio.Task[None] | None = None
        self._background: set[asyncio.Task[None]] = set()
        self._freeing: dict[str, set[asyncio.Task[None]]] = {}  # pool -> slots being freed
        self._checked_store = False
        overrides = dict(providers or {})
        self._entries: dict[str, _Entry] = {}
        for entry in config.chain:
            if not entry.enabled:
                continue
            provider = overrides.pop(entry.name, None) or provider_class(entry.provider)(
                entry.name, entry.provider_options()
            )
            ref = EntryRef(
                entry.name,
                entry.pool,
                config.pool_quota(entry).limits(),
                config.window(entry),
                entry.fingerprint(),
            )
            self._entries[entry.name] = _Entry(entry, provider, ref, missing_sdk(entry.provider))
        if overrides:
            raise ValueError(f"providers given for entries not in the chain: {sorted(overrides)}")
        # Only a pool with a concurrency limit can turn an acquire away for a slot
        # this router is still freeing, so only its frees hold acquire back.
        self._slot_pools = {
            e.ref.pool for e in self._entries.values() if e.ref.limits.concurrent is not None
        }

    # -- construction ----------------------------------------------------------
    @classmethod
    def from_config(cls, source: str | Path | Mapping[str, Any], **kwargs: Any) -> Router:
        """A router from a YAML file path or a config mapping (validated)."""
        return cls(config_mod.load_config(source), **kwargs)

    @classmethod
    def from_env(cls, **kwargs: Any) -> Router:
        """A router from ``SANDBOX_ROUTER_CONFIG`` or the default chain (see README)."""
        return cls(config_mod.from_env(), **kwargs)

    @property
    def store(self) -> StateStore:
        return self._store

    @property
    def entries(self) -> list[str]:
        return list(self._entries)

    def provider(self, entry: str) -> Provider:
        return self._entries[entry].provider

    # -- public API --------------------------------------------------------------
    def acquire(
        self,
        spec: SandboxSpec | None = None,
        *,
        requires: Iterable[str] = (),
        labels: Mapping[str, str] | None = None,
        session: str | None = None,
        timeout: float | None = None,
    ) -> Lease:
        """A live sandbox from the first entry that can serve.

        Args:
            spec: what to create (template, env, resources...).
            requires: capabilities the entry must declare, e.g. ``("gpu",)``.
            labels: extra labels put on the sandbox.
            session: a sticky session key: the same key gets the same live
                sandbox back (any replica, same entry) until the session's
                idle TTL passes or `close_session` is called; if that sandbox
                is gone a new one is bound and ``lease.resumed`` is False.
            timeout: the overall deadline in seconds (default ``acquire_timeout``).

        Raises:
            NoProviderAvailable: every entry was skipped or failed; the message
                lists each entry and why.
            StateUnavailable: the state store is down and ``on_state_error``
                is ``fail_closed``.
            SandboxError: the provider refused the spec itself (not retried).
        """
        requires = _check_acquire(spec, requires, labels, session, timeout)
        held = self._engine.run(self._acquire(spec, requires, labels, session, timeout))
        return Lease(held, self._engine, self._release)

    async def aacquire(
        self,
        spec: SandboxSpec | None = None,
        *,
        requires: Iterable[str] = (),
        labels: Mapping[str, str] | None = None,
        session: str | None = None,
        timeout: float | None = None,
    ) -> AsyncLease:
        """The async twin of `acquire` (same logic, same arguments)."""
        requires = _check_acquire(spec, requires, labels, session, timeout)
        held = await self._engine.arun(self._acquire(spec, requires, labels, session, timeout))
        return AsyncLease(held, self._engine, self._release)

    def status(self) -> RouterStatus:
        """Per entry: configured, breaker state, quota used/limit, reset, live leases."""
        return self._engine.run(self._status())

    async def astatus(self) -> RouterStatus:
        return await self._engine.arun(self._status())

    def close_session(self, session: str) -> bool:
        """Kill a sticky session's sandbox and forget it; False when it had none."""
        return self._engine.run(self._close_session(session))

    async def aclose_session(self, session: str) -> bool:
        return await self._engine.arun(self._close_session(session))

    def reap(self) -> ReapReport:
        """Kill this router's sandboxes that no live lease or session holds.

        Lists each configured entry's sandboxes carrying this router's labels
        (never anyone else's) under a fleet-wide lock per entry, so several
        replicas may run it at once. Apps schedule it; ``sandbox-router
        janitor`` runs it once.
        """
        return self._engine.run(self._reap())

    async def areap(self) -> ReapReport:
        return await self._engine.arun(self._reap())

    def set_usage(self, pool: str, unit: str, value: float) -> None:
        """Overwrite a pool's used amount this window (``sandbox-router quota set``)."""
        self._engine.run(self._set_usage(pool, unit, value))

    def close(self) -> None:
        """Release SDK clients and store connections, stop the engine loop."""
        with contextlib.suppress(RuntimeError):
            self._engine.run(self._aclose())
        self._engine.close()

    async def aclose(self) -> None:
        await self._engine.arun(self._aclose())
        self._engine.close()

    def __enter__(self) -> Router:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    async def __aenter__(self) -> Router:
        """Run the router on the caller's event loop (no thread, no hand-offs).

        Only before its first call; a router already running on its own
        thread stays there. Sync calls from other threads still work while
        this loop runs.
        """
        self._engine.adopt(asyncio.get_running_loop())
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def __repr__(self) -> str:
        return f"<Router entries={list(self._entries)} store={self._store!r}>"

    # -- the one implementation ------------------------------------------------
    async def _acquire(
        self,
        spec: SandboxSpec | None,
        requires: Iterable[str],
        labels: Mapping[str, str] | None,
        session: str | None,
        timeout: float | None,
    ) -> Held:
        started = self._clock()
        deadline = started + (timeout if timeout is not None else self.config.acquire_timeout)
        spec = spec or SandboxSpec()
        requires = tuple(requires)
        if not self._checked_store:
            await self._check_store()
        await self._caught_up(self._slot_pools)
        if session is not None:
            resumed = await self._resume(session, requires, deadline)
            if resumed is not None:
                emit(
                    self.hooks,
                    "acquired",
                    entry=resumed.entry,
                    lease_id=resumed.lease_id,
                    sandbox_id=resumed.sandbox.id,
                    attempts=1,
                    failovers=0,
                    resumed=True,
                    latency=self._clock() - started,
                )
                return resumed
            labels = {**(labels or {}), LABEL_SESSION: session}
        names, reasons = order(await self._candidates(), self.config.strategy, requires)
        failed: list[str] = []
        for i, name in enumerate(names):
            entry = self._entries[name]
            try:
                held = await self._try_entry(entry, spec, labels, deadline)
            except _Denied as denied:
                reasons[name] = self._describe(denied.reservation)
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
                    self.hooks,
                    "failover",
                    from_entry=name,
                    to_entry=names[i + 1] if i + 1 < len(names) else "none",
                    reason=verdict.reason,
                )
                if self._clock() >= deadline:
                    reasons.update(
                        {n: "not tried: acquire deadline passed" for n in names[i + 1 :]}
                    )
                    break
                continue
            held.failovers = failed
            if session is not None:
                held.session = session
                await self._bind(held, self.config.lease_ttl)
            emit(
                self.hooks,
                "acquired",
                entry=name,
                lease_id=held.lease_id,
                sandbox_id=held.sandbox.id,
                attempts=held.attempts,
                failovers=len(failed),
                latency=self._clock() - started,
            )
            return held
        ordered = {e: reasons[e] for e in self._entries if e in reasons}
        emit(self.hooks, "acquire_failed", reasons=ordered, latency=self._clock() - started)
        raise NoProviderAvailable(ordered)

    async def _candidates(self) -> list[Candidate]:
        fractions: dict[str, float] = {}
        if self.config.strategy == "balanced":
            refs = [e.ref for e in self._entries.values()]
            snap = await self._store_call("snapshot", lambda s: s.snapshot(refs, self._clock()))
            for e in self._entries.values():
                fractions[e.name] = remaining_fraction(snap.pools[e.ref.pool].used, e.ref.limits)
        return [
            Candidate(
                e.name,
                e.unusable(),
                e.capabilities,
                fractions.get(e.name, 1.0),
            )
            for e in self._entries.values()
        ]

    async def _try_entry(
        self,
        entry: _Entry,
        spec: SandboxSpec,
        labels: Mapping[str, str] | None,
        deadline: float,
    ) -> Held:
        try:
            return await self._attempt(entry, spec, labels, deadline, 1)
        except Exception as exc:
            if not classify(exc).retry_same or self._retry.attempts == 1:
                raise
            first: Exception | None = exc
        # Only a failure pays for tenacity (~50 us a loop); it is handed the first
        # attempt's error as its own attempt 1, so it waits and stops as if it ran it.
        retrying = tenacity.AsyncRetrying(
            stop=self._retry.stop(deadline, self._clock),
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
                return await self._attempt(entry, spec, labels, deadline, attempt_no)
        raise AssertionError("unreachable: tenacity reraises the last error")  # pragma: no cover

    async def _attempt(
        self,
        entry: _Entry,
        spec: SandboxSpec,
        labels: Mapping[str, str] | None,
        deadline: float,
        attempt: int,
    ) -> Held:
        lease_id = "l-" + secrets.token_hex(8)
        budget = max(0.0, min(self.config.create_timeout, deadline - self._clock()))
        store, ref = await self._reserve(entry, lease_id, budget + _RESERVE_GRACE)
        if entry.provider.kind != "local" or entry.cfg.template:
            spec = replace(spec, template=spec.template or entry.cfg.template)
        spec = spec.with_labels(
            {
                **(labels or {}),
                LABEL_ROUTER: self.config.key_prefix,
                LABEL_ENTRY: entry.name,
                LABEL_LEASE: lease_id,
            }
        )
        created_at = self._clock()
        try:
            async with asyncio.timeout(budget + 1.0):
                sandbox = await entry.provider.create(spec, timeout=budget)
        except BaseException as exc:
            await self._settle_failure(store, entry, ref, lease_id, exc, attempt, created_at)
            if isinstance(exc, TimeoutError):
                raise Unavailable(
                    f"create timed out after {budget:.1f}s", provider=entry.name
                ) from exc
            if isinstance(exc, ProviderError):
                exc.attempt = attempt
                exc.provider = exc.provider or entry.name
            raise
        emit(self.hooks, "created", entry=entry.name, latency=self._clock() - created_at)
        held = Held(
            lease_id,
            entry.name,
            entry.provider.kind,
            sandbox,
            self._clock(),
            attempt,
            store_kind="shared" if store is self._store else "fallback",
        )
        held.committing = self._spawn(self._commit(store, ref, held))
        self._keep(held)
        return held

    async def _commit(self, store: StateStore, ref: EntryRef, held: Held) -> None:
        """Turn the reservation into a live lease while the caller already uses the sandbox.

        The reservation holds every unit the lease needs, and it outlives the
        create by _RESERVE_GRACE, so the commit is off the caller's path (one
        round trip less per acquire). Only lost state (Redis flushed or
        unreachable) makes it fail, and that is told as a heartbeat that
        finds its lease gone is told. Heartbeats and the release wait for it.
        """
        try:
            settled = await store.settle(
                ref,
                self._breaker,
                held.lease_id,
                held.acquired_at,
                outcome=Outcome.SUCCESS,
                ttl=self.config.lease_ttl,
                sandbox_id=held.sandbox.id,
            )
        except StateUnavailable as exc:
            self._report_state_error("commit", exc)
            return
        if settled.transition:
            self._emit_transition(held.entry, settled.transition)
        if not settled.applied:
            self._live.pop(held.lease_id, None)
            emit(self.hooks, "lease_lost", entry=held.entry, lease_id=held.lease_id)

    async def _reserve(
        self, entry: _Entry, lease_id: str, hold: float, *, new_session: bool = True
    ) -> tuple[StateStore, EntryRef]:
        now = self._clock()
        try:
            reservation = await self._store.reserve(
                entry.ref, self._breaker, lease_id, now, hold, new_session=new_session
            )
            store, ref = self._store, entry.ref
            self._state_error = None
        except StateUnavailable as exc:
            self._on_state_error("reserve", exc)
            ref = self._fallback_ref(entry.ref)
            store = self._fallback
            reservation = await store.reserve(
                ref, self._breaker, lease_id, now, hold, new_session=new_session
            )
        if reservation.transition:
            self._emit_transition(entry.name, reservation.transition)
        if not reservation.granted:
            raise _Denied(reservation)
        return store, ref

    def _fallback_ref(self, ref: EntryRef) -> EntryRef:
        share = self.config.fail_open_share

        def part(limit: float | None) -> int | None:
            return None if limit is None else int(limit * share)

        limits = Limits(
            part(ref.limits.sessions),
            part(ref.limits.sandbox_seconds),
            part(ref.limits.concurrent),
        )
        return replace(ref, limits=limits)

    def _report_state_error(self, operation: str, exc: Exception) -> None:
        emit(
            self.hooks,
            "state_error",
            operation=operation,
            error=str(exc),
            mode=self.config.on_state_error,
        )

    def _on_state_error(self, operation: str, exc: StateUnavailable) -> None:
        """Record it; raise it under fail_closed (the caller falls back under fail_open)."""
        self._state_error = str(exc)
        self._report_state_error(operation, exc)
        if self.config.on_state_error == "fail_closed":
            raise exc

    async def _settle_failure(
        self,
        store: StateStore,
        entry: _Entry,
        ref: EntryRef,
        lease_id: str,
        exc: BaseException,
        attempt: int,
        started: float,
    ) -> None:
        verdict = classify(exc)
        outcome = Outcome.NEUTRAL if isinstance(exc, asyncio.CancelledError) else verdict.outcome
        until = None
        if isinstance(exc, QuotaExceeded) and exc.reset_at is not None:
            until = exc.reset_at.timestamp()
        elif isinstance(exc, RateLimited) and exc.retry_after is not None:
            until = self._clock() + exc.retry_after
        try:
            settled = await asyncio.shield(
                store.settle(
                    ref,
                    self._breaker,
                    lease_id,
                    self._clock(),
                    outcome=outcome,
                    detail=str(exc)[:200],
                    until=until,
                )
            )
        except StateUnavailable as state_exc:
            # The reservation expires by itself (its hold); nothing is leaked.
            self._report_state_error("refund", state_exc)
            return
        if settled.applied:
            emit(self.hooks, "refund", entry=entry.name, lease_id=lease_id, reason=verdict.reason)
        if settled.transition:
            self._emit_transition(entry.name, settled.transition)
        if not isinstance(exc, asyncio.CancelledError):
            emit(
                self.hooks,
                "create_failed",
                entry=entry.name,
                reason=verdict.reason,
                error=str(exc)[:300],
                attempt=attempt,
                latency=self._clock() - started,
            )

    def _emit_transition(self, entry: str, transition: tuple[str, str]) -> None:
        emit(self.hooks, "breaker", entry=entry, from_state=transition[0], to_state=transition[1])

    async def _kill(self, entry: _Entry, sandbox: Sandbox) -> None:
        """Kill; a failure is an event (the janitor gets it later), not the caller's error."""
        try:
            await sandbox.kill()
        except Exception as exc:
            emit(self.hooks, "kill_failed", entry=entry.name, sandbox_id=sandbox.id, error=str(exc))

    def _keep(self, held: Held) -> None:
        """Heartbeat ``held`` until it is released (one sweeper task for all leases)."""
        self._live[held.lease_id] = held
        if self._sweeper is None or self._sweeper.done():
            self._sweeper = asyncio.create_task(self._sweep())

    async def _sweep(self) -> None:
        """Every lease_ttl / 3, renew every live lease; ends when it finds none."""
        while True:
            await asyncio.sleep(self.config.lease_ttl / 3)
            if not self._live:
                return
            renewals = [self._heartbeat(h) for h in list(self._live.values())]
            for outcome in await asyncio.gather(*renewals, return_exceptions=True):
                if isinstance(outcome, Exception):  # one lease's bad luck stops no other
                    self._report_state_error("heartbeat", outcome)

    async def _ledger(self, held: Held) -> tuple[StateStore, EntryRef]:
        """The store and pool holding ``held``'s lease, once its commit has landed
        (a heartbeat or a release never overtakes the commit)."""
        if held.committing is not None:
            await held.committing
        ref = self._entries[held.entry].ref
        if held.store_kind == "shared":
            return self._store, ref
        return self._fallback, self._fallback_ref(ref)

    async def _heartbeat(self, held: Held) -> None:
        ttl = self.config.lease_ttl
        store, ref = await self._ledger(held)
        try:
            alive = await store.heartbeat(ref, held.lease_id, self._clock(), ttl)
        except StateUnavailable as exc:
            self._report_state_error("heartbeat", exc)
            return
        if held.released:
            return
        if not alive:
            self._live.pop(held.lease_id, None)
            emit(self.hooks, "lease_lost", entry=held.entry, lease_id=held.lease_id)
            return
        if held.session is not None:
            with contextlib.suppress(StateUnavailable):
                await self._bind(held, ttl)
        with contextlib.suppress(ProviderError):
            await held.sandbox.keepalive(ttl * 2)

    async def _bind(self, held: Held, ttl: float) -> None:
        assert held.session is not None
        now = self._clock()
        await self._store.bind_session(held.session, held.entry, held.sandbox.id, now + ttl, now)

    async def _resume(
        self, session: str, requires: tuple[str, ...], deadline: float
    ) -> Held | None:
        """Reconnect to the session's bound sandbox, or None (and say why) to create anew."""
        try:
            binding = await self._store.session(session, self._clock())
        except StateUnavailable as exc:
            self._on_state_error("session", exc)
            return None
        if binding is None:
            return None
        entry = self._entries.get(binding.entry)
        why = None
        if entry is None:
            why = f"entry {binding.entry!r} is no longer in the chain"
        elif (reason := entry.unusable()) is not None:
            why = f"entry {binding.entry!r} is not configured: {reason}"
        elif not set(requires) <= entry.capabilities:
            why = f"entry {binding.entry!r} lacks {', '.join(requires)}"
        if entry is None or why is not None:
            emit(self.hooks, "session_lost", session=session, entry=binding.entry, reason=why)
            self._discard(binding)
            return None
        lease_id = "l-" + secrets.token_hex(8)
        budget = max(0.0, min(self.config.create_timeout, deadline - self._clock()))
        try:
            store, ref = await self._reserve(
                entry, lease_id, budget + _RESERVE_GRACE, new_session=False
            )
        except _Denied as denied:
            emit(
                self.hooks,
                "session_lost",
                session=session,
                entry=entry.name,
                reason=self._describe(denied.reservation),
            )
            self._discard(binding)
            return None
        started = self._clock()
        try:
            sandbox = await asyncio.wait_for(entry.provider.connect(binding.sandbox_id), budget)
        except Exception as exc:
            await self._settle_failure(store, entry, ref, lease_id, exc, 1, started)
            emit(
                self.hooks,
                "session_lost",
                session=session,
                entry=entry.name,
                sandbox_id=binding.sandbox_id,
                reason=f"{classify(exc).reason}: {exc}",
            )
            self._discard(binding)
            return None
        settled = await store.settle(
            ref,
            self._breaker,
            lease_id,
            self._clock(),
            outcome=Outcome.SUCCESS,
            ttl=self.config.lease_ttl,
            sandbox_id=sandbox.id,
        )
        if not settled.applied:
            return None
        held = Held(
            lease_id,
            entry.name,
            entry.provider.kind,
            sandbox,
            self._clock(),
            1,
            store_kind="shared" if store is self._store else "fallback",
            session=session,
            resumed=True,
        )
        await self._bind(held, self.config.lease_ttl)
        self._keep(held)
        return held

    async def _check_store(self) -> None:
        """Warn once per router about a store that would lose the ledger (no persistence)."""
        self._checked_store = True
        try:
            problems = await self._store.warnings()
        except StateUnavailable:
            return  # the acquire that follows reports it, by on_state_error
        for problem in problems:
            emit(self.hooks, "state_warning", url=self._store.url, problem=problem)

    def _discard(self, binding: SessionBinding) -> None:
        """Kill a session's old sandbox in the background: the session moves to a new one.

        Best effort: when its provider is down the janitor reaps it later.
        """
        entry = self._entries.get(binding.entry)
        if entry is None:
            return

        async def kill() -> None:
            try:
                await entry.provider.kill(binding.sandbox_id)
            except Exception as exc:  # any failure: the janitor reaps it
                emit(self.hooks, "kill_failed", entry=entry.name,
                     sandbox_id=binding.sandbox_id, error=str(exc))  # fmt: skip

        self._spawn(kill())

    async def _caught_up(self, pools: Iterable[str]) -> None:
        """Wait for the slots this router is still freeing in ``pools`` (so its callers
        read their own releases)."""
        pending = [task for pool in pools for task in self._freeing.get(pool, ())]
        if pending:
            await asyncio.wait(pending)

    def _spawn(self, work: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        """Run ``work`` as a task that closing the router waits for."""
        task = asyncio.create_task(work)
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        return task

    async def _close_session(self, session: str) -> bool:
        binding = await self._store.session(session, self._clock())
        if binding is None:
            return False
        entry = self._entries.get(binding.entry)
        if entry is not None:
            try:
                await entry.provider.kill(binding.sandbox_id)
            except ProviderError as exc:
                emit(
                    self.hooks,
                    "kill_failed",
                    entry=entry.name,
                    sandbox_id=binding.sandbox_id,
                    error=str(exc),
                )
        await self._store.unbind_session(session)
        emit(
            self.hooks,
            "session_closed",
            session=session,
            entry=binding.entry,
            sandbox_id=binding.sandbox_id,
        )
        return True

    async def _reap(self) -> ReapReport:
        report = ReapReport()
        now = self._clock()
        bound = await self._store.bound_sandboxes(now)
        for entry in self._entries.values():
            reason = entry.unusable()
            if reason is not None:
                report.skipped[entry.name] = f"not configured: {reason}"
                continue
            token = secrets.token_hex(8)
            lock = f"janitor:{entry.name}"
            if not await self._store.lock(lock, token, _JANITOR_LOCK_TTL, now):
                report.skipped[entry.name] = "another replica is reaping it"
                continue
            try:
                ours = {LABEL_ROUTER: self.config.key_prefix, LABEL_ENTRY: entry.name}
                found = await entry.provider.list(ours)
                live = await self._store.lease_ids(entry.ref, self._clock())
                for info in found:
                    if info.labels.get(LABEL_LEASE) in live or (entry.name, info.id) in bound:
                        report.kept += 1
                    elif await entry.provider.kill(info.id):
                        report.killed.append((entry.name, info.id))
                        emit(
                            self.hooks,
                            "reaped",
                            entry=entry.name,
                            sandbox_id=info.id,
                            lease_id=info.labels.get(LABEL_LEASE, ""),
                        )
            except ProviderError as exc:
                report.skipped[entry.name] = f"{classify(exc).reason}: {exc}"
            finally:
                await self._store.unlock(lock, token)
        return report

    async def _release(self, held: Held) -> None:
        """Dispose of the sandbox; free the slot beside it, off the caller's path.

        The caller waits for the kill only. The slot's release is a task of
        its own that this router's status, and its next acquire on a pool with
        a concurrency limit, wait for (`_caught_up`): a program that releases
        and acquires again still finds its slot free. Closing the router
        waits for it too.
        """
        if held.released:
            return
        held.released = True
        self._live.pop(held.lease_id, None)
        disposing = self._spawn(self._dispose(held))  # first: the kill is what the caller awaits
        freeing = self._spawn(self._free_slot(held))
        in_pool = self._freeing.setdefault(self._entries[held.entry].ref.pool, set())
        in_pool.add(freeing)
        freeing.add_done_callback(in_pool.discard)
        await asyncio.shield(disposing)  # a cancelled release still kills the sandbox

    async def _dispose(self, held: Held) -> None:
        """Kill the sandbox, or keep a session's for its idle TTL (a task of its own)."""
        entry = self._entries[held.entry]
        idle = self.config.session_idle_ttl
        if held.session is not None and idle > 0:
            try:
                await self._bind(held, idle)
            except StateUnavailable:
                await self._kill(entry, held.sandbox)
            else:
                with contextlib.suppress(ProviderError):
                    await held.sandbox.keepalive(idle)
        else:
            await self._kill(entry, held.sandbox)

    async def _free_slot(self, held: Held) -> None:
        store, ref = await self._ledger(held)
        try:
            seconds = await store.release(ref, held.lease_id, self._clock())
        except StateUnavailable as exc:
            self._report_state_error("release", exc)
            return
        emit(self.hooks, "released", entry=held.entry, lease_id=held.lease_id, seconds=seconds)

    async def _store_call(
        self, operation: str, call: Callable[[StateStore], Awaitable[Any]]
    ) -> Any:
        try:
            return await call(self._store)
        except StateUnavailable as exc:
            self._on_state_error(operation, exc)
            return await call(self._fallback)

    async def _status(self) -> RouterStatus:
        await self._caught_up(self._freeing)
        now = self._clock()
        refs = [e.ref for e in self._entries.values()]
        try:
            snap = await self._store.snapshot(refs, now)
            state_ok, error = True, None
        except StateUnavailable as exc:
            snap = await self._fallback.snapshot([self._fallback_ref(r) for r in refs], now)
            state_ok, error = False, str(exc)
        views = []
        for e in self._entries.values():
            pool = snap.pools[e.ref.pool]
            health = snap.entries[e.name].breaker
            reason = e.unusable()
            if reason is not None:
                state, until = "unconfigured", None
            elif health.block:
                state = health.block
                until = _dt(health.block_until) if health.block_until else None
            else:
                state = health.circuit
                until = _dt(health.open_until) if health.circuit == "open" else None
            views.append(
                EntryView(
                    name=e.name,
                    provider=e.provider.kind,
                    pool=e.ref.pool,
                    configured=reason is None,
                    unconfigured_reason=reason,
                    state=state,
                    until=until,
                    detail=health.block_detail,
                    used=dict(pool.used),
                    limits={u: e.ref.limits.get(u) for u in UNITS},
                    reset_at=e.ref.window.reset_at(now),
                    live_leases=snap.entries[e.name].live_leases,
                    exhausted_at=_projections(pool.used, e.ref, now),
                )
            )
        return RouterStatus(
            views,
            self._store.url,
            state_ok,
            error or self._state_error,
            self.config.on_state_error,
        )

    async def _set_usage(self, pool: str, unit: str, value: float) -> None:
        refs = [e.ref for e in self._entries.values() if e.ref.pool == pool]
        if not refs:
            pools = sorted({e.ref.pool for e in self._entries.values()})
            raise ValueError(f"no pool {pool!r} in this config (pools: {', '.join(pools)})")
        await self._store.set_usage(refs[0], unit, value, self._clock())
        emit(self.hooks, "quota_changed", pool=pool, unit=unit, value=value)

    async def _aclose(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
        if self._background:
            await asyncio.wait(self._background, timeout=10)
        for entry in self._entries.values():
            with contextlib.suppress(Exception):
                await entry.provider.aclose()
        await self._store.close()

    def _describe(self, r: Reservation) -> str:
        if r.reason == "quota":
            return (
                f"quota exhausted: {r.unit} {_num(r.used)}/{_num(r.limit)} "
                f"until {_dt(r.until).isoformat()}"
            )
        if r.reason == "open":
            return f"breaker open for {max(0.0, r.until - self._clock()):.0f}s"
        if r.reason == "half_open":
            return "breaker half-open: a probe is in flight"
        if r.reason == "misconfigured":
            return f"misconfigured (credentials refused: {r.detail}); fix the config"
        if r.reason == "exhausted":
            return f"provider quota exhausted until {_dt(r.until).isoformat()}"
        if r.reason == "rate_limited":
            return f"rate limited for {max(0.0, r.until - self._clock()):.0f}s"
        if r.reason == "capacity":
            return "provider concurrency cap reached"
        return r.reason


_RESERVED_LABELS = frozenset({LABEL_ROUTER, LABEL_ENTRY, LABEL_LEASE, LABEL_SESSION})


def _check_acquire(
    spec: object,
    requires: Iterable[str],
    labels: Mapping[str, str] | None,
    session: str | None,
    timeout: float | None,
) -> tuple[str, ...]:
    """Reject bad arguments before anything is reserved, naming the argument."""
    if spec is not None and not isinstance(spec, SandboxSpec):
        raise TypeError(f"acquire(spec=...): expected a SandboxSpec, got {type(spec).__name__}")
    if isinstance(requires, str):
        raise TypeError(
            f"acquire(requires={requires!r}): give a sequence of capabilities, "
            f"e.g. requires=({requires!r},)"
        )
    needed = tuple(requires)
    for cap in needed:
        if not isinstance(cap, str) or not cap:
            raise TypeError(
                f"acquire(requires=...): capabilities are non-empty strings, got {cap!r}"
            )
    for key, value in (labels or {}).items():
        if not isinstance(key, str) or not isinstance(value, str):
            raise TypeError(
                f"acquire(labels=...): keys and values are strings, got {key!r}: {value!r}"
            )
        if key in _RESERVED_LABELS:
            raise ValueError(f"acquire(labels=...): {key!r} is set by the router itself")
    if session is not None and (not isinstance(session, str) or not session.strip()):
        raise ValueError(f"acquire(session={session!r}): a session key is a non-empty string")
    if timeout is not None and not timeout > 0:
        raise ValueError(
            f"acquire(timeout={timeout!r}): the deadline must be a positive number of seconds"
        )
    return needed


# A trickle of usage against a large limit projects past what datetime can hold.
_LAST_TIMESTAMP = datetime(9999, 1, 1, tzinfo=UTC).timestamp()


def _projections(used: Mapping[str, float], ref: EntryRef, now: float) -> dict[str, datetime]:
    start = ref.window.bounds(now)[0].timestamp()
    out = {}
    for unit in ("sessions", "sandbox_seconds"):
        when = projected_exhaustion(used[unit], ref.limits.get(unit), start, now)
        if when is not None and when < _LAST_TIMESTAMP:
            out[unit] = _dt(when)
    return out


def _dt(ts: float) -> datetime:
    return datetime.fromtimestamp(ts, UTC)


def _num(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:.1f}"
