"""A replica's share of a pool while the shared state store is unreachable.

Under ``on_state_error: fail_open`` each replica keeps serving from a local
ledger when the store goes away. A fixed share of each limit overspends as
soon as the fleet has more replicas than 1 / share (8 replicas at 25 % each
granted 2x the quota). So while the store is up every replica heartbeats into
a fleet registry and learns two facts (a `Contact`): how many replicas are
alive, and what each pool had used. During an outage a replica may spend only
what was left at that contact divided by the fleet it saw, clamped by the
configured floor and ceiling (fractions of what was left). With the default
floor of 0 the whole fleet together never spends more than was left, whatever
its size. A replica that never reached the store knows neither fact and falls
back to ``blind`` (a fraction of each limit).

The usage seen at a contact is up to one heartbeat old when the outage
starts, and the fleet kept spending meanwhile: the fleet's spend rate over
the last two contacts (``Contact.rate``) projects it to the outage's start,
so the replicas together stay within what was really left as long as the
fleet's rate held steady over that heartbeat.

Everything here is pure: the router feeds in the contact and the limits and
gets back the limits of its outage ledger.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from policies.quota import UNITS, Limits

__all__ = ["Contact", "OutageShare", "outage_limits"]

_CUMULATIVE = ("sessions", "sandbox_seconds")  # concurrent is a level, not a sum
_WINDOWS = 8  # contacts a rate is measured back over


@dataclass(frozen=True, slots=True)
class OutageShare:
    """How much of what was left one replica may spend during an outage.

    Attributes:
        floor: the least share of what was left, whatever the fleet's size
            (above 1 / fleet it lets the fleet overspend; 0 never does).
        ceiling: the most share of what was left, even for a lone replica.
        blind: the share of each limit a replica uses that never reached the
            store (it knows neither the fleet nor the usage).
    """

    floor: float = 0.0
    ceiling: float = 1.0
    blind: float = 0.25

    def __post_init__(self) -> None:
        for name in ("floor", "ceiling", "blind"):
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"{name} is a fraction in [0, 1], got {value!r}")
        if self.floor > self.ceiling:
            raise ValueError(f"floor {self.floor} is above ceiling {self.ceiling}")

    def fraction(self, fleet: int) -> float:
        """The part of what was left that one replica of ``fleet`` may spend."""
        return min(self.ceiling, max(self.floor, 1.0 / max(1, fleet)))


@dataclass(frozen=True, slots=True)
class Contact:
    """What a replica learned at its last heartbeat into the fleet registry.

    Attributes:
        at: when (the router's clock).
        fleet: live replicas, this one included.
        used: per pool, per unit, the pool's usage then (``concurrent`` is
            its live leases).
        rate: per pool, the fleet's spend per second of the cumulative units
            (sessions, sandbox_seconds) up to this contact (see `then`).
        earlier: the last few contacts' times and usage, the rate's windows.
    """

    at: float
    fleet: int
    used: Mapping[str, Mapping[str, float]]
    rate: Mapping[str, Mapping[str, float]] = field(default_factory=dict)
    earlier: tuple[tuple[float, Mapping[str, Mapping[str, float]]], ...] = ()

    def then(self, at: float, fleet: int, used: Mapping[str, Mapping[str, float]]) -> Contact:
        """The next contact, with the fleet's spend rate up to it.

        The rate is the highest over the windows from each of the last few
        contacts to this one: spend comes in bursts, and underestimating it
        is what would let the fleet overspend.
        """
        earlier = ((*self.earlier, (self.at, self.used)))[-_WINDOWS:]
        rate: dict[str, dict[str, float]] = {}
        for pool, units in used.items():
            for unit in _CUMULATIVE:
                spans = [
                    (units.get(unit, 0.0) - then[pool].get(unit, 0.0)) / (at - when)
                    for when, then in earlier
                    if pool in then and at > when
                ]
                if spans:
                    rate.setdefault(pool, {})[unit] = max(0.0, *spans)
        return Contact(at, fleet, used, rate, earlier)


def outage_limits(
    limits: Limits,
    pool: str,
    contact: Contact | None,
    share: OutageShare,
    started: float | None = None,
    own: Mapping[str, float] | None = None,
    margin: float = 0.0,
) -> Limits:
    """The limits of this replica's outage ledger for ``pool``, for an outage that
    ``started`` then (default: at the contact), ``own``: what this replica itself
    spent from the pool since the contact (known exactly; the fleet's projected
    spend is at least that). ``margin`` seconds more of the fleet's rate are kept
    back for the error of a rate measured over bursts.

    Unlimited units stay unlimited. Counted units (sessions, concurrent)
    round down, so a share of less than one unit is none.
    """
    if contact is None or pool not in contact.used:
        used: Mapping[str, float] = {}
        fraction = share.blind
    else:
        elapsed = max(0.0, (started if started is not None else contact.at) - contact.at)
        rate = contact.rate.get(pool, {})
        mine = own or {}
        used = {
            unit: value
            + max(rate.get(unit, 0.0) * elapsed, mine.get(unit, 0.0))
            + rate.get(unit, 0.0) * margin
            for unit, value in contact.used[pool].items()
        }
        fraction = share.fraction(contact.fleet)
    parts: list[float | None] = []
    for unit in UNITS:
        limit = limits.get(unit)
        if limit is None:
            parts.append(None)
            continue
        part = max(0.0, limit - used.get(unit, 0.0)) * fraction
        parts.append(part if unit == "sandbox_seconds" else math.floor(part + 1e-9))
    sessions, seconds, concurrent = parts
    return Limits(
        None if sessions is None else int(sessions),
        seconds,
        None if concurrent is None else int(concurrent),
    )
