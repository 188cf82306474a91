"""Warm pools: sandboxes made in advance, claimed by any replica's acquire.

An entry with ``warm: {size, max_idle, pause}`` keeps ``size`` sandboxes
ready, fleet-wide, recorded in the state store (`router.state.warm`):

* **claim**: `LedgerSupport.reserve` with ``warm=True`` hands a ready one
  to the reservation in the same script (no round trip of its own); the
  acquire then connects to it (`Provider.connect`, or `Provider.resume`
  for one parked paused). One that cannot be reached is killed, its lease
  given back, and the acquire goes on (the next warm one, else a create).
  Only an acquire a warm sandbox can serve claims one: the entry's own
  template, no spec fields, no labels of the caller's.
  Each replica connects ahead to the running ones (`router.warm_handles`,
  every ``warm_reach_every`` seconds), so a claim mostly finds a handle and
  connects nothing.
* **refill**: one replica at a time (a fleet-wide lock per entry) creates
  up to ``size`` through the ordinary reserve (so the pool's quota and
  concurrency limits bound it: a warm sandbox is a session when created,
  and holds a slot while it runs), labels each with `LABEL_WARM` and its
  lease, commits it, pauses it if asked, and records it. It runs every
  ``warm_refill_every`` seconds and after each claim or miss.
* **kill**: the refill kills those unclaimed past ``max_idle``, and drains
  them all while the entry fails (`policies.warm.failing`: breaker open,
  misconfigured, provider quota exhausted, no ``sandbox_seconds`` left).

Where the vendor holds ready sandboxes itself (``warm.server``: Daytona's
warm pools), the router holds none: the refill, under the same fleet lock,
sets the vendor's pool to ``size`` (`Provider.keep_warm`), to 0 while the
entry fails or once its ``warm`` is dropped, and acquires create as usual,
served from the vendor's pool. Nothing is claimed from the store, so such
an entry has no hits or misses; ``warm_ready`` is what the vendor last said
it held.

How the seconds are metered is `policies.warm`'s docstring. Closing a
router leaves the pools to the fleet: the sandboxes are the fleet's, and
expire from the store (and so fall to the janitor) when no replica is left
to kill them.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from collections.abc import Mapping
from dataclasses import replace

from policies.warm import WarmRecord, failing, vendor_pool
from providers.base import (
    LABEL_ENTRY,
    LABEL_LEASE,
    LABEL_ROUTER,
    LABEL_SESSION,
    LABEL_WARM,
    Sandbox,
    SandboxSpec,
)
from providers.capabilities import Capability
from providers.errors import (
    ConfigError,
    ProviderError,
    StateUnavailable,
    Unavailable,
)
from router.booking import RESERVE_GRACE, Booking, Denied
from router.config import WarmConfig
from router.context import Context
from router.entries import Entry
from router.events import (
    Created,
    TaskFailed,
    WarmClaimed,
    WarmCreated,
    WarmKilled,
    WarmMissed,
    WarmSized,
)
from router.lease import Held
from router.ledger import Ledger
from router.spans import untraced
from router.upkeep import Upkeep
from router.waits import until_done
from router.warm_handles import WarmHandles

__all__ = ["WarmPools"]

_CLOSE_WAIT = 10.0  # seconds closing waits for a refill in flight


class WarmPools:
    """The warm pools of this router's entries: claims, refills, kills."""

    def __init__(self, ledger: Ledger, upkeep: Upkeep, ctx: Context) -> None:
        self._ctx = ctx
        self._ledger = ledger
        self._upkeep = upkeep
        self.settings: dict[str, WarmConfig] = {}
        self.server: set[str] = set()  # entries whose pool the vendor holds
        self._vendor_ready: dict[str, int] = {}
        self._sized: dict[str, int] = {}  # the size this replica last set a vendor pool to
        self._dropped: set[str] = set()  # vendor pools to end (their warm was dropped)
        for entry in ctx.entries.values():
            if entry.cfg.warm is not None:
                self.configure(entry.name, entry.cfg.warm)
        self._task: asyncio.Task[None] | None = None
        self._kick: asyncio.Event | None = None
        self._closing = False
        self._handles = WarmHandles(ctx.clock)
        self._reaching: asyncio.Task[None] | None = None
        self._passing = asyncio.Lock()  # one pass at a time here: `fill_warm` waits for the loop's

    def configure(self, name: str, warm: WarmConfig | None) -> None:
        """Set (or with None, drop) an entry's warm pool; the next refill applies it."""
        entry = self._ctx.entries.get(name)
        if entry is None:
            known = ", ".join(self._ctx.entries)
            raise ValueError(f"no entry {name!r} in this router (entries: {known})")
        server = warm is not None and _held_by_vendor(name, warm, entry)
        if server and entry.quota.usd is not None:
            raise ConfigError(
                f"{name}.warm.server: its pool has a usd budget, and a warm pool the vendor "
                "holds is billed unseen by the router; set server: false"
            )
        if warm is not None and warm.pause and Capability.PAUSE not in entry.capabilities:
            raise ConfigError(
                f"{name}.warm.pause: the entry does not declare the 'pause' capability"
            )
        kept = warm is not None and warm.size > 0
        if name in self.server and not (kept and server):
            self._dropped.add(name)  # the vendor's pool is ended by the next pass
        self.server.discard(name)
        if warm is None or not kept:
            self.settings.pop(name, None)
            return
        self.settings[name] = warm
        if server:
            self.server.add(name)
            self._dropped.discard(name)

    def fits(self, entry: Entry, spec: SandboxSpec | None, labels: Mapping[str, str]) -> bool:
        """Can a warm sandbox of ``entry`` serve this acquire? Only when the entry
        has a pool and the acquire asks for nothing a warm sandbox was not made with."""
        if entry.name not in self.settings or entry.name in self.server:
            return False
        if any(key != LABEL_SESSION for key in labels):
            return False
        if spec is None:
            return True
        return replace(spec, template=None) == SandboxSpec() and spec.template in (
            None,
            entry.cfg.template,
        )

    # -- claims (on the acquire's path) ---------------------------------------------
    async def claim(self, entry: Entry, booking: Booking, attempt: int) -> Held | None:
        """Connect to the warm sandbox ``booking`` claimed; None when it cannot be
        reached (it is killed and its lease given back, so the acquire goes on)."""
        claimed = booking.claimed
        assert claimed is not None
        started = self._ctx.clock()
        reached = None if claimed.paused else self._handles.take(entry.name, claimed.sandbox_id)
        try:
            sandbox = reached if reached is not None else await self._connect(entry, booking)
        except BaseException as exc:
            await asyncio.shield(self._upkeep.give_back(entry, booking))
            if not isinstance(exc, Exception):
                raise
            cost = await self._charged(entry, claimed.sandbox_id, claimed.paused, claimed.metered)
            self._ctx.emit(
                WarmKilled(
                    entry.name, claimed.sandbox_id, "unreachable", claimed.paused,
                    claimed.idle, claimed.metered, cost, entry.ref.pool,
                )
            )  # fmt: skip
            return None
        now = self._ctx.clock()
        cost = await self._charged(entry, claimed.sandbox_id, claimed.paused, claimed.metered)
        self._ctx.emit(
            WarmClaimed(
                entry.name, booking.lease_id, sandbox.id, claimed.paused, claimed.idle,
                claimed.metered, now - started, reached is not None, cost, entry.ref.pool,
            )
        )  # fmt: skip
        held = booking.held(entry.provider.kind, sandbox, now, attempt)
        self._upkeep.start(held, booking)
        self.kick()
        return held

    async def _charged(
        self, entry: Entry, sandbox_id: str, paused: bool, metered: float
    ) -> float | None:
        """What a warm sandbox's wait cost its pool: running, its fee and ``metered``
        seconds (the store settled them with the claim or the take); paused, the storage
        its hold settles to. None when the entry is unpriced."""
        if entry.tariff.price is None:
            return None
        if not paused:
            return entry.cost(None, metered)
        return await self._ledger.storage.settle(entry, sandbox_id)

    async def _connect(self, entry: Entry, booking: Booking) -> Sandbox:
        claimed = booking.claimed
        assert claimed is not None
        async with asyncio.timeout(booking.budget + 1.0):  # no task, unlike wait_for
            if claimed.paused:
                return await entry.provider.resume(claimed.sandbox_id, timeout=booking.budget)
            return await entry.provider.connect(claimed.sandbox_id)

    def missed(self, entry: Entry) -> None:
        """An acquire this pool could have served found it empty."""
        self._ctx.emit(WarmMissed(entry.name))
        self.kick()

    # -- the refill (in the background) ---------------------------------------------
    def start(self) -> None:
        """Run the refill and reach loops on this loop, once each (a router with no
        warm pool runs neither)."""
        if not self.settings or self._closing:
            return
        every = self._ctx.config.warm_refill_every
        if self._task is None and every > 0:
            self._kick = asyncio.Event()
            self._task = untraced(self._run(every))
        reach_every = self._ctx.config.warm_reach_every
        if self._reaching is None and reach_every > 0:
            self._reaching = untraced(self._reach_loop(reach_every))

    def kick(self) -> None:
        """Refill now rather than at the next tick."""
        if self._kick is not None:
            self._kick.set()

    async def _run(self, every: float) -> None:
        assert self._kick is not None
        while not self._closing:
            self._kick.clear()
            try:
                await self.fill()
            except Exception as exc:  # a pass's bad luck stops no later pass
                self._ctx.emit(TaskFailed("warm refill", f"{type(exc).__name__}: {exc}"))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._kick.wait(), every)

    async def _reach_loop(self, every: float) -> None:
        while not self._closing:
            await asyncio.sleep(every)  # the claim that started the loop connects itself
            try:
                await self.reach()
            except Exception as exc:
                self._ctx.emit(TaskFailed("warm reach", f"{type(exc).__name__}: {exc}"))

    async def reach(self) -> None:
        """Connect ahead to the running warm sandboxes this replica may claim
        (`router.warm_handles`), one store read per pool; nothing when
        ``warm_reach_every`` is 0."""
        if self._ctx.config.warm_reach_every <= 0:
            return
        reachable = [
            self._ctx.entries[name]
            for name, warm in self.settings.items()
            if name not in self.server and not warm.pause
        ]
        self._handles.retain(entry.name for entry in reachable)
        for entry in reachable:
            try:
                records = await self._ledger.store.warm_list(entry.ref, self._ctx.clock())
            except StateUnavailable:
                return  # the refill reports the store's outage; claims connect meanwhile
            await self._handles.reach(entry, records)

    async def fill(self) -> dict[str, int]:
        """One pass over every warm pool: kill the idle and the drained, refill the rest,
        and size the pools vendors hold (those dropped from the config to 0).

        Returns how many each pool holds ready after the pass; a pool whose
        lock another replica held (it refills it) is left out. A pass of this
        replica's own in flight (the background one) is waited for first.
        """
        async with self._passing:
            return await self._pass()

    async def _pass(self) -> dict[str, int]:
        if await self._ledger.outage.active(self._ledger.store):
            return {}  # the pools live in the shared store; the outage ledger has none
        passes = {
            name: (
                self._size_vendor(self._ctx.entries[name], warm.size)
                if name in self.server
                else self._fill(self._ctx.entries[name], warm)
            )
            for name, warm in self.settings.items()
        }
        passes.update(
            {name: self._size_vendor(self._ctx.entries[name], 0) for name in self._dropped}
        )
        results = await asyncio.gather(*passes.values(), return_exceptions=True)
        ready: dict[str, int] = {}
        for name, result in zip(passes, results, strict=True):
            if isinstance(result, StateUnavailable):
                self._ledger.report("warm", result)
            elif isinstance(result, BaseException):
                raise result
            elif result is not None:
                ready[name] = result
        self._dropped.difference_update(n for n in passes if n not in self.settings and n in ready)
        return {name: count for name, count in ready.items() if name in self.settings}

    async def _size_vendor(self, entry: Entry, size: int) -> int | None:
        """Set the vendor's own pool of ``entry`` to ``size``, or to 0 while the entry
        fails; under the fleet lock, so one replica sizes it. Returns what the vendor
        holds ready (None: another replica holds the lock, or the vendor failed)."""
        store, name = self._ledger.store, f"warm:{entry.name}"
        token = secrets.token_hex(8)
        if not await store.lock(name, token, self._ctx.config.create_timeout + 30.0,
                                self._ctx.clock()):  # fmt: skip
            return None
        try:
            wanted, why = 0, None
            if size:
                now = self._ctx.clock()
                snap = await store.snapshot([entry.ref], now)
                wanted, why = vendor_pool(
                    size, snap.entries[entry.name].breaker, snap.pools[entry.ref.pool].used,
                    entry.ref.limits, now,
                )  # fmt: skip
            try:
                ready = await entry.provider.keep_warm(entry.cfg.template, wanted)
            except ProviderError as exc:
                self._ctx.emit(TaskFailed("warm keep_warm", f"{type(exc).__name__}: {exc}"))
                return None
            self._vendor_ready[entry.name] = ready
            if self._sized.get(entry.name) != wanted:
                self._sized[entry.name] = wanted
                self._ctx.emit(WarmSized(entry.name, wanted, ready, why))
            return ready
        finally:
            with contextlib.suppress(StateUnavailable):
                await store.unlock(name, token)

    async def _fill(self, entry: Entry, warm: WarmConfig) -> int | None:
        store, name = self._ledger.store, f"warm:{entry.name}"
        token = secrets.token_hex(8)
        hold = self._ctx.config.create_timeout + RESERVE_GRACE + 30.0
        if not await store.lock(name, token, hold, self._ctx.clock()):
            return None
        try:
            now = self._ctx.clock()
            records = await store.warm_list(entry.ref, now)
            snap = await store.snapshot([entry.ref], now)
            why = failing(
                snap.entries[entry.name].breaker, snap.pools[entry.ref.pool].used,
                entry.ref.limits, now,
            )  # fmt: skip
            doomed = {
                lid: ("drained: " + why if why else "max_idle")
                for lid, record in records.items()
                if why is not None or record.deadline <= now
            }
            await asyncio.gather(
                *(self._retire(entry, lid, records[lid], reason) for lid, reason in doomed.items())
            )
            ready = len(records) - len(doomed)
            if why is None and ready < warm.size:
                missing = warm.size - ready
                ready += sum(
                    await asyncio.gather(*(self._make(entry, warm) for _ in range(missing)))
                )
            return ready
        finally:
            with contextlib.suppress(StateUnavailable):
                await store.unlock(name, token)

    async def _make(self, entry: Entry, warm: WarmConfig) -> bool:
        """Create one warm sandbox, commit it, pause it if asked, and record it."""
        ttl = warm.max_idle + self._ctx.config.lease_ttl
        meter = entry.meter(None)  # a usd budget holds its fee and whole stay from now on
        try:
            deadline = self._ctx.clock() + self._ctx.config.create_timeout
            booking = await self._upkeep.book(
                entry, deadline, meter=None if meter is None else replace(meter, first=ttl)
            )
        except Denied:
            return False  # quota, concurrency or the breaker says no: the pool stays short
        if not booking.shared:  # the store went away since the pass began
            await self._ledger.refund(booking, "warm_refill_outage")
            return False
        router = self._ctx.config.key_prefix
        labels = {LABEL_ROUTER: router, LABEL_ENTRY: entry.name, LABEL_LEASE: booking.lease_id}
        spec = entry.create_spec(SandboxSpec(), {**labels, LABEL_WARM: "1"})
        started = self._ctx.clock()
        create = self._upkeep.late.create(entry, spec, booking.budget)
        try:
            await until_done(create, booking.budget)
        except asyncio.CancelledError:
            self._upkeep.late.abandon(create, booking, entry)
            raise
        if not create.done():
            late = Unavailable(f"create timed out after {booking.budget:.1f}s", provider=entry.name)
            await self._ledger.record_failure(booking, late, 1, started)
            self._upkeep.late.abandon(create, booking, entry)
            return False
        if (error := create.exception()) is not None:
            await self._upkeep.late.failed(create, booking, entry, error, 1, started)
            return False
        sandbox = create.result()
        self._ctx.emit(Created(entry=entry.name, latency=self._ctx.clock() - started))
        committed = self._ctx.clock()
        if not await self._ledger.commit(booking, sandbox.id, committed, ttl=ttl):
            await self._upkeep.kills.kill_id(entry, sandbox.id)
            return False
        # Parked running (its lease's hold covers that) where its storage cannot be held.
        held = await self._ledger.storage.try_hold(entry, sandbox.id, ttl) if warm.pause else None
        paused = held is not None
        try:
            if paused:
                await sandbox.pause()
        except Exception as exc:
            self._ctx.emit(TaskFailed("warm pause", f"{type(exc).__name__}: {exc}"))
            with contextlib.suppress(StateUnavailable):  # lapsed, it is charged whole
                await self._ledger.storage.drop(entry, sandbox.id, held)
            await self._upkeep.kills.kill_id(entry, sandbox.id)
            await self._ledger.release(booking)
            return False
        now = self._ctx.clock()
        # Its stay ends where its lease's cover does (the held worst case), not later.
        record = WarmRecord(sandbox.id, now, now + warm.max_idle, committed + ttl, paused=paused)
        if not await self._ledger.store.warm_put(entry.ref, booking.lease_id, record, now):
            await self._upkeep.kills.kill_id(entry, sandbox.id)  # its lease was lost
            return False
        if not paused and self._ctx.config.warm_reach_every > 0:
            self._handles.keep(entry.name, sandbox)  # the reach loop lets go of it once claimed
        cost = entry.cost(None, now - committed) if paused and entry.tariff.price else None
        self._ctx.emit(
            WarmCreated(entry.name, sandbox.id, paused, now - started, cost, entry.ref.pool)
        )
        return True

    async def _retire(self, entry: Entry, lease_id: str, record: WarmRecord, reason: str) -> None:
        """Take one out of the pool and kill it (unless a claim took it first)."""
        now = self._ctx.clock()
        metered = await self._ledger.store.warm_take(entry.ref, lease_id, now)
        if metered is None:
            return
        self._handles.drop(entry.name, record.sandbox_id)
        await self._upkeep.kills.kill_id(entry, record.sandbox_id)
        idle = now - record.since
        cost = await self._charged(entry, record.sandbox_id, record.paused, metered)
        self._ctx.emit(
            WarmKilled(
                entry.name, record.sandbox_id, reason, record.paused, idle, metered, cost,
                entry.ref.pool,
            )
        )  # fmt: skip

    async def ready(self) -> dict[str, int]:
        """How many claimable warm sandboxes each pool holds now (one read per pool)."""
        now = self._ctx.clock()
        counts = {}
        for name in self.settings:
            if name in self.server:
                if name in self._vendor_ready:
                    counts[name] = self._vendor_ready[name]
                continue
            records = await self._ledger.store.warm_list(self._ctx.entries[name].ref, now)
            counts[name] = sum(1 for r in records.values() if r.deadline > now)
        return counts

    async def close(self) -> None:
        """Stop the refill loop, letting a pass in flight end (10 s at most), stop
        reaching, and let go of the handles held for claims."""
        self._closing = True
        if self._reaching is not None:
            self._reaching.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reaching
        if self._task is not None:
            self.kick()
            done, _ = await asyncio.wait({self._task}, timeout=_CLOSE_WAIT)
            if not done:
                self._task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await self._task
        await self._handles.close()


def _held_by_vendor(name: str, warm: WarmConfig, entry: Entry) -> bool:
    """Whether the vendor holds ``entry``'s warm pool (``warm.server``; by default
    wherever the entry declares it, unless the pool is to be parked paused)."""
    declared = Capability.WARM_SERVER in entry.capabilities
    if warm.server and not declared:
        raise ConfigError(
            f"{name}.warm.server: the entry does not declare the 'warm.server' capability"
        )
    if warm.server and warm.pause:
        raise ConfigError(f"{name}.warm.pause: a pool the vendor holds cannot be parked paused")
    return declared and not warm.pause if warm.server is None else warm.server
