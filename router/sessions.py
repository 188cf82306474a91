"""Sticky sessions: the same key gets the same live sandbox back, from any replica, to one
holder at a time.

The binding (session -> entry, sandbox id, until when, paused or not, who
holds it) lives in the shared store. An acquire with a session first
claims it (`Sessions.claim`): while another live lease holds the session,
on any replica, the acquire waits for that lease's release, up to its own
timeout (then `SessionBusy`), so a sandbox is never used, paused or killed
by two leases at once. Holding the claim, it tries `Sessions.resume`:
reconnect to the bound sandbox (wake it, when the session's release paused
it) under a slot-only reservation (nothing new is created). When that
sandbox is gone, the entry left the chain or cannot serve, the session is
lost (an event says why), its old sandbox is killed in the background, and
the acquire creates and binds a new one. The lease it hands out holds the
session from then on; its release lets go of it (`router.upkeep`).
"""

from __future__ import annotations

import asyncio
import secrets
from dataclasses import dataclass

from policies.outcome import classify
from policies.quota import Renewal
from providers.errors import SessionBusy, StateUnavailable
from router.booking import RESERVE_GRACE, Denied, describe
from router.context import Context
from router.entries import Entry
from router.events import Resumed, SessionClosed, SessionHeld, SessionLost
from router.lease import Held
from router.ledger import Ledger
from router.state.base import SessionBinding, TenantRef
from router.upkeep import Upkeep
from router.waits import until_done

__all__ = ["Claim", "Sessions"]

_FIRST_LOOK, _LAST_LOOK = 0.05, 0.5  # seconds between looks at a held session (doubling)


@dataclass(slots=True)
class Claim:
    """An acquire's hold on its session.

    Attributes:
        binding: the sandbox the session names (None: none, or it was lost: the
            acquire creates one).
        taken: a lease holds the session now; its release lets go of it.
    """

    session: str
    holder: str
    binding: SessionBinding | None
    taken: bool = False


