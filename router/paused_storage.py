"""Paused sandboxes' storage, held against their pools' ``usd`` budgets and settled.

A pause (`Lease.pause`'s token, a sticky session's release) first holds the
sandbox's storage for the longest the pause may last, before the vendor is
asked to pause it (`PausedStorage.hold`: `BudgetExceeded` when the pool's
budget has no room, and nothing was done); a resume, a kill or the
janitor's reap settles the hold to the storage used (`PausedStorage.settle`).
Priced by the entry's ``paused_gib_hour`` and size (`policies.pricing`); an
entry without that rate holds and charges nothing. The rules are
`policies.paused`'s, applied in the store (`router.state.paused`).
"""

from __future__ import annotations

from providers.errors import BudgetExceeded, StateUnavailable
from router.context import Context
from router.entries import Entry
from router.events import StateError
from router.state import EntryRef, Spend, StateStore
from router.state.paused import PausedHold

__all__ = ["PausedStorage"]


class PausedStorage:
    """Holds and settles paused storage for the router's pauses (the ledger's, the
    janitor's)."""

    def __init__(self, store: StateStore, ctx: Context) -> None:
        self._store = store
        self._ctx = ctx

    async def hold(self, entry: Entry, sandbox_id: str, seconds: float, what: str) -> float | None:
        """Hold ``sandbox_id``'s storage for ``seconds`` from now against ``entry``'s pool:
        when it started (`drop` takes it), None when the entry prices no storage.

        Raises:
            BudgetExceeded: the pool's usd budget has no room for it (``what`` names the
                pause in the message); nothing is held.
            StateUnavailable: the store cannot be reached; nothing is held.
        """
        rate = entry.paused_rate()
        if rate <= 0:
            return None
        now = self._ctx.clock()
        denial = await self._store.hold_paused(
            entry.ref, sandbox_id, PausedHold(entry.name, now, now + seconds, rate), now
        )
        if denial is not None:
            raise BudgetExceeded(
                f"{what} on {entry.name} refused: usd budget of pool {entry.ref.pool!r}: "
                f"${denial.used:.4f} spent or held of ${denial.limit:.4f}, no room for its "
                f"paused storage's hold (${rate * seconds:.4f} for {seconds:.0f}s); nothing "
                "was paused"
            )
        return now

    async def settle(self, entry: Entry, sandbox_id: str) -> float | None:
        """Charge ``entry``'s pool the storage ``sandbox_id`` used paused until now, and
        drop its hold: the USD, None when it held none (or the store cannot be reached:
        the hold is charged whole once it lapses); an entry that prices no storage asks
        the store nothing."""
        if entry.paused_rate() <= 0:
            return None
        try:
            return await self._store.settle_paused(entry.ref, sandbox_id, self._ctx.clock())
        except StateUnavailable as exc:
            mode = self._ctx.config.on_state_error
            self._ctx.emit(StateError(operation="charge", error=str(exc), mode=mode))
            return None

    async def spend(self, ref: EntryRef, key: str, usd: float) -> None:
        """Charge ``usd`` of storage spent outside any hold (a warm sandbox parked paused)
        to ``ref``'s pool: once per ``key``, however often it is sent."""
        if usd <= 0:
            return
        try:
            await self._store.reconcile(key, [Spend(ref, usd=usd)], self._ctx.clock())
        except StateUnavailable as exc:
            mode = self._ctx.config.on_state_error
            self._ctx.emit(StateError(operation="charge", error=str(exc), mode=mode))

    async def drop(self, entry: Entry, sandbox_id: str, started: float | None) -> None:
        """Give back a hold whose pause never happened (``started``: `hold`'s answer),
        charging nothing."""
        if started is not None:
            await self._store.settle_paused(entry.ref, sandbox_id, started)
