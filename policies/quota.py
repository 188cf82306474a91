"""Quota windows and the quota ledger of one pool, as pure functions.

A pool is one provider account's allowance, shared by every chain entry that
names it. Three units are counted:

* ``sessions``: sandboxes created in the current window (reserved before the
  create, refunded when it fails);
* ``sandbox_seconds``: lease time, metered when a lease is released (or,
  for a crashed app's lease, when it expires: up to its expiry);
* ``concurrent``: live leases, including ones whose create is in flight.

A grant is all-or-nothing across the units. ``sandbox_seconds`` is known
only on release, so it admits while the used seconds are below the limit;
the overshoot is bounded by what the live leases run for.

The Redis store runs the same rules as Lua scripts (``router/state/lua``);
``tests/policies`` checks the two against each other.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from zoneinfo import ZoneInfo

__all__ = [
    "UNITS",
    "Grant",
    "LeaseSlot",
    "Limits",
    "MonthlyWindow",
    "PoolState",
    "QuotaDenial",
    "check",
    "commit",
    "heartbeat",
    "projected_exhaustion",
    "purge_expired",
    "refund",
    "release",
    "remaining_fraction",
    "reserve",
]

UNITS = ("sessions", "sandbox_seconds", "concurrent")
RECONNECT_UNITS = ("sandbox_seconds", "concurrent")


@dataclass(frozen=True, slots=True)
class Limits:
    """A pool's limits; None means unlimited in that unit."""

    sessions: int | None = None
    sandbox_seconds: float | None = None
    concurrent: int | None = None

    def get(self, unit: str) -> float | None:
        value: float | None = getattr(self, unit)
        return value


@dataclass(frozen=True, slots=True)
class MonthlyWindow:
    """A calendar month in ``timezone`` that starts on ``reset_day``.

    A reset day past the end of a short month falls on that month's last day
    (reset_day 31 resets on 30 April and 28/29 February).
    """

    timezone: str = "UTC"
    reset_day: int = 1

    def __post_init__(self) -> None:
        if not 1 <= self.reset_day <= 31:
            raise ValueError(f"reset_day must be 1..31, got {self.reset_day}")
        ZoneInfo(self.timezone)  # raises for an unknown zone

    def _start_in(self, year: int, month: int) -> datetime:
        last = _days_in_month(year, month)
        return datetime(year, month, min(self.reset_day, last), tzinfo=ZoneInfo(self.timezone))

    def bounds(self, now: float) -> tuple[datetime, datetime]:
        """The [start, end) of the window containing the instant ``now``."""
        local = datetime.fromtimestamp(now, ZoneInfo(self.timezone))
        start = self._start_in(local.year, local.month)
        if local < start:
            year, month = _shift(local.year, local.month, -1)
            start = self._start_in(year, month)
        year, month = _shift(start.year, start.month, 1)
        return start, self._start_in(year, month)

    def key(self, now: float) -> str:
        """A stable name of the window containing ``now`` (its start date)."""
        return self.bounds(now)[0].strftime("%Y-%m-%d")

    def reset_at(self, now: float) -> datetime:
        return self.bounds(now)[1]


def _days_in_month(year: int, month: int) -> int:
    ny, nm = _shift(year, month, 1)
    return (datetime(ny, nm, 1) - timedelta(days=1)).day


def _shift(year: int, month: int, delta: int) -> tuple[int, int]:
    index = year * 12 + (month - 1) + delta
    return index // 12, index % 12 + 1


@dataclass(slots=True)
class LeaseSlot:
    """A concurrency slot: reserved while creating, live once committed."""

    entry: str
    started: float
    expires: float
    ttl: float
    live: bool = False
    counted: bool = True  # took a session unit (False: reconnect to a session's sandbox)
    sandbox_id: str = ""


@dataclass(slots=True)
class PoolState:
    """A pool's usage in one window plus its leases (the fleet's ledger)."""

    window: str
    sessions: int = 0
    sandbox_seconds: float = 0.0
    leases: dict[str, LeaseSlot] = field(default_factory=dict)

    def used(self, unit: str) -> float:
        if unit == "concurrent":
            return len(self.leases)
        value: float = getattr(self, unit)
        return value


