"""Instrumentation as hooks: every routing event goes to each hook, as a typed record.

The router never logs or counts directly; it emits one of the frozen
dataclasses below and the hooks decide: `log_hook` writes one structured
log line per event (``sandbox_router.<name>``, the event's fields as
keywords) through structlog when the app configured it, else through the
stdlib logger ``sandbox_router`` (a library configures no logging: the
app's own setup decides where the lines go); the Prometheus hook in
``router.metrics`` counts. Both `match` on the classes, so mypy checks
that every field they read exists and that every event is handled
(`RouterEvent` is the closed union of them all). A hook that raises is
logged and otherwise ignored, so instrumentation can never break an
acquire.

A hook is any callable taking one event (stamina's ``RetryHook`` shape)::

    def hook(event: RouterEvent) -> None:
        match event:
            case Failover(from_entry=entry):
                ...

Every event also has ``name`` (its log name) and ``fields`` (its fields as
a dict), for hooks that only forward them.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol, assert_never

from providers.logs import Log

__all__ = [
    "AcquireFailed",
    "Acquired",
    "BreakerTransition",
    "BudgetExhausted",
    "CreateFailed",
    "Created",
    "Event",
    "Failover",
    "FreesOwed",
    "HedgeSettled",
    "HedgeStarted",
    "Hook",
    "KillAbandoned",
    "KillFailed",
    "LateCreate",
    "LeaseLost",
    "OutageHandedOver",
    "Paused",
    "QuotaChanged",
    "Reaped",
    "Refund",
    "Released",
    "Resumed",
    "RouterEvent",
    "SessionClosed",
    "SessionHeld",
    "SessionLost",
    "StateError",
    "StateWarning",
    "TaskFailed",
    "WarmClaimed",
    "WarmCreated",
    "WarmKilled",
    "WarmMissed",
    "WarmSized",
    "emit",
    "log_hook",
]

_log = Log("sandbox_router")


class Event:
    """The base of every routing event."""

    __slots__ = ()
    name: ClassVar[str]

    @property
    def fields(self) -> dict[str, Any]:
        """The event's fields by name (the keywords of its log line)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}  # type: ignore[arg-type]


@dataclass(frozen=True, slots=True)
class Acquired(Event):
    """A lease was granted: from ``entry`` after ``attempts`` creates and ``failovers``
    failed entries, or a sticky session's sandbox came back (``resumed``)."""

    name: ClassVar[str] = "acquired"
    entry: str
    lease_id: str
    sandbox_id: str
    attempts: int
    failovers: int
    latency: float
    resumed: bool = False


@dataclass(frozen=True, slots=True)
class AcquireFailed(Event):
    """No entry could serve; ``reasons`` says why, per entry."""

    name: ClassVar[str] = "acquire_failed"
    reasons: dict[str, str]
    latency: float


@dataclass(frozen=True, slots=True)
class Created(Event):
    name: ClassVar[str] = "created"
    entry: str
    latency: float


@dataclass(frozen=True, slots=True)
class CreateFailed(Event):
    """One create (or a session's reconnect) failed; ``reason`` is the error's class."""

    name: ClassVar[str] = "create_failed"
    entry: str
    reason: str
    error: str
    attempt: int
    latency: float


@dataclass(frozen=True, slots=True)
class LateCreate(Event):
    """A create the acquire stopped waiting for (its deadline passed, or the caller
    cancelled), or that failed unanswered, came to an end. ``outcome``: ``killed``
    (it answered with a sandbox: counted, and killed at once, ``seconds`` after it
    landed), ``found`` (no answer, but the lookup by its lease label found the
    sandbox it made, ``sandbox_id``: counted and killed), ``failed`` (it made
    nothing: refunded) or ``unanswered`` (nothing could tell: counted, its
    sandbox, if any, left to the janitor). ``cost``: the USD charged to the entry's
    ``pool`` for it (its sandbox fee and ``seconds`` at its price, as the ledger
    settled them; None when unpriced or refunded)."""

    name: ClassVar[str] = "late_create"
    entry: str
    lease_id: str
    outcome: str
    sandbox_id: str = ""
    seconds: float = 0.0
    cost: float | None = None
    pool: str = ""


