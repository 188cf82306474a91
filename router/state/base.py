"""The state store contract: quota ledger, leases and entry health, fleet-wide.

A store is assembled from capabilities, each an abstract base holding the
calls of one concern (limits' ``Storage`` with its ``MovingWindowSupport``
is the model): `LedgerSupport` (quota units, lease slots, entry health),
`SessionSupport` (sticky session bindings), `LockSupport` (fleet-wide
locks) and `FleetSupport` (the replica registry and the reconcile of an
outage's spend). `StateStore` is all of them plus the connection's upkeep;
the router holds one.

Each call is one atomic decision (a Lua script on Redis, one transaction on
SQLite and memory, see `router.state.tables`) so replicas racing for the
last unit never both win. One contract suite (``tests/state``) runs against
every store.
"""

from __future__ import annotations

import abc
from collections.abc import Awaitable
from dataclasses import dataclass, field

from policies.breaker import BreakerConfig, BreakerState, Outcome
from policies.quota import Limits, MonthlyWindow
from router.state.warm import Claim, WarmSupport

__all__ = [
    "CALL_MEMORY",
    "JOURNAL_MEMORY",
    "EntryRef",
    "EntryStatus",
    "FleetSupport",
    "FleetView",
    "HeldLease",
    "LedgerSupport",
    "LockSupport",
    "PoolStatus",
    "Reservation",
    "SessionBinding",
    "SessionSupport",
    "Settlement",
    "Snapshot",
    "Spend",
    "StateStore",
]

CALL_MEMORY = 300.0  # seconds a store keeps a call's answer for a retry of it
JOURNAL_MEMORY = 14 * 24 * 3600.0  # seconds a store remembers a reconciled journal id


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
    claimed: Claim | None = None  # a warm sandbox handed to this reservation (see WarmSupport)
    version: int = 0  # a quota denial's: the pool's limits version (see `PoolStatus`)


@dataclass(frozen=True, slots=True)
class Settlement:
    """The answer to `StateStore.settle`: did the ledger change, did the circuit."""

    applied: bool
    transition: tuple[str, str] | None = None


@dataclass(frozen=True, slots=True)
class PoolStatus:
    """A pool's usage in ``window``; ``version`` moves on with every operator change of
    it (`LedgerSupport.set_usage`), so a replica knows its remembered exhaustion is stale."""

    pool: str
    window: str
    used: dict[str, float]
    limits: dict[str, float | None]
    version: int = 0


@dataclass(frozen=True, slots=True)
class EntryStatus:
    entry: str
    breaker: BreakerState
    live_leases: int


@dataclass(frozen=True, slots=True)
class SessionBinding:
    """A sticky session's sandbox: where it lives, until when it is kept, and whether it
    was paused (a binding written before the field existed reads as not paused)."""

    entry: str
    sandbox_id: str
    expires: float
    paused: bool = False


@dataclass(slots=True)
class Snapshot:
    """The fleet's state as one read: for status, the CLI and metrics."""

    pools: dict[str, PoolStatus] = field(default_factory=dict)
    entries: dict[str, EntryStatus] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class FleetView:
    """What a replica learns at each contact: the live fleet and the pools' usage."""

    replicas: int  # live replicas, the caller included
    pools: dict[str, PoolStatus]


@dataclass(frozen=True, slots=True)
class HeldLease:
    """A lease a replica granted while the store was down and still holds."""

    lease_id: str
    entry: str
    started: float
    ttl: float
    sandbox_id: str = ""


@dataclass(frozen=True, slots=True)
class Spend:
    """What one replica spent from one pool while the store was down.

    ``sandbox_seconds`` are those of leases already released; a lease still
    held goes in ``leases`` and is metered from ``started`` when released.
    """

    ref: EntryRef
    sessions: int = 0
    sandbox_seconds: float = 0.0
    leases: tuple[HeldLease, ...] = ()


