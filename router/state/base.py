"""The state store contract: quota ledger, leases and entry health, fleet-wide.

A store is assembled from capabilities, each an abstract base holding the
calls of one concern (limits' ``Storage`` with its ``MovingWindowSupport``
is the model): `LedgerSupport` (quota units, lease slots, entry health),
`SessionSupport` (sticky session bindings), `LockSupport` (fleet-wide
locks), `FleetSupport` (the replica registry and the reconcile of an
outage's spend), `WarmSupport` (warm pools) and `PausedSupport` (paused
storage's holds). `StateStore` is all of them plus the connection's upkeep;
the router holds one.

Each call is one atomic decision (a Lua script on Redis, one transaction on
SQLite and memory, see `router.state.tables`) so replicas racing for the
last unit never both win. One contract suite (``tests/state``) runs against
every store.
"""

from __future__ import annotations

import abc
from collections.abc import Awaitable, Collection
from dataclasses import dataclass, field

from policies.breaker import BreakerConfig, BreakerState, Outcome
from policies.fleet import Registration
from policies.quota import Limits, Meter, MonthlyWindow, Renewal, ShortOf
from policies.sessions import SessionBinding, SessionClaim
from policies.tenants import TenantLimits, TenantWindow
from router.state.paused import PausedSupport
from router.state.warm import Claim, WarmSupport

__all__ = [
    "CALL_MEMORY",
    "FLEET_MEMORY",
    "JOURNAL_MEMORY",
    "EntryRef",
    "EntryStatus",
    "FleetSupport",
    "FleetView",
    "HeldLease",
    "LedgerSupport",
    "LockSupport",
    "PoolStatus",
    "Renewal",
    "Reservation",
    "SessionBinding",
    "SessionClaim",
    "SessionSupport",
    "Settlement",
    "Snapshot",
    "Spend",
    "StateStore",
    "TenantRef",
    "TenantUsage",
]

CALL_MEMORY = 300.0  # seconds a store keeps a call's answer for a retry of it
JOURNAL_MEMORY = 14 * 24 * 3600.0  # seconds a store remembers a reconciled journal id
FLEET_MEMORY = 24 * 3600.0  # seconds the fleet registry's sequence outlives its last contact


@dataclass(frozen=True, slots=True)
class TenantRef:
    """The tenant a lease is counted to, its limits and window (`policies.tenants`)."""

    name: str
    limits: TenantLimits
    window: TenantWindow


@dataclass(frozen=True, slots=True)
class EntryRef:
    """Everything a store needs to know about one chain entry.

    Attributes:
        entry: the entry's name; pool: its quota pool's name.
        limits / window: the pool's limits and window.
        fingerprint: a digest of the entry's config; a ``misconfigured`` block
            lasts until it changes.
        tenant: the tenant a lease's calls count to as well (in the same
            atomic call), None for none.
    """

    entry: str
    pool: str
    limits: Limits
    window: MonthlyWindow
    fingerprint: str = ""
    tenant: TenantRef | None = None


@dataclass(frozen=True, slots=True)
class Reservation:
    """The answer to `StateStore.reserve`."""

    granted: bool
    probe: bool = False
    reason: str = ""  # breaker reason (open, half_open, misconfigured...), "quota" or "tenant"
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
    """The answer to `StateStore.settle`: did the ledger change, did the circuit; a
    commit's ``short_at`` is when its lease's cover ends when the ``usd`` budget could
    not cover its first TTL (`policies.quota.Renewal`), else 0; ``short_of`` which
    budget could not: its pool's or its tenant's."""

    applied: bool
    transition: tuple[str, str] | None = None
    short_at: float = 0.0
    short_of: ShortOf | None = None


@dataclass(frozen=True, slots=True)
class PoolStatus:
    """A pool's usage in ``window``; ``version`` moves on with every operator change of
    it (`LedgerSupport.set_usage`), so a replica knows its remembered exhaustion is stale.
    ``used["usd"]`` is the window's settled spend; ``usd_held`` what the live leases hold
    on top of it (`policies.quota`)."""

    pool: str
    window: str
    used: dict[str, float]
    limits: dict[str, float | None]
    version: int = 0
    usd_held: float = 0.0

    def committed(self) -> dict[str, float]:
        """``used`` with the holds counted as spent (what a new lease must fit beside)."""
        return {**self.used, "usd": self.used.get("usd", 0.0) + self.usd_held}


@dataclass(frozen=True, slots=True)
class TenantUsage:
    """A tenant's spend in one window (`LedgerSupport.tenants`): ``usd`` settled,
    ``usd_held`` what its live leases hold, ``concurrent`` how many it holds."""

    tenant: str
    window: str
    sessions: int
    usd: float
    usd_held: float = 0.0
    concurrent: int = 0


@dataclass(frozen=True, slots=True)
class EntryStatus:
    entry: str
    breaker: BreakerState
    live_leases: int


@dataclass(slots=True)
class Snapshot:
    """The fleet's state as one read: for status, the CLI and metrics."""

    pools: dict[str, PoolStatus] = field(default_factory=dict)
    entries: dict[str, EntryStatus] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class FleetView:
    """What a replica learns at each contact: the fleet (`policies.fleet`) and the
    pools' usage."""

    fleet: Registration
    pools: dict[str, PoolStatus]


