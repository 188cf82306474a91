"""What a sandbox costs: each vendor's published price, how it meters, and a lease's cost.

Prices are USD per hour (``vcpu_hour``, ``memory_gib_hour``, ``gpu_hour`` by
GPU type, ``paused_gib_hour``) plus ``per_sandbox``, the keys of an entry's
``price`` in the config, which overrides the defaults below key by key
(negotiated rates). A vendor meters in its own way (`Metering`): Modal
takes ``cpu`` as physical cores, 1 core = 2 vCPU, billed at the greater of
request and use (the router sees the request only, so its figure is a
floor); Daytona bills whole minutes (rounded up); E2B bills per second.

The defaults were read on 2026-11-28 from stored copies of the pages named
per vendor (the sandbox this was written in had no internet). Where a
number could not be confirmed from the vendor's own page it says so;
docs/money.md lists them.

* E2B, per second, allocated (not used) CPU and RAM: $0.000014 per
  vCPU-second ($0.0504/h) and $0.0000045 per GiB-second ($0.0162/h).
  Sources: https://e2b-add-billing-page.mintlify.app/docs/billing (E2B's
  billing page: per second, allocated resources; "8 vCPU and 4 GB RAM
  costs $0.468 per hour", which these two rates give exactly),
  https://www.usagepricing.com/blueprint/e2b ($0.000014/s per vCPU; 2 vCPU
  the default), https://www.beam.cloud/blog/e2b-pricing-explained (both
  rates, "verified at e2b.dev/pricing on 2026-06-16"). Default size 2 vCPU,
  512 MiB (the RAM not confirmed). Paused storage: no published rate found.
* Daytona, per minute (the issue's rule; not confirmed in a stored page):
  $0.0504 per vCPU-hour and $0.0162 per GiB-hour ("identical to E2B's",
  https://www.beam.cloud/blog/e2b-pricing-explained), H100 $3.95/h (same
  page). Default size 1 vCPU, 1 GiB (https://www.daytona.io/docs/en/sandboxes).
  Storage of a stopped sandbox: no rate found.
* Modal, per second at max(request, use), ``cpu`` in physical cores
  (1 core = 2 vCPU: https://modal.com/docs/guide/sandbox-resources): a
  Sandbox core is 3x the Function rate of $0.0000131/core/s
  (https://www.beam.cloud/blog/modal-pricing-explained, "verified June 27,
  2026"), so $0.0000393/core/s = $0.07074 per vCPU-hour; memory
  $0.00000672/GiB/s ($0.024192/h) is 3x the Function rate and NOT confirmed
  in a stored page; H100 $3.95/h (same blog). Default request 0.125 cores,
  128 MiB (https://modal.com/docs/guide/resources).
* Runloop: no published rate found; no default (it costs nothing until its
  entry is given a ``price``, and ``status`` says so).
* local: costs nothing.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from policies import quota

__all__ = [
    "DEFAULTS",
    "ESTIMATE_SECONDS",
    "HOUR",
    "METERING",
    "SIZES",
    "Metering",
    "Price",
    "Resources",
    "Tariff",
    "estimate",
    "lease_cost",
    "meter",
    "metered",
    "paused_cost",
    "paused_rate",
    "rate",
    "resources",
    "tariff",
    "window_spend",
]

HOUR = 3600.0
# `estimate`'s lease length when the spec gives no lifetime: what `cheapest`
# compares, so a per-sandbox fee and a per-minute rounding weigh as they would
# on a short agent task.
ESTIMATE_SECONDS = 300.0


@dataclass(frozen=True, slots=True)
class Price:
    """USD per hour of each resource, and per sandbox created; absent keys cost nothing."""

    vcpu_hour: float = 0.0
    memory_gib_hour: float = 0.0
    gpu_hour: Mapping[str, float] = field(default_factory=dict)
    per_sandbox: float = 0.0
    paused_gib_hour: float = 0.0

    def merged(self, override: Mapping[str, object]) -> Price:
        """This price with the keys ``override`` gives replaced (``gpu_hour`` type by type)."""

        def given(key: str, default: float) -> float:
            value = override.get(key)
            return float(value) if isinstance(value, int | float) else default

        gpus = dict(self.gpu_hour)
        extra = override.get("gpu_hour")
        if isinstance(extra, Mapping):
            gpus.update({str(k): float(v) for k, v in extra.items()})
        return Price(
            vcpu_hour=given("vcpu_hour", self.vcpu_hour),
            memory_gib_hour=given("memory_gib_hour", self.memory_gib_hour),
            gpu_hour=gpus,
            per_sandbox=given("per_sandbox", self.per_sandbox),
            paused_gib_hour=given("paused_gib_hour", self.paused_gib_hour),
        )


@dataclass(frozen=True, slots=True)
class Metering:
    """How a vendor counts: vCPUs per unit of the spec's ``cpu``, and the billing step.

    ``step``: seconds are billed in whole steps, rounded up (E2B and Modal: 1,
    Daytona: 60); None bills the exact duration.
    """

    vcpu_per_cpu: float = 1.0
    step: float | None = None


@dataclass(frozen=True, slots=True)
class Resources:
    """What one sandbox holds while it runs: vCPUs, GiB of memory, and GPUs of a type."""

    vcpu: float
    memory_gib: float
    gpu: str | None = None
    gpus: int = 0


@dataclass(frozen=True, slots=True)
class Tariff:
    """An entry's price (None: unpriced, costs nothing), metering and default size."""

    price: Price | None
    metering: Metering
    size: Resources
    source: str


