"""Per-tenant limits: what one end user of an app may spend, across every pool.

A tenant (``acquire(tenant="user-42")``) is counted in three units, per
window (a calendar month, or a day: `DailyWindow`, both in the pools'
timezone):

* ``sessions``: sandboxes created for it in the window;
* ``concurrent``: its live leases (reserved or committed);
* ``usd``: its settled spend in the window plus what its live leases hold.

The tenant's ledger mirrors its leases' pool slots (`policies.quota.LeaseSlot`):
each slot the pool holds for a tenant's lease is copied here, and every
change the pool makes to it (a commit, a cover grown by a heartbeat, the
release, a refund, its expiry) is made here too, in the same atomic store
call. So the tenant holds exactly what its leases hold in their pools, and
settles exactly what they cost. An expired lease is charged by each ledger
on its own (`purge_expired`), with the same slot, so the two agree without
one reading the other; a call naming a lease its pool still holds keeps it
from that purge and settles it as the pool does (a refund, a release). One
corner is left: a reservation past its expiry that another call of its
tenant purged (its fee charged, its session kept) and that its pool, not yet
purged, then refunds or commits. The router commits only within the hold
(a create past its budget is abandoned and released, `router.late_creates`);
a late refund leaves the tenant counting that session and fee: more than
the pool, never less.

A reservation is all-or-nothing across pool and tenant: the store asks
`check` before the pool's `policies.quota.reserve`, and writes neither when
either refuses. The Redis store runs the same rules in Lua
(``router/state/lua/lib.lua``); ``tests/state/test_lua_matches_policies.py``
checks the two agree.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Collection
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Literal
from zoneinfo import ZoneInfo

from policies.quota import LeaseSlot, MonthlyWindow, QuotaDenial, metered

if TYPE_CHECKING:
    from policies.paused import PausedHold

__all__ = [
    "TENANT_NAME",
    "TENANT_UNITS",
    "DailyWindow",
    "TenantDenial",
    "TenantLimits",
    "TenantState",
    "TenantWindow",
    "add",
    "budget",
    "check",
    "hand_over",
    "mirror",
    "purge_expired",
    "refund",
    "release",
    "valid_name",
]

TENANT_UNITS = ("sessions", "concurrent", "usd")
TENANT_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.@+-]{0,127}$")


def valid_name(name: object) -> bool:
    """A tenant name: 1 to 128 of letters, digits and ``_ . @ + -``, starting with a letter
    or digit (it names store keys and rows, so no separator of theirs)."""
    return isinstance(name, str) and TENANT_NAME.fullmatch(name) is not None


@dataclass(frozen=True, slots=True)
class DailyWindow:
    """A calendar day in ``timezone``: from midnight to midnight (the interface of
    `policies.quota.MonthlyWindow`)."""

    timezone: str = "UTC"

    def __post_init__(self) -> None:
        ZoneInfo(self.timezone)  # raises for an unknown zone

    def bounds(self, now: float) -> tuple[datetime, datetime]:
        """The [start, end) of the day containing the instant ``now``."""
        zone = ZoneInfo(self.timezone)
        local = datetime.fromtimestamp(now, zone)
        start = datetime(local.year, local.month, local.day, tzinfo=zone)
        following = start.date() + timedelta(days=1)
        return start, datetime(following.year, following.month, following.day, tzinfo=zone)

    def key(self, now: float) -> str:
        """A stable name of the day containing ``now`` (its date, ``d`` before it so it
        never equals a month window's name)."""
        return "d" + self.bounds(now)[0].strftime("%Y-%m-%d")

    def reset_at(self, now: float) -> datetime:
        return self.bounds(now)[1]


TenantWindow = MonthlyWindow | DailyWindow
WindowName = Literal["month", "day"]


@dataclass(frozen=True, slots=True)
class TenantLimits:
    """One tenant's limits per window; None means unlimited in that unit."""

    sessions: int | None = None
    usd: float | None = None
    concurrent: int | None = None

    def get(self, unit: str) -> float | None:
        value: float | None = getattr(self, unit)
        return value


@dataclass(frozen=True, slots=True)
class TenantDenial(QuotaDenial):
    """A unit the tenant, not the pool, has no room in."""


@dataclass(slots=True)
class TenantState:
    """A tenant's usage in one window plus copies of its leases' pool slots and of its
    paused sandboxes' storage holds (`policies.paused`)."""

    window: str
    sessions: int = 0
    usd: float = 0.0  # settled spend in the window
    usd_held: float = 0.0  # every lease's and paused sandbox's hold (whatever the window)
    leases: dict[str, LeaseSlot] = field(default_factory=dict)
    paused: dict[str, PausedHold] = field(default_factory=dict)


def purge_expired(state: TenantState, now: float, keep: Collection[str] = ()) -> list[str]:
    """Drop expired leases, charging each until its expiry (as its pool does), but
    ``keep``: the leases a call names while their pool still holds them (not purged
    there yet), so the call settles them here as it does there."""
    expired = [lid for lid, slot in state.leases.items() if slot.expires <= now and lid not in keep]
    for lid in expired:
        slot = state.leases.pop(lid)
        _settle(state, slot, max(0.0, slot.expires - slot.started) if slot.live else 0.0)
    if expired:
        _no_dust(state)
    return expired


def check(state: TenantState, limits: TenantLimits, slot: LeaseSlot) -> TenantDenial | None:
    """The first unit the tenant has no room in for ``slot`` (its pool's new slot), or
    None: a session if it takes one, a concurrent lease, and its usd hold."""
    if slot.counted and limits.sessions is not None and state.sessions >= limits.sessions:
        return TenantDenial("sessions", state.sessions, limits.sessions)
    if limits.concurrent is not None and len(state.leases) >= limits.concurrent:
        return TenantDenial("concurrent", len(state.leases), limits.concurrent)
    held = state.usd + state.usd_held
    if limits.usd is not None and slot.priced and held + slot.hold() > limits.usd:
        return TenantDenial("usd", held, limits.usd)
    return None


def add(state: TenantState, lease_id: str, slot: LeaseSlot) -> None:
    """Count a slot its pool granted (`check` said it fits)."""
    state.leases[lease_id] = copy.copy(slot)
    if slot.counted:
        state.sessions += 1
    state.usd_held += slot.hold()


def hand_over(state: TenantState, lease_id: str, slot: LeaseSlot) -> None:
    """Hold a lease an outage ledger granted (its session is in the hand-over's spend)."""
    state.leases[lease_id] = copy.copy(slot)
    state.usd_held += slot.hold()


def budget(state: TenantState, limits: TenantLimits) -> tuple[float, float] | None:
    """The tenant's usd budget as `policies.quota.cover` reads a second one: (spent and
    held, limit), None when unlimited."""
    if limits.usd is None:
        return None
    return state.usd + state.usd_held, limits.usd


def mirror(state: TenantState, lease_id: str, slot: LeaseSlot | None) -> None:
    """Copy the pool's slot after a commit or heartbeat changed it (its cover grown: the
    hold follows); a slot the tenant no longer has (expired here) stays gone."""
    mine = state.leases.get(lease_id)
    if mine is None or slot is None:
        return
    state.usd_held = max(0.0, state.usd_held + slot.hold() - mine.hold())
    state.leases[lease_id] = copy.copy(slot)


def release(state: TenantState, lease_id: str, now: float) -> float | None:
    """Drop the lease and settle its hold to its metered cost (`policies.quota.release`'s
    rule); None when the tenant did not hold it."""
    slot = state.leases.pop(lease_id, None)
    if slot is None:
        return None
    seconds = max(0.0, min(now, slot.expires) - slot.started) if slot.live else 0.0
    charged = _settle(state, slot, seconds)
    _no_dust(state)
    return charged


def refund(state: TenantState, lease_id: str) -> bool:
    """Give back a reservation whose create failed (its session and hold); False if the
    tenant does not hold it as a reservation."""
    slot = state.leases.get(lease_id)
    if slot is None or slot.live:
        return False
    del state.leases[lease_id]
    if slot.counted:
        state.sessions = max(0, state.sessions - 1)
    state.usd_held = max(0.0, state.usd_held - slot.hold())
    _no_dust(state)
    return True


def _settle(state: TenantState, slot: LeaseSlot, seconds: float) -> float:
    """Drop ``slot``'s hold and charge its cost for ``seconds`` (its fee if it made a
    sandbox: `policies.quota.settle_usd`'s rule)."""
    if not slot.priced:
        return 0.0
    state.usd_held = max(0.0, state.usd_held - slot.hold())
    charged = slot.rate * metered(seconds, slot.step) + (slot.fee if slot.counted else 0.0)
    state.usd += charged
    return charged


def _no_dust(state: TenantState) -> None:
    """Nothing left holds anything: no float dust stays behind."""
    if not state.leases and not state.paused:
        state.usd_held = 0.0
