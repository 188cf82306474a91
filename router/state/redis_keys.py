"""Where the Redis store keeps what: every key of one namespace, named in one place.

Keys of one pool share the hash tag ``{<prefix>:<pool>}`` (usage per window,
the lease set, lease metadata, the count of leases each entry holds, call
answers, reconciled journals, and the health of every entry drawing on the
pool), so each ledger script touches one slot and runs on Redis Cluster.
The tenants' keys share ``{<prefix>:tenants}``: a script counting a lease to
its pool and its tenant touches both tags, which one Redis (or Sentinel's
master) runs. On Redis Cluster with tenants (`KeySpace` ``shared``), every
pool's keys and the tenants' share the one tag ``{<prefix>:ledger}``
instead, so those scripts touch one slot, on one node: the layout differs
only there (a Cluster that turns tenants on or off moves its ledger).
Sessions, locks and the replica registry each have a tag of their own.
"""

from __future__ import annotations

import itertools
import secrets
from typing import NamedTuple

from policies.tenants import TenantWindow
from router.state.base import EntryRef, TenantRef

__all__ = ["KeySpace", "PoolKeys"]


class PoolKeys(NamedTuple):
    """The keys an entry's ledger scripts touch, all under its pool's hash tag."""

    usage: str  # hash: sessions, sandbox_seconds, limits version of the current window
    leases: str  # zset: lease id -> expiry
    meta: str  # hash: lease id -> slot (json)
    health: str  # the entry's breaker state (json)
    held: str  # hash: entry -> leases it holds in the pool (kept by the scripts)


class KeySpace:
    """The key names under ``prefix``; ``shared``: every pool's and tenant's ledger key
    under one hash tag (Redis Cluster with tenants, see the module's docstring)."""

    def __init__(self, prefix: str, *, shared: bool = False) -> None:
        self.prefix = prefix
        self.shared = shared
        self._windows: dict[TenantWindow, tuple[float, float, str]] = {}
        self._calls = itertools.count()
        self._replica = secrets.token_hex(8)  # call ids of replicas never meet

    def pool(self, ref: EntryRef, now: float) -> PoolKeys:
        tag = self._tag(ref.pool)
        return PoolKeys(
            f"{tag}:usage:{self._window(ref.window, now)}",
            f"{tag}:leases",
            f"{tag}:lease",
            f"{tag}:entry:{ref.entry}",
            self.held(ref),
        )

    def held(self, ref: EntryRef) -> str:
        """The pool's holds (hash: entry -> leases it holds, ``$usd``, ``$paused``)."""
        return f"{self._tag(ref.pool)}:held"

    def tenant(self, tenant: TenantRef | None, now: float) -> list[str]:
        """The tenant's keys (none without one), under the tenants' hash tag: its
        window's usage (hash: sessions, usd), its leases (zset: id -> expiry), their
        slots (hash: id -> slot json, ``$usd`` their holds), and the window's spend by
        tenant (zset)."""
        if tenant is None:
            return []
        window = self._window(tenant.window, now)
        return [
            self.tenant_usage(tenant.window, now, tenant.name),
            *self.tenant_leases(tenant.name),
            f"{self._tenants}:spend:{window}",
        ]

    def tenant_usage(self, window: TenantWindow, now: float, tenant: str) -> str:
        return f"{self._tenants}:{tenant}:usage:{self._window(window, now)}"

    def tenant_leases(self, tenant: str) -> tuple[str, str]:
        """The tenant's lease set (zset: id -> expiry) and their slots (hash)."""
        return f"{self._tenants}:{tenant}:leases", f"{self._tenants}:{tenant}:lease"

    def tenant_spend(self, window: TenantWindow, now: float) -> str:
        return f"{self._tenants}:spend:{self._window(window, now)}"

    @property
    def _tenants(self) -> str:
        return f"{{{self.prefix}:ledger}}:tenants" if self.shared else f"{{{self.prefix}:tenants}}"

    def memo(self, ref: EntryRef, call_id: str) -> str:
        """Where a script keeps this call's answer for a retry (see `LedgerSupport`)."""
        return f"{self._tag(ref.pool)}:call:{call_id or f'{self._replica}.{next(self._calls)}'}"

    def warm(self, ref: EntryRef) -> str:
        """The entry's warm records (hash: lease id -> record json), under its pool's tag:
        reserve claims from it in the same script."""
        return f"{self._tag(ref.pool)}:warm:{ref.entry}"

    def journal(self, ref: EntryRef, journal_id: str) -> str:
        """Marks a replica's outage journal as reconciled into this pool."""
        return f"{self._tag(ref.pool)}:journal:{journal_id}"

    def sessions(self) -> tuple[str, str]:
        """The session index (zset: name -> expiry) and bindings (hash: name -> json)."""
        tag = f"{{{self.prefix}:sessions}}"
        return f"{tag}:expiry", f"{tag}:binding"

    def session_memo(self) -> str:
        """Where a session script keeps this call's answer for a retry of it."""
        return f"{{{self.prefix}:sessions}}:call:{self._replica}.{next(self._calls)}"

    def lock(self, name: str) -> str:
        return f"{{{self.prefix}:locks}}:{name}"

    def fleet(self) -> tuple[str, str]:
        """The replica registry (hash: replica id -> its `policies.fleet.Member`) and the
        sequence that orders its contacts."""
        tag = f"{{{self.prefix}:fleet}}"
        return f"{tag}:members", f"{tag}:seq"

    def _tag(self, pool: str) -> str:
        if self.shared:
            return f"{{{self.prefix}:ledger}}:pool:{pool}"
        return f"{{{self.prefix}:{pool}}}"

    def _window(self, window: TenantWindow, now: float) -> str:
        """The window's name, recomputed only when ``now`` leaves the cached window."""
        cached = self._windows.get(window)
        if cached is None or not cached[0] <= now < cached[1]:
            start, end = window.bounds(now)
            cached = (start.timestamp(), end.timestamp(), window.key(now))
            self._windows[window] = cached
        return cached[2]
