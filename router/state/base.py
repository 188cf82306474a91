"""The state store contract: quota ledger, leases and entry health, fleet-wide.

Each method is one atomic decision (a Lua script on Redis, one IMMEDIATE
transaction on SQLite) so replicas racing for the last unit never both win.
Stores that apply the pure policies in-process (SQLite, memory) share
`apply_reserve` and friends below; the Redis store runs the same rules in
Lua. One contract suite (``tests/state``) runs against every store.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass, field
from typing import Protocol

from policies import breaker, quota
from policies.breaker import BreakerConfig, BreakerState, Outcome
from policies.quota import Limits, MonthlyWindow, PoolState

__all__ = [
    "EntryRef",
    "EntryStatus",
    "PoolStatus",
    "Reservation",
    "SessionBinding",
    "Settlement",
    "Snapshot",
    "StateStore",
]


@dataclass(frozen=True, slots=True)
class EntryRef:
    """Everything a store needs to know about one chain entry.

    Attributes:
        entry: the entry's name; pool: its quota pool's name.
        limits / window: the pool's limits and window.
        fingerprint: a digest of the entry's config; a ``misconfigured`` block
            lasts until it changes.
    """

    entry: str
    pool: str
    limits: Limits
    window: MonthlyWindow
    fingerprint: str = ""


@dataclass(frozen=True, slots=True)
class Reservation:
    """The answer to `StateStore.reserve`."""

    granted: bool
    probe: bool = False
    reason: str = ""  # breaker reason (open, half_open, misconfigured...) or "quota"
    until: float = 0.0
    unit: str = ""
    used: float = 0.0
    limit: float = 0.0
    detail: str = ""
    transition: tuple[str, str] | None = None


@dataclass(frozen=True, slots=True)
class Settlement:
    """The answer to `StateStore.settle`: did the ledger change, did the circuit."""

    applied: bool
    transition: tuple[str, str] | None = None


@dataclass(frozen=True, slots=True)
class PoolStatus:
    pool: str
    window: str
    used: dict[str, float]
    limits: dict[str, float | None]


@dataclass(frozen=True, slots=True)
class EntryStatus:
    entry: str
    breaker: BreakerState
    live_leases: int


@dataclass(frozen=True, slots=True)
class SessionBinding:
    """A sticky session's sandbox: where it lives and until when it is kept."""

    entry: str
    sandbox_id: str
    expires: float


@dataclass(slots=True)
class Snapshot:
    """The fleet's state as one read: for status, the CLI and metrics."""

    pools: dict[str, PoolStatus] = field(default_factory=dict)
    entries: dict[str, EntryStatus] = field(default_factory=dict)


class StateStore(abc.ABC):
    """Shared state for one router configuration (namespaced by ``prefix``)."""

    url: str
    prefix: str

    @abc.abstractmethod
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
        """Admit through the breaker and reserve a session and a slot.

        ``new_session=False`` reserves only a slot (reconnecting to a sticky
        session's existing sandbox creates nothing).
        """

    @abc.abstractmethod
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
        """Commit (outcome SUCCESS: the lease goes live for ``ttl``) or refund."""

    @abc.abstractmethod
    async def release(self, ref: EntryRef, lease_id: str, now: float) -> float | None:
        """Free the lease's slot and meter its seconds; None if it was not held."""

    @abc.abstractmethod
    async def heartbeat(self, ref: EntryRef, lease_id: str, now: float, ttl: float) -> bool:
        """Extend a live lease; False when it had already expired."""

    @abc.abstractmethod
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
        """Record a health outcome outside an acquire (a reconnect, a probe)."""

    @abc.abstractmethod
    async def snapshot(self, refs: list[EntryRef], now: float) -> Snapshot:
        """Usage of every pool and health of every entry, in one read."""

    @abc.abstractmethod
    async def set_usage(self, ref: EntryRef, unit: str, value: float, now: float) -> None:
        """Overwrite a pool's used amount in the current window (operators)."""

    @abc.abstractmethod
    async def lease_ids(self, ref: EntryRef, now: float) -> set[str]:
        """Ids of the pool's unexpired leases (reserved or live)."""

    @abc.abstractmethod
    async def bind_session(
        self, session: str, entry: str, sandbox_id: str, expires: float, now: float
    ) -> None:
        """Bind (or re-bind) a sticky session to a sandbox until ``expires``."""

    @abc.abstractmethod
    async def session(self, session: str, now: float) -> SessionBinding | None:
        """The session's live binding, or None."""

    @abc.abstractmethod
    async def unbind_session(self, session: str) -> None: ...

    @abc.abstractmethod
    async def bound_sandboxes(self, now: float) -> set[tuple[str, str]]:
        """(entry, sandbox_id) of every live session binding (the janitor keeps them)."""

    @abc.abstractmethod
    async def lock(self, name: str, token: str, ttl: float, now: float) -> bool:
        """Take a fleet-wide lock for ``ttl`` seconds; False when someone holds it."""

    @abc.abstractmethod
    async def unlock(self, name: str, token: str) -> None:
        """Release the lock if ``token`` still holds it."""

    @abc.abstractmethod
    async def ping(self) -> None:
        """Raise StateUnavailable when the store cannot be reached."""

    async def warnings(self) -> list[str]:
        """Operational problems worth a warning at start (e.g. no persistence)."""
        return []

    async def close(self) -> None:  # noqa: B027 - optional hook
        """Release connections."""

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.url} prefix={self.prefix!r}>"


