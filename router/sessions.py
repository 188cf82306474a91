"""Sticky sessions: the same key gets the same live sandbox back, from any replica.

The binding (session -> entry, sandbox id, until when, paused or not) lives
in the shared store. An acquire with a session first tries
`Sessions.resume`: reconnect to the bound sandbox (wake it, when the
session's release paused it) under a slot-only reservation (nothing new is
created). When that sandbox is gone, the entry left the chain or cannot
serve, the session is lost (an event says why), its old sandbox is killed
in the background, and the acquire creates and binds a new one.
"""

from __future__ import annotations

import asyncio

from policies.outcome import classify
from providers.errors import StateUnavailable
from router.context import Context
from router.events import Resumed, SessionClosed, SessionLost
from router.lease import Held
from router.ledger import Denied, Ledger
from router.state.base import SessionBinding
from router.upkeep import Upkeep
from router.waits import until_done

__all__ = ["Sessions"]


class Sessions:
    """Resume, bind, close and discard sticky sessions."""

    def __init__(self, ledger: Ledger, upkeep: Upkeep, ctx: Context) -> None:
        self._ctx = ctx
        self._ledger = ledger
        self._upkeep = upkeep

    async def resume(self, session: str, requires: tuple[str, ...], deadline: float) -> Held | None:
        """Reconnect to the session's bound sandbox, or None (and say why) to create anew."""
        try:
            binding = await self._ledger.store.session(session, self._ctx.clock())
        except StateUnavailable as exc:
            self._ledger.on_state_error("session", exc)
            return None
        if binding is None:
            return None
        entry = self._ctx.entries.get(binding.entry)
        if entry is None:
            self._lose(session, binding, f"entry {binding.entry!r} is no longer in the chain")
            return None
        why = None
        if (reason := entry.unusable()) is not None:
            why = f"entry {binding.entry!r} is not configured: {reason}"
        elif not set(requires) <= entry.capabilities:
            why = f"entry {binding.entry!r} lacks {', '.join(requires)}"
        if why is not None:
            self._lose(session, binding, why)
            return None
        try:
            booking = await self._upkeep.book(entry, deadline, new_session=False)
        except Denied as denied:
            self._lose(session, binding, self._ledger.describe(denied.reservation))
            return None
        started = self._ctx.clock()
        try:
            wake = (
                entry.provider.resume(binding.sandbox_id, timeout=booking.budget)
                if binding.paused
                else entry.provider.connect(binding.sandbox_id)
            )
            sandbox = await asyncio.wait_for(wake, booking.budget)
        except asyncio.CancelledError:
            self._upkeep.spawn(self._ledger.refund(booking, "acquire_cancelled"))
            raise
        except Exception as exc:
            await self._ledger.settle_failure(booking, exc, 1, started)
            self._lose(
                session, binding, f"{classify(exc).reason}: {exc}", sandbox_id=binding.sandbox_id
            )
            return None
        committing = self._ledger.commit(booking, sandbox.id, self._ctx.clock())
        held = booking.held(
            entry.provider.kind, sandbox, self._ctx.clock(), 1, session=session, resumed=True
        )
        try:
            await until_done(committing)  # a cancel here leaves the commit running
            if not committing.result():
                return None
            await self.bind(held, session)
        except asyncio.CancelledError:
            self._upkeep.spawn(self._let_go(committing, held))
            raise
        self._upkeep.keep(held)
        if binding.paused:
            self._ctx.emit(Resumed(entry.name, held.lease_id, sandbox.id, session))
        return held

    async def _let_go(self, committing: asyncio.Future[bool | None], held: Held) -> None:
        """Release a reconnected lease whose caller was cancelled, once its commit lands:
        the sandbox stays the session's, as after any release."""
        await until_done(committing)
        if committing.result():
            self._upkeep.keep(held)
            await self._upkeep.release(held)

    async def bind(self, held: Held, session: str) -> None:
        """Bind ``session`` to the lease's sandbox while the lease lives."""
        held.session = session
        await self._ledger.bind(held, self._ctx.config.lease_ttl)

    def _lose(
        self, session: str, binding: SessionBinding, why: str, *, sandbox_id: str = ""
    ) -> None:
        """Say why the session lost its sandbox, and kill that sandbox in the background."""
        self._ctx.emit(SessionLost(session, binding.entry, why, sandbox_id))
        self._discard(binding)

    def _discard(self, binding: SessionBinding) -> None:
        """Kill a session's old sandbox in the background: the session moves to a new one.

        Best effort: when its provider is down the janitor reaps it later.
        """
        entry = self._ctx.entries.get(binding.entry)
        if entry is not None:
            self._upkeep.spawn(self._upkeep.kill_id(entry, binding.sandbox_id))

    async def close(self, session: str) -> bool:
        """Kill the session's sandbox and forget it; False when it had none."""
        binding = await self._ledger.store.session(session, self._ctx.clock())
        if binding is None:
            return False
        entry = self._ctx.entries.get(binding.entry)
        if entry is not None:
            await self._upkeep.kill_id(entry, binding.sandbox_id)
        await self._ledger.store.unbind_session(session)
        self._ctx.emit(
            SessionClosed(session=session, entry=binding.entry, sandbox_id=binding.sandbox_id)
        )
        return True
