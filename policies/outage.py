"""A replica's share of a pool while the shared state store is unreachable.

Under ``on_state_error: fail_open`` each replica keeps serving from a local
ledger when the store goes away. A fixed share of each limit overspends as
soon as the fleet has more replicas than 1 / share (8 replicas at 25 % each
granted 2x the quota). So while the store is up every replica heartbeats into
the fleet registry (`policies.fleet`) and learns, at each contact (a
`Contact`), how many replicas it shares the pool with and what the pool had
used. During an outage it may spend what was left at that contact divided by
the fleet, less what it spent itself since the fleet's oldest contact:

* the fleet is the registry's count of replicas seen in the last TTL, never
  less than ``expected`` (`OutageShare`), and only a settled view counts (every
  replica that may serve has registered since this one joined, so each counts
  it): a replica whose view is not settled, or that never reached the store,
  gets ``blind`` of each limit, 0 by default;
* what was left is the usage at this replica's contact; the rest of the fleet
  spent more since, each replica from its own share: every replica takes off
  its own spend since the oldest contact any replica that may serve made
  (`spent_since`), so that spend is counted once, by whoever made it.

Together the settled replicas then never spend more than was left when the
store went away, rounded down, provided every process spending from the pool
is in the registry and none spent more than its share since that oldest
contact (`tests/policies/test_fleet.py` checks it over random histories).
What falls outside (a process that joined after another's last contact and
spent before the outage; one that spent more than its share between two
heartbeats; a fail_closed router on the same pool) is what ``expected`` and
the rounding down keep room for.

Everything here is pure: the router feeds in the contact and the limits and
gets back the limits of its outage ledger.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from policies.fleet import Registration
from policies.quota import UNITS, Limits

__all__ = ["Contact", "OutageShare", "outage_limits", "seen", "spent_since"]

Usage = Mapping[str, Mapping[str, float]]  # per pool, per unit


@dataclass(frozen=True, slots=True)
class OutageShare:
    """How much of what was left one replica may spend during an outage.

    Attributes:
        floor: the least share of what was left, whatever the fleet's size
            (above 1 / fleet it lets the fleet overspend; 0 never does).
        ceiling: the most share of what was left, even for a lone replica.
        blind: the share of each limit a replica uses that has not seen the
            fleet (it never reached the store, or its view is not settled):
            every such replica spends it on top of the fleet's shares.
        expected: the fewest replicas a share divides by (the fleet the
            operator runs; the registry's count is used when larger).
    """

    floor: float = 0.0
    ceiling: float = 1.0
    blind: float = 0.0
    expected: int = 1

    def __post_init__(self) -> None:
        for name in ("floor", "ceiling", "blind"):
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"{name} is a fraction in [0, 1], got {value!r}")
        if self.floor > self.ceiling:
            raise ValueError(f"floor {self.floor} is above ceiling {self.ceiling}")
        if isinstance(self.expected, bool) or not isinstance(self.expected, int):
            raise ValueError(f"expected is a whole number of replicas, got {self.expected!r}")
        if self.expected < 1:
            raise ValueError(f"expected is at least 1 replica, got {self.expected}")

    def divisor(self, fleet: int) -> int:
        """The fleet a share divides by: the registry's, or ``expected`` when larger."""
        return max(1, fleet, self.expected)

    def fraction(self, fleet: int) -> float:
        """The part of what was left that one replica of ``fleet`` may spend."""
        return min(self.ceiling, max(self.floor, 1.0 / self.divisor(fleet)))


@dataclass(frozen=True, slots=True)
class Contact:
    """What a replica learned at its last heartbeat into the fleet registry.

    Attributes:
        fleet: the registry's answer (the fleet's size, whether it is settled).
        used: per pool, per unit, the pool's usage then (``concurrent`` is
            its live leases, ``usd`` its spend plus every lease's hold).
    """

    fleet: Registration
    used: Usage


def spent_since(spends: Sequence[tuple[int, Usage]], oldest: int, pool: str) -> dict[str, float]:
    """What this replica spent from ``pool`` since the registry's contact ``oldest``.

    ``spends`` are this replica's contacts in order, each with what it spent
    after it (until the next): the spend after the last of them made at or
    before ``oldest`` counts whole (where in its span ``oldest`` fell is not
    known, so all of it), and all the spend when none was.
    """
    start = 0
    for i, (seq, _) in enumerate(spends):
        if seq <= oldest:
            start = i
    total: dict[str, float] = {}
    for _, usage in spends[start:]:
        for unit, amount in usage.get(pool, {}).items():
            total[unit] = total.get(unit, 0.0) + amount
    return total


def outage_limits(
    limits: Limits,
    pool: str,
    contact: Contact | None,
    share: OutageShare,
    own: Mapping[str, float] | None = None,
) -> Limits:
    """The limits of this replica's outage ledger for ``pool``.

    ``own``: what this replica spent from the pool since the fleet's oldest
    contact (`spent_since`), taken off its share.

    Unlimited units stay unlimited. Counted units (sessions, concurrent)
    round down, so a share of less than one unit is none. The contact's
    ``usd`` is what was spent and held (`Contact`).
    """
    used: Mapping[str, float] = {}
    mine: Mapping[str, float] = {}
    fraction = share.blind
    if contact is not None and seen(contact, pool):
        used, mine = contact.used[pool], own or {}
        fraction = share.fraction(contact.fleet.replicas)
    parts: list[float | None] = []
    for unit in UNITS:
        limit = limits.get(unit)
        if limit is None:
            parts.append(None)
            continue
        part = max(0.0, max(0.0, limit - used.get(unit, 0.0)) * fraction - mine.get(unit, 0.0))
        parts.append(part if unit in ("sandbox_seconds", "usd") else math.floor(part + 1e-9))
    sessions, seconds, concurrent, usd = parts
    return Limits(
        None if sessions is None else int(sessions),
        seconds,
        None if concurrent is None else int(concurrent),
        usd,
    )


def seen(contact: Contact | None, pool: str) -> bool:
    """Whether ``contact`` lets this replica share ``pool`` out (else: the blind share)."""
    return contact is not None and contact.fleet.settled and pool in contact.used
