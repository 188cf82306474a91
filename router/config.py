"""The router's configuration: a YAML chain file, or the environment.

Validation errors name the file, the field path and what was expected
(``chain.yaml: chain[1].quota.sessions: must be >= 0, got -5``). Unknown
keys are rejected, at every level, including each provider's ``options``
(validated by the adapter's own ``Options`` model). String values may use
``${VAR}`` or ``${VAR:-default}``; secrets are ``SecretStr`` and never show
in a repr, a log line or an error.

Without a file, `from_env` builds the default chain daytona -> runloop ->
modal -> e2b -> local from the environment (see its docstring).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import json
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal, get_args
from urllib.parse import parse_qs, urlsplit

import yaml
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    SecretStr,
    Strict,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from policies.breaker import BreakerConfig
from policies.latency import percentile
from policies.outage import OutageShare
from policies.pricing import Resources, Tariff, tariff
from policies.quota import Limits, MonthlyWindow
from policies.retry import RetryPolicy
from policies.tenants import TENANT_NAME, DailyWindow, TenantLimits, TenantWindow
from providers import PROVIDERS, provider_class
from providers.base import ProviderOptions
from providers.capabilities import Capability
from providers.errors import ConfigError
from router.config_file import MAX_DEPTH, read_yaml
from router.logs import LogFormat
from router.state import SCHEMES

__all__ = [
    "DEFAULT_CHAIN",
    "BreakerSettings",
    "EntryConfig",
    "HedgeConfig",
    "McpSettings",
    "PriceConfig",
    "QuotaConfig",
    "ResourcesConfig",
    "RetrySettings",
    "RouterConfig",
    "TenantLimitsConfig",
    "TenantsConfig",
    "WarmConfig",
    "default_state_url",
    "load_config",
]

DEFAULT_CHAIN = ("daytona", "runloop", "modal", "e2b")
_NAME = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$"
_ENV_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")
_SAFE_PERSISTENT_DIR = "sandbox-router"
_SECRET_WORD = re.compile(r"key|secret|token|password")
_RENAMED = {
    "fail_open_share": "fail_open_blind is the share of each limit a replica that has not "
    "seen the fleet grants in an outage, 0 by default",
}


class _FromEnv(str):
    """A string made by ``${VAR}`` substitution: a number or boolean field reads it
    as YAML would have read the same text written in the file."""


def _env_scalar(value: Any) -> Any:
    if isinstance(value, _FromEnv):
        with contextlib.suppress(yaml.YAMLError):
            parsed = yaml.safe_load(value)
            if isinstance(parsed, bool | int | float):
                return parsed
    return value


# Strict: YAML already typed the value, so `true` is not 1 and "5" is not 5.
Int = Annotated[int, Strict(), BeforeValidator(_env_scalar)]
Float = Annotated[float, Strict(), BeforeValidator(_env_scalar)]
Bool = Annotated[bool, Strict(), BeforeValidator(_env_scalar)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class QuotaConfig(_Strict):
    """A pool's monthly limits; an absent unit is unlimited.

    ``usd``: dollars a window may spend, held per lease (`policies.quota`): a
    lease holds its lifetime's cost, else ``budget_window`` seconds' worth,
    renewed by its heartbeats while the budget covers them; when it cannot,
    ``on_budget_end`` says what happens: ``warn`` (the lease runs on, an
    overdraft the pool's hold shows) or ``kill`` (its sandbox ends when its
    cover does).
    """

    sessions: Annotated[Int, Field(ge=0)] | None = None
    sandbox_seconds: Annotated[Float, Field(ge=0)] | None = None
    concurrent: Annotated[Int, Field(ge=0)] | None = None
    usd: Annotated[Float, Field(ge=0)] | None = None
    budget_window: Annotated[Float, Field(ge=1, le=30 * 24 * 3600)] = 3600.0
    on_budget_end: Literal["warn", "kill"] = "warn"
    timezone: str | None = None
    reset_day: Annotated[Int, Field(ge=1, le=31)] | None = None

    @field_validator("timezone")
    @classmethod
    def _zone(cls, value: str | None) -> str | None:
        if value is not None:
            _check_zone(value)
        return value

    def limits(self) -> Limits:
        return Limits(self.sessions, self.sandbox_seconds, self.concurrent, self.usd)


class HedgeConfig(_Strict):
    """When a create on this entry is slow, start the next eligible entry's beside it.

    ``after``: seconds (e.g. ``1.5``), or a percentile of this entry's recent
    create latency on this replica (``"p95"``; ``p50`` to ``p99.9``); a
    percentile hedges only once the entry has `policies.latency.MIN_SAMPLES`
    creates behind it.
    """

    after: float | str

    @field_validator("after", mode="plain")
    @classmethod
    def _seconds_or_percentile(cls, value: object) -> float | str:
        """One check and one message for both forms (a union would report each form's)."""
        if isinstance(value, _FromEnv):
            with contextlib.suppress(ValueError):
                value = float(value)
        if isinstance(value, int | float) and not isinstance(value, bool) and 0 < value <= 600:
            return float(value)
        if isinstance(value, str) and percentile(value) is not None:
            return value
        raise ValueError(
            f"expected seconds (a number > 0, at most 600) or a percentile of this entry's "
            f"recent creates such as 'p95' (p1 to p99.9), got {value!r}"
        )


# The policies own their defaults; the settings read them from there.
_RETRY = RetryPolicy()
_BREAKER = BreakerConfig()
_WINDOW = MonthlyWindow()
_OUTAGE = OutageShare()


class RetrySettings(_Strict):
    """`policies.retry.RetryPolicy` as configured (its defaults)."""

    attempts: Annotated[Int, Field(ge=1, le=20)] = _RETRY.attempts
    initial: Annotated[Float, Field(gt=0, le=60)] = _RETRY.initial
    maximum: Annotated[Float, Field(gt=0, le=300)] = _RETRY.maximum

    def policy(self) -> RetryPolicy:
        return RetryPolicy(**self.model_dump())


class BreakerSettings(_Strict):
    """`policies.breaker.BreakerConfig` as configured (its defaults); an unset
    ``probe_timeout`` is the router's ``acquire_timeout``."""

    failure_threshold: Annotated[Int, Field(ge=1)] = _BREAKER.failure_threshold
    failure_rate: Annotated[Float, Field(gt=0, le=1)] = _BREAKER.failure_rate
    window_seconds: Annotated[Float, Field(gt=0)] = _BREAKER.window_seconds
    min_calls: Annotated[Int, Field(ge=1)] = _BREAKER.min_calls
    cooldown_base: Annotated[Float, Field(gt=0)] = _BREAKER.cooldown_base
    cooldown_max: Annotated[Float, Field(gt=0)] = _BREAKER.cooldown_max
    probe_timeout: Annotated[Float, Field(gt=0)] | None = None
    capacity_cooldown: Annotated[Float, Field(ge=0)] = _BREAKER.capacity_cooldown
    rate_limit_default: Annotated[Float, Field(ge=0)] = _BREAKER.rate_limit_default

    def policy(self, probe_timeout: float) -> BreakerConfig:
        return dataclasses.replace(
            _BREAKER,
            **{**self.model_dump(), "probe_timeout": self.probe_timeout or probe_timeout},
        )


class WarmConfig(_Strict):
    """A warm pool: ``size`` sandboxes kept ready, each killed after ``max_idle`` seconds
    unclaimed; ``pause`` parks them paused (the entry must declare ``pause``).

    ``server``: the vendor holds them (``warm.server``, Daytona's warm pools: the
    router only sizes the vendor's pool and creates are served from it) rather
    than the router. Unset: the vendor's pool where the entry declares
    ``warm.server`` and ``pause`` is off, else the router's."""

    size: Annotated[Int, Field(ge=0, le=1000)]
    max_idle: Annotated[Float, Field(gt=0, le=7 * 24 * 3600)] = 600.0
    pause: Bool = False
    server: Bool | None = None


class PriceConfig(_Strict):
    """An entry's price in USD (negotiated rates); a key left out keeps the vendor's
    published default (`policies.pricing`), or costs nothing where there is none."""

    vcpu_hour: Annotated[Float, Field(ge=0)] | None = None
    memory_gib_hour: Annotated[Float, Field(ge=0)] | None = None
    gpu_hour: dict[Annotated[str, Field(min_length=1)], Annotated[Float, Field(ge=0)]] = Field(
        default_factory=dict
    )
    per_sandbox: Annotated[Float, Field(ge=0)] | None = None
    paused_gib_hour: Annotated[Float, Field(ge=0)] | None = None


class ResourcesConfig(_Strict):
    """What one of the entry's sandboxes holds when the spec names no size (its
    template's size); used to price it. ``vcpu`` counts vCPUs (2 per Modal core)."""

    vcpu: Annotated[Float, Field(gt=0, le=1024)]
    memory_gib: Annotated[Float, Field(gt=0, le=65536)]
    gpu: Annotated[str, Field(min_length=1)] | None = None
    gpus: Annotated[Int, Field(ge=0, le=64)] = 0

    def resources(self) -> Resources:
        count = self.gpus or (1 if self.gpu is not None else 0)
        return Resources(self.vcpu, self.memory_gib, self.gpu, count)


class EntryConfig(_Strict):
    """One chain entry: a provider account (and template) with its pool."""

    name: Annotated[str, Field(pattern=_NAME)]
    provider: str
    quota_pool: Annotated[str, Field(pattern=_NAME)] | None = None
    quota: QuotaConfig | None = None
    hedge: HedgeConfig | None = None
    template: str | None = None
    capabilities: list[str] | None = None
    enabled: Bool = True
    warm: WarmConfig | None = None
    price: PriceConfig | None = None
    resources: ResourcesConfig | None = None
    options: dict[str, Any] = Field(default_factory=dict)

    @field_validator("provider")
    @classmethod
    def _known(cls, value: str) -> str:
        if value not in PROVIDERS:
            raise ValueError(f"unknown provider {value!r}; expected one of {sorted(PROVIDERS)}")
        return value

    @field_validator("options")
    @classmethod
    def _hide_secrets(cls, options: dict[str, Any], info: ValidationInfo) -> dict[str, Any]:
        """Wrap the values of the adapter's secret fields (``SecretStr`` in its
        ``Options``) so that no repr, dump or log of the config shows them."""
        kind = info.data.get("provider")
        if kind is None:
            return options
        secret = _secret_fields(kind)
        return {
            k: SecretStr(v) if k in secret and isinstance(v, str) else v for k, v in options.items()
        }

    @property
    def pool(self) -> str:
        return self.quota_pool or self.name

    def tariff(self) -> Tariff:
        """What its sandboxes cost: the vendor's published price under this entry's ``price``."""
        override = None if self.price is None else self.price.model_dump(exclude_none=True)
        size = None if self.resources is None else self.resources.resources()
        return tariff(self.provider, override, size)

    def provider_options(self) -> ProviderOptions:
        return provider_class(self.provider).Options.model_validate(self.options)

    def fingerprint(self) -> str:
        """A digest of everything that configures the entry (secrets included,
        only hashed): a ``misconfigured`` verdict lasts until it changes."""
        raw = json.dumps(
            {"provider": self.provider, "template": self.template, "options": self.options},
            sort_keys=True,
            default=lambda v: v.get_secret_value() if isinstance(v, SecretStr) else str(v),
        )
        return hashlib.sha256(raw.encode()).hexdigest()[:16]


MIN_TOKEN_LENGTH = 16


class McpSettings(_Strict):
    """``sandbox-router mcp``: who may use the server over HTTP and how much one call may carry.

    ``tokens`` maps each tenant to its bearer token (also read from
    ``SANDBOX_ROUTER_MCP_TOKENS``; see `router.mcp.auth`); with none the HTTP
    server listens on loopback only. A session idle for
    ``session_idle_timeout`` seconds ends, and its sandboxes with it. The
    ``max_*`` limits refuse a call's argument (a file written, a command or
    code) or cap what a result carries (a file read, a command's output).
    """

    tokens: dict[Annotated[str, Field(pattern=_NAME)], SecretStr] = Field(default_factory=dict)
    session_idle_timeout: Annotated[Float, Field(gt=0, le=7 * 24 * 3600)] = 1800.0
    max_write_bytes: Annotated[Int, Field(ge=1, le=2**30)] = 8 * 2**20
    max_read_bytes: Annotated[Int, Field(ge=1, le=2**30)] = 8 * 2**20
    max_command_bytes: Annotated[Int, Field(ge=1, le=2**26)] = 256 * 2**10
    max_output_chars: Annotated[Int, Field(ge=1, le=2**28)] = 100_000

    @field_validator("tokens")
    @classmethod
    def _long_enough(cls, tokens: dict[str, SecretStr]) -> dict[str, SecretStr]:
        for tenant, token in tokens.items():
            if len(token.get_secret_value()) < MIN_TOKEN_LENGTH:
                raise ValueError(
                    f"the token of tenant {tenant!r} is shorter than {MIN_TOKEN_LENGTH} "
                    "characters: too short for a bearer secret"
                )
        return tokens


class TenantLimitsConfig(_Strict):
    """One tenant's limits per window (`policies.tenants`); an absent unit is unlimited.
    An override's absent unit and window are the default's."""

    sessions: Annotated[Int, Field(ge=0)] | None = None
    usd: Annotated[Float, Field(ge=0)] | None = None
    concurrent: Annotated[Int, Field(ge=0)] | None = None
    window: Literal["month", "day"] | None = None


class TenantsConfig(_Strict):
    """``tenants:``: the limits of every tenant (``default``) and of named ones
    (``overrides``), for acquires that name a tenant (``acquire(tenant=...)``)."""

    default: TenantLimitsConfig = TenantLimitsConfig()
    overrides: dict[Annotated[str, Field(pattern=TENANT_NAME.pattern)], TenantLimitsConfig] = Field(
        default_factory=dict
    )


class LogSettings(_Strict):
    """How the ``sandbox-router`` command logs (the library never configures logging)."""

    format: LogFormat = "auto"
    level: Literal["debug", "info", "warning", "error"] = "info"


class RouterConfig(_Strict):
    """The whole router configuration (one YAML file).

    Attributes:
        state_url: where quotas, leases and health live (``redis://...``,
            ``sqlite:///path``); default: the SQLite file under the user's
            state directory.
        key_prefix: namespace of every key/row (several routers, one Redis).
        on_state_error: ``fail_closed`` refuses to create sandboxes the
            ledger cannot count; ``fail_open`` serves, until the store is
            back, from this replica's share of what was left at its last
            contact: that divided by the fleet it saw, clamped to
            ``fail_open_floor``..``fail_open_ceiling`` (``policies.outage``).
        fail_open_expected_replicas: the fewest replicas a fail_open share
            divides by (the most you run at once, rolling deploys included);
            the registry's count is used when it is larger.
        fail_open_blind: the share of each limit a fail_open replica grants
            in an outage when it has not seen the fleet (it never reached the
            store, or not every replica has registered since it joined); 0
            by default: such a replica grants nothing. Each such replica
            spends it on top of the fleet's shares.
        fleet_heartbeat: how often a fail_open replica registers in the store
            (the fleet's size and usage it would share out in an outage).
        fail_open_journal: the file keeping what a replica spent during an
            outage until the store has it (default:
            ``$XDG_STATE_HOME/sandbox-router/outage-<key_prefix>.db``); it must
            outlive the replica's disk, see the README.
        strategy: ``ordered`` (chain order), ``balanced`` (largest remaining
            quota fraction first) or ``cheapest`` (lowest estimated price for
            the spec first, `policies.pricing`).
        acquire_timeout: one deadline for a whole acquire, failovers included.
        create_timeout: the cap of one create attempt.
        lease_ttl: a lease not heartbeated for this long expires (crashed app).
        session_idle_ttl: how long a released session sandbox stays bound.
        session_pause: pause a released session's sandbox through its idle
            TTL where its entry declares ``pause`` (its bill stops), and
            resume it on the session's next acquire.
        pause_ttl: how long a paused lease's resume token stays valid; past
            it the janitor kills the paused sandbox.
        warm_refill_every: how often a replica tries to refill the warm pools
            (entries' ``warm``) and kill their idle sandboxes; 0: only when
            `Router.fill_warm` is called.
        warm_reach_every: how often a replica connects ahead to the running
            warm sandboxes it may claim, so a claim skips the vendor's connect
            (`router.warm_handles`); 0: never, each claim connects.
        mcp: the ``sandbox-router mcp`` server's tenants and limits (`McpSettings`).
        reap_every: how often the fleet runs the janitor by itself (one replica
            at a time, under a fleet-wide lock), so an orphan of a failed kill,
            a crash or a lost reply is killed without anyone asking; 0: never,
            only `Router.reap` or ``sandbox-router janitor``.
    """

    version: Int = 1
    state_url: SecretStr | None = None
    key_prefix: Annotated[str, Field(pattern=r"^[A-Za-z0-9_.:-]{1,64}$")] = "sandbox-router"
    on_state_error: Literal["fail_closed", "fail_open"] = "fail_closed"
    fail_open_floor: Annotated[Float, Field(ge=0, le=1)] = _OUTAGE.floor
    fail_open_ceiling: Annotated[Float, Field(gt=0, le=1)] = _OUTAGE.ceiling
    fail_open_expected_replicas: Annotated[Int, Field(ge=1, le=10_000)] = _OUTAGE.expected
    fail_open_blind: Annotated[Float, Field(ge=0, le=1)] = _OUTAGE.blind
    fleet_heartbeat: Annotated[Float, Field(gt=0, le=600)] = 2.0
    fail_open_journal: str | None = None
    strategy: Literal["ordered", "balanced", "cheapest"] = "ordered"
    timezone: str = _WINDOW.timezone
    reset_day: Annotated[Int, Field(ge=1, le=31)] = _WINDOW.reset_day
    acquire_timeout: Annotated[Float, Field(gt=0, le=3600)] = 120.0
    create_timeout: Annotated[Float, Field(gt=0, le=3600)] = 60.0
    lease_ttl: Annotated[Float, Field(ge=5, le=7 * 24 * 3600)] = 300.0
    session_idle_ttl: Annotated[Float, Field(ge=0, le=7 * 24 * 3600)] = 900.0
    session_pause: Bool = True
    pause_ttl: Annotated[Float, Field(gt=0, le=90 * 24 * 3600)] = 7 * 24 * 3600.0
    warm_refill_every: Annotated[Float, Field(ge=0, le=3600)] = 2.0
    warm_reach_every: Annotated[Float, Field(ge=0, le=3600)] = 1.0
    reap_every: Annotated[Float, Field(ge=0, le=24 * 3600)] = 300.0
    retry: RetrySettings = RetrySettings()
    breaker: BreakerSettings = BreakerSettings()
    pools: dict[Annotated[str, Field(pattern=_NAME)], QuotaConfig] = Field(default_factory=dict)
    chain: Annotated[list[EntryConfig], Field(min_length=1)]
    log: LogSettings = LogSettings()
    mcp: McpSettings = McpSettings()
    tenants: TenantsConfig = TenantsConfig()

    @field_validator("timezone")
    @classmethod
    def _zone(cls, value: str) -> str:
        _check_zone(value)
        return value

    @field_validator("reap_every")
    @classmethod
    def _reap_every(cls, value: float) -> float:
        if 0 < value < 1:
            raise ValueError(
                f"expected 0 (the router reaps only when asked) or at least 1 second, got {value}"
            )
        return value

    @field_validator("version")
    @classmethod
    def _version(cls, value: int) -> int:
        if value != 1:
            raise ValueError(f"unknown config version {value}; this router reads version 1")
        return value

    @field_validator("state_url")
    @classmethod
    def _state_url(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None:
            check_state_url(value.get_secret_value())
        return value

    @model_validator(mode="after")
    def _entries(self) -> RouterConfig:
        seen: set[str] = set()
        inline_pools: dict[str, str] = {}
        for i, entry in enumerate(self.chain):
            where = f"chain[{i}]"
            if entry.name in seen:
                raise ValueError(f"{where}.name: duplicate entry name {entry.name!r}")
            seen.add(entry.name)
            if entry.quota is not None and entry.quota_pool is not None:
                raise ValueError(
                    f"{where}: give either quota (a pool of its own) or quota_pool "
                    f"(a pool under `pools`), not both"
                )
            if entry.quota_pool is not None and entry.quota_pool not in self.pools:
                raise ValueError(
                    f"{where}.quota_pool: pool {entry.quota_pool!r} is not defined under "
                    f"`pools` (defined: {sorted(self.pools) or 'none'})"
                )
            if entry.quota is not None:
                if entry.name in self.pools or entry.name in inline_pools:
                    raise ValueError(
                        f"{where}.quota: pool {entry.name!r} is already defined; use quota_pool"
                    )
                inline_pools[entry.name] = where
            if entry.warm is not None and self.pool_quota(entry).usd is not None:
                declared = entry.capabilities
                if declared is None:
                    declared = list(provider_class(entry.provider).capabilities)
                server = entry.warm.server
                if server is None:
                    server = Capability.WARM_SERVER in declared and not entry.warm.pause
                if server:
                    raise ValueError(
                        f"{where}.warm.server: pool {entry.pool!r} has a usd budget, and a "
                        "warm pool the vendor holds is billed unseen by the router (its idle "
                        "time cannot be held nor charged); set warm.server: false or drop "
                        "the pool's usd"
                    )
            if entry.warm is not None and entry.warm.pause:
                declared = entry.capabilities
                if declared is None:
                    declared = list(provider_class(entry.provider).capabilities)
                if Capability.PAUSE not in declared:
                    raise ValueError(
                        f"{where}.warm.pause: entry {entry.name!r} (provider "
                        f"{entry.provider}) does not declare the 'pause' capability, so its "
                        "warm sandboxes cannot be parked paused; drop pause or list it "
                        "under capabilities"
                    )
            try:
                _no_bool_numbers(entry)
                entry.provider_options()
            except ValidationError as exc:
                raise ValueError(_format_errors(exc, f"{where}.options")) from None
            except ValueError as exc:
                raise ValueError(f"{where}.options.{exc}") from None
        if self.fail_open_floor > self.fail_open_ceiling:
            raise ValueError(
                f"fail_open_floor: {self.fail_open_floor} is above fail_open_ceiling "
                f"{self.fail_open_ceiling}"
            )
        return self

    def pool_quota(self, entry: EntryConfig) -> QuotaConfig:
        if entry.quota is not None:
            return entry.quota
        return self.pools.get(entry.pool, QuotaConfig())

    def window(self, entry: EntryConfig) -> MonthlyWindow:
        q = self.pool_quota(entry)
        return MonthlyWindow(q.timezone or self.timezone, q.reset_day or self.reset_day)

    @property
    def counts_tenants(self) -> bool:
        """The config has a ``tenants:`` section, empty or not. A Redis Cluster store then
        keeps every pool's and tenant's ledger keys under one hash tag (`open_store`'s
        ``tenants``), and without one it counts no tenant (`router.tenants`)."""
        return "tenants" in self.model_fields_set

    def tenant_limits(self, tenant: str) -> tuple[TenantLimits, TenantWindow]:
        """``tenant``'s limits (its override over the default) and window (in the pools'
        timezone: a month from ``reset_day``, or a day from midnight)."""
        default = self.tenants.default
        override = self.tenants.overrides.get(tenant, default)
        units = ("sessions", "usd", "concurrent")
        given = override.model_fields_set
        values = {u: getattr(override if u in given else default, u) for u in units}
        name = (override.window if "window" in given else default.window) or "month"
        window: TenantWindow = (
            DailyWindow(self.timezone)
            if name == "day"
            else MonthlyWindow(self.timezone, self.reset_day)
        )
        return TenantLimits(**values), window

    def resolved_state_url(self) -> str:
        return self.state_url.get_secret_value() if self.state_url else default_state_url()

    def breaker_policy(self) -> BreakerConfig:
        return self.breaker.policy(probe_timeout=self.acquire_timeout)

    def outage_share(self) -> OutageShare:
        return OutageShare(
            self.fail_open_floor,
            self.fail_open_ceiling,
            self.fail_open_blind,
            self.fail_open_expected_replicas,
        )

    def journal_path(self) -> Path:
        """Where a fail_open replica journals its outage spend."""
        if self.fail_open_journal:
            return Path(self.fail_open_journal)
        base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
        return Path(base) / _SAFE_PERSISTENT_DIR / f"outage-{self.key_prefix}.db"


def _check_zone(value: str) -> None:
    from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

    try:
        ZoneInfo(value)
    except (ZoneInfoNotFoundError, ValueError):
        raise ValueError(f"unknown timezone {value!r} (expected an IANA name like UTC)") from None


def check_state_url(url: str) -> None:
    """Refuse a state URL the store would refuse later, or worse, misread.

    Only the scheme is ever quoted back: a malformed URL may have its
    password where the port or host should be.

    Raises:
        ValueError: what is wrong, in a sentence.
    """
    scheme, sep, rest = url.partition("://")
    scheme = scheme.lower()
    if not sep or not re.fullmatch(r"[a-z][a-z0-9+.-]{0,19}", scheme):
        raise ValueError("expected a URL (redis://host:port/db, sqlite:///path/state.db, ...)")
    kind = SCHEMES.get(scheme)
    if kind is None:
        raise ValueError(
            f"unsupported scheme {scheme!r}; expected one of "
            + ", ".join(f"{s}://" for s in sorted(SCHEMES))
        )
    if kind == "sqlite":
        if not rest.startswith("/") or rest == "/" or any(c in rest for c in "?#\0"):
            raise ValueError("expected sqlite:///absolute/path/to/file.db")
        if Path(rest).is_dir():
            raise ValueError("the sqlite path is a directory; name a file in it")
        return
    if kind == "memory":
        return
    try:
        parts = urlsplit(url)
    except ValueError:
        raise ValueError("the host is malformed (an unclosed IPv6 bracket?)") from None
    segments = [p for p in parts.path.split("/") if p]
    if scheme == "unix":
        if not segments:
            raise ValueError("expected unix:///path/to/redis.sock[?db=N]")
        segments = []
    hosts = parts.netloc.rpartition("@")[2]
    for host in hosts.split(",") if "sentinel" in scheme else [hosts]:
        _check_port(host)
    if "sentinel" in scheme:
        if not segments:
            raise ValueError("name the Sentinel service: redis+sentinel://host:port/service[/db]")
        segments = segments[1:]
    if len(segments) > 1:
        raise ValueError("expected at most one path segment, the database number")
    query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
    if segments and not segments[0].isdigit():
        raise ValueError("the database must be a number (redis://host:port/0)")
    for name in ("db", "socket_timeout", "socket_connect_timeout", "health_check_interval",
                 "max_connections"):  # fmt: skip
        if name in query:
            try:
                float(query[name])
            except ValueError:
                raise ValueError(f"{name} must be a number") from None


def _check_port(host: str) -> None:
    port = host.rpartition("]")[2] if host.startswith("[") else host
    if ":" not in port:
        return
    port = port.rpartition(":")[2]
    if not port.isdigit():
        raise ValueError("the port is not a number (expected host:port)")
    if not 1 <= int(port) <= 65535:
        raise ValueError("the port must be between 1 and 65535")


@functools.cache
def _secret_fields(kind: str) -> frozenset[str]:
    fields = provider_class(kind).Options.model_fields
    return frozenset(
        name
        for name, f in fields.items()
        if SecretStr in (get_args(f.annotation) or (f.annotation,))
    )


def _no_bool_numbers(entry: EntryConfig) -> None:
    """YAML's `true` is not a number: reject it for an adapter option that is one
    (the adapters' models are lax, and pydantic reads a bool as 0 or 1)."""
    fields = provider_class(entry.provider).Options.model_fields
    for name, value in entry.options.items():
        if isinstance(value, bool) and name in fields:
            annotation = fields[name].annotation
            kinds = get_args(annotation) or (annotation,)
            if bool not in kinds and any(k in kinds for k in (int, float)):
                raise ValueError(f"{name}: expected a number, got a boolean")


def default_state_url(env: Mapping[str, str] | None = None) -> str:
    """The embedded SQLite store under the user's state directory."""
    env = os.environ if env is None else env
    base = env.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return f"sqlite:///{Path(base) / _SAFE_PERSISTENT_DIR / 'state.db'}"


def _format_errors(exc: ValidationError, prefix: str = "") -> str:
    lines = []
    for err in exc.errors():
        path = prefix
        for part in err["loc"]:
            if isinstance(part, int):
                path += f"[{part}]"
            elif part not in ("function-after", "constrained-str"):
                path += f".{part}" if path else str(part)
        message = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            message = "unknown key"
            if path in _RENAMED:
                message += f" (renamed: {_RENAMED[path]})"
        elif err["type"] == "missing":
            message = "required field is missing"
        elif "input" in err and err["type"] not in ("value_error", "assertion_error"):
            message += f" (got {_shown(err['input'], path)})"
        lines.append(f"{path}: {message}" if path else message)
    return "\n".join(lines)


def _shown(value: Any, path: str) -> str:
    """The wrong value for an error message, unless it may be a secret: the state
    URL and provider options may carry credentials, typed where another field was."""
    lowered = path.lower()
    if lowered.startswith("state_url") or ".options" in lowered or _SECRET_WORD.search(lowered):
        return f"a value of type {type(value).__name__}, not shown"
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def interpolate(value: Any, env: Mapping[str, str], path: str = "", depth: int = 0) -> Any:
    """Replace ``${VAR}`` / ``${VAR:-default}`` in every string of a YAML tree."""
    if depth > MAX_DEPTH:
        raise ConfigError(f"{path}: nested deeper than {MAX_DEPTH} levels")
    if isinstance(value, Mapping):
        return {
            k: interpolate(v, env, f"{path}.{k}" if path else str(k), depth + 1)
            for k, v in value.items()
        }
    if isinstance(value, list | tuple):
        return [interpolate(v, env, f"{path}[{i}]", depth + 1) for i, v in enumerate(value)]
    if not isinstance(value, str):
        return value

    def substitute(match: re.Match[str]) -> str:
        name, default = match.group(1), match.group(2)
        if name in env:
            return env[name]
        if default is not None:
            return default
        raise ConfigError(
            f"{path}: environment variable {name} is not set (write ${{{name}:-}} "
            "to make it optional)"
        )

    result = _ENV_REF.sub(substitute, value)
    if result == value:
        return value
    return None if result == "" and _ENV_REF.fullmatch(value) else _FromEnv(result)


def load_config(
    source: str | Path | Mapping[str, Any], env: Mapping[str, str] | None = None
) -> RouterConfig:
    """Validate a config from a YAML file path or an already-parsed mapping.

    Raises:
        ConfigError: naming the file, the field path and what was expected.
    """
    env = os.environ if env is None else env
    if isinstance(source, Mapping):
        where, raw = "<config>", dict(source)
    else:
        where = str(source)
        raw = read_yaml(source)
        if not isinstance(raw, dict):
            raise ConfigError(
                f"{where}: expected a mapping at the top level, got {type(raw).__name__}"
            )
    try:
        data = interpolate(raw, env)
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc}") from None
    try:
        return RouterConfig.model_validate(data)
    except ValidationError as exc:
        details = _format_errors(exc).replace("\n", f"\n{where}: ")
        raise ConfigError(f"{where}: {details}") from None


def from_env(env: Mapping[str, str] | None = None) -> RouterConfig:
    """The config `Router.from_env` uses.

    ``SANDBOX_ROUTER_CONFIG`` names a YAML file; without it the default chain
    daytona -> runloop -> modal -> e2b -> local is built: each cloud entry
    is configured when its key is in the environment (DAYTONA_API_KEY,
    RUNLOOP_API_KEY, MODAL_TOKEN_ID + MODAL_TOKEN_SECRET, E2B_API_KEY),
    ``QUOTA_<PROVIDER>_MONTHLY`` caps its sessions per month, and
    ``REDIS_URL`` selects Redis (else the embedded SQLite store).
    """
    env = os.environ if env is None else env
    if path := env.get("SANDBOX_ROUTER_CONFIG"):
        return load_config(path, env)
    chain: list[dict[str, Any]] = []
    for name in (*DEFAULT_CHAIN, "local"):
        try:
            provider_class(name)
        except (ImportError, AttributeError):  # an adapter missing from this build
            continue
        entry: dict[str, Any] = {"name": name, "provider": name}
        monthly = env.get(f"QUOTA_{name.upper()}_MONTHLY")
        if monthly:
            try:
                entry["quota"] = {"sessions": int(monthly)}
            except ValueError:
                raise ConfigError(
                    f"QUOTA_{name.upper()}_MONTHLY: expected a whole number, got {monthly!r}"
                ) from None
        chain.append(entry)
    data: dict[str, Any] = {
        "chain": chain,
        "state_url": env.get("REDIS_URL") or default_state_url(env),
    }
    return load_config(data, env)