@dataclass(frozen=True, slots=True)
class OutageHandedOver(Event):
    """The store is back and has what this replica granted while it was down
    (one journal batch, applied once): sessions, metered seconds, leases still held,
    and the USD the released ones cost."""

    name: ClassVar[str] = "outage_handed_over"
    journal_id: str
    sessions: int
    sandbox_seconds: float
    leases: int
    usd: float = 0.0


@dataclass(frozen=True, slots=True)
class HedgeStarted(Event):
    """``entry``'s create was not done ``after`` seconds in, so ``hedge_entry``'s create
    started beside it (its reservation granted first)."""

    name: ClassVar[str] = "hedge_started"
    entry: str
    hedge_entry: str
    after: float


@dataclass(frozen=True, slots=True)
class HedgeSettled(Event):
    """A hedged acquire ended: ``winner`` is the entry whose sandbox it got (``none``
    when neither create made one); the other create is followed as a late create."""

    name: ClassVar[str] = "hedge_settled"
    entry: str
    hedge_entry: str
    winner: str


@dataclass(frozen=True, slots=True)
class Failover(Event):
    """The acquire moved on from ``from_entry`` (``to_entry`` is ``none`` at the end)."""

    name: ClassVar[str] = "failover"
    from_entry: str
    to_entry: str
    reason: str


@dataclass(frozen=True, slots=True)
class Refund(Event):
    """A reservation was given back: its create failed."""

    name: ClassVar[str] = "refund"
    entry: str
    lease_id: str
    reason: str


@dataclass(frozen=True, slots=True)
class BreakerTransition(Event):
    name: ClassVar[str] = "breaker"
    entry: str
    from_state: str
    to_state: str


@dataclass(frozen=True, slots=True)
class Released(Event):
    """A lease's slot was freed; ``seconds`` metered (None: the store no longer held it).

    ``cost``: USD the lease cost (`policies.pricing.lease_cost` on its entry's
    price, the acquire's spec and ``seconds``; None with ``seconds``), ``pool`` its
    entry's quota pool.
    """

    name: ClassVar[str] = "released"
    entry: str
    lease_id: str
    seconds: float | None
    cost: float | None = None
    pool: str = ""


@dataclass(frozen=True, slots=True)
class BudgetExhausted(Event):
    """A ``usd`` budget could not renew a lease's cover (`policies.quota.cover`).

    ``ends``: when its cover ends (Unix time). ``action``: ``kill`` (the router ends
    the lease then: ``on_budget_end: kill``) or ``warn`` (it runs on, an overdraft).
    ``budget``: whose budget is short, ``pool`` (its pool's ``usd``, asked first) or
    ``tenant`` (the tenant's, named in ``tenant``: the lease's, whichever is short).
    The lease says so too (`Lease.budget_exhausted`, `Lease.budget_short`).
    """

    name: ClassVar[str] = "budget_exhausted"
    entry: str
    lease_id: str
    pool: str
    ends: float
    action: str
    budget: str = "pool"
    tenant: str | None = None


@dataclass(frozen=True, slots=True)
class LeaseLost(Event):
    """Its commit or a heartbeat found the lease gone from the store."""

    name: ClassVar[str] = "lease_lost"
    entry: str
    lease_id: str


@dataclass(frozen=True, slots=True)
class KillFailed(Event):
    """Kill ``attempt`` of a sandbox failed; it is tried again in the background (see
    `KillAbandoned`)."""

    name: ClassVar[str] = "kill_failed"
    entry: str
    sandbox_id: str
    error: str
    attempt: int = 1


@dataclass(frozen=True, slots=True)
class KillAbandoned(Event):
    """The router stopped trying to kill a sandbox: every try failed for
    `router.kills.KILL_RETRY_FOR` seconds (``reason`` "retries_ended"), or the router
    closed (``closed``). It is left to the reaper, which kills it as an orphan."""

    name: ClassVar[str] = "kill_abandoned"
    entry: str
    sandbox_id: str
    attempts: int
    error: str
    reason: str


