"""The store's half of paused storage: holds on a pool's ``usd`` budget, per sandbox.

A pause holds its sandbox's storage for the whole pause before the vendor
is asked to pause (`PausedSupport.hold_paused`, refused when the budget has
no room); a resume, a claim or the janitor's kill settles it to the storage
used (`PausedSupport.settle_paused`). A ref naming a tenant holds against
the tenant's budget too and settles its copy. The rules are
`policies.paused`'s.
"""

from __future__ import annotations

import abc
from typing import TYPE_CHECKING

from policies.paused import PausedHold
from policies.quota import QuotaDenial

if TYPE_CHECKING:
    from router.state.base import EntryRef

__all__ = ["PausedHold", "PausedSupport"]


class PausedSupport(abc.ABC):
    """Paused sandboxes' storage held against their pools' budgets, shared by the fleet."""

    @abc.abstractmethod
    async def hold_paused(
        self, ref: EntryRef, sandbox_id: str, hold: PausedHold, now: float
    ) -> QuotaDenial | None:
        """Hold ``hold``'s storage for ``sandbox_id`` against ``ref``'s pool and tenant (the
        hold names it), or the usd denial (spent and held, limit; a
        `policies.tenants.TenantDenial` when the tenant's budget is the short one) when
        it does not fit; a hold it had is settled."""

    @abc.abstractmethod
    async def settle_paused(self, ref: EntryRef, sandbox_id: str, now: float) -> float | None:
        """Drop ``sandbox_id``'s hold, charging the storage it used until ``now`` (never
        past the hold's end) to the pool, and to ``ref``'s tenant when the hold is
        that tenant's: the USD, None when it held none."""

    @abc.abstractmethod
    async def paused_tenant(self, ref: EntryRef, sandbox_id: str) -> str | None:
        """The tenant ``sandbox_id``'s hold in ``ref``'s pool is counted to, if any (the
        settle must name it: a janitor knows the sandbox, not the lease that paused it)."""
