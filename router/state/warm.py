"""The store's half of warm pools: records of ready sandboxes, per entry.

A claim happens inside `LedgerSupport.reserve` (``warm=True``: the same
script or transaction that reserves, no round trip of its own); the calls
here put a sandbox in the pool once its create is committed, take one out
to kill it, and list them (the refill, the janitor, the metrics). The
rules are `policies.warm`'s.
"""

from __future__ import annotations

import abc
from typing import TYPE_CHECKING

from policies.warm import Claim, WarmRecord

if TYPE_CHECKING:
    from router.state.base import EntryRef

__all__ = ["Claim", "WarmRecord", "WarmSupport"]


class WarmSupport(abc.ABC):
    """Warm sandboxes ready for an entry, shared by the fleet."""

    @abc.abstractmethod
    async def warm_put(self, ref: EntryRef, lease_id: str, record: WarmRecord, now: float) -> bool:
        """Put the sandbox of the committed lease ``lease_id`` in the entry's pool.

        Running (``record.paused`` False): the lease keeps its slot until
        ``record.expires``. Paused: the lease is released, its seconds
        metered. False when the lease is not live (nothing is put).
        """

    @abc.abstractmethod
    async def warm_take(self, ref: EntryRef, lease_id: str, now: float) -> float | None:
        """Take a warm sandbox out of the pool (to kill it): the seconds metered for
        it, or None when it was no longer there (claimed, or taken by another)."""

    @abc.abstractmethod
    async def warm_list(self, ref: EntryRef, now: float) -> dict[str, WarmRecord]:
        """The entry's warm records by lease id (claimable or past their deadline)."""

    @abc.abstractmethod
    async def warm_kept(self, ref: EntryRef, now: float) -> set[str]:
        """In one read, the lease ids the janitor keeps: the pool's unexpired leases
        and the entry's warm records (a paused warm sandbox holds no lease)."""
