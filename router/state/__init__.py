"""State stores, chosen by the URL scheme of ``state_url``.

``redis://``, ``rediss://``, ``redis+sentinel://`` and ``redis+cluster://``
select `RedisStore` (a fleet of replicas); ``sqlite:///path`` selects
`SQLiteStore` (one host, the embedded default); ``memory://`` an in-process
store for tests. An unknown scheme is a ConfigError naming the schemes.
"""

from __future__ import annotations

from providers.errors import ConfigError
from router.state.base import (
    EntryRef,
    FleetView,
    HeldLease,
    Reservation,
    Settlement,
    Snapshot,
    Spend,
    StateStore,
    TenantRef,
    TenantUsage,
)

__all__ = [
    "SCHEMES",
    "EntryRef",
    "FleetView",
    "HeldLease",
    "Reservation",
    "Settlement",
    "Snapshot",
    "Spend",
    "StateStore",
    "TenantRef",
    "TenantUsage",
    "on_cluster",
    "open_store",
]

SCHEMES = {
    "redis": "redis",
    "rediss": "redis",
    "redis+sentinel": "redis",
    "rediss+sentinel": "redis",
    "redis+cluster": "redis",
    "rediss+cluster": "redis",
    "unix": "redis",
    "sqlite": "sqlite",
    "memory": "memory",
}


def on_cluster(url: str) -> bool:
    """Whether ``url`` names a Redis Cluster (a script there touches one hash slot)."""
    return url.partition("://")[0].lower() in ("redis+cluster", "rediss+cluster")


def open_store(url: str, prefix: str, *, tenants: bool = False) -> StateStore:
    """The store for ``url``, namespaced by ``prefix``; ``tenants``: the config counts
    tenants (on Redis Cluster its ledger keys then share one hash tag)."""
    scheme = url.partition("://")[0].lower() if "://" in url else ""
    kind = SCHEMES.get(scheme)
    if kind == "redis":
        from router.state.redis import RedisStore

        return RedisStore(url, prefix, tenants=tenants)
    if kind == "sqlite":
        from router.state.sqlite import SQLiteStore

        return SQLiteStore(url, prefix)
    if kind == "memory":
        from router.state.memory import MemoryStore

        return MemoryStore(url, prefix)
    raise ConfigError(
        f"state_url: unsupported scheme {scheme or url!r}; expected one of "
        + ", ".join(f"{s}://" for s in sorted(SCHEMES))
    )
