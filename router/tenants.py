"""What a tenant is to the router: a checked name and its `TenantRef` from the config.

An acquire that names a tenant (``acquire(tenant="user-42")``) is counted to
it as well as to its pool, in the same store call (`policies.tenants`); its
limits are the config's ``tenants`` (the default, or the tenant's override).
An acquire without one is not tenant-limited.
"""

from __future__ import annotations

import functools

from policies.tenants import valid_name
from providers.errors import ArgumentTypeError, ConfigError, InvalidArgument
from router.config import RouterConfig
from router.state import TenantRef, on_cluster

__all__ = ["Tenants", "check_tenant"]


def check_tenant(call: str, tenant: object) -> str | None:
    """``tenant`` if it is a valid name (or None), else the error naming the argument."""
    if tenant is None:
        return None
    if not isinstance(tenant, str):
        raise ArgumentTypeError(f"{call}(tenant=...): expected a str, got {type(tenant).__name__}")
    if not valid_name(tenant):
        raise InvalidArgument(
            f"{call}(tenant={tenant[:40]!r}): a tenant is 1 to 128 letters, digits and "
            "'_ . @ + -', starting with a letter or digit"
        )
    return tenant


class Tenants:
    """Each tenant's `TenantRef`, made once per name (a bounded cache: names are
    unbounded, the config that makes them is not)."""

    def __init__(self, config: RouterConfig) -> None:
        self._config = config
        self.ref = functools.lru_cache(maxsize=4096)(self._make)
        url = config.state_url.get_secret_value() if config.state_url else ""
        self._uncounted = on_cluster(url) and not config.counts_tenants

    def _make(self, tenant: str | None) -> TenantRef | None:
        """The tenant's ref (None for an acquire without one); a Redis Cluster store whose
        config has no ``tenants:`` keeps no tenant's keys beside its pools' (a
        `ConfigError`)."""
        if tenant is None:
            return None
        if self._uncounted:
            raise ConfigError(
                f"tenant {tenant!r}: the state store is a Redis Cluster, where tenants are "
                "counted only with a tenants: section in the config (tenants: {} counts "
                "them without limits); it puts every ledger key under one hash tag"
            )
        limits, window = self._config.tenant_limits(tenant)
        return TenantRef(tenant, limits, window)
