"""The janitor: kill this router's sandboxes that no live lease or session holds.

The net under crashed processes: an app killed while holding leases leaves
sandboxes behind; once their leases expire (no heartbeat for ``lease_ttl``)
`Janitor.reap` finds them by this router's labels (never anyone else's)
and kills them. A warm sandbox is kept while the store records it (a
paused one holds no lease); one labelled warm that no record or lease
holds (its refill died half way) is reaped like any orphan. A fleet-wide
lock per entry lets several replicas run it at once.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field

from policies.outcome import classify
from providers.base import LABEL_ENTRY, LABEL_LEASE, LABEL_ROUTER
from providers.errors import ProviderError
from router.context import Context
from router.entries import Entry
from router.events import Reaped
from router.state import StateStore

__all__ = ["Janitor", "ReapReport"]

_LOCK_TTL = 300.0


@dataclass(slots=True)
class ReapReport:
    """What `Router.reap` did: sandboxes killed, kept (leased or bound), entries skipped."""

    killed: list[tuple[str, str]] = field(default_factory=list)
    kept: int = 0
    skipped: dict[str, str] = field(default_factory=dict)


class Janitor:
    def __init__(self, store: StateStore, ctx: Context) -> None:
        self._ctx = ctx
        self._store = store

    async def reap(self) -> ReapReport:
        report = ReapReport()
        now = self._ctx.clock()
        bound = await self._store.bound_sandboxes(now)
        for entry in self._ctx.entries.values():
            reason = entry.unusable()
            if reason is not None:
                report.skipped[entry.name] = f"not configured: {reason}"
                continue
            token = secrets.token_hex(8)
            lock = f"janitor:{entry.name}"
            if not await self._store.lock(lock, token, _LOCK_TTL, now):
                report.skipped[entry.name] = "another replica is reaping it"
                continue
            try:
                await self._reap_entry(entry, bound, report)
            except ProviderError as exc:
                report.skipped[entry.name] = f"{classify(exc).reason}: {exc}"
            finally:
                await self._store.unlock(lock, token)
        return report

    async def _reap_entry(
        self, entry: Entry, bound: set[tuple[str, str]], report: ReapReport
    ) -> None:
        ours = {LABEL_ROUTER: self._ctx.config.key_prefix, LABEL_ENTRY: entry.name}
        found = await entry.provider.list(ours)
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
                    )
                )