@dataclass(frozen=True, slots=True)
class StateError(Event):
    """A state store call failed: ``operation`` (reserve, commit, record, refund,
    release, heartbeat, session, snapshot), under ``mode`` (fail_closed / fail_open).
    A failed release is kept and tried again until it lands (see `FreesOwed`)."""

    name: ClassVar[str] = "state_error"
    operation: str
    error: str
    mode: str


@dataclass(frozen=True, slots=True)
class FreesOwed(Event):
    """The router closed while ``count`` slot frees still could not reach the store:
    those slots stay taken until their leases expire (``lease_ttl``)."""

    name: ClassVar[str] = "frees_owed"
    count: int


@dataclass(frozen=True, slots=True)
class TaskFailed(Event):
    """A background task of the router ended with an error nobody else would see."""

    name: ClassVar[str] = "task_failed"
    task: str
    error: str


@dataclass(frozen=True, slots=True)
class StateWarning(Event):
    """The store works but would lose the ledger (e.g. Redis without persistence)."""

    name: ClassVar[str] = "state_warning"
    url: str
    problem: str


@dataclass(frozen=True, slots=True)
class SessionLost(Event):
    """A sticky session's sandbox cannot be used: a new one is bound."""

    name: ClassVar[str] = "session_lost"
    session: str
    entry: str
    reason: str
    sandbox_id: str = ""


@dataclass(frozen=True, slots=True)
class SessionHeld(Event):
    """An acquire of a sticky session found it held by another live lease (on any
    replica), and waits for its release (up to the acquire's timeout)."""

    name: ClassVar[str] = "session_held"
    session: str
    entry: str
    sandbox_id: str


@dataclass(frozen=True, slots=True)
class SessionClosed(Event):
    name: ClassVar[str] = "session_closed"
    session: str
    entry: str
    sandbox_id: str


@dataclass(frozen=True, slots=True)
class Paused(Event):
    """A lease's sandbox was paused: its lease ended (seconds metered, slot freed) and it
    waits for a resume (``session``: a sticky session's, else a token's)."""

    name: ClassVar[str] = "paused"
    entry: str
    lease_id: str
    sandbox_id: str
    session: str = ""


@dataclass(frozen=True, slots=True)
class Resumed(Event):
    """A paused sandbox runs again under a new lease (``session`` as in `Paused`).
    ``cost``: the USD its paused storage was charged to ``pool`` (a pause token's or a
    sticky session's, priced with ``paused_gib_hour``; else None)."""

    name: ClassVar[str] = "resumed"
    entry: str
    lease_id: str
    sandbox_id: str
    session: str = ""
    cost: float | None = None
    pool: str = ""


@dataclass(frozen=True, slots=True)
class Reaped(Event):
    """The janitor killed an orphan. ``cost``: the USD of paused storage charged to
    ``pool`` for a paused one whose token lapsed unresumed (its ``pause_ttl`` at
    ``paused_gib_hour``; else None)."""

    name: ClassVar[str] = "reaped"
    entry: str
    sandbox_id: str
    lease_id: str
    cost: float | None = None
    pool: str = ""


@dataclass(frozen=True, slots=True)
class QuotaChanged(Event):
    """An operator overwrote a pool's usage."""

    name: ClassVar[str] = "quota_changed"
    pool: str
    unit: str
    value: float


@dataclass(frozen=True, slots=True)
class WarmClaimed(Event):
    """An acquire was served by a warm sandbox (a hit): it waited ``idle`` seconds,
    ``metered`` of them charged to the pool (0 when it waited paused); ``latency``
    is its connect (or resume); ``reached``: this replica had connected to it
    ahead of the claim (`router.warm_handles`), so the claim connected nothing.
    ``cost``: the USD charged to ``pool`` for its wait (running: its fee and its
    metered seconds; paused: its storage at ``paused_gib_hour``), None unpriced."""

    name: ClassVar[str] = "warm_claimed"
    entry: str
    lease_id: str
    sandbox_id: str
    paused: bool
    idle: float
    metered: float
    latency: float
    reached: bool = False
    cost: float | None = None
    pool: str = ""


@dataclass(frozen=True, slots=True)
class WarmMissed(Event):
    """An acquire a warm sandbox of ``entry`` would have served found none ready."""

    name: ClassVar[str] = "warm_missed"
    entry: str


