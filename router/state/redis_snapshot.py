"""The Redis store's snapshot, decoded from what its read returned.

Pools first (usage of the window, the live lease ids, their slots), then
one health value per entry, as `RedisStore.snapshot` reads them.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from policies.breaker import BreakerState
from policies.quota import UNITS
from router.state.base import EntryRef, EntryStatus, PoolStatus, Snapshot

__all__ = ["decode"]

Usage = tuple[bytes | None, bytes | None]


def decode(
    refs: Sequence[EntryRef],
    now: float,
    usage: Sequence[Usage],
    slots: Sequence[Sequence[bytes | None]],
    healths: Sequence[bytes | None],
) -> Snapshot:
    """The snapshot of ``refs``: per pool (in first-seen order) its usage and live
    slots, per entry its health."""
    snap = Snapshot()
    live_by_entry: dict[str, int] = {}
    pools = {ref.pool: ref for ref in reversed(refs)}
    for ref, (sessions, seconds), live in zip(
        (pools[p] for p in dict.fromkeys(r.pool for r in refs)), usage, slots, strict=True
    ):
        for raw in live:
            if raw:
                entry = json.loads(raw)["entry"]
                live_by_entry[entry] = live_by_entry.get(entry, 0) + 1
        snap.pools[ref.pool] = PoolStatus(
            ref.pool,
            ref.window.key(now),
            {
                "sessions": float(sessions or 0),
                "sandbox_seconds": float(seconds or 0),
                "concurrent": float(len(live)),
            },
            {u: ref.limits.get(u) for u in UNITS},
        )
    for ref, raw in zip(refs, healths, strict=True):
        health = BreakerState.from_dict(json.loads(raw) if raw else None)
        snap.entries[ref.entry] = EntryStatus(ref.entry, health, live_by_entry.get(ref.entry, 0))
    return snap
