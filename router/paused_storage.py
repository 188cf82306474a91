"""Paused sandboxes' storage, held against their pools' ``usd`` budgets and settled.

A pause (`Lease.pause`'s token, a sticky session's release) first holds the
sandbox's storage for the longest the pause may last, before the vendor is
asked to pause it (`PausedStorage.hold`: `BudgetExceeded` when the pool's
budget has no room, and nothing was done); a resume, a kill or the
janitor's reap settles the hold to the storage used (`PausedStorage.settle`).
Priced by the entry's ``paused_gib_hour`` and size (`policies.pricing`); an
entry without that rate holds and charges nothing. A pause of a tenant's
lease holds against the tenant's budget too; the settle finds the hold's
tenant first (the janitor knows a sandbox, not who paused it). The rules
are `policies.paused`'s, applied in the store (`router.state.paused`).
"""

from __future__ import annotations

from dataclasses import replace

from policies.tenants import TenantDenial
from providers.errors import BudgetExceeded, ConfigError, StateUnavailable
from router.context import Context
from router.entries import Entry
from router.events import StateError
from router.state import EntryRef, StateStore, TenantRef
from router.state.paused import PausedHold
from router.tenants import Tenants

__all__ = ["PausedStorage"]


class PausedStorage:
    """Holds and settles paused storage for the router's pauses (the ledger's, the
    janitor's)."""

    def __init__(self, store: StateStore, ctx: Context, tenants: Tenants) -> None:
        self._store = store
        self._ctx = ctx
        self._tenants = tenants

    async def hold(
        self,
        entry: Entry,
        sandbox_id: str,
        seconds: float,
        what: str,
        tenant: TenantRef | None = None,
    ) -> float | None:
        """Hold ``sandbox_id``'s storage for ``seconds`` from now against ``entry``'s pool
        and ``tenant`` (the paused lease's): when it started (`drop` takes it), None when
        the entry prices no storage.

        Raises:
            BudgetExceeded: the pool's or the tenant's usd budget has no room for it
                (``what`` names the pause in the message); nothing is held.
            StateUnavailable: the store cannot be reached; nothing is held.
        """
        rate = entry.paused_rate()
        if rate <= 0:
            return None
        now = self._ctx.clock()
        ref = replace(entry.ref, tenant=tenant)
        hold = PausedHold(entry.name, now, now + seconds, rate)
        denial = await self._store.hold_paused(ref, sandbox_id, hold, now)
        if denial is not None:
            budget = f"pool {entry.ref.pool!r}"
            if isinstance(denial, TenantDenial) and tenant is not None:
                budget = f"tenant {tenant.name!r}"
            raise BudgetExceeded(
                f"{what} on {entry.name} refused: usd budget of {budget}: "
                f"${denial.used:.4f} spent or held of ${denial.limit:.4f}, no room for its "
                f"paused storage's hold (${rate * seconds:.4f} for {seconds:.0f}s); nothing "
                "was paused"
            )
        return now

    async def try_hold(self, entry: Entry, sandbox_id: str, seconds: float) -> float | None:
        """`hold`, where being refused is an answer: when the hold began (now, when the
        entry prices no storage), None when the pool's usd budget has no room or the
        store cannot be reached (a warm sandbox is then parked running instead)."""
        try:
            started = await self.hold(entry, sandbox_id, seconds, f"pause of {sandbox_id}")
        except (BudgetExceeded, StateUnavailable):
            return None
        return self._ctx.clock() if started is None else started

    async def settle(self, entry: Entry, sandbox_id: str) -> float | None:
        """Charge ``entry``'s pool the storage ``sandbox_id`` used paused until now, and
        drop its hold: the USD, None when it held none (or the store cannot be reached:
        the hold is charged whole once it lapses); an entry that prices no storage asks
        the store nothing."""
        if entry.paused_rate() <= 0:
            return None
        try:
            ref = await self._counted(entry, sandbox_id)
            return await self._store.settle_paused(ref, sandbox_id, self._ctx.clock())
        except StateUnavailable as exc:
            mode = self._ctx.config.on_state_error
            self._ctx.emit(StateError(operation="charge", error=str(exc), mode=mode))
            return None

    async def drop(self, entry: Entry, sandbox_id: str, started: float | None) -> None:
        """Give back a hold whose pause never happened (``started``: `hold`'s answer),
        charging nothing."""
        if started is not None:
            ref = await self._counted(entry, sandbox_id)
            await self._store.settle_paused(ref, sandbox_id, started)

    async def _counted(self, entry: Entry, sandbox_id: str) -> EntryRef:
        """``entry``'s ref naming the tenant ``sandbox_id``'s hold is counted to. A tenant
        the config no longer counts (a Redis Cluster's without ``tenants:``) is left out:
        its copy lapses, charged whole."""
        name = await self._store.paused_tenant(entry.ref, sandbox_id)
        if name is None:
            return entry.ref
        try:
            return replace(entry.ref, tenant=self._tenants.ref(name))
        except ConfigError:
            return entry.ref