@dataclass(frozen=True, slots=True)
class WarmCreated(Event):
    """The refill put a new sandbox in ``entry``'s warm pool (``paused`` when parked:
    ``cost``, what was charged to ``pool`` for it then, its fee and its seconds until
    the pause; a running one's is charged when it is claimed or killed)."""

    name: ClassVar[str] = "warm_created"
    entry: str
    sandbox_id: str
    paused: bool
    latency: float
    cost: float | None = None
    pool: str = ""


@dataclass(frozen=True, slots=True)
class WarmSized(Event):
    """The vendor's own warm pool for ``entry`` (``warm.server``) was set to ``size``
    sandboxes (0: drained while the entry fails, ``reason`` says why, or dropped from
    the config); the vendor held ``ready`` of them then."""

    name: ClassVar[str] = "warm_sized"
    entry: str
    size: int
    ready: int
    reason: str | None


@dataclass(frozen=True, slots=True)
class WarmKilled(Event):
    """A warm sandbox left the pool unclaimed and was killed. ``reason``: ``max_idle``,
    ``unreachable`` (a claim could not connect to it), or ``drained: <why>`` (the
    entry failed: ``open``, ``misconfigured``, ``exhausted``, ``quota``). It waited
    ``idle`` seconds, ``metered`` of them charged to the pool; ``cost`` as in
    `WarmClaimed`."""

    name: ClassVar[str] = "warm_killed"
    entry: str
    sandbox_id: str
    reason: str
    paused: bool
    idle: float
    metered: float
    cost: float | None = None
    pool: str = ""


RouterEvent = (
    Acquired
    | AcquireFailed
    | Created
    | CreateFailed
    | LateCreate
    | HedgeStarted
    | HedgeSettled
    | OutageHandedOver
    | Failover
    | Refund
    | BreakerTransition
    | Released
    | BudgetExhausted
    | LeaseLost
    | KillFailed
    | KillAbandoned
    | StateError
    | FreesOwed
    | TaskFailed
    | StateWarning
    | SessionLost
    | SessionHeld
    | SessionClosed
    | Paused
    | Resumed
    | Reaped
    | QuotaChanged
    | WarmClaimed
    | WarmMissed
    | WarmCreated
    | WarmKilled
    | WarmSized
)


class Hook(Protocol):
    """Called with every event the router emits (on the router's loop: keep it quick)."""

    def __call__(self, event: RouterEvent, /) -> None: ...


def log_hook(event: RouterEvent) -> None:
    """One structured log line per event, at warning level for trouble."""
    match event:
        case (
            Failover()
            | Refund()
            | StateError()
            | FreesOwed()
            | TaskFailed()
            | LeaseLost()
            | BudgetExhausted()
            | KillFailed()
            | KillAbandoned()
            | LateCreate()
            | OutageHandedOver()
            | AcquireFailed()
            | QuotaChanged()
            | StateWarning()
            | SessionLost()
            | Reaped()
            | WarmKilled(reason="unreachable")
            | BreakerTransition(to_state="open")
        ):
            _line(logging.WARNING, event.name, event.fields)
        case (
            Acquired()
            | Created()
            | CreateFailed()
            | HedgeStarted()
            | HedgeSettled()
            | BreakerTransition()
            | Released()
            | SessionClosed()
            | SessionHeld()
            | Paused()
            | Resumed()
            | WarmClaimed()
            | WarmMissed()
            | WarmCreated()
            | WarmKilled()
            | WarmSized()
        ):
            _line(logging.INFO, event.name, event.fields)
        case _:
            assert_never(event)


def _line(level: int, name: str, fields: dict[str, Any], *, exc_info: bool = False) -> None:
    """One log line: structlog's when the app set it up, else the stdlib logger's."""
    _log.line(level, f"sandbox_router.{name}", fields, exc_info=exc_info)


def emit(hooks: Sequence[Hook], event: RouterEvent) -> None:
    for hook in hooks:
        try:
            hook(event)
        except Exception:  # a broken hook must not break routing
            with contextlib.suppress(Exception):
                fields = {"hook": repr(hook), "event_name": event.name}
                _line(logging.ERROR, "hook_failed", fields, exc_info=True)