class Sessions:
    """Claim, resume, bind, let go of and close sticky sessions."""

    def __init__(self, ledger: Ledger, upkeep: Upkeep, ctx: Context) -> None:
        self._ctx = ctx
        self._ledger = ledger
        self._upkeep = upkeep

    async def claim(self, session: str, deadline: float) -> Claim:
        """Hold ``session`` for this acquire, waiting while another lease holds it.

        The claim lasts until the acquire's deadline (plus the grace a
        reservation has), so a claimer that dies frees the session soon. A
        release on this replica wakes the wait at once; one on another
        replica is seen at the next look (every 50 ms, doubling to 500 ms).

        Raises:
            SessionBusy: another lease held it until ``deadline``.
            StateUnavailable: the store cannot say who holds it.
        """
        holder = "h-" + secrets.token_hex(8)
        loop = asyncio.get_running_loop()
        waited = max(0.0, deadline - self._ctx.clock())
        ends, look, told = loop.time() + waited, _FIRST_LOOK, False
        while True:
            now = self._ctx.clock()
            try:
                got = await self._ledger.store.claim_session(
                    session, holder, deadline + RESERVE_GRACE, now
                )
            except StateUnavailable as exc:
                self._ledger.report("session", exc)
                raise
            if not got.busy:
                return Claim(session, holder, got.binding)
            held = got.binding
            assert held is not None
            if not told:  # a sandbox id "" while the holder creates its sandbox
                self._ctx.emit(SessionHeld(session, held.entry, held.sandbox_id))
                told = True
            left = ends - loop.time()
            if left <= 0:
                what = "creating its sandbox"
                if held.sandbox_id:
                    what = f"sandbox {held.sandbox_id} on {held.entry}"
                raise SessionBusy(
                    f"session {session!r} is held by another live lease ({what}); waited "
                    f"{waited:.1f}s for its release, the acquire's timeout"
                )
            await self._upkeep.session_released(min(look, left))
            look = min(look * 2, _LAST_LOOK)

    def let_go(self, claim: Claim) -> None:
        """Give the session back when no lease took it (the acquire failed or was
        cancelled), in the background: its sandbox stays bound for the session's idle
        TTL, as after a release; a claim naming none is dropped."""
        if not claim.taken:
            self._upkeep.spawn(self._let_go(claim))

    async def _let_go(self, claim: Claim) -> None:
        idle, now = self._ctx.config.session_idle_ttl, self._ctx.clock()
        drop = claim.binding is None or idle <= 0
        try:
            held = await self._ledger.store.release_session(
                claim.session, claim.holder, now + idle, now, drop=drop
            )
        except StateUnavailable as exc:  # the claim expires by itself
            self._ledger.report("session", exc)
            return
        finally:
            self._upkeep.wake_sessions()
        if held and drop and claim.binding is not None:  # kept for no idle time: killed
            self._discard(claim.binding)

    async def resume(
        self,
        claim: Claim,
        requires: tuple[str, ...],
        deadline: float,
        tenant: TenantRef | None = None,
    ) -> Held | None:
        """Reconnect to the claimed session's sandbox, or None (and say why) to create anew."""
        binding = claim.binding
        if binding is None:
            return None
        entry = self._ctx.entries.get(binding.entry)
        if entry is None:
            self._lose(claim, f"entry {binding.entry!r} is no longer in the chain")
            return None
        why = None
        if (reason := entry.unusable()) is not None:
            why = f"entry {binding.entry!r} is not configured: {reason}"
        elif not set(requires) <= entry.capabilities:
            why = f"entry {binding.entry!r} lacks {', '.join(requires)}"
        if why is not None:
            self._lose(claim, why)
            return None
        try:
            booking = await self._upkeep.book(
                entry, deadline, new_session=False, meter=entry.meter(None), tenant=tenant
            )
        except Denied as denied:
            self._lose(claim, describe(denied.reservation, self._ctx.clock()))
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
            why = f"{classify(exc).reason}: {exc}"
            self._lose(claim, why, sandbox_id=binding.sandbox_id)
            return None
        committing = self._ledger.commit(booking, sandbox.id, self._ctx.clock())
        held = booking.held(
            entry.provider.kind, sandbox, self._ctx.clock(), 1, session=claim.session, resumed=True
        )
        held.holder, claim.taken = claim.holder, True  # its release lets go from here on
        try:
            await until_done(committing)  # a cancel here leaves the commit running
            if not committing.result():
                claim.taken = False
                return None
            await self.bind(held, claim)
        except BaseException:
            self._upkeep.spawn(self._release(committing, held))
            raise
        self._upkeep.keep(held)
        if binding.paused:
            cost = await self._ledger.storage.settle(entry, binding.sandbox_id)
            self._ctx.emit(
                Resumed(entry.name, held.lease_id, sandbox.id, claim.session, cost, entry.ref.pool)
            )
        return held

    async def _release(self, committing: asyncio.Future[Renewal | None], held: Held) -> None:
        """Release a reconnected lease its caller will not get (cancelled, or the session
        is not its), once its commit lands: the sandbox stays the session's, as after any
        release, while the lease held the session."""
        await until_done(committing)
        if committing.result():
            self._upkeep.keep(held)
            await self._upkeep.release(held)

    async def bind(self, held: Held, claim: Claim) -> None:
        """Bind the claimed session to the lease's sandbox, held by the lease from now on.

        The bind runs on if the caller is cancelled, and the lease's release
        waits for it: whether it landed decides whether the sandbox stays the
        session's.

        Raises:
            SessionBusy: another acquire holds the session: this one's claim expired
                (it stalled past its deadline) and the session moved on.
        """
        held.session, held.holder, claim.taken = claim.session, claim.holder, True
        binding = self._ledger.bindings.bind(held, self._ctx.config.lease_ttl)
        held.binding = asyncio.ensure_future(binding)
        await until_done(held.binding)  # a cancel here leaves it running: the release waits
        if not held.binding.result():
            raise SessionBusy(
                f"session {claim.session!r} was claimed by another acquire while this one "
                "stalled past its deadline"
            )

    def _lose(self, claim: Claim, why: str, *, sandbox_id: str = "") -> None:
        """Say why the session lost its sandbox, and kill that sandbox in the background."""
        binding = claim.binding
        assert binding is not None
        self._ctx.emit(SessionLost(claim.session, binding.entry, why, sandbox_id))
        claim.binding = None
        self._discard(binding)

    def _discard(self, binding: SessionBinding) -> None:
        """Kill a session's old sandbox in the background: the session moves to a new one
        (its claim is this acquire's, so no other lease holds that sandbox).

        Best effort: when its provider is down the reaper gets it later.
        """
        entry = self._ctx.entries.get(binding.entry)
        if entry is not None:
            self._upkeep.spawn(self._kill(entry, binding))

    async def _kill(self, entry: Entry, binding: SessionBinding) -> None:
        """Kill a session's sandbox, and settle the storage a paused one held."""
        await self._upkeep.kills.kill_id(entry, binding.sandbox_id)
        if binding.paused:
            await self._ledger.storage.settle(entry, binding.sandbox_id)

    async def close(self, session: str) -> bool:
        """Forget the session now and kill its sandbox; False when it had none.

        A sandbox a live lease holds is not killed under it: its release kills
        it (the session no longer names it).
        """
        binding = await self._ledger.store.take_session(session, self._ctx.clock())
        if binding is None:
            return False
        entry = self._ctx.entries.get(binding.entry)
        if entry is not None and not binding.holder:
            await self._kill(entry, binding)
        self._ctx.emit(
            SessionClosed(session=session, entry=binding.entry, sandbox_id=binding.sandbox_id)
        )
        return True
