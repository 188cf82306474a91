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

A pause made for a tenant's lease (`policies.tenants`) holds the same
storage against the tenant's ``usd`` budget too, all or nothing: the hold
names its tenant, the tenant's ledger keeps a copy (``TenantState.paused``)
and every settle charges both. As with its leases, each ledger charges a
lapsed copy on its own, with the same hold, so the two agree without one
reading the other. A hold settled without its tenant (the tenant's budget
unknown there, or the sandbox paused again for another tenant) leaves the
tenant's copy to lapse, charged whole: more than the pool, never less.

The holds are keyed by sandbox id in the pool (the janitor knows a sandbox
by its id, not by the token or session that paused it). The Redis store
runs the same rules in Lua (``router/state/lua/lib.lua``).
"""

from __future__ import annotations

from collections.abc import MutableMapping
from dataclasses import dataclass
from typing import Protocol

from policies.quota import Limits, PoolState, QuotaDenial
from policies.tenants import TenantDenial, TenantLimits, TenantState

__all__ = ["LAPSE_GRACE", "Ledger", "PausedHold", "hold", "purge_expired", "settle"]

# Seconds past its end a hold waits for the janitor's reap (every ``reap_every``, a day
# at most) to settle it, with its event; the store charges it whole after that.
LAPSE_GRACE = 24 * 3600.0


@dataclass(frozen=True, slots=True)
class PausedHold:
    """A paused sandbox's storage: ``rate`` USD a second from ``started`` to ``expires``,
    for ``tenant`` too when a tenant's lease paused it."""

    entry: str
    started: float
    expires: float
    rate: float
    tenant: str | None = None

    def held(self) -> float:
        """USD it holds: its whole pause."""
        return self.rate * (self.expires - self.started)

    def charge(self, now: float) -> float:
        """USD its storage cost until ``now``, never past its end."""
        return self.rate * (min(max(now, self.started), self.expires) - self.started)


class Ledger(Protocol):
    """What a hold is charged to: a pool's or a tenant's spend and holds."""

    usd: float
    usd_held: float


def hold(
    pool: PoolState,
    holds: MutableMapping[str, PausedHold],
    sandbox_id: str,
    new: PausedHold,
    limits: Limits,
    tenant: tuple[TenantState, TenantLimits] | None = None,
) -> QuotaDenial | None:
    """Hold ``new``'s storage for ``sandbox_id``, or say which budget has no room for it
    (nothing changes then): the pool's, then ``tenant``'s (``new.tenant``'s ledger and
    limits, when a tenant's lease paused it). A hold the sandbox had is settled first,
    at ``new``'s start (it was paused again)."""
    denial = _room(pool, holds.get(sandbox_id), new, limits.usd)
    if denial is not None:
        return denial
    if tenant is not None:
        state, tenant_limits = tenant
        denial = _room(state, state.paused.get(sandbox_id), new, tenant_limits.usd)
        if denial is not None:
            return TenantDenial(denial.unit, denial.used, denial.limit)
    settle(pool, holds, sandbox_id, new.started, tenant[0] if tenant else None)
    _add(pool, holds, sandbox_id, new)
    if tenant is not None:
        _add(tenant[0], tenant[0].paused, sandbox_id, new)
    return None


def settle(
    pool: PoolState,
    holds: MutableMapping[str, PausedHold],
    sandbox_id: str,
    now: float,
    tenant: TenantState | None = None,
) -> float | None:
    """Drop ``sandbox_id``'s hold and charge the storage it used until ``now``: the USD,
    None when it held none. ``tenant`` (the hold's tenant's ledger) is charged its copy."""
    if tenant is not None:
        _settle(tenant, tenant.paused, sandbox_id, now)
    return _settle(pool, holds, sandbox_id, now)


def purge_expired(ledger: Ledger, holds: MutableMapping[str, PausedHold], now: float) -> int:
    """Charge whole every hold `LAPSE_GRACE` past its end (in sandbox id order), in a
    pool's ledger or a tenant's; how many."""
    ended = sorted(sid for sid, found in holds.items() if found.expires + LAPSE_GRACE <= now)
    for sandbox_id in ended:
        _settle(ledger, holds, sandbox_id, now)
    return len(ended)


def _room(
    ledger: Ledger, old: PausedHold | None, new: PausedHold, limit: float | None
) -> QuotaDenial | None:
    """The usd denial when ``ledger`` cannot hold ``new`` (``old`` settled first)."""
    freed = old.held() - old.charge(new.started) if old is not None else 0.0
    committed = ledger.usd + ledger.usd_held
    if limit is not None and committed - freed + new.held() > limit:
        return QuotaDenial("usd", committed, limit)
    return None


def _add(ledger: Ledger, holds: MutableMapping[str, PausedHold], sid: str, new: PausedHold) -> None:
    holds[sid] = new
    ledger.usd_held += new.held()


def _settle(
    ledger: Ledger, holds: MutableMapping[str, PausedHold], sandbox_id: str, now: float
) -> float | None:
    found = holds.pop(sandbox_id, None)
    if found is None:
        return None
    ledger.usd_held = max(0.0, ledger.usd_held - found.held())
    charged = found.charge(now)
    ledger.usd += charged
    return charged
