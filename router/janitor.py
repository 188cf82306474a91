"""The janitor: kill this router's sandboxes that no live lease or session holds.

The net under crashed processes, failed kills and lost replies: an app
killed while holding leases leaves sandboxes behind; once their leases
expire (no heartbeat for ``lease_ttl``) `Janitor.reap` finds them by this
router's labels (never anyone else's) and kills them. A warm sandbox is
kept while the store records it (a paused one holds no lease); one labelled
warm that no record or lease holds (its refill died half way) is reaped
like any orphan. A fleet-wide lock per entry lets several replicas run it
at once.

The router runs it by itself every ``reap_every`` seconds (`Janitor.start`,
from the first acquire or resume): each replica tries a fleet-wide lock
(``reaper``) and leaves it to expire, so about one replica a period reaps,
whichever takes it; if that replica dies, another takes the next period.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from dataclasses import dataclass, field

from policies.outcome import classify
from providers.base import LABEL_ENTRY, LABEL_LEASE, LABEL_ROUTER, LABEL_WARM, SandboxInfo
from providers.errors import ProviderError
from router.context import Context
from router.entries import Entry
from router.events import Reaped, TaskFailed
from router.paused_storage import PausedStorage
from router.spans import untraced
from router.state import StateStore

__all__ = ["REAPER_LOCK", "Janitor", "ReapReport"]

_LOCK_TTL = 300.0
REAPER_LOCK = "reaper"  # the fleet-wide lock of the periodic pass
_REAPER_HOLD = 0.9  # of ``reap_every``: the lock is gone by the taker's next period


@dataclass(slots=True)
class ReapReport:
    """What `Router.reap` did: sandboxes killed, kept (leased or bound), entries skipped."""

    killed: list[tuple[str, str]] = field(default_factory=list)
    kept: int = 0
    skipped: dict[str, str] = field(default_factory=dict)


class Janitor:
    def __init__(self, store: StateStore, ctx: Context, paused: PausedStorage) -> None:
        self._ctx = ctx
        self._store = store
        self._paused = paused
        self._task: asyncio.Task[None] | None = None
        self._closed = False

    def start(self) -> None:
        """Reap every ``reap_every`` seconds in the background, from now on (once per
        router; not at all when it is 0)."""
        every = self._ctx.config.reap_every
        if self._task is None and every > 0 and not self._closed:
            self._task = untraced(self._run(every))

    async def _run(self, every: float) -> None:
        # Until closed, not only until cancelled: a vendor SDK's own timeout scope can
        # take the close's cancel for its timeout, and the pass then ends in an error.
        while not self._closed:
            await asyncio.sleep(every)
            hold, token = every * _REAPER_HOLD, secrets.token_hex(8)
            try:
                if await self._store.lock(REAPER_LOCK, token, hold, self._ctx.clock()):
                    await self.reap()
            except Exception as exc:  # a pass's bad luck stops no later pass
                if not self._closed:  # one cut short by the close is no failure
                    self._ctx.emit(TaskFailed("reaper", f"{type(exc).__name__}: {exc}"))

    async def close(self) -> None:
        """Stop reaping (a pass in flight is cancelled: the next replica's finishes it)."""
        self._closed = True
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def reap(self) -> ReapReport:
        report = ReapReport()
        for entry in self._ctx.entries.values():
            reason = entry.unusable()
            if reason is not None:
                report.skipped[entry.name] = f"not configured: {reason}"
                continue
            token = secrets.token_hex(8)
            lock = f"janitor:{entry.name}"
            if not await self._store.lock(lock, token, _LOCK_TTL, self._ctx.clock()):
                report.skipped[entry.name] = "another replica is reaping it"
                continue
            try:
                await self._reap_entry(entry, report)
            except ProviderError as exc:
                report.skipped[entry.name] = f"{classify(exc).reason}: {exc}"
            finally:
                await self._store.unlock(lock, token)
        return report

    async def _storage(self, entry: Entry, info: SandboxInfo) -> float | None:
        """Settle a reaped paused sandbox's storage hold: its pause token (or its sticky
        session) lapsed unresumed, so no resume settled it. Its hold ends with the pause's
        TTL, so that much is charged (the lapse to this reap is not: it was never held).
        None for one that held nothing (running, warm, unpriced)."""
        if LABEL_WARM in info.labels:
            return None
        return await self._paused.settle(entry, info.id)

    async def _reap_entry(self, entry: Entry, report: ReapReport) -> None:
        """Kill the entry's listed sandboxes that neither a session binding nor a lease
        (or warm record) holds, both read after the listing, bindings first: a sandbox
        moving from one to the other (a resume by token, a pause) is seen in one."""
        ours = {LABEL_ROUTER: self._ctx.config.key_prefix, LABEL_ENTRY: entry.name}
        found = await entry.provider.list(ours)
        bound = await self._store.bound_sandboxes(self._ctx.clock())
        live = await self._store.warm_kept(entry.ref, self._ctx.clock())
        for info in found:
            if info.labels.get(LABEL_LEASE) in live or (entry.name, info.id) in bound:
                report.kept += 1
            elif await entry.provider.kill(info.id):
                report.killed.append((entry.name, info.id))
                self._ctx.emit(
                    Reaped(
                        entry=entry.name,
                        sandbox_id=info.id,
                        lease_id=info.labels.get(LABEL_LEASE, ""),
                        cost=await self._storage(entry, info),
                        pool=entry.ref.pool,
                    )
                )
