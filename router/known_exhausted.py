"""The pools this replica knows are out of quota, as the ledger uses that memory.

`policies.exhausted` decides when a remembered exhaustion still holds; here
a booking on such a pool is denied without asking the store, and a chain
that walks past it says why, in words made once per remembered denial (the
walk passes the same exhausted entries on every acquire).
"""

from __future__ import annotations

from policies.exhausted import Exhausted, ExhaustedPools
from router.booking import Denied, describe, remembered_denial
from router.state import EntryRef, Reservation, Snapshot

__all__ = ["KnownExhausted"]


class KnownExhausted:
    def __init__(self, recheck: float) -> None:
        self.pools = ExhaustedPools(recheck=recheck)
        self._why: dict[str, tuple[Exhausted, str]] = {}

    def skip(self, ref: EntryRef, now: float) -> None:
        """Raise `Denied` for a pool this replica knows is out of quota, asking nobody."""
        known = self.pools.lookup(ref.pool, ref.limits, now)
        if known is not None:
            raise Denied(remembered_denial(known))

    def why(self, ref: EntryRef, now: float) -> str | None:
        """Why ``ref``'s pool is skipped, or None when it is not known to be exhausted."""
        known = self.pools.lookup(ref.pool, ref.limits, now)
        if known is None:
            return None
        why = self._why.get(ref.pool)
        if why is None or why[0] is not known:
            why = self._why[ref.pool] = (known, describe(remembered_denial(known), now))
        return why[1]

    def remember(self, ref: EntryRef, r: Reservation, now: float) -> None:
        """Learn from the store's answer to a reservation."""
        if r.granted:
            self.pools.forget(ref.pool)
        elif r.reason == "quota":
            self.pools.note(ref.pool, ref.limits, r.unit, r.used, r.limit, r.until, r.version, now)

    def observe(self, snap: Snapshot) -> Snapshot:
        """Let a pool status read anyway clear what this replica remembers of it."""
        for status in snap.pools.values():
            self.pools.observe(status.pool, status.version, status.used)
        return snap

    def forget(self, pool: str) -> None:
        self.pools.forget(pool)
