"""Quota windows and the quota ledger of one pool, as pure functions.

A pool is one provider account's allowance, shared by every chain entry that
names it. Four units are counted:

* ``sessions``: sandboxes created in the current window (reserved before the
  create, refunded when it fails);
* ``sandbox_seconds``: lease time, metered when a lease is released (or,
  for a crashed app's lease, when it expires: up to its expiry);
* ``concurrent``: live leases, including ones whose create is in flight;
* ``usd``: dollars, exact under concurrency (below).

A grant is all-or-nothing across the units. ``sandbox_seconds`` is known
only on release, so it admits while the used seconds are below the limit;
the overshoot is bounded by what the live leases run for.

``usd`` is never overshot that way: a lease priced by a `Meter` HOLDS its
worst case from its reservation on (its sandbox fee plus its rate times the
seconds it is covered for: its lifetime, else the renewable window), and a
reservation is admitted only when the window's spend plus every lease's
hold plus its own fits the limit. The release settles the hold to the
metered cost (the fee, and the rate times the seconds rounded up to the
vendor's step: `policies.pricing.lease_cost`); a refund gives it back; a
lease that expires (its app crashed) is charged until its expiry, which a
lease's cover never passes. A cover ends where the billing steps its hold
pays for end (`LeaseSlot.paid`): a vendor billing whole minutes charges the
minute a lease starts, so the lease may run it out without more money.
Whenever a lease's ledger expiry would pass its cover's end (a commit, a
heartbeat), the cover grows by whole renewal windows if
the budget holds them; if not, the lease is `Renewal.short`: with
``kill`` its expiry stops at the cover's end (the router ends the sandbox
then), else the cover grows anyway (an overdraft the pool's hold shows, so
nothing new is admitted while it lasts).

The Redis store runs the same rules as Lua scripts (``router/state/lua``);
``tests/policies`` checks the two against each other.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Literal
from zoneinfo import ZoneInfo

__all__ = [
    "COUNTED_UNITS",
    "UNITS",
    "Grant",
    "LeaseSlot",
    "Limits",
    "Meter",
    "MonthlyWindow",
    "PoolState",
    "QuotaDenial",
    "Renewal",
    "ShortOf",
    "check",
    "commit",
    "cover",
    "heartbeat",
    "metered",
    "projected_exhaustion",
    "projected_spend",
    "purge_expired",
    "refund",
    "release",
    "remaining_fraction",
    "reserve",
    "settle_usd",
]

UNITS = ("sessions", "sandbox_seconds", "concurrent", "usd")
COUNTED_UNITS = ("sessions", "sandbox_seconds", "concurrent")  # `check`'s: usd has its own
RECONNECT_UNITS = ("sandbox_seconds", "concurrent")
ShortOf = Literal["pool", "tenant"]  # the budget that could not renew a lease's cover


@dataclass(frozen=True, slots=True)
class Limits:
    """A pool's limits; None means unlimited in that unit."""

    sessions: int | None = None
    sandbox_seconds: float | None = None
    concurrent: int | None = None
    usd: float | None = None

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


@dataclass(frozen=True, slots=True)
class Meter:
    """What one lease costs in USD, as the ledger holds and settles it.

    Attributes:
        rate: USD per second of the running sandbox (`policies.pricing.rate`).
        fee: USD per sandbox made (charged once the vendor made it).
        step: the vendor's billing step in seconds, rounded up (0: exact).
        first: the seconds the first hold covers (the lease's lifetime, else
            ``renew``).
        renew: the seconds each renewal adds to the cover (``budget_window``).
        kill: the lease ends when the budget cannot renew its cover
            (``on_budget_end: kill``); else it runs on, as an overdraft.
    """

    rate: float
    fee: float = 0.0
    step: float = 0.0
    first: float = 3600.0
    renew: float = 3600.0
    kill: bool = False

    def cost(self, seconds: float, fee: bool = True) -> float:
        """USD ``seconds`` of running cost, rounded up to the step, plus the fee."""
        return _cost(self.rate, self.fee if fee else 0.0, self.step, seconds)


def metered(seconds: float, step: float) -> float:
    """The seconds a vendor bills: whole steps, rounded up (`policies.pricing.metered`)."""
    if seconds <= 0:
        return 0.0
    if step <= 0:
        return seconds
    # The tolerance keeps a float just over a whole step (60.000000001) in that step.
    return math.ceil(seconds / step - 1e-9) * step


def _cost(rate: float, fee: float, step: float, seconds: float) -> float:
    return rate * metered(seconds, step) + fee


