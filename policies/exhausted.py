"""Which pools this replica knows to be out of quota, so it skips them without a round trip.

A chain walks past every entry whose pool is used up; asking the store each
time costs a reserve round trip per skipped entry on every acquire. A pool
whose ``sessions`` or ``sandbox_seconds`` ran out stays out until one of:

* its window ends (the store said when: the reservation's ``until``);
* this replica's limits for it change (a new config);
* the pool's limits version in the store moves on (``quota set`` / ``quota
  reset``: `StateStore.set_usage` bumps it), seen in any pool status this
  replica reads anyway (a snapshot, status, the fleet heartbeat);
* a pool status shows the unit below its limit again (another replica's
  refund gave a session back);
* ``recheck`` seconds pass: what a replica that reads no status at all
  may miss (a refund) costs it at most that long, and one reserve then.

``concurrent`` is never remembered: a slot comes back with every release.
Pure: no I/O, the caller passes the time.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from policies.quota import Limits

__all__ = ["REMEMBERED_UNITS", "Exhausted", "ExhaustedPools"]

REMEMBERED_UNITS = frozenset({"sessions", "sandbox_seconds"})


@dataclass(frozen=True, slots=True)
class Exhausted:
    """A pool seen out of ``unit`` (``used`` of ``limit``) until ``until`` at ``version``."""

    unit: str
    used: float
    limit: float
    until: float
    version: int
    limits: Limits
    noted: float


class ExhaustedPools:
    """This replica's memory of exhausted pools, by pool name (bounded by the pools it uses)."""

    def __init__(self, recheck: float) -> None:
        if recheck <= 0:
            raise ValueError(f"recheck must be positive, got {recheck}")
        self.recheck = recheck
        self._pools: dict[str, Exhausted] = {}

    def __contains__(self, pool: str) -> bool:
        return pool in self._pools

    def __len__(self) -> int:
        return len(self._pools)

    def lookup(self, pool: str, limits: Limits, now: float) -> Exhausted | None:
        """The remembered exhaustion that still holds for ``limits`` at ``now``, else None
        (and a stale one is forgotten)."""
        known = self._pools.get(pool)
        if known is None:
            return None
        if now >= known.until or now - known.noted >= self.recheck or known.limits != limits:
            del self._pools[pool]
            return None
        return known

    def note(
        self,
        pool: str,
        limits: Limits,
        unit: str,
        used: float,
        limit: float,
        until: float,
        version: int,
        now: float,
    ) -> None:
        """A reserve was denied for ``unit``: remember it (``concurrent`` is not kept)."""
        if unit in REMEMBERED_UNITS and now < until:
            self._pools[pool] = Exhausted(unit, used, limit, until, version, limits, now)

    def observe(self, pool: str, version: int, used: Mapping[str, float]) -> None:
        """A status of ``pool`` read anyway: forget it when its version moved or the unit
        has room again."""
        known = self._pools.get(pool)
        if known is None:
            return
        if version != known.version or used.get(known.unit, known.used) < known.limit:
            del self._pools[pool]

    def forget(self, pool: str) -> None:
        """``pool`` has room (a reserve on it was granted) or this replica changed its usage."""
        self._pools.pop(pool, None)