_E2B = Price(vcpu_hour=0.0504, memory_gib_hour=0.0162)
DEFAULTS: Mapping[str, Price] = {
    "e2b": _E2B,
    "daytona": Price(vcpu_hour=0.0504, memory_gib_hour=0.0162, gpu_hour={"H100": 3.95}),
    "modal": Price(
        vcpu_hour=0.0000393 * HOUR / 2, memory_gib_hour=0.00000672 * HOUR, gpu_hour={"H100": 3.95}
    ),
    "local": Price(),
}
METERING: Mapping[str, Metering] = {
    "e2b": Metering(step=1.0),
    "modal": Metering(vcpu_per_cpu=2.0, step=1.0),
    "daytona": Metering(step=60.0),
}
SIZES: Mapping[str, Resources] = {
    "e2b": Resources(2.0, 0.5),
    "daytona": Resources(1.0, 1.0),
    "modal": Resources(0.25, 0.125),
}
_NO_SIZE = Resources(1.0, 1.0)


def tariff(
    provider: str,
    override: Mapping[str, object] | None = None,
    size: Resources | None = None,
) -> Tariff:
    """The tariff of an entry of ``provider``: its default price with ``override``'s keys
    over it, and ``size`` (else the vendor's default) when the spec names none."""
    default = DEFAULTS.get(provider)
    if override is not None:
        price: Price | None = (default or Price()).merged(override)
        source = "config" if default is None else "config over the vendor's published price"
    elif default is not None:
        price, source = default, "the vendor's published price"
    else:
        price, source = None, "no price configured and no published default: costs nothing"
    chosen = size or SIZES.get(provider, _NO_SIZE)
    return Tariff(price, METERING.get(provider, Metering()), chosen, source)


def resources(
    t: Tariff, cpu: float | None = None, memory_mb: int | None = None, gpu: str | None = None
) -> Resources:
    """What a sandbox of this spec holds on this tariff: the spec's, else the default size.

    ``gpu`` is a type with an optional count (``"A100:2"``, Modal's form).
    """
    vcpu = cpu * t.metering.vcpu_per_cpu if cpu is not None else t.size.vcpu
    memory = memory_mb / 1024 if memory_mb is not None else t.size.memory_gib
    kind, count = t.size.gpu, t.size.gpus
    if gpu is not None:
        kind, _, n = gpu.partition(":")
        count = int(n) if n.isdigit() and int(n) > 0 else 1
    return Resources(vcpu, memory, kind, count if kind is not None else 0)


def rate(price: Price | None, res: Resources) -> float:
    """USD per second of a running sandbox holding ``res`` (a GPU type unpriced costs nothing)."""
    if price is None:
        return 0.0
    hourly = price.vcpu_hour * res.vcpu + price.memory_gib_hour * res.memory_gib
    if res.gpu is not None:
        hourly += price.gpu_hour.get(res.gpu, 0.0) * res.gpus
    return hourly / HOUR


def metered(seconds: float, metering: Metering) -> float:
    """The seconds a vendor bills for ``seconds`` of running: whole steps, rounded up."""
    return quota.metered(seconds, metering.step or 0.0)


def lease_cost(t: Tariff, res: Resources, seconds: float, *, fee: bool = True) -> float:
    """USD one lease cost: its resources times its billed seconds, plus the sandbox fee
    (``fee`` False: the lease made no sandbox, a sticky session's reconnect)."""
    if t.price is None:
        return 0.0
    return rate(t.price, res) * metered(seconds, t.metering) + (t.price.per_sandbox if fee else 0.0)


def meter(
    t: Tariff, res: Resources, first: float, renew: float, *, kill: bool = False
) -> quota.Meter | None:
    """How the ledger holds and settles a lease of ``res`` on this tariff (a ``usd``
    budget, `policies.quota.Meter`): its first cover ``first`` seconds, each renewal
    ``renew``; None when it costs nothing."""
    if t.price is None:
        return None
    per_second = rate(t.price, res)
    if per_second <= 0 and t.price.per_sandbox <= 0:
        return None
    step = t.metering.step or 0.0
    return quota.Meter(per_second, t.price.per_sandbox, step, first, renew, kill)


def paused_rate(t: Tariff, res: Resources) -> float:
    """USD a second a paused sandbox holding ``res`` costs: its memory's GiB (the image a
    pause keeps) at ``paused_gib_hour``."""
    if t.price is None:
        return 0.0
    return t.price.paused_gib_hour * res.memory_gib / HOUR


def paused_cost(t: Tariff, res: Resources, seconds: float) -> float:
    """USD a paused sandbox holding ``res`` costs for ``seconds``, exact (no vendor step
    is known)."""
    return paused_rate(t, res) * seconds if seconds > 0 else 0.0


def estimate(t: Tariff, res: Resources, lifetime: float | None = None) -> float:
    """What a lease is expected to cost: ``lifetime`` seconds (else `ESTIMATE_SECONDS`)."""
    return lease_cost(t, res, lifetime if lifetime is not None else ESTIMATE_SECONDS)


def window_spend(t: Tariff, seconds: float, sessions: float) -> float:
    """USD a pool's window usage costs at this tariff: ``seconds`` metered at the default
    size's rate plus ``sessions`` sandbox fees.

    An approximation of the leases' own costs: the store keeps the seconds, not each
    lease's resources nor its rounding to the vendor's step.
    """
    if t.price is None:
        return 0.0
    return rate(t.price, t.size) * max(seconds, 0.0) + t.price.per_sandbox * max(sessions, 0.0)
