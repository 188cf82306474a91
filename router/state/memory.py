"""An in-process store: one process only, nothing persisted.

For tests, for ``sandbox-router exec`` experiments, and as the per-replica
fallback ledger when ``on_state_error: fail_open`` and the shared store is
down.
"""

from __future__ import annotations

import copy
import threading

from policies.breaker import BreakerConfig, BreakerState, Outcome
from policies.quota import LeaseSlot, PoolState
from router.state import base
from router.state.base import EntryRef, Reservation, Settlement, Snapshot, StateStore

__all__ = ["MemoryStore"]


class _Tables:
    def __init__(self) -> None:
        self.usage: dict[tuple[str, str], tuple[int, float]] = {}
        self.leases: dict[str, dict[str, LeaseSlot]] = {}
        self.entries: dict[str, BreakerState] = {}

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


class MemoryStore(StateStore):
    def __init__(self, url: str = "memory://", prefix: str = "sandbox-router") -> None:
        self.url = url
        self.prefix = prefix
        self._lock = threading.Lock()
        self._tables = _Tables()

    async def reserve(
        self, ref: EntryRef, cfg: BreakerConfig, lease_id: str, now: float, hold: float
    ) -> Reservation:
        with self._lock:
            return base.apply_reserve(self._tables, ref, cfg, lease_id, now, hold)

    async def settle(
        self,
        ref: EntryRef,
        cfg: BreakerConfig,
        lease_id: str,
        now: float,
        *,
        outcome: Outcome,
        ttl: float = 0.0,
        detail: str = "",
        until: float | None = None,
    ) -> Settlement:
        with self._lock:
            return base.apply_settle(
                self._tables, ref, cfg, lease_id, now, outcome, ttl, detail, until
            )

    async def release(self, ref: EntryRef, lease_id: str, now: float) -> float | None:
        with self._lock:
            return base.apply_release(self._tables, ref, lease_id, now)

    async def heartbeat(self, ref: EntryRef, lease_id: str, now: float, ttl: float) -> bool:
        with self._lock:
            return base.apply_heartbeat(self._tables, ref, lease_id, now, ttl)

    async def record(
        self,
        ref: EntryRef,
        cfg: BreakerConfig,
        outcome: Outcome,
        now: float,
        *,
        detail: str = "",
        until: float | None = None,
    ) -> tuple[str, str] | None:
        with self._lock:
            return base.apply_record(self._tables, ref, cfg, outcome, now, detail, until)

    async def snapshot(self, refs: list[EntryRef], now: float) -> Snapshot:
        with self._lock:
            return base.apply_snapshot(self._tables, refs, now)

    async def set_usage(self, ref: EntryRef, unit: str, value: float, now: float) -> None:
        with self._lock:
            base.apply_set_usage(self._tables, ref, unit, value, now)

    async def ping(self) -> None:
        return None
