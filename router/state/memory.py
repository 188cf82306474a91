"""An in-process store: one process only, nothing persisted.

For tests, for ``sandbox-router exec`` experiments, and as the per-replica
fallback ledger when ``on_state_error: fail_open`` and the shared store is
down.
"""

from __future__ import annotations

import collections
import copy
import threading
from collections.abc import Callable
from typing import TypeVar

from policies.breaker import BreakerState
from policies.quota import LeaseSlot, PoolState
from router.state.tables import Tables, TableStore

__all__ = ["MemoryStore"]

T = TypeVar("T")


class _Tables:
    """`Tables` in dicts; loads and saves copy, so a caller never aliases a row."""

    def __init__(self) -> None:
        self.usage: dict[tuple[str, str], tuple[int, float]] = {}
        self.leases: dict[str, dict[str, LeaseSlot]] = {}
        self.entries: dict[str, BreakerState] = {}
        # Insertion order is roughly expiry order, so `put` prunes from the front.
        self.rows: dict[str, collections.OrderedDict[str, tuple[str, float]]] = (
            collections.defaultdict(collections.OrderedDict)
        )

    def load_pool(self, pool: str, window: str) -> PoolState:
        sessions, seconds = self.usage.get((pool, window), (0, 0.0))
        return PoolState(window, sessions, seconds, copy.deepcopy(self.leases.get(pool, {})))

    def save_pool(self, pool: str, state: PoolState) -> None:
        self.usage[(pool, state.window)] = (state.sessions, state.sandbox_seconds)
        self.leases[pool] = copy.deepcopy(state.leases)

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
