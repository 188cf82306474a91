"""The Router: a small facade over the parts that do the work.

Each concern lives in a module of its own (see docs/design.md's map):
``acquire`` (the chain walk with retries and failover), ``ledger`` (the
state store and its fail-open fallback), ``upkeep`` (commits, heartbeats,
releases, background tasks), ``sessions`` (sticky sessions), ``pause``
(pause tokens), ``janitor`` (orphan reaping) and ``status``. The facade builds them.
Each call is written once, async (``aacquire``, ``astatus``...), and awaits
the parts' work on the router's engine loop (see ``router.engine``); its sync
twin (``acquire``, ``status``...) is derived with `router.portal.sync_twin`,
which runs the async call there and waits. ``close`` is the one written
twice: it must stop the engine's thread from outside it.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from providers.base import Provider, SandboxSpec, Snapshot, check_positive, check_text
from providers.errors import InvalidArgument
from router import config as config_mod
from router.acquire import Acquirer, check_acquire
from router.config import RouterConfig
from router.context import Context
from router.engine import Engine
from router.entries import build_entries
from router.events import Hook, QuotaChanged, emit, log_hook
from router.janitor import Janitor, ReapReport
from router.lease import AsyncLease, Held, Lease, PendingLease
from router.ledger import Ledger
from router.pause import Pauses
from router.portal import sync_twin
from router.sessions import Sessions
from router.spans import AcquireSpan, Spans, Tracer
from router.state import StateStore, TenantUsage, open_store
from router.state.base import SETTABLE_UNITS
from router.status import EntryView, RouterStatus, read_status
from router.tenants import check_tenant
from router.upkeep import Upkeep
from router.warm import WarmPools

__all__ = ["EntryView", "ReapReport", "Router", "RouterStatus"]


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
        self._hooks = list(hooks)
        self._spans = Spans()
        self._clock = clock
        self._engine = Engine()
        self._entries = build_entries(config, providers)
        store = store or open_store(
            config.resolved_state_url(), config.key_prefix, tenants=config.counts_tenants
        )
        ctx = Context(config, self._entries, self._hooks, clock, self._spans)
        self._ledger = Ledger(store, ctx)
        self._upkeep = Upkeep(self._ledger, ctx)
        self._sessions = Sessions(self._ledger, self._upkeep, ctx)
        self._warm = WarmPools(self._ledger, self._upkeep, ctx)
        self._acquirer = Acquirer(
            self._ledger, self._upkeep, self._sessions, ctx, sleep, self._warm
        )
        self._janitor = Janitor(store, ctx, self._ledger.storage)
        self._pauses = Pauses(self._ledger, self._upkeep, ctx)

    # -- construction ----------------------------------------------------------
    @classmethod
    def from_config(cls, source: str | Path | Mapping[str, Any], **kwargs: Any) -> Router:
        """A router from a YAML file path or a config mapping (validated)."""
        return cls(config_mod.load_config(source), **kwargs)

    @classmethod
    def from_env(cls, **kwargs: Any) -> Router:
        """A router from ``SANDBOX_ROUTER_CONFIG`` or the default chain (docs/configuration.md)."""
        return cls(config_mod.from_env(), **kwargs)

    @property
    def hooks(self) -> list[Hook]:
        """The event hooks; append to add one (every part of the router shares this list)."""
        return self._hooks

    @hooks.setter
    def hooks(self, hooks: Sequence[Hook]) -> None:
        self._hooks[:] = hooks

    @property
    def tracers(self) -> list[Tracer]:
        """The span hooks (`router.spans`); append to add one, as to `hooks`."""
        return self._spans.tracers

    @property
    def store(self) -> StateStore:
        return self._ledger.store

    @property
    def entries(self) -> list[str]:
        return list(self._entries)

    def provider(self, entry: str) -> Provider:
        return self._entries[entry].provider

    def capabilities(self, entry: str) -> frozenset[str]:
        """What ``entry`` can do (what ``requires=`` routes by): its config's
        ``capabilities``, else what its provider declares."""
        if entry not in self._entries:
            known = ", ".join(self._entries)
            raise InvalidArgument(f"capabilities(entry={entry!r}): not an entry here ({known})")
        return self._entries[entry].capabilities

    # -- public API: each call written once, async; its sync twin derived --------
    def aacquire(
        self,
        spec: SandboxSpec | None = None,
        *,
        requires: Iterable[str] = (),
        labels: Mapping[str, str] | None = None,
        session: str | None = None,
        timeout: float | None = None,
        tenant: str | None = None,
    ) -> PendingLease:
        """A live sandbox from the first entry that can serve.

        ``async with router.aacquire() as lease:`` releases the lease at the
        block's end, as ``with router.acquire() as lease:`` does; ``await
        router.aacquire()`` is the lease itself.

        Args:
            spec: what to create (template, env, resources...).
            requires: capabilities the entry must declare, e.g. ``("gpu",)``.
            labels: extra labels put on the sandbox.
            session: a sticky session key: the same key gets the same live
                sandbox back (any replica, same entry) until the session's
                idle TTL passes or `close_session` is called; if that sandbox
                is gone a new one is bound and ``lease.resumed`` is False.
            timeout: the overall deadline in seconds (default ``acquire_timeout``).
            tenant: the app's end user the lease is counted to (``tenants`` in
                the config limits each one's sessions, usd and concurrent leases,
                across every pool); None: no tenant limit.

        Raises:
            NoProviderAvailable: every entry was skipped or failed; the message
                lists each entry and why (a tenant over its limit: which limit,
                until when).
            StateUnavailable: the state store is down and ``on_state_error``
                is ``fail_closed``.
            SandboxError: the provider refused the spec itself (not retried).
        """
        return PendingLease(self._acquire(spec, requires, labels, session, timeout, tenant))

    acquire = sync_twin(aacquire, Lease.of)

    def aresume(
        self, token: str, *, timeout: float | None = None, tenant: str | None = None
    ) -> PendingLease:
        """A live lease on the sandbox `Lease.pause` paused, from any replica.

        A slot-only reservation on the sandbox's entry: it takes a concurrency
        slot but no session unit. Releasing the lease kills the sandbox.
        ``tenant`` counts the lease to that tenant, as `acquire`'s does (a
        paused sandbox remembers none).

        Raises:
            LeaseError: no paused sandbox for this token (unknown, expired or
                resumed already).
            NoProviderAvailable: the entry cannot take it now (concurrency full,
                breaker open); the token and the paused sandbox stay.
            NotFound: the sandbox is gone at the provider (the token is dropped).
        """
        return PendingLease(self._resume(token, timeout, tenant))

    resume = sync_twin(aresume, Lease.of)

    async def adelete_snapshot(self, snapshot: Snapshot) -> bool:
        """Delete a snapshot `sandbox.snapshot()` made, on its entry; False when it was gone."""
        return await self._engine.arun(self._delete_snapshot(snapshot))

    delete_snapshot = sync_twin(adelete_snapshot)

    async def astatus(self) -> RouterStatus:
        """Per entry: configured, breaker state, quota used/limit, reset, live leases."""
        return await self._engine.arun(self._status())

    status = sync_twin(astatus)

    async def atenants(self, top: int = 10) -> list[TenantUsage]:
        """The ``top`` tenants by usd spent in their current window (then sessions): each
        one's sessions, usd settled and held, and live leases (``sandbox-router cost
        --tenants``)."""
        check_positive(top, "tenants", "top")
        return await self._engine.arun(self._tenants(int(top)))

    tenants = sync_twin(atenants)

    async def aclose_session(self, session: str) -> bool:
        """Kill a sticky session's sandbox and forget it; False when it had none."""
        check_text(session, "close_session", "session")
        return await self._engine.arun(self._sessions.close(session))

    close_session = sync_twin(aclose_session)

    async def areap(self) -> ReapReport:
        """Kill this router's sandboxes that no live lease or session holds.

        Lists each configured entry's sandboxes carrying this router's labels
        (never anyone else's) under a fleet-wide lock per entry, so several
        replicas may run it at once. The router runs it by itself every
        ``reap_every`` seconds; ``sandbox-router janitor`` runs it once.
        """
        return await self._engine.arun(self._reap())

    reap = sync_twin(areap)

    async def aset_warm(
        self, entry: str, size: int, *, max_idle: float | None = None, pause: bool | None = None
    ) -> None:
        """Set ``entry``'s warm pool as its config's ``warm`` would (size 0 drops it);
        unset arguments keep what the entry had (else the `WarmConfig` defaults).
        The next refill applies it: call `fill_warm` to apply it now."""
        if not isinstance(entry, str) or entry not in self._entries:
            known = ", ".join(self._entries)
            raise InvalidArgument(f"set_warm(entry={entry!r}): not an entry here ({known})")
        current = self._warm.settings.get(entry) or self._entries[entry].cfg.warm
        fields = current.model_dump() if current is not None else {}
        given = {"size": size, "max_idle": max_idle, "pause": pause}
        fields.update({name: value for name, value in given.items() if value is not None})
        try:
            warm = config_mod.WarmConfig.model_validate(fields)
        except ValidationError as exc:
            name = ".".join(str(part) for part in exc.errors()[0]["loc"])
            message = exc.errors()[0]["msg"]
            raise InvalidArgument(f"set_warm({name}=...): {message}") from None

        async def configure() -> None:  # on the engine loop, between two refill passes
            self._warm.configure(entry, warm)

        await self._engine.arun(configure())

    set_warm = sync_twin(aset_warm)

    async def afill_warm(self) -> dict[str, int]:
        """Refill the warm pools now and wait: kill idle and drained ones, create up to
        each ``size`` within the pool's limits, and connect ahead to the running ones
        this replica may claim (``warm_reach_every``). Returns each pool's ready count
        (a pool another replica is refilling is left out). Starts the background refill."""
        return await self._engine.arun(self._fill_warm())

    fill_warm = sync_twin(afill_warm)

    async def awarm_ready(self) -> dict[str, int]:
        """How many claimable warm sandboxes each warm pool holds, fleet-wide."""
        return await self._engine.arun(self._warm.ready())

    warm_ready = sync_twin(awarm_ready)

    async def aset_usage(self, pool: str, unit: str, value: float) -> None:
        """Overwrite a pool's used amount this window (``sandbox-router quota set``)."""
        pools = {e.ref.pool for e in self._entries.values()}
        if pool not in pools:
            known = ", ".join(sorted(pools))
            raise InvalidArgument(f"set_usage(pool={pool!r}): no such pool here ({known})")
        if unit not in SETTABLE_UNITS:
            raise InvalidArgument(f"set_usage(unit={unit!r}): expected one of {SETTABLE_UNITS}")
        check_positive(value, "set_usage", "value", zero=True)
        await self._engine.arun(self._set_usage(pool, unit, value))

    set_usage = sync_twin(aset_usage)

    async def aclose(self) -> None:
        """Release SDK clients and store connections, stop the engine loop; once (the
        router's calls raise `RouterClosed` after it), again is a no-op."""
        if self._engine.closed:
            return
        await self._engine.arun(self._aclose())
        self._engine.close()

    def close(self) -> None:
        """`aclose`, waited for. Not derived with `sync_twin`: the engine's thread is
        stopped from the caller's, after the closing work ran on the engine loop."""
        if self._engine.closed:
            return
        with contextlib.suppress(RuntimeError):
            self._engine.run(self._aclose())
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
        return f"<Router entries={list(self._entries)} store={self.store!r}>"

    # -- the parts' work, run on the engine loop ---------------------------------
    async def _acquire(
        self,
        spec: SandboxSpec | None,
        requires: Iterable[str],
        labels: Mapping[str, str] | None,
        session: str | None,
        timeout: float | None,
        tenant: str | None = None,
    ) -> AsyncLease:
        requires = check_acquire(spec, requires, labels, session, timeout)
        tenant = check_tenant("acquire", tenant)
        work = self._acquirer.acquire(spec, requires, labels, session, timeout, tenant)
        held = await self._engine.arun(self._started(work))
        return AsyncLease(held, self._engine, self._upkeep.release, self._pauses.pause, self._spans)

    async def _resume(self, token: str, timeout: float | None, tenant: str | None) -> AsyncLease:
        timeout = _check_resume(token, timeout, self.config.acquire_timeout)
        tenant = check_tenant("resume", tenant)
        resuming = self._spans.wrap(
            AcquireSpan(resume=True), self._pauses.resume(token, timeout, tenant)
        )
        held = await self._engine.arun(self._started(resuming))
        return AsyncLease(held, self._engine, self._upkeep.release, self._pauses.pause, self._spans)

    async def _started(self, work: Awaitable[Held]) -> Held:
        """``work`` on the engine loop, the router's background tasks started first."""
        self._janitor.start()  # the periodic reaper starts with the router's first lease
        return await work

    async def _tenants(self, top: int) -> list[TenantUsage]:
        """Each tenant read in the window its config gives it (the default's, or its
        override's when that names another)."""
        await self._upkeep.caught_up()
        now, tenants = self._clock(), self.config.tenants
        windows = {self.config.tenant_limits(t)[1] for t in ["", *tenants.overrides]}
        found: list[TenantUsage] = []
        for window in windows:
            for usage in await self.store.tenants(window, now, top):
                if self.config.tenant_limits(usage.tenant)[1] == window:
                    found.append(usage)
        found.sort(key=lambda t: (-t.usd, -t.sessions, t.tenant))
        return found[:top]

    async def _status(self) -> RouterStatus:
        await self._upkeep.caught_up()
        return await read_status(
            self._ledger, self._entries, self.config.on_state_error, self._clock()
        )

    async def _reap(self) -> ReapReport:
        await self._ledger.outage.adopt(self._ledger.store)
        return await self._janitor.reap()

    async def _set_usage(self, pool: str, unit: str, value: float) -> None:
        ref = next(e.ref for e in self._entries.values() if e.ref.pool == pool)
        # an operator's value replaces what the journal holds too
        await self._ledger.outage.adopt(self._ledger.store)
        await self._ledger.store.set_usage(ref, unit, value, self._clock())
        self._ledger.exhausted.forget(pool)  # other replicas learn it from the limits version
        emit(self._hooks, QuotaChanged(pool=pool, unit=unit, value=value))

    async def _delete_snapshot(self, snapshot: Snapshot) -> bool:
        entry = self._entries.get(snapshot.entry)
        if entry is None:
            raise InvalidArgument(f"delete_snapshot: entry {snapshot.entry!r} is not in the chain")
        return await entry.provider.delete_snapshot(snapshot.id)

    async def _fill_warm(self) -> dict[str, int]:
        self._warm.start()
        ready = await self._warm.fill()
        await self._warm.reach()
        return ready

    async def _aclose(self) -> None:
        await self._janitor.close()
        await self._warm.close()
        await self._upkeep.close()
        for entry in self._entries.values():
            with contextlib.suppress(Exception):
                await entry.provider.aclose()
        await self._ledger.close()


def _check_resume(token: object, timeout: float | None, default: float) -> float:
    if not isinstance(token, str) or not token or not token.isascii() or not token.isprintable():
        raise InvalidArgument("resume(token): not a pause token")
    check_positive(timeout, "resume", "timeout", optional=True)
    return default if timeout is None else float(timeout)