class Ledger(Protocol):
    """Row access inside one transaction, for stores applying the pure policies."""

    def load_pool(self, pool: str, window: str) -> PoolState: ...
    def save_pool(self, pool: str, state: PoolState) -> None: ...
    def load_entry(self, entry: str) -> BreakerState: ...
    def save_entry(self, entry: str, state: BreakerState) -> None: ...


def apply_reserve(
    tx: Ledger,
    ref: EntryRef,
    cfg: BreakerConfig,
    lease_id: str,
    now: float,
    hold: float,
    new_session: bool = True,
) -> Reservation:
    pool = tx.load_pool(ref.pool, ref.window.key(now))
    if lease_id in pool.leases:  # a retried call whose reply was lost: already granted
        return Reservation(True)
    health = tx.load_entry(ref.entry)
    admission = breaker.admit(health, cfg, now, ref.fingerprint)
    if not admission.allowed:
        tx.save_entry(ref.entry, health)
        return Reservation(
            False, reason=admission.reason, until=admission.until, detail=health.block_detail
        )
    verdict = quota.reserve(pool, ref.limits, lease_id, ref.entry, now, hold, new_session)
    if isinstance(verdict, quota.QuotaDenial):
        if admission.probe:
            health.probe_until = 0.0
        tx.save_entry(ref.entry, health)
        tx.save_pool(ref.pool, pool)
        return Reservation(
            False,
            reason="quota",
            unit=verdict.unit,
            used=verdict.used,
            limit=verdict.limit,
            until=ref.window.reset_at(now).timestamp(),
        )
    tx.save_entry(ref.entry, health)
    tx.save_pool(ref.pool, pool)
    return Reservation(True, probe=admission.probe, transition=admission.transition)


def apply_settle(
    tx: Ledger,
    ref: EntryRef,
    cfg: BreakerConfig,
    lease_id: str,
    now: float,
    outcome: Outcome,
    ttl: float,
    detail: str,
    until: float | None,
    sandbox_id: str = "",
) -> Settlement:
    pool = tx.load_pool(ref.pool, ref.window.key(now))
    if outcome is Outcome.SUCCESS:
        applied = quota.commit(pool, lease_id, now, ttl, sandbox_id)
    else:
        applied = quota.refund(pool, lease_id)
    tx.save_pool(ref.pool, pool)
    health = tx.load_entry(ref.entry)
    transition = breaker.record(
        health, cfg, outcome, now, fingerprint=ref.fingerprint, detail=detail, until=until
    )
    tx.save_entry(ref.entry, health)
    return Settlement(applied, transition)


def apply_release(tx: Ledger, ref: EntryRef, lease_id: str, now: float) -> float | None:
    pool = tx.load_pool(ref.pool, ref.window.key(now))
    seconds = quota.release(pool, lease_id, now)
    tx.save_pool(ref.pool, pool)
    if seconds is None:
        return None
    health = tx.load_entry(ref.entry)
    if health.block == breaker.CAPACITY:
        breaker.clear_capacity(health)
        tx.save_entry(ref.entry, health)
    return seconds


def apply_heartbeat(tx: Ledger, ref: EntryRef, lease_id: str, now: float, ttl: float) -> bool:
    pool = tx.load_pool(ref.pool, ref.window.key(now))
    alive = quota.heartbeat(pool, lease_id, now, ttl)
    tx.save_pool(ref.pool, pool)
    return alive


def apply_record(
    tx: Ledger,
    ref: EntryRef,
    cfg: BreakerConfig,
    outcome: Outcome,
    now: float,
    detail: str,
    until: float | None,
) -> tuple[str, str] | None:
    health = tx.load_entry(ref.entry)
    transition = breaker.record(
        health, cfg, outcome, now, fingerprint=ref.fingerprint, detail=detail, until=until
    )
    tx.save_entry(ref.entry, health)
    return transition


def apply_snapshot(tx: Ledger, refs: list[EntryRef], now: float) -> Snapshot:
    snap = Snapshot()
    live: dict[str, dict[str, int]] = {}
    for ref in refs:
        if ref.pool not in snap.pools:
            pool = tx.load_pool(ref.pool, ref.window.key(now))
            counts: dict[str, int] = {}
            for slot in pool.leases.values():
                if slot.expires > now:
                    counts[slot.entry] = counts.get(slot.entry, 0) + 1
            live[ref.pool] = counts
            used = {u: pool.used(u) for u in quota.UNITS}
            used["concurrent"] = float(sum(counts.values()))
            snap.pools[ref.pool] = PoolStatus(
                ref.pool, pool.window, used, {u: ref.limits.get(u) for u in quota.UNITS}
            )
        snap.entries[ref.entry] = EntryStatus(
            ref.entry, tx.load_entry(ref.entry), live[ref.pool].get(ref.entry, 0)
        )
    return snap


def apply_lease_ids(tx: Ledger, ref: EntryRef, now: float) -> set[str]:
    pool = tx.load_pool(ref.pool, ref.window.key(now))
    return {lid for lid, slot in pool.leases.items() if slot.expires > now}


def apply_set_usage(tx: Ledger, ref: EntryRef, unit: str, value: float, now: float) -> None:
    if unit not in ("sessions", "sandbox_seconds"):
        raise ValueError(f"unit must be sessions or sandbox_seconds, got {unit!r}")
    pool = tx.load_pool(ref.pool, ref.window.key(now))
    if unit == "sessions":
        pool.sessions = int(value)
    else:
        pool.sandbox_seconds = float(value)
    tx.save_pool(ref.pool, pool)
