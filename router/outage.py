"""Serving through a state-store outage (``on_state_error: fail_open``).

Three things make a fleet's outage spend safe, all kept here:

* the fleet registry: while the store is up, the replica heartbeats into it
  every ``fleet_heartbeat`` seconds and keeps what it learns (a `Contact`:
  the fleet's size and whether its view is settled, each pool's usage), and
  what it spent from the shared ledger after each contact;
* the share: when the store goes away, the replica's outage ledger (an
  in-memory store) gets the limits `policies.outage.outage_limits` computes
  from the last contact and what this replica spent since the fleet's oldest
  contact, fixed for the whole outage (none when its view of the fleet is not
  settled, unless ``fail_open_blind`` says otherwise);
* the journal (`router.journal`): every lease the outage ledger grants is
  written to disk, with its seconds once released, and handed over to the
  store with `StateStore.reconcile` when it answers again, exactly once. A
  lease still held then moves to the store, which meters it from then on.

When the store answers again the replica keeps serving from its share for
three more heartbeats (the registry's TTL), then grants nothing for two more
while it hands over its last batch. Every live replica hands over within a
heartbeat of the others, so by the time any goes back to the shared ledger,
the ledger knows the whole outage's spend. A replica that ended during the
outage leaves its journal on disk: whichever router reaches the store next
and can see the file hands it over (`Outage.adopt`), before it answers.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from collections import defaultdict
from dataclasses import replace

from policies.outage import Contact, outage_limits, seen, spent_since
from policies.quota import Limits, Meter
from providers.errors import StateUnavailable
from router.context import Context
from router.events import OutageHandedOver
from router.journal import OutageJournal
from router.spans import untraced
from router.state import (
    EntryRef,
    FleetView,
    HeldLease,
    Reservation,
    Snapshot,
    Spend,
    StateStore,
    TenantRef,
)
from router.state.base import PoolStatus
from router.state.memory import MemoryStore

__all__ = ["Outage"]


class Outage:
    """This replica's side of fail_open: its fleet contact, its share, its journal."""

    def __init__(self, ctx: Context) -> None:
        self._ctx = ctx
        self.replica = "r-" + secrets.token_hex(6)
        self.store = MemoryStore("memory://fail-open", ctx.config.key_prefix)
        self._policy = ctx.config.outage_share()
        self.contact: Contact | None = None
        self.started: float | None = None  # when the current outage began
        self._until: float | None = None  # the outage ends then (the store is back)
        self._limits: dict[str, Limits] = {}  # this outage's share, per pool
        self._journal: OutageJournal | None = None
        # What this replica spent from the shared ledger after each of its contacts
        # (the registry's sequence number of the contact, spend per pool per unit).
        self._spends: list[tuple[int, dict[str, dict[str, float]]]] = [(0, {})]
        self._held: set[str] = set()  # leases the outage ledger holds now
        self._moved: set[str] = set()  # leases handed over to the shared store
        self._adopted = False  # a router that does not heartbeat handed the journal over
        self._beat: asyncio.Task[None] | None = None
        self._lock = asyncio.Lock()

    @property
    def journal(self) -> OutageJournal:
        if self._journal is None:
            self._journal = OutageJournal(self._ctx.config.journal_path(), self.replica)
        return self._journal

    @property
    def serving(self) -> bool:
        return self._ctx.config.on_state_error == "fail_open"

    async def active(self, store: StateStore) -> bool:
        """True while this replica must serve from its share (down, or just back).

        Between the two it waits out the quiet period (at most two heartbeats),
        its last batch handed over.
        """
        if self.started is None or not self.serving:
            return False
        now = self._ctx.clock()
        if self._until is None or now < self._until:
            return True
        await self.hand_over(store)
        quiet = self._until + 2 * self._ctx.config.fleet_heartbeat
        if now < quiet:
            await asyncio.sleep(quiet - now)
        self.started = self._until = None
        return False

    def share(self, ref: EntryRef) -> EntryRef:
        """``ref`` with this replica's share of what was left, for the current outage."""
        if self.started is None and self.serving:  # (fail_closed's status reads it too)
            self.started = self._ctx.clock()
            self._limits = {}
            if not self._held:  # a new outage counts from the last contact, not the last outage
                self.store = MemoryStore("memory://fail-open", self._ctx.config.key_prefix)
        limits = self._limits.get(ref.pool)
        if limits is None:  # fixed for the whole outage: the fleet's shares must not overlap
            own = {}
            if self.contact is not None:
                own = spent_since(self._spends, self.contact.fleet.oldest, ref.pool)
            limits = outage_limits(ref.limits, ref.pool, self.contact, self._policy, own)
            self._limits[ref.pool] = limits
        return replace(ref, limits=limits)

    def denial(self, pool: str, refused: Reservation) -> str:
        """Why this replica's outage ledger refused ``pool`` (for `NoProviderAvailable`)."""
        used = f"{refused.unit} {refused.used:g}/{refused.limit:g}"
        if seen(self.contact, pool):
            assert self.contact is not None
            fleet = self._policy.divisor(self.contact.fleet.replicas)
            return (
                f"state store unreachable (fail_open): this replica's share of what pool "
                f"{pool!r} had left (a fleet of {fleet}) is used up: {used}"
            )
        why = (
            "it never reached the store"
            if self.contact is None
            else "it joined too recently: not every replica has registered since"
        )
        blind = self._policy.blind
        grants = (
            "with fail_open_blind 0 it grants nothing until the store answers"
            if blind == 0
            else f"its blind share (fail_open_blind {blind:g} of each limit) is used up: {used}"
        )
        return (
            f"state store unreachable (fail_open): this replica has not seen the fleet "
            f"({why}), so it cannot know its share of pool {pool!r}; {grants}"
        )

    def spent(self, pool: str, unit: str, amount: float) -> None:
        """This replica spent ``amount`` from the shared ledger since its last contact."""
        units = self._spends[-1][1].setdefault(pool, {})
        units[unit] = units.get(unit, 0.0) + amount

    async def keep_in_touch(self, store: StateStore) -> None:
        """Heartbeat into the fleet registry from now on (fail_open replicas only).

        The first contact is made at once (one round trip, once), so a
        replica knows its share as soon as it has served; it hands over the
        outage journal it can see, as any router's first contact does.
        """
        if not self.serving:
            if not self._adopted:
                self._adopted = await self.adopt(store) is not None
            return
        if self._beat is not None and not self._beat.done():
            return
        if self.contact is None:
            await self.touch(store)
        self._beat = untraced(self._heartbeat(store))

    async def _heartbeat(self, store: StateStore) -> None:
        while True:
            await asyncio.sleep(self._ctx.config.fleet_heartbeat)
            await self.touch(store)

    async def touch(self, store: StateStore) -> None:
        """One contact: register, learn the fleet, hand over what the journal holds."""
        refs = [e.ref for e in self._ctx.entries.values()]
        ttl = self._ctx.config.fleet_heartbeat * 3
        try:
            view = await store.register_replica(self.replica, ttl, refs, self._ctx.clock())
        except StateUnavailable:
            return
        self._learn(view)
        if self.started is not None:
            await self.hand_over(store)
        else:
            await self.adopt(store)

    def _learn(self, view: FleetView) -> None:
        used = {pool: status.committed() for pool, status in view.pools.items()}
        self.contact = Contact(view.fleet, used)
        # A share counts this replica's spend from the span in which the fleet's oldest
        # contact fell; that contact only moves on, so the spans before it are done with.
        # (None does when the store lost the registry and numbers from 1 again: all count.)
        spans = enumerate(self._spends)
        first = max((i for i, (seq, _) in spans if seq <= view.fleet.oldest), default=0)
        self._spends = [*self._spends[first:], (view.fleet.seq, {})]

    def granted(
        self,
        lease_id: str,
        ref: EntryRef,
        sandbox_id: str,
        *,
        counted: bool,
        meter: Meter | None = None,
    ) -> None:
        """A lease the outage ledger granted and whose sandbox exists: journal it (with
        its price: its cost is handed over as usd spend, or its hold with it)."""
        self._held.add(lease_id)
        now = self._ctx.clock()
        ttl = self._ctx.config.lease_ttl
        tenant = ref.tenant.name if ref.tenant else None
        self.journal.granted(
            lease_id, ref.pool, ref.entry, now, ttl, sandbox_id, counted=counted, meter=meter,
            tenant=tenant,
        )  # fmt: skip

    def unanswered(self, lease_id: str, ref: EntryRef) -> None:
        """A reservation the store did not answer: journal it, for the store to refund
        if it made it (the share books this lease instead)."""
        self.journal.unanswered(lease_id, ref.pool, ref.tenant.name if ref.tenant else None)

    def released(self, lease_id: str, seconds: float) -> None:
        """Meter a journaled lease freed during the outage."""
        self._held.discard(lease_id)
        self.journal.released(lease_id, seconds)

    def moved(self, lease_id: str) -> bool:
        """True once the shared store holds this lease (it was handed over)."""
        return lease_id in self._moved

    async def adopt(self, store: StateStore) -> int | None:
        """Hand over the outage journal this router can see, if it holds anything for its
        pools: its own rows, and those of processes that are gone (a replica that ended
        during an outage). Every router that reaches the store does, before it answers.

        Returns the leases handed over, None when the store failed.
        """
        if self._journal is None and not self._ctx.config.journal_path().exists():
            return 0
        if not self.journal.pending(self._refs()):
            return 0
        return await self.hand_over(store)

    def _refs(self) -> dict[str, EntryRef]:
        """One entry's ref per pool of this router (a journal row's pool is what counts)."""
        return {e.ref.pool: e.ref for e in reversed(list(self._ctx.entries.values()))}

    async def hand_over(self, store: StateStore) -> int | None:
        """Give the store what this replica (and gone neighbours) spent while it was down.

        Returns the leases handed over, None when the store failed.
        """
        refs = self._refs()
        count = 0
        async with self._lock:
            while (batch := self.journal.take(refs)) is not None:
                journal_id, rows = batch.id, batch.leases
                # One spend per pool and tenant: each is counted to its tenant too.
                spends: dict[tuple[str, str | None], Spend] = {}
                leases: dict[tuple[str, str | None], list[HeldLease]] = defaultdict(list)
                unanswered: dict[tuple[str, str | None], list[str]] = defaultdict(list)
                for lease_id, pool, tenant in batch.unanswered:
                    spends.setdefault((pool, tenant), Spend(self._ref(refs[pool], tenant)))
                    unanswered[pool, tenant].append(lease_id)
                for row in rows:
                    key = (row.pool, row.tenant)
                    spend = spends.setdefault(key, Spend(self._ref(refs[row.pool], row.tenant)))
                    usd = 0.0
                    if row.meter is not None and row.released is not None:
                        usd = row.meter.cost(row.released, fee=row.counted)
                    spends[key] = replace(
                        spend,
                        sessions=spend.sessions + int(row.counted),
                        sandbox_seconds=spend.sandbox_seconds + (row.released or 0.0),
                        usd=spend.usd + usd,
                    )
                    if row.released is None:
                        meter = row.meter
                        if meter is not None and not row.counted:
                            meter = replace(meter, fee=0.0)
                        leases[key].append(
                            HeldLease(row.lease_id, row.entry, row.started, row.ttl,
                                      row.sandbox_id, meter)
                        )  # fmt: skip
                whole = [
                    replace(s, leases=tuple(leases[k]), unanswered=tuple(unanswered[k]))
                    for k, s in spends.items()
                ]
                try:
                    await store.reconcile(journal_id, whole, self._ctx.clock())
                except StateUnavailable:
                    return None
                self.journal.handed_over(journal_id, refs)
                count += len(rows) + len(batch.unanswered)
                for (pool, tenant), spend in spends.items():  # in the ledger now
                    self.spent(pool, "sessions", spend.sessions)
                    self.spent(pool, "sandbox_seconds", spend.sandbox_seconds)
                    self.spent(pool, "usd", spend.usd)
                    self.spent(pool, "concurrent", len(leases[pool, tenant]))
                for row in rows:
                    if row.released is None:
                        self._moved.add(row.lease_id)
                        self._held.discard(row.lease_id)
                self._ctx.emit(
                    OutageHandedOver(
                        journal_id=journal_id,
                        sessions=sum(s.sessions for s in whole),
                        sandbox_seconds=sum(s.sandbox_seconds for s in whole),
                        leases=sum(len(s.leases) for s in whole),
                        usd=sum(s.usd for s in whole),
                    )
                )
            if self.started is not None and self._until is None:
                self._until = self._ctx.clock() + 3 * self._ctx.config.fleet_heartbeat
        return count

    def _ref(self, ref: EntryRef, tenant: str | None) -> EntryRef:
        """``ref`` counting to ``tenant`` (its limits as this router's config has them)."""
        if tenant is None:
            return ref
        limits, window = self._ctx.config.tenant_limits(tenant)
        return replace(ref, tenant=TenantRef(tenant, limits, window))

    def usage(self, snap: Snapshot) -> Snapshot:
        """The outage ledger's ``snap`` plus the fleet's usage at the last contact and
        this replica's own spend since."""
        if self.contact is None:
            return snap
        pools = {}
        for name, status in snap.pools.items():
            seen, own = self.contact.used.get(name, {}), self._spends[-1][1].get(name, {})
            used = {
                unit: value + seen.get(unit, 0.0) + own.get(unit, 0.0)
                for unit, value in status.used.items()
            }
            pools[name] = PoolStatus(
                status.pool, status.window, used, status.limits, usd_held=status.usd_held
            )
        return Snapshot(pools, snap.entries)

    async def close(self, store: StateStore) -> None:
        if self._beat is not None:
            self._beat.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._beat
        if self.serving:
            await self.touch(store)  # a last hand-over while we can
            with contextlib.suppress(StateUnavailable):
                await store.deregister_replica(self.replica, self._ctx.clock())
        if self._journal is not None and self._journal.pending(self._refs()):
            self._journal.abandon()  # the next replica to reach the store hands it over
