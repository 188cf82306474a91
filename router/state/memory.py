"""An in-process store: one process only, nothing persisted.

For tests, for ``sandbox-router exec`` experiments, and as the per-replica
fallback ledger when ``on_state_error: fail_open`` and the shared store is
down.
"""

from __future__ import annotations

import collections
import copy
import dataclasses
import heapq
import threading
from collections.abc import Callable, Collection, Mapping
from typing import TypeVar

from policies.breaker import BreakerState
from policies.quota import LeaseSlot
from router.state.tables import Tables, TableStore

__all__ = ["MemoryStore"]

T = TypeVar("T")


class _Tables:
    """`Tables` in dicts; loads and saves copy, so a caller never aliases a row.

    Each pool's leases have a heap of (expiry, id) to find the expired ones;
    a pair whose lease is gone or has moved its expiry is stale and skipped.
    """

    def __init__(self) -> None:
        self.usage_rows: dict[tuple[str, str], tuple[int, float, float]] = {}
        self.slots: dict[str, dict[str, LeaseSlot]] = collections.defaultdict(dict)
        self.expiry: dict[str, list[tuple[float, str]]] = collections.defaultdict(list)
        self.counts: dict[str, dict[str, int]] = collections.defaultdict(dict)
        self.entries: dict[str, BreakerState] = {}
        # Insertion order is roughly expiry order, so `put` prunes from the front.
        self.rows: dict[str, collections.OrderedDict[str, tuple[str, float]]] = (
            collections.defaultdict(collections.OrderedDict)
        )

    def usage(self, pool: str, window: str) -> tuple[int, float, float]:
        return self.usage_rows.get((pool, window), (0, 0.0, 0.0))

    def save_usage(self, pool: str, window: str, sessions: int, seconds: float, usd: float) -> None:
        self.usage_rows[(pool, window)] = (sessions, seconds, usd)

    def leases(
        self, pool: str, ids: Collection[str], expired_at: float | None
    ) -> dict[str, LeaseSlot]:
        stored = self.slots[pool]
        found = {lid: dataclasses.replace(stored[lid]) for lid in ids if lid in stored}
        heap, live = self.expiry[pool], []
        while expired_at is not None and heap and heap[0][0] <= expired_at:
            expires, lid = heapq.heappop(heap)
            slot = stored.get(lid)
            if slot is not None and slot.expires == expires:
                found.setdefault(lid, dataclasses.replace(slot))
                live.append((expires, lid))
        for pair in live:  # still held until the caller drops them
            heapq.heappush(heap, pair)
        return found

    def save_leases(
        self, pool: str, leases: Mapping[str, LeaseSlot], dropped: Collection[str]
    ) -> None:
        stored = self.slots[pool]
        for lid in dropped:
            stored.pop(lid, None)
        for lid, slot in leases.items():
            old = stored.get(lid)
            if old is None or old.expires != slot.expires:
                heapq.heappush(self.expiry[pool], (slot.expires, lid))
            stored[lid] = dataclasses.replace(slot)

    def held(self, pool: str) -> dict[str, int]:
        return dict(self.counts[pool])

    def count_held(self, pool: str, deltas: Mapping[str, int]) -> None:
        counts = self.counts[pool]
        for entry, n in deltas.items():
            counts[entry] = counts.get(entry, 0) + n
            if counts[entry] <= 0:
                del counts[entry]

    def lease_ids(self, pool: str, now: float) -> set[str]:
        return {lid for lid, slot in self.slots[pool].items() if slot.expires > now}

    def load_entry(self, entry: str) -> BreakerState:
        return copy.deepcopy(self.entries.get(entry) or BreakerState())

    def save_entry(self, entry: str, state: BreakerState) -> None:
        self.entries[entry] = copy.deepcopy(state)

    def get(self, table: str, key: str) -> tuple[str, float] | None:
        return self.rows[table].get(key)

    def put(self, table: str, key: str, value: str, expires: float, now: float) -> None:
        rows = self.rows[table]
        while rows and next(iter(rows.values()))[1] <= now:
            rows.popitem(last=False)
        rows[key] = (value, expires)
        rows.move_to_end(key)

    def delete(self, table: str, key: str) -> None:
        self.rows[table].pop(key, None)

    def live(self, table: str, now: float) -> dict[str, tuple[str, float]]:
        rows = self.rows[table]
        for key in [k for k, (_, expires) in rows.items() if expires <= now]:
            del rows[key]
        return dict(rows)


class MemoryStore(TableStore):
    def __init__(self, url: str = "memory://", prefix: str = "sandbox-router") -> None:
        self.url = url
        self.prefix = prefix
        self._lock = threading.Lock()
        self._tables: Tables = _Tables()

    async def _transact(self, fn: Callable[[Tables], T]) -> T:
        with self._lock:
            return fn(self._tables)