@dataclass(frozen=True, slots=True)
class HeldLease:
    """A lease a replica granted while the store was down and still holds."""

    lease_id: str
    entry: str
    started: float
    ttl: float
    sandbox_id: str = ""
    meter: Meter | None = None  # its price: the store holds its cover from then on


@dataclass(frozen=True, slots=True)
class Spend:
    """What one replica spent from one pool while the store was down.

    ``sandbox_seconds`` are those of leases already released, ``usd`` their cost
    (and a late create's: `Ledger.charge`); a lease still held goes in
    ``leases`` and is metered from ``started`` when released.
    ``unanswered`` are the lease ids whose reservation the replica sent as the
    store went down and never heard back about: the store may have made them,
    and nothing commits them now (the replica booked from its share instead),
    so reconcile refunds each it still holds as a reservation, before the rest.
    """

    ref: EntryRef
    sessions: int = 0
    sandbox_seconds: float = 0.0
    leases: tuple[HeldLease, ...] = ()
    unanswered: tuple[str, ...] = ()
    usd: float = 0.0


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
        meter: Meter | None = None,
        call_id: str = "",
    ) -> Awaitable[Reservation]:
        """Admit through the breaker and reserve a session and a slot.

        ``meter`` prices the lease: its first cover is held against the pool's
        ``usd`` limit (`policies.quota.reserve`), denied as unit ``usd``.
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
        """Commit (outcome SUCCESS: the lease goes live for ``ttl``) or refund (its
        ``usd`` hold given back)."""

    @abc.abstractmethod
    def release(
        self, ref: EntryRef, lease_id: str, now: float, *, call_id: str = ""
    ) -> Awaitable[float | None]:
        """Free the lease's slot, meter its seconds and settle its ``usd`` hold to their
        cost; None if it was not held."""

    @abc.abstractmethod
    async def heartbeat(self, ref: EntryRef, lease_id: str, now: float, ttl: float) -> Renewal:
        """Extend a live lease and its ``usd`` cover (`policies.quota.heartbeat`); not
        alive when it had already expired."""

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

    @abc.abstractmethod
    async def tenants(self, window: TenantWindow, now: float, top: int) -> list[TenantUsage]:
        """The ``top`` tenants of the window containing ``now`` by usd spent (then
        sessions), highest first: ``sandbox-router cost --tenants``."""


class SessionSupport(abc.ABC):
    """Sticky sessions: which sandbox a session name is bound to, until when, and who
    holds it now (one holder at a time: the rules are `policies.sessions`')."""

    @abc.abstractmethod
    async def claim_session(
        self, session: str, holder: str, expires: float, now: float
    ) -> SessionClaim:
        """Hold ``session`` for ``holder`` until ``expires``, unless another holder has it
        (`SessionClaim.busy`); the binding it names as found, None for none yet."""

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
        holder: str = "",
    ) -> bool:
        """Bind (or re-bind) a sticky session to a sandbox until ``expires``, held by
        ``holder`` ("" for nobody); ``paused``: its sandbox is paused (a resume wakes it
        rather than connects). Refused (False) while another holder has the session;
        ``kept``: only while its live binding names this sandbox and this holder (a
        lease keeping its session)."""

    @abc.abstractmethod
    async def release_session(
        self,
        session: str,
        holder: str,
        expires: float,
        now: float,
        *,
        sandbox_id: str = "",
        paused: bool | None = None,
        drop: bool = False,
    ) -> bool:
        """``holder`` lets go of the session (of its binding to ``sandbox_id``, when
        given): kept unheld until ``expires``, marked ``paused`` (None: as it was), or
        deleted when ``drop`` or it names no sandbox. False when ``holder`` did not hold
        it (nothing changes)."""

    @abc.abstractmethod
    async def session(self, session: str, now: float) -> SessionBinding | None:
        """The session's live binding to a sandbox, or None."""

    @abc.abstractmethod
    async def take_session(self, session: str, now: float) -> SessionBinding | None:
        """Forget the session at once; the live binding it had (its holder included),
        or None."""

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
        """Register ``replica`` for ``ttl`` seconds (`policies.fleet.register`): the
        fleet it learns, and ``refs``' pools."""

    @abc.abstractmethod
    async def deregister_replica(self, replica: str, now: float) -> None:
        """Leave the fleet (a clean shutdown): it no longer holds back the others' views
        (`policies.fleet.deregister`)."""

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
    "usd",
)  # `StateStore.set_usage`; concurrent is live leases


class StateStore(
    LedgerSupport, SessionSupport, LockSupport, FleetSupport, WarmSupport, PausedSupport
):
    """Shared state for one router configuration (namespaced by ``prefix``)."""

    url: str
    prefix: str

    @abc.abstractmethod
    async def ping(self) -> None:
        """Raise StateUnavailable when the store cannot be reached."""

    async def warnings(self, refs: Collection[EntryRef], now: float) -> list[str]:
        """Operational problems worth a warning at start (e.g. no persistence, or the
        ledger of ``refs`` kept where this store does not read it)."""
        return []

    async def close(self) -> None:
        """Release connections."""

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.url} prefix={self.prefix!r}>"
