"""Paused sandboxes' storage, held against a pool's ``usd`` budget from the pause on.

A vendor bills a paused sandbox's storage (`policies.pricing.paused_cost`)
for as long as it stays paused, so the pause HOLDS that storage for the
longest it may last (the pause token's ``pause_ttl``, a sticky session's
idle TTL), beside the leases' holds (`policies.quota`): a pause is made
only when the window's spend plus every hold plus this one fits the
budget, so a paused sandbox never takes the pool past it. Its resume (or
its kill, the janitor's reap of a lapsed one) settles the hold to the
storage used, from the pause to then and never past the hold's end; a
hold still unsettled `LAPSE_GRACE` past its end (its sandbox gone unseen)
is charged whole by the store itself.

The holds are keyed by sandbox id in the pool (the janitor knows a sandbox
by its id, not by the token or session that paused it). The Redis store
runs the same rules in Lua (``router/state/lua/lib.lua``).
"""

from __future__ import annotations

from collections.abc import MutableMapping
from dataclasses import dataclass

from policies.quota import Limits, PoolState, QuotaDenial

__all__ = ["LAPSE_GRACE", "PausedHold", "hold", "purge_expired", "settle"]

# Seconds past its end a hold waits for the janitor's reap (every ``reap_every``, a day
# at most) to settle it, with its event; the store charges it whole after that.
LAPSE_GRACE = 24 * 3600.0


@dataclass(frozen=True, slots=True)
class PausedHold:
    """A paused sandbox's storage: ``rate`` USD a second from ``started`` to ``expires``."""

    entry: str
    started: float
    expires: float
    rate: float

    def held(self) -> float:
        """USD it holds: its whole pause."""
        return self.rate * (self.expires - self.started)

    def charge(self, now: float) -> float:
        """USD its storage cost until ``now``, never past its end."""
        return self.rate * (min(max(now, self.started), self.expires) - self.started)


def hold(
    pool: PoolState,
    holds: MutableMapping[str, PausedHold],
    sandbox_id: str,
    new: PausedHold,
    limits: Limits,
) -> QuotaDenial | None:
    """Hold ``new``'s storage for ``sandbox_id``, or say that the budget has no room for
    it (nothing changes then). A hold the sandbox had is settled first, at ``new``'s
    start (it was paused again)."""
    old = holds.get(sandbox_id)
    freed = old.held() - old.charge(new.started) if old is not None else 0.0
    committed = pool.usd + pool.usd_held
    if limits.usd is not None and committed - freed + new.held() > limits.usd:
        return QuotaDenial("usd", committed, limits.usd)
    settle(pool, holds, sandbox_id, new.started)
    holds[sandbox_id] = new
    pool.usd_held += new.held()
    return None


def settle(
    pool: PoolState, holds: MutableMapping[str, PausedHold], sandbox_id: str, now: float
) -> float | None:
    """Drop ``sandbox_id``'s hold and charge the storage it used until ``now``: the USD,
    None when it held none."""
    found = holds.pop(sandbox_id, None)
    if found is None:
        return None
    pool.usd_held = max(0.0, pool.usd_held - found.held())
    charged = found.charge(now)
    pool.usd += charged
    return charged


def purge_expired(pool: PoolState, holds: MutableMapping[str, PausedHold], now: float) -> int:
    """Charge whole every hold `LAPSE_GRACE` past its end (in sandbox id order); how
    many."""
    ended = sorted(sid for sid, found in holds.items() if found.expires + LAPSE_GRACE <= now)
    for sandbox_id in ended:
        settle(pool, holds, sandbox_id, now)
    return len(ended)
