"""Where a sticky session's sandbox waits between uses.

A session's lease pauses (or keeps) its sandbox while it still holds the
session, and only then lets go of it, so no other lease finds it being
paused or killed. Paused storage is held against the pool's usd budget for
the idle TTL before the pause (`router.paused_storage.PausedStorage`).
"""

from __future__ import annotations

import contextlib

from providers.capabilities import Capability
from providers.errors import BudgetExceeded, ProviderError, StateUnavailable
from router.context import Context
from router.entries import Entry
from router.events import Paused, SessionLost
from router.kills import Kills
from router.lease import Held
from router.ledger import Ledger
from router.waits import until_done

__all__ = ["Parking"]


class Parking:
    """Parks a released session's sandbox, paused or running, for its idle TTL."""

    def __init__(self, ledger: Ledger, ctx: Context, kills: Kills) -> None:
        self._ledger = ledger
        self._ctx = ctx
        self._kills = kills

    async def leave(self, entry: Entry, held: Held) -> None:
        """Park a session's sandbox while the lease still holds the session, then let go.

        Paused where the entry can pause and ``session_pause`` is on (its
        bill stops; its paused storage held for the idle TTL first, and where
        the pool's usd budget cannot hold it, killed and the session lost),
        else kept running for ``session_idle_ttl``; killed when sessions are
        kept for no idle time, or when the session no longer names this lease
        (closed, or its claim expired and it moved on). The
        pause comes first: once let go, another replica may resume the
        sandbox, and nothing may pause it under that lease. A store that
        cannot be reached leaves the binding held until it expires; the
        reaper kills the sandbox then.
        """
        if held.binding is not None:  # a release never overtakes its session's bind
            await until_done(held.binding)
            if not held.binding.cancelled():
                held.binding.exception()  # what it answered, the let-go below reads again
        idle = self._ctx.config.session_idle_ttl
        if idle <= 0:
            await self._kills.kill(entry, held.sandbox)
            await self._let_go(held, 0.0, drop=True)
            return
        paused = False
        if self._ctx.config.session_pause and Capability.PAUSE in entry.capabilities:
            try:
                started = await self._hold_storage(entry, held, idle)
            except BudgetExceeded as exc:  # parked neither paused (unpaid) nor running
                self._ctx.emit(
                    SessionLost(held.session or "", entry.name, str(exc), held.sandbox.id)
                )
                await self._kills.kill(entry, held.sandbox)
                await self._let_go(held, 0.0, drop=True)
                return
            with contextlib.suppress(ProviderError):
                await held.sandbox.pause()
                paused = True
            if not paused:
                with contextlib.suppress(StateUnavailable):
                    await self._ledger.storage.drop(entry, held.sandbox.id, started)
        if not paused:
            with contextlib.suppress(ProviderError):
                await held.sandbox.keepalive(idle)
        kept = await self._let_go(held, idle, paused=paused)
        if kept is False:
            await self._kills.kill(entry, held.sandbox)
            if paused:
                await self._ledger.storage.settle(entry, held.sandbox.id)
        elif kept and paused:
            self._ctx.emit(Paused(entry.name, held.lease_id, held.sandbox.id, held.session or ""))

    async def _hold_storage(self, entry: Entry, held: Held, idle: float) -> float | None:
        """Hold a session's sandbox's paused storage for its idle TTL (`PausedStorage.hold`);
        a store that cannot be reached holds nothing (reported), and the pause goes on."""
        what = f"pause of session {held.session!r}'s sandbox"
        try:
            return await self._ledger.storage.hold(entry, held.sandbox.id, idle, what, held.tenant)
        except StateUnavailable as exc:
            self._ledger.report("session", exc)
            return None

    async def _let_go(
        self, held: Held, ttl: float, *, paused: bool = False, drop: bool = False
    ) -> bool | None:
        """`Bindings.let_go`, None when the store cannot be reached (reported)."""
        try:
            return await self._ledger.bindings.let_go(held, ttl, paused=paused, drop=drop)
        except StateUnavailable as exc:
            self._ledger.report("session", exc)
            return None
