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
from router.state.base import (
    EntryRef,
    Reservation,
    SessionBinding,
    Settlement,
    Snapshot,
    StateStore,
)

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
        self._sessions: dict[str, SessionBinding] = {}
        self._locks: dict[str, tuple[str, float]] = {}

    async def reserve(
        self,
        ref: EntryRef,
        cfg: BreakerConfig,
        lease_id: str,
        now: float,
        hold: float,
        *,
        new_session: bool = True,
    ) -> Reservation:
        with self._lock:
            return base.apply_reserve(self._tables, ref, cfg, lease_id, now, hold, new_session)

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
        sandbox_id: str = "",
    ) -> Settlement:
        with self._lock:
            return base.apply_settle(
                self._tables, ref, cfg, lease_id, now, outcome, ttl, detail, until, sandbox_id
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

    async def lease_ids(self, ref: EntryRef, now: float) -> set[str]:
        with self._lock:
            return base.apply_lease_ids(self._tables, ref, now)

    async def bind_session(
        self, session: str, entry: str, sandbox_id: str, expires: float, now: float
    ) -> None:
        with self._lock:
            self._sessions[session] = SessionBinding(entry, sandbox_id, expires)

    async def session(self, session: str, now: float) -> SessionBinding | None:
        with self._lock:
            binding = self._sessions.get(session)
            return binding if binding is not None and binding.expires > now else None

    async def unbind_session(self, session: str) -> None:
        with self._lock:
            self._sessions.pop(session, None)

    async def bound_sandboxes(self, now: float) -> set[tuple[str, str]]:
        with self._lock:
            return {(b.entry, b.sandbox_id) for b in self._sessions.values() if b.expires > now}

    async def lock(self, name: str, token: str, ttl: float, now: float) -> bool:
        with self._lock:
            holder = self._locks.get(name)
            if holder is not None and holder[1] > now:
                return False
            self._locks[name] = (token, now + ttl)
            return True

    async def unlock(self, name: str, token: str) -> None:
        with self._lock:
            if self._locks.get(name, ("", 0.0))[0] == token:
                del self._locks[name]

    async def ping(self) -> None:
        return None
