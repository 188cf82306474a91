"""The Redis store's snapshot, decoded from the ``snapshot`` script's replies.

The script runs once per pool (its keys share one hash tag) and answers
from counters the ledger scripts keep, never from the lease set, so a
snapshot costs the same at ten live leases as at a hundred thousand.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from policies.breaker import BreakerState
from policies.quota import UNITS
from router.state.base import EntryRef, EntryStatus, PoolStatus, Snapshot

__all__ = ["decode"]


def decode(
    pools: Sequence[Sequence[EntryRef]], replies: Sequence[list[object]], now: float
) -> Snapshot:
    """The snapshot of each pool's entries (``pools``, one list per pool) from its reply:
    sessions, sandbox seconds, leases held, limits version, then each entry's leases,
    then its health."""
    snap = Snapshot()
    for members, reply in zip(pools, replies, strict=True):
        sessions, seconds, held, version, usd, usd_held, *rest = reply
        ref = members[0]
        snap.pools[ref.pool] = PoolStatus(
            ref.pool,
            ref.window.key(now),
            {
                "sessions": float(_text(sessions) or 0),
                "sandbox_seconds": float(_text(seconds) or 0),
                "concurrent": float(_text(held) or 0),
                "usd": float(_text(usd) or 0),
            },
            {u: ref.limits.get(u) for u in UNITS},
            int(_text(version) or 0),
            float(_text(usd_held) or 0),
        )
        counts, healths = rest[: len(members)], rest[len(members) :]
        for member, leases, health in zip(members, counts, healths, strict=True):
            state = BreakerState.from_dict(json.loads(_text(health)) if health else None)
            snap.entries[member.entry] = EntryStatus(member.entry, state, int(_text(leases) or 0))
    return snap


def _text(value: object) -> str:
    """A reply value as text: redis-py and the lean connection both give bytes or int."""
    if isinstance(value, bytes):
        return value.decode()
    return "" if value is None else str(value)