@dataclass(slots=True)
class LeaseSlot:
    """A concurrency slot: reserved while creating, live once committed.

    A priced one (``rate`` or ``fee``, from its `Meter`) holds `hold` USD: its
    cost for the ``covered`` seconds from ``started``; ``short`` once the
    budget could not renew that cover.
    """

    entry: str
    started: float
    expires: float
    ttl: float
    live: bool = False
    counted: bool = True  # took a session unit (False: reconnect to a session's sandbox)
    sandbox_id: str = ""
    rate: float = 0.0
    fee: float = 0.0
    step: float = 0.0
    renew: float = 0.0
    covered: float = 0.0
    kill: bool = False
    short: bool = False

    @property
    def priced(self) -> bool:
        return self.rate > 0 or self.fee > 0

    def paid(self) -> float:
        """Seconds its cover pays for: ``covered`` rounded up to the vendor's step (a
        step-billed vendor charges the whole step it starts, so the cover ends there)."""
        return metered(self.covered, self.step)

    def hold(self) -> float:
        """USD this lease holds against its pool's budget."""
        return _cost(self.rate, self.fee, self.step, self.covered) if self.priced else 0.0

    def charge(self, seconds: float) -> float:
        """USD it costs when metered ``seconds`` (the fee: a sandbox was made)."""
        return _cost(self.rate, self.fee, self.step, seconds) if self.priced else 0.0


@dataclass(slots=True)
class PoolState:
    """A pool's usage in one window plus its leases (the fleet's ledger)."""

    window: str
    sessions: int = 0
    sandbox_seconds: float = 0.0
    leases: dict[str, LeaseSlot] = field(default_factory=dict)
    usd: float = 0.0  # settled spend in the window
    usd_held: float = 0.0  # every lease's hold (the pool's, whatever the window)

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


@dataclass(frozen=True, slots=True)
class Renewal:
    """A heartbeat's answer: is the lease alive, and did its budget run short.

    ``short_at`` (0: not short) is when the cover of a lease whose renewal the
    budget refused ends; ``short_of`` which budget refused it (`cover`); truthy
    as ``alive``.
    """

    alive: bool
    short_at: float = 0.0
    short_of: ShortOf | None = None

    def __bool__(self) -> bool:
        return self.alive


def settle_usd(state: PoolState, slot: LeaseSlot, seconds: float, *, fee: bool = True) -> float:
    """Drop ``slot``'s hold and charge it ``seconds`` (its fee when ``fee``); the USD."""
    if not slot.priced:
        return 0.0
    state.usd_held = max(0.0, state.usd_held - slot.hold())
    charged = _cost(slot.rate, slot.fee if fee else 0.0, slot.step, seconds)
    state.usd += charged
    return charged


def cover(
    state: PoolState, slot: LeaseSlot, limits: Limits, also: tuple[float, float] | None = None
) -> ShortOf | None:
    """Grow ``slot``'s cover (its end: `LeaseSlot.paid`) to its ledger expiry by whole
    renewals, if the budget holds them; None when they fit, else which budget cannot
    (``short``, see the module's docstring): ``"pool"`` (asked first) or ``"tenant"``.
    ``also`` is a second budget the renewal must fit, as (spent and held, limit): its
    tenant's (`policies.tenants`)."""
    need = slot.expires - slot.started
    if not slot.priced or need <= slot.paid() or slot.renew <= 0:
        return None
    grown = _grown(slot.covered, slot.renew, slot.step, need)
    extra = slot.rate * (metered(grown, slot.step) - metered(slot.covered, slot.step))
    short: ShortOf | None = None
    if limits.usd is not None and state.usd + state.usd_held + extra > limits.usd:
        short = "pool"
    elif also is not None and also[0] + extra > also[1]:
        short = "tenant"
    slot.short = short is not None
    if short and slot.kill:
        slot.expires = slot.started + slot.paid()
        return short
    state.usd_held += extra
    slot.covered = grown
    return short


def _grown(covered: float, renew: float, step: float, need: float) -> float:
    """``covered`` grown by the fewest whole ``renew`` windows whose paid steps reach
    ``need`` seconds (a window's seconds inside a step already paid add nothing)."""
    if step <= 0:
        return covered + math.ceil((need - covered) / renew - 1e-9) * renew
    steps = math.ceil(need / step - 1e-9)  # the steps ``need`` takes, as `metered` counts
    windows = max(1, math.floor(((steps - 1) * step - covered) / renew))
    while metered(covered + windows * renew, step) < need:
        windows += 1
    return covered + windows * renew


def purge_expired(state: PoolState, now: float) -> list[str]:
    """Drop expired leases, charging each its seconds until it expired.

    The app that held it is gone (crashed), so its sandbox may have run until
    then: charging the whole lease errs on the side of never overspending.
    """
    expired = [lid for lid, slot in state.leases.items() if slot.expires <= now]
    for lid in expired:
        slot = state.leases.pop(lid)
        seconds = max(0.0, slot.expires - slot.started) if slot.live else 0.0
        state.sandbox_seconds += seconds
        settle_usd(state, slot, seconds, fee=slot.counted)
    return expired