class LedgerSupport(abc.ABC):
    """Quota units, lease slots and entry health: the decisions of an acquire.

    The calls that change the ledger take a ``call_id``: a call repeated with
    the same id within `CALL_MEMORY` seconds (a retry after a lost reply)
    returns the first answer and applies nothing. Without one, the store
    gives the call its own id, which its internal retries share. A heartbeat
    needs none: repeating it sets the same expiry.

    `settle` and `release` return an awaitable: a coroutine, or a future of a
    call already sent (the Redis store). The router commits and frees a
    lease off the caller's path with ``asyncio.ensure_future``, which then
    costs no task where the store sends at once.
    """

    @abc.abstractmethod
    def reserve(
        self,
        ref: EntryRef,
        cfg: BreakerConfig,
        lease_id: str,
        now: float,
        hold: float,
        *,
        new_session: bool = True,
        warm: bool = False,
        call_id: str = "",
    ) -> Awaitable[Reservation]:
        """Admit through the breaker and reserve a session and a slot.

        ``new_session=False`` reserves only a slot (reconnecting to a sticky
        session's existing sandbox creates nothing). ``warm=True`` first
        claims a ready warm sandbox of the entry when one is (never for the
        half-open probe): ``Reservation.claimed`` names it, and its lease id
        replaces ``lease_id`` (`policies.warm.claim`). Redis sends it before
        returning (a posted call): a caller cancelled meanwhile still gets its
        answer to a callback (`Ledger.book`), with no task to pay for.
        """

    @abc.abstractmethod
    def settle(
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
        call_id: str = "",
    ) -> Awaitable[Settlement]:
        """Commit (outcome SUCCESS: the lease goes live for ``ttl``) or refund."""

    @abc.abstractmethod
    def release(
        self, ref: EntryRef, lease_id: str, now: float, *, call_id: str = ""
    ) -> Awaitable[float | None]:
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
        call_id: str = "",
    ) -> tuple[str, str] | None:
        """Record a health outcome outside an acquire (a reconnect, a probe)."""

    @abc.abstractmethod
    async def snapshot(self, refs: list[EntryRef], now: float) -> Snapshot:
        """Usage of every pool and health of every entry, in one read."""

    @abc.abstractmethod
    async def set_usage(self, ref: EntryRef, unit: str, value: float, now: float) -> None:
        """Overwrite a pool's used amount in the current window (operators); bumps the
        pool's limits version (`PoolStatus.version`, a quota denial's `Reservation.version`)."""

    @abc.abstractmethod
    async def lease_ids(self, ref: EntryRef, now: float) -> set[str]:
        """Ids of the pool's unexpired leases (reserved or live)."""


class SessionSupport(abc.ABC):
    """Sticky sessions: which sandbox a session name is bound to, until when."""

    @abc.abstractmethod
    async def bind_session(
        self,
        session: str,
        entry: str,
        sandbox_id: str,
        expires: float,
        now: float,
        *,
        paused: bool = False,
        kept: bool = False,
    ) -> bool:
        """Bind (or re-bind) a sticky session to a sandbox until ``expires``; ``paused``:
        its sandbox is paused (a resume wakes it rather than connects). ``kept``: only
        while its live binding names this sandbox (a lease keeping its session); False
        when it did not bind."""

    @abc.abstractmethod
    async def session(self, session: str, now: float) -> SessionBinding | None:
        """The session's live binding, or None."""

    @abc.abstractmethod
    async def unbind_session(self, session: str) -> None: ...

    @abc.abstractmethod
    async def bound_sandboxes(self, now: float) -> set[tuple[str, str]]:
        """(entry, sandbox_id) of every live session binding (the janitor keeps them)."""


class LockSupport(abc.ABC):
    """Fleet-wide locks with a TTL, so a crashed holder cannot keep one."""

    @abc.abstractmethod
    async def lock(self, name: str, token: str, ttl: float, now: float) -> bool:
        """Take a fleet-wide lock for ``ttl`` seconds; False when someone holds it."""

    @abc.abstractmethod
    async def unlock(self, name: str, token: str) -> None:
        """Release the lock if ``token`` still holds it."""


class FleetSupport(abc.ABC):
    """The fleet of replicas, and the spend of an outage written back once.

    While the store is up each replica registers itself with a TTL and learns
    the live fleet size and what its pools had used; during an outage it can
    serve its share of what was left (the router's fail_open). When the store
    returns, it reconciles what it spent, keyed by a journal id.
    """

    @abc.abstractmethod
    async def register_replica(
        self, replica: str, ttl: float, refs: list[EntryRef], now: float
    ) -> FleetView:
        """Mark ``replica`` live for ``ttl`` seconds; the live fleet and ``refs``' pools."""

    @abc.abstractmethod
    async def deregister_replica(self, replica: str) -> None:
        """Leave the fleet at once (a clean shutdown) rather than at the TTL."""

    @abc.abstractmethod
    async def reconcile(self, journal_id: str, spends: list[Spend], now: float) -> int:
        """Add each spend to its pool's current window, once per journal id and pool.

        Returns how many pools it applied now: a repeat of a journal already
        applied (within `JOURNAL_MEMORY`) applies nothing and returns 0 for it.
        Held leases take their slots (live until ``now + ttl``) unless the
        store already holds that lease id.
        """


SETTABLE_UNITS = (
    "sessions",
    "sandbox_seconds",
)  # `StateStore.set_usage`; concurrent is live leases


class StateStore(LedgerSupport, SessionSupport, LockSupport, FleetSupport, WarmSupport):
    """Shared state for one router configuration (namespaced by ``prefix``)."""

    url: str
    prefix: str

    @abc.abstractmethod
    async def ping(self) -> None:
        """Raise StateUnavailable when the store cannot be reached."""

    async def warnings(self) -> list[str]:
        """Operational problems worth a warning at start (e.g. no persistence)."""
        return []

    async def close(self) -> None:
        """Release connections."""

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.url} prefix={self.prefix!r}>"
