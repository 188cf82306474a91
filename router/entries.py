"""A chain entry as the router holds it: its config, its adapter, its ledger reference.

Built once per router from the config (`build_entries`); every part of the
router (acquire, sessions, upkeep, the janitor, status) looks entries up by
name in the mapping this returns.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

from policies.pricing import (
    Resources,
    Tariff,
    estimate,
    lease_cost,
    meter,
    paused_cost,
    paused_rate,
    resources,
)
from policies.quota import Meter
from providers import missing_sdk, provider_class
from providers.base import Provider, SandboxSpec
from router.config import EntryConfig, QuotaConfig, RouterConfig
from router.events import Released
from router.state import EntryRef

__all__ = ["Entry", "build_entries"]


@dataclass(frozen=True, slots=True)
class Entry:
    cfg: EntryConfig
    provider: Provider
    ref: EntryRef
    missing_sdk: str | None  # looked up once: a find_spec costs ~50 us per call
    tariff: Tariff
    quota: QuotaConfig  # its pool's

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

    def create_spec(self, spec: SandboxSpec, labels: Mapping[str, str]) -> SandboxSpec:
        """What the router asks this entry to create for ``spec``: the entry's template
        where the spec names none (``local`` only when its entry sets one: its sandboxes
        have no image), and ``labels`` (the router's, naming its lease) on top."""
        template = spec.template
        if self.provider.kind != "local" or self.cfg.template:
            template = template or self.cfg.template
        return replace(spec, template=template, labels={**spec.labels, **labels})

    def resources(self, spec: SandboxSpec | None) -> Resources:
        """What a sandbox of ``spec`` holds here (the entry's size where the spec names none)."""
        if spec is None:
            return self.tariff.size
        return resources(self.tariff, spec.cpu, spec.memory_mb, spec.gpu)

    def cost(self, spec: SandboxSpec | None, seconds: float, *, fee: bool = True) -> float:
        """USD a lease of ``spec`` metered ``seconds`` costs on this entry (without the
        sandbox fee when ``fee`` is False: it made no sandbox, a session's reconnect)."""
        return lease_cost(self.tariff, self.resources(spec), seconds, fee=fee)

    def paused_cost(self, seconds: float) -> float:
        """USD one of its sandboxes (the entry's size) costs paused for ``seconds``."""
        return paused_cost(self.tariff, self.tariff.size, seconds)

    def paused_rate(self) -> float:
        """USD a second one of its sandboxes (the entry's size) costs paused."""
        return paused_rate(self.tariff, self.tariff.size)

    def meter(self, spec: SandboxSpec | None) -> Meter | None:
        """How the ledger holds and settles a lease of ``spec`` here (its pool's ``usd``):
        its lifetime, else the pool's ``budget_window``, renewed by that window."""
        window = self.quota.budget_window
        first = spec.lifetime if spec is not None and spec.lifetime else window
        kill = self.quota.on_budget_end == "kill"
        return meter(self.tariff, self.resources(spec), first, window, kill=kill)

    def released(
        self,
        lease_id: str,
        seconds: float | None,
        spec: SandboxSpec | None = None,
        *,
        fee: bool = True,
    ) -> Released:
        """The `Released` event of a lease of this entry, priced (no spec: the entry's size),
        as the ledger settled it."""
        cost = None if seconds is None else self.cost(spec, seconds, fee=fee)
        return Released(self.name, lease_id, seconds, cost, self.ref.pool)

    def estimate(self, spec: SandboxSpec) -> float:
        """USD a lease of ``spec`` is expected to cost here (what ``cheapest`` compares)."""
        return estimate(self.tariff, self.resources(spec), spec.lifetime)


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
        entries[entry.name] = Entry(
            entry, provider, ref, missing_sdk(entry.provider), entry.tariff(),
            config.pool_quota(entry),
        )  # fmt: skip
    if overrides:
        raise ValueError(f"providers given for entries not in the chain: {sorted(overrides)}")
    return entries