def check(
    state: PoolState, limits: Limits, units: tuple[str, ...] = COUNTED_UNITS
) -> QuotaDenial | None:
    """The first of ``units`` with nothing left, or None when a grant fits (``usd`` is
    `reserve`'s: it admits by the hold)."""
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
    meter: Meter | None = None,
    admit: Callable[[LeaseSlot], QuotaDenial | None] | None = None,
) -> Grant | QuotaDenial:
    """Reserve one session and one slot for ``hold`` seconds, or say which unit is out.

    ``new_session=False`` (reconnecting to a sticky session's sandbox) takes a
    slot but no session: nothing new is created, so ``meter``'s fee is not
    held. A ``meter`` holds its first cover against ``limits.usd``. ``admit``
    is asked last, with the slot the pool would grant, before anything is
    spent: its denial refuses the grant (the lease's tenant, `policies.tenants`).
    """
    purge_expired(state, now)
    denial = check(state, limits, COUNTED_UNITS if new_session else RECONNECT_UNITS)
    if denial is not None:
        return denial
    slot = LeaseSlot(entry, now, now + hold, hold, counted=new_session)
    if meter is not None and (meter.rate > 0 or (meter.fee > 0 and new_session)):
        slot.rate, slot.fee, slot.step = meter.rate, meter.fee if new_session else 0.0, meter.step
        slot.renew, slot.covered, slot.kill = meter.renew, meter.first, meter.kill
        held = state.usd + state.usd_held
        if limits.usd is not None and held + slot.hold() > limits.usd:
            return QuotaDenial("usd", held, limits.usd)
    if admit is not None and (denial := admit(slot)) is not None:
        return denial
    state.usd_held += slot.hold()
    if new_session:
        state.sessions += 1
    state.leases[lease_id] = slot
    return Grant(lease_id)


def commit(
    state: PoolState,
    lease_id: str,
    now: float,
    ttl: float,
    sandbox_id: str = "",
    limits: Limits = Limits(),
    also: tuple[float, float] | None = None,
) -> Renewal:
    """Turn a reservation into a live lease with ``ttl`` (its cover metered from now on,
    grown to ``ttl`` if short of it: `cover`); not alive if it was lost."""
    slot = state.leases.get(lease_id)
    if slot is None:
        return Renewal(False)
    slot.live, slot.started, slot.expires, slot.ttl = True, now, now + ttl, ttl
    slot.sandbox_id = sandbox_id
    return _renewal(state, slot, limits, also)


def _renewal(
    state: PoolState, slot: LeaseSlot, limits: Limits, also: tuple[float, float] | None
) -> Renewal:
    short = cover(state, slot, limits, also)
    if short is None:
        return Renewal(True)
    return Renewal(True, slot.started + slot.paid(), short)


def refund(state: PoolState, lease_id: str) -> bool:
    """Give back a reservation whose create failed; False if already gone."""
    slot = state.leases.pop(lease_id, None)
    if slot is None or slot.live:
        if slot is not None:
            state.leases[lease_id] = slot
        return False
    if slot.counted:
        state.sessions = max(0, state.sessions - 1)
    state.usd_held = max(0.0, state.usd_held - slot.hold())
    return True


def heartbeat(
    state: PoolState,
    lease_id: str,
    now: float,
    ttl: float,
    limits: Limits = Limits(),
    also: tuple[float, float] | None = None,
) -> Renewal:
    """Extend a live lease (its cover with it: `cover`); not alive if it already expired
    (its slot is gone)."""
    slot = state.leases.get(lease_id)
    if slot is None or slot.expires <= now:
        return Renewal(False)
    slot.expires, slot.ttl = now + ttl, ttl
    return _renewal(state, slot, limits, also)


def release(state: PoolState, lease_id: str, now: float) -> float | None:
    """Free the slot, meter its seconds and settle its hold to their cost; None if the
    lease was not held. A reservation never committed is charged its fee (a late
    create's sandbox was made: its session stays spent too)."""
    slot = state.leases.pop(lease_id, None)
    if slot is None:
        return None
    seconds = max(0.0, min(now, slot.expires) - slot.started) if slot.live else 0.0
    state.sandbox_seconds += seconds
    settle_usd(state, slot, seconds, fee=slot.counted)
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


def projected_spend(spent: float, start: float, end: float, now: float) -> float:
    """What a window's spend comes to at its ``end`` if it goes on at its average rate
    so far: ``spent`` plus that rate times the time left (a timestamp each).

    ``spent`` itself before the window started or once it ended (nothing to go on,
    or nothing left to run); never below ``spent``.
    """
    if spent <= 0 or now <= start or now >= end:
        return max(spent, 0.0)
    return spent + spent / (now - start) * (end - now)