@dataclass(frozen=True, slots=True)
class QuotaDenial:
    unit: str
    used: float
    limit: float


@dataclass(frozen=True, slots=True)
class Grant:
    lease_id: str


def purge_expired(state: PoolState, now: float) -> list[str]:
    """Drop expired leases, charging each its seconds until it expired.

    The app that held it is gone (crashed), so its sandbox may have run until
    then: charging the whole lease errs on the side of never overspending.
    """
    expired = [lid for lid, slot in state.leases.items() if slot.expires <= now]
    for lid in expired:
        slot = state.leases.pop(lid)
        if slot.live:
            state.sandbox_seconds += max(0.0, slot.expires - slot.started)
    return expired


def check(state: PoolState, limits: Limits, units: tuple[str, ...] = UNITS) -> QuotaDenial | None:
    """The first of ``units`` with nothing left, or None when a grant fits."""
    for unit in units:
        limit = limits.get(unit)
        if limit is not None and state.used(unit) >= limit:
            return QuotaDenial(unit, state.used(unit), limit)
    return None


def reserve(
    state: PoolState,
    limits: Limits,
    lease_id: str,
    entry: str,
    now: float,
    hold: float,
    new_session: bool = True,
) -> Grant | QuotaDenial:
    """Reserve one session and one slot for ``hold`` seconds, or say which unit is out.

    ``new_session=False`` (reconnecting to a sticky session's sandbox) takes a
    slot but no session: nothing new is created.
    """
    purge_expired(state, now)
    denial = check(state, limits, UNITS if new_session else RECONNECT_UNITS)
    if denial is not None:
        return denial
    if new_session:
        state.sessions += 1
    state.leases[lease_id] = LeaseSlot(entry, now, now + hold, hold, counted=new_session)
    return Grant(lease_id)


def commit(state: PoolState, lease_id: str, now: float, ttl: float, sandbox_id: str = "") -> bool:
    """Turn a reservation into a live lease with ``ttl``; False if it was lost."""
    slot = state.leases.get(lease_id)
    if slot is None:
        return False
    slot.live, slot.started, slot.expires, slot.ttl = True, now, now + ttl, ttl
    slot.sandbox_id = sandbox_id
    return True


def refund(state: PoolState, lease_id: str) -> bool:
    """Give back a reservation whose create failed; False if already gone."""
    slot = state.leases.pop(lease_id, None)
    if slot is None or slot.live:
        if slot is not None:
            state.leases[lease_id] = slot
        return False
    if slot.counted:
        state.sessions = max(0, state.sessions - 1)
    return True


def heartbeat(state: PoolState, lease_id: str, now: float, ttl: float) -> bool:
    """Extend a live lease; False if it already expired (its slot is gone)."""
    slot = state.leases.get(lease_id)
    if slot is None or slot.expires <= now:
        return False
    slot.expires, slot.ttl = now + ttl, ttl
    return True


def release(state: PoolState, lease_id: str, now: float) -> float | None:
    """Free the slot and meter its seconds; None if the lease was not held."""
    slot = state.leases.pop(lease_id, None)
    if slot is None:
        return None
    seconds = max(0.0, min(now, slot.expires) - slot.started) if slot.live else 0.0
    state.sandbox_seconds += seconds
    return seconds


def remaining_fraction(used: Mapping[str, float], limits: Limits) -> float:
    """The smallest fraction left over the limited units (1.0 when unlimited)."""
    fraction = 1.0
    for unit in UNITS:
        limit = limits.get(unit)
        if limit is not None:
            left = 1.0 - used.get(unit, 0.0) / limit if limit > 0 else 0.0
            fraction = min(fraction, max(0.0, left))
    return fraction


def projected_exhaustion(
    used: float, limit: float | None, start: float, now: float
) -> float | None:
    """When ``used`` reaches ``limit`` at the window's average rate so far (a timestamp).

    None when the unit is unlimited or nothing was used yet; ``now`` when it
    is already exhausted.
    """
    if limit is None or used <= 0 or now <= start:
        return None
    if used >= limit:
        return now
    rate = used / (now - start)
    return now + (limit - used) / rate
