"""Pause a lease's sandbox and resume it later, from any replica.

`Pauses.pause` pauses the sandbox and ends its lease without the kill: the
seconds are metered up to the pause and the slot is freed (a paused
sandbox is not running). Where the entry prices paused storage, the pause
first holds that storage for ``pause_ttl`` against its pool's ``usd``
budget (`router.paused_storage`; refused with `BudgetExceeded` when it has
no room, the lease untouched), and the resume or the janitor settles it.
The paused sandbox is recorded in the shared store as a session binding
under a key of its own (``pause:<token>``) kept for ``pause_ttl``, so any
replica can find it and the janitor, which keeps every bound sandbox,
leaves it alone until then and reaps it after.

The token is a bearer secret (whoever holds it can wake the sandbox), so no
error, event or log line shows it.

`Pauses.resume` books a slot-only reservation on the same entry (a resume
is not a new session for the quota, but the sandbox runs again, so it takes
a concurrency slot), wakes the sandbox and hands back a live lease. A
refused reservation leaves the token and the paused sandbox as they were.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets

from providers.capabilities import Capability
from providers.errors import (
    BudgetExceeded,
    LeaseError,
    NoProviderAvailable,
    NotFound,
    ProviderError,
    StateUnavailable,
    Unsupported,
)
from router.booking import RESERVE_GRACE, Denied, describe
from router.context import Context
from router.events import Paused, Resumed
from router.lease import Held
from router.ledger import Ledger
from router.state.base import SessionBinding, TenantRef
from router.upkeep import Upkeep

__all__ = ["PAUSE_KEY", "Pauses"]

PAUSE_KEY = "pause:"  # session bindings under it are pause tokens'; no session key starts so


class Pauses:
    """Pause leases into tokens, and tokens back into leases."""

    def __init__(self, ledger: Ledger, upkeep: Upkeep, ctx: Context) -> None:
        self._ctx = ctx
        self._ledger = ledger
        self._upkeep = upkeep

    async def pause(self, held: Held) -> str:
        """Pause the lease's sandbox, end the lease without killing it; the resume token.

        A sticky session's lease leaves its session: the sandbox is the token's,
        and the session's next acquire creates a new one.

        Raises:
            Unsupported: the entry does not declare ``pause`` (the lease stays live).
            BudgetExceeded: its pool's usd budget, or its tenant's, cannot hold the
                paused storage for ``pause_ttl`` (the lease stays live, its sandbox
                running).
            LeaseError: the lease was already released.
        """
        if held.released:
            raise LeaseError(f"lease {held.lease_id} on {held.entry} was already released")
        entry = self._ctx.entries[held.entry]
        if Capability.PAUSE not in entry.capabilities:
            raise Unsupported(entry.name, Capability.PAUSE)
        token, ttl = secrets.token_urlsafe(24), self._ctx.config.pause_ttl
        storage, sandbox_id = self._ledger.storage, held.sandbox.id
        # Its storage held first: a pause the budget cannot pay for is not made.
        what = f"pause of lease {held.lease_id}"
        started = await storage.hold(entry, sandbox_id, ttl, what, held.tenant)
        try:
            # Bound next: a sandbox paused with no record of it could be neither resumed
            # nor kept.
            now = self._ctx.clock()
            await self._ledger.store.bind_session(
                PAUSE_KEY + token, held.entry, sandbox_id, now + ttl, now
            )
            try:
                await held.sandbox.pause()
            except BaseException:
                await asyncio.shield(self._ledger.store.unbind_session(PAUSE_KEY + token))
                raise
        except BaseException:
            await asyncio.shield(storage.drop(entry, sandbox_id, started))
            raise
        if held.session is not None:  # the sandbox is the token's now, not the session's
            await self._ledger.bindings.let_go(held, 0.0, drop=True)
        await self._upkeep.release(held, kill=False)
        self._ctx.emit(Paused(held.entry, held.lease_id, held.sandbox.id, held.session or ""))
        return token

    async def resume(self, token: str, timeout: float, tenant: str | None = None) -> Held:
        """Wake the sandbox ``token`` names under a new lease on its entry (counted to
        ``tenant``, as an acquire's).

        Raises:
            LeaseError: no paused sandbox for this token (unknown, expired, resumed
                already or being resumed), or its entry left the chain.
            NoProviderAvailable: the entry cannot take it now (concurrency, breaker);
                the token stays valid.
            NotFound: the sandbox is gone at the provider (the token is dropped).
        """
        key, now = PAUSE_KEY + token, self._ctx.clock()
        binding = await self._ledger.store.session(key, now)
        if binding is None:
            raise LeaseError("no paused sandbox for this token (unknown, expired or resumed)")
        entry = self._ctx.entries.get(binding.entry)
        if entry is None:
            raise LeaseError(f"the paused sandbox's entry {binding.entry!r} left the chain")
        claim = secrets.token_hex(8)
        if not await self._ledger.store.lock(key, claim, timeout + RESERVE_GRACE, now):
            raise LeaseError("this paused sandbox is being resumed by another call")
        try:
            held = await self._wake(key, binding, now + timeout, self._ledger.tenants.ref(tenant))
        except BaseException:
            await asyncio.shield(self._ledger.store.unlock(key, claim))
            raise
        # The token is spent: nobody waits on its lock, and an await here could lose the lease.
        self._upkeep.spawn(self._unlock(key, claim))
        return held

    async def _unlock(self, key: str, claim: str) -> None:
        with contextlib.suppress(StateUnavailable):  # it expires by itself
            await self._ledger.store.unlock(key, claim)

    async def _wake(
        self, key: str, binding: SessionBinding, deadline: float, tenant: TenantRef | None
    ) -> Held:
        name, sandbox_id = binding.entry, binding.sandbox_id
        entry = self._ctx.entries[name]
        try:
            booking = await self._upkeep.book(
                entry, deadline, new_session=False, meter=entry.meter(None), tenant=tenant
            )
        except Denied as denied:
            why = describe(denied.reservation, self._ctx.clock())
            raise NoProviderAvailable({name: why}) from None
        started = self._ctx.clock()
        try:
            sandbox = await asyncio.wait_for(
                entry.provider.resume(sandbox_id, timeout=booking.budget), booking.budget
            )
        except BaseException as exc:
            await self._ledger.settle_failure(booking, exc, 1, started)
            if isinstance(exc, NotFound):
                await self._ledger.store.unbind_session(key)
            raise
        held = booking.held(entry.provider.kind, sandbox, self._ctx.clock(), 1, resumed=True)
        self._upkeep.start(held, booking)
        try:
            await self._ledger.store.unbind_session(key)
        except StateUnavailable as exc:  # the sandbox runs: the lease is the caller's anyway
            self._ledger.report("session", exc)
        except asyncio.CancelledError:
            self._upkeep.spawn(self._repark(key, binding.expires, held))
            raise
        cost = await self._ledger.storage.settle(entry, sandbox.id)
        self._ctx.emit(Resumed(name, held.lease_id, sandbox.id, cost=cost, pool=entry.ref.pool))
        return held

    async def _repark(self, key: str, expires: float, held: Held) -> None:
        """Pause again, under its token, a sandbox woken for a caller who was cancelled (its
        storage held again, to the token's end); a sandbox that cannot be parked again
        (nor its storage held) is killed, its token dropped."""
        entry = self._ctx.entries[held.entry]
        try:
            now = self._ctx.clock()
            storage = self._ledger.storage
            await storage.hold(entry, held.sandbox.id, expires - now, "re-pause", held.tenant)
            await self._ledger.store.bind_session(key, held.entry, held.sandbox.id, expires, now)
            await held.sandbox.pause()
        except (ProviderError, StateUnavailable, BudgetExceeded):
            with contextlib.suppress(StateUnavailable):
                await self._ledger.store.unbind_session(key)
            await self._ledger.storage.settle(entry, held.sandbox.id)  # what it held so far
            await self._upkeep.release(held)
            return
        await self._upkeep.release(held, kill=False)
