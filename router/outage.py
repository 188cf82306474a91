"""Serving through a state-store outage (``on_state_error: fail_open``).

Three things make a fleet's outage spend safe, all kept here:

* the fleet registry: while the store is up, the replica heartbeats into it
  every ``fleet_heartbeat`` seconds and keeps what it learns (a `Contact`:
  the live fleet's size, each pool's usage, the fleet's spend rate);
* the share: when the store goes away, the replica's outage ledger (an
  in-memory store) gets the limits `policies.outage.outage_limits` computes
  from the last contact, fixed for the whole outage;
* the journal (`router.journal`): every lease the outage ledger grants is
  written to disk, with its seconds once released, and handed over to the
  store with `StateStore.reconcile` when it answers again, exactly once. A
  lease still held then moves to the store, which meters it from then on.

When the store answers again the replica keeps serving from its share for
three more heartbeats (the registry's TTL), then grants nothing for two more
while it hands over its last batch. Every live replica hands over within a
heartbeat of the others, so by the time any goes back to the shared ledger,
the ledger knows the whole outage's spend.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from collections import defaultdict
from dataclasses import replace

from policies.outage import Contact, outage_limits
from policies.quota import Limits
from providers.errors import StateUnavailable
from router.context import Context
from router.events import OutageHandedOver
from router.journal import OutageJournal
from router.state import EntryRef, FleetView, HeldLease, Snapshot, Spend, StateStore
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
        self.answered = 0.0  # the store's last answer: the fleet could spend until then
        self._limits: dict[str, Limits] = {}  # this outage's share, per pool
        self._journal: OutageJournal | None = None
        self._own: dict[str, dict[str, float]] = {}  # spent since the contact, per pool
        self._held: set[str] = set()  # leases the outage ledger holds now
        self._moved: set[str] = set()  # leases handed over to the shared store
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
            own = self._own.get(ref.pool)
            margin = self._ctx.config.fleet_heartbeat / 2  # the rate's error: half a heartbeat
            limits = outage_limits(
                ref.limits, ref.pool, self.contact, self._policy, self.answered, own, margin
            )
            self._limits[ref.pool] = limits
        return replace(ref, limits=limits)

    def spent(self, pool: str, unit: str, amount: float) -> None:
        """This replica spent ``amount`` from the shared ledger since its last contact."""
        units = self._own.setdefault(pool, {})
        units[unit] = units.get(unit, 0.0) + amount

    async def keep_in_touch(self, store: StateStore) -> None:
        """Heartbeat into the fleet registry from now on (fail_open replicas only).

        The first contact is made at once (one round trip, once), so a
        replica knows its share as soon as it has served.
        """
        if not self.serving or (self._beat is not None and not self._beat.done()):
            return
        if self.contact is None:
            await self.touch(store)
        self._beat = asyncio.create_task(self._heartbeat(store))

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
        self.answered = self._ctx.clock()
        self._learn(view)
        owed = self._journal is not None or self._ctx.config.journal_path().exists()
        if self.started is not None or (owed and self.journal.pending()):
            await self.hand_over(store)

    def _learn(self, view: FleetView) -> None:
        now = self._ctx.clock()
        self._own = {}
        used = {pool: dict(status.used) for pool, status in view.pools.items()}
        if self.contact is None:
            self.contact = Contact(now, view.replicas, used)
        else:
            self.contact = self.contact.then(now, view.replicas, used)

    def granted(self, lease_id: str, ref: EntryRef, sandbox_id: str, *, counted: bool) -> None:
        """A lease the outage ledger granted and whose sandbox exists: journal it."""
        self._held.add(lease_id)
        now = self._ctx.clock()
        ttl = self._ctx.config.lease_ttl
        self.journal.granted(lease_id, ref.pool, ref.entry, now, ttl, sandbox_id, counted=counted)

    def released(self, lease_id: str, seconds: float) -> None:
        """Meter a journaled lease freed during the outage."""
        self._held.discard(lease_id)
        self.journal.released(lease_id, seconds)

    def moved(self, lease_id: str) -> bool:
        """True once the shared store holds this lease (it was handed over)."""
        return lease_id in self._moved

    async def hand_over(self, store: StateStore) -> None:
        """Give the store what this replica (and gone neighbours) spent while it was down."""
        async with self._lock:
            while (batch := self.journal.take()) is not None:
                journal_id, rows = batch
                spends: dict[str, Spend] = {}
                leases: dict[str, list[HeldLease]] = defaultdict(list)
                for row in rows:
                    entry = self._ctx.entries.get(row.entry)
                    if entry is None:
                        continue
                    spend = spends.setdefault(row.pool, Spend(entry.ref))
                    spends[row.pool] = replace(
                        spend,
                        sessions=spend.sessions + int(row.counted),
                        sandbox_seconds=spend.sandbox_seconds + (row.released or 0.0),
                    )
                    if row.released is None:
                        leases[row.pool].append(
                            HeldLease(row.lease_id, row.entry, row.started, row.ttl, row.sandbox_id)
                        )
                whole = [replace(s, leases=tuple(leases[p])) for p, s in spends.items()]
                try:
                    await store.reconcile(journal_id, whole, self._ctx.clock())
                except StateUnavailable:
                    return
                self.journal.handed_over(journal_id)
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
                    )
                )
            if self.started is not None and self._until is None:
                self._until = self._ctx.clock() + 3 * self._ctx.config.fleet_heartbeat

    def usage(self, snap: Snapshot) -> Snapshot:
        """The outage ledger's ``snap`` plus the fleet's usage at the last contact and
        this replica's own spend since."""
        if self.contact is None:
            return snap
        pools = {}
        for name, status in snap.pools.items():
            seen, own = self.contact.used.get(name, {}), self._own.get(name, {})
            used = {
                unit: value + seen.get(unit, 0.0) + own.get(unit, 0.0)
                for unit, value in status.used.items()
            }
            pools[name] = PoolStatus(status.pool, status.window, used, status.limits)
        return Snapshot(pools, snap.entries)

    async def close(self, store: StateStore) -> None:
        if self._beat is not None:
            self._beat.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._beat
        if self.serving:
            await self.touch(store)  # a last hand-over while we can
            with contextlib.suppress(StateUnavailable):
                await store.deregister_replica(self.replica)
        if self._journal is not None and self._journal.pending():
            self._journal.abandon()  # the next replica to reach the store hands it over
