"""A chain entry as the router holds it: its config, its adapter, its ledger reference.

Built once per router from the config (`build_entries`); every part of the
router (acquire, sessions, upkeep, the janitor, status) looks entries up by
name in the mapping this returns.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from providers import missing_sdk, provider_class
from providers.base import Provider
from router.config import EntryConfig, RouterConfig
from router.state import EntryRef

__all__ = ["Entry", "build_entries"]


@dataclass(frozen=True, slots=True)
class Entry:
    cfg: EntryConfig
    provider: Provider
    ref: EntryRef
    missing_sdk: str | None  # looked up once: a find_spec costs ~50 us per call

    @property
    def name(self) -> str:
        return self.cfg.name

    def unusable(self) -> str | None:
        """Why the entry cannot serve here (no SDK, no credentials), or None."""
        return self.missing_sdk or self.provider.unconfigured_reason()

    @property
    def capabilities(self) -> frozenset[str]:
        """The config's override, else what the provider declares."""
        if self.cfg.capabilities is not None:
            return frozenset(self.cfg.capabilities)
        return self.provider.capabilities


def build_entries(
    config: RouterConfig, providers: Mapping[str, Provider] | None = None
) -> dict[str, Entry]:
    """The enabled entries of the chain, in order; ``providers`` overrides adapters by name."""
    overrides = dict(providers or {})
    entries: dict[str, Entry] = {}
    for entry in config.chain:
        if not entry.enabled:
            continue
        provider = overrides.pop(entry.name, None) or provider_class(entry.provider)(
            entry.name, entry.provider_options()
        )
        ref = EntryRef(
            entry.name,
            entry.pool,
            config.pool_quota(entry).limits(),
            config.window(entry),
            entry.fingerprint(),
        )
        entries[entry.name] = Entry(entry, provider, ref, missing_sdk(entry.provider))
    if overrides:
        raise ValueError(f"providers given for entries not in the chain: {sorted(overrides)}")
    return entries
