"""Config validation: clear errors that name the file, the field and what was expected."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from providers.errors import ConfigError
from router.config import EntryConfig, HedgeConfig, from_env, load_config

LOCAL = {"name": "local", "provider": "local"}


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "chain.yaml"
    path.write_text(text)
    return path


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("chain: []", "chain: List should have at least 1 item"),
        ("chain:\n  - {name: a, provider: local, quota: {sessions: -5}}",
         "chain[0].quota.sessions: Input should be greater than or equal to 0 (got -5)"),
        ("chain:\n  - {name: a, provider: local, quota: {sesions: 5}}",
         "chain[0].quota.sesions: unknown key"),
        ("chain:\n  - {name: a, provider: nope}", "chain[0].provider: unknown provider 'nope'"),
        ("chain:\n  - {name: a, provider: local}\n  - {name: a, provider: local}",
         "chain[1].name: duplicate entry name 'a'"),
        ("chain:\n  - {name: a, provider: local, quota_pool: acct}",
         "chain[0].quota_pool: pool 'acct' is not defined under `pools`"),
        ("chain:\n  - {name: a, provider: local, options: {isolation: maybe}}",
         "chain[0].options.isolation: Input should be 'auto', 'bwrap' or 'none'"),
        ("chain:\n  - {name: a, provider: local, options: {colour: red}}",
         "chain[0].options.colour: unknown key"),
        ("timezone: Mars/Base\nchain:\n  - {name: a, provider: local}",
         "timezone: unknown timezone 'Mars/Base'"),
        ("reset_day: 40\nchain:\n  - {name: a, provider: local}",
         "reset_day: Input should be less than or equal to 31 (got 40)"),
        ("lease_ttl: ten\nchain:\n  - {name: a, provider: local}",
         "lease_ttl: Input should be a valid number"),
        ("chain:\n  - {name: a, provider: local, quota: {sessions: 1e400}}",
         "chain[0].quota.sessions"),
        ("chain: !!python/object/apply:os.system ['true']", "invalid YAML"),
        ("chain:\n  - {name: a, provider: local}\nchain: []", "duplicate key 'chain'"),
        ("- just\n- a list", "expected a mapping at the top level, got list"),
        ("chain:\n  - {name: a, provider: local, options: {root: '${NOPE_NOT_SET}'}}",
         "chain[0].options.root: environment variable NOPE_NOT_SET is not set"),
        ("bogus: 1\nchain:\n  - {name: a, provider: local}", "bogus: unknown key"),
        ("fail_open_expected_replicas: 0\nchain:\n  - {name: a, provider: local}",
         "fail_open_expected_replicas: Input should be greater than or equal to 1 (got 0)"),
        ("fail_open_expected_replicas: 2.5\nchain:\n  - {name: a, provider: local}",
         "fail_open_expected_replicas: Input should be a valid integer"),
        ("fail_open_expected_replicas: yes\nchain:\n  - {name: a, provider: local}",
         "fail_open_expected_replicas: Input should be a valid integer"),
        ("fail_open_blind: 1.5\nchain:\n  - {name: a, provider: local}",
         "fail_open_blind: Input should be less than or equal to 1 (got 1.5)"),
        ("fail_open_blind: -0.1\nchain:\n  - {name: a, provider: local}",
         "fail_open_blind: Input should be greater than or equal to 0 (got -0.1)"),
        ("fail_open_share: 0.25\nchain:\n  - {name: a, provider: local}",
         "fail_open_share: unknown key (renamed: fail_open_blind is the share of each limit"),
        ("reap_every: 0.5\nchain:\n  - {name: a, provider: local}",
         "reap_every: expected 0 (the router reaps only when asked) or at least 1 second"),
        ("reap_every: -1\nchain:\n  - {name: a, provider: local}",
         "reap_every: Input should be greater than or equal to 0"),
        ("reap_every: true\nchain:\n  - {name: a, provider: local}",
         "reap_every: Input should be a valid number"),
        ("chain:\n  - {name: a, provider: e2b, price: {vcpu_hour: -1}}",
         "chain[0].price.vcpu_hour: Input should be greater than or equal to 0 (got -1)"),
        ("chain:\n  - {name: a, provider: e2b, price: {vcpu_hours: 1}}",
         "chain[0].price.vcpu_hours: unknown key"),
        ("chain:\n  - {name: a, provider: e2b, price: {per_sandbox: cheap}}",
         "chain[0].price.per_sandbox: Input should be a valid number"),
        ("chain:\n  - {name: a, provider: e2b, price: {gpu_hour: {H100: true}}}",
         "chain[0].price.gpu_hour.H100: Input should be a valid number"),
        ("chain:\n  - {name: a, provider: e2b, price: {gpu_hour: [H100]}}",
         "chain[0].price.gpu_hour: Input should be a valid dictionary"),
        ("chain:\n  - {name: a, provider: e2b, resources: {vcpu: 0, memory_gib: 1}}",
         "chain[0].resources.vcpu: Input should be greater than 0 (got 0)"),
        ("chain:\n  - {name: a, provider: e2b, resources: {vcpu: 2}}",
         "chain[0].resources.memory_gib: required field is missing"),
        ("strategy: cheap\nchain:\n  - {name: a, provider: local}",
         "strategy: Input should be 'ordered', 'balanced' or 'cheapest'"),
    ],
)  # fmt: skip
def test_bad_configs_name_file_field_and_expectation(
    tmp_path: Path, text: str, message: str
) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        load_config(path, env={})
    assert str(path) in str(info.value)
    assert message in str(info.value)


def test_missing_file_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"nope.yaml: cannot read config"):
        load_config(tmp_path / "nope.yaml")


def test_env_interpolation_and_defaults(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "state_url: ${STATE:-memory://}\nkey_prefix: ${PREFIX}\n"
        "chain:\n  - {name: a, provider: local, options: {root: '${ROOT}/x'}}",
    )
    cfg = load_config(path, env={"PREFIX": "team-a", "ROOT": "/srv"})
    assert cfg.key_prefix == "team-a"
    assert cfg.resolved_state_url() == "memory://"
    assert cfg.chain[0].options == {"root": "/srv/x"}


def test_secrets_never_show_in_repr_or_errors(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "state_url: redis://:hunter2@localhost:6379/0\n"
        "chain:\n  - {name: a, provider: local, quota: {sessions: 3}}",
    )
    cfg = load_config(path, env={})
    assert "hunter2" not in repr(cfg)
    assert "hunter2" not in str(cfg.model_dump())
    bad = write(tmp_path, "chain:\n  - {name: a, provider: local, options: {api_key: sk-live-1}}")
    with pytest.raises(ConfigError) as info:
        load_config(bad, env={})
    assert "sk-live-1" not in str(info.value)
    assert "chain[0].options.api_key: unknown key" in str(info.value)


def test_pools_are_shared_and_windows_configurable() -> None:
    cfg = load_config(
        {
            "timezone": "Europe/Berlin",
            "pools": {"acct": {"sessions": 10, "reset_day": 15}},
            "chain": [
                {"name": "a", "provider": "local", "quota_pool": "acct"},
                {"name": "b", "provider": "local", "quota_pool": "acct"},
                {"name": "c", "provider": "local", "quota": {"concurrent": 2}},
            ],
        },
        env={},
    )
    a, b, c = cfg.chain
    assert a.pool == b.pool == "acct"
    assert cfg.pool_quota(b).sessions == 10
    assert cfg.window(a).reset_day == 15
    assert cfg.window(a).timezone == "Europe/Berlin"
    assert (c.pool, cfg.pool_quota(c).concurrent) == ("c", 2)


def test_inline_quota_and_pool_together_is_an_error() -> None:
    with pytest.raises(ConfigError, match=r"either quota .* or quota_pool"):
        load_config(
            {"pools": {"p": {}}, "chain": [{**LOCAL, "quota": {}, "quota_pool": "p"}]}, env={}
        )


def test_fingerprint_changes_with_config_not_with_quota() -> None:
    one = load_config({"chain": [{**LOCAL, "options": {"cpu_seconds": 5}}]}, env={}).chain[0]
    two = load_config({"chain": [{**LOCAL, "options": {"cpu_seconds": 6}}]}, env={}).chain[0]
    same = load_config(
        {"chain": [{**LOCAL, "options": {"cpu_seconds": 5}, "quota": {"sessions": 1}}]}, env={}
    ).chain[0]
    assert one.fingerprint() != two.fingerprint()
    assert one.fingerprint() == same.fingerprint()


def test_from_env_reads_the_config_file(tmp_path: Path) -> None:
    path = write(tmp_path, "chain:\n  - {name: only, provider: local}")
    cfg = from_env({"SANDBOX_ROUTER_CONFIG": str(path)})
    assert [e.name for e in cfg.chain] == ["only"]


def test_from_env_rejects_a_bad_quota_variable() -> None:
    with pytest.raises(ConfigError, match="QUOTA_E2B_MONTHLY: expected a whole number"):
        from_env({"QUOTA_E2B_MONTHLY": "lots"})


def test_from_env_builds_the_default_chain(tmp_path: Path) -> None:
    from providers import PROVIDERS

    env = {"XDG_STATE_HOME": str(tmp_path), "QUOTA_E2B_MONTHLY": "50"}
    cfg = from_env(env)
    names = [e.name for e in cfg.chain]
    expected = [n for n in ("daytona", "runloop", "modal", "e2b") if n in PROVIDERS]
    assert names[-1] == "local"
    assert set(names[:-1]) <= set(expected)
    assert names[:-1] == [n for n in expected if n in names]
    assert cfg.resolved_state_url() == f"sqlite:///{tmp_path}/sandbox-router/state.db"
    e2b = next((e for e in cfg.chain if e.name == "e2b"), None)
    if e2b is not None:
        assert cfg.pool_quota(e2b).sessions == 50
    with_redis = from_env({**env, "REDIS_URL": "redis://cache:6379/2"})
    assert with_redis.resolved_state_url() == "redis://cache:6379/2"


def test_router_from_env_skips_providers_without_keys(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from router import Router

    for var in ("DAYTONA_API_KEY", "RUNLOOP_API_KEY", "MODAL_TOKEN_ID", "MODAL_TOKEN_SECRET",
                "E2B_API_KEY", "SANDBOX_ROUTER_CONFIG", "REDIS_URL"):  # fmt: skip
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    with Router.from_env(hooks=[]) as router:
        with router.acquire() as lease:
            assert lease.entry == "local"
            assert lease.failovers == []  # the keyless entries were skipped, not tried
        reasons = {v.name: v.unconfigured_reason for v in router.status().entries}
    assert reasons.pop("local") is None
    assert all(reasons.values())


@pytest.mark.parametrize(
    ("provider", "options"),
    [
        ("e2b", {"api_key": "sk-live-4815"}),
        ("daytona", {"api_key": "sk-live-4815"}),
        ("runloop", {"api_key": "sk-live-4815"}),
        ("modal", {"token_id": "ak-4815", "token_secret": "sk-live-4815"}),
    ],
)
def test_provider_keys_never_show_in_a_repr_a_dump_or_a_log(
    provider: str, options: dict[str, str], tmp_path: Path
) -> None:
    path = write(
        tmp_path,
        f"chain:\n  - name: a\n    provider: {provider}\n    options:\n"
        + "".join(f"      {k}: '${{{k.upper()}}}'\n" for k in options),
    )
    cfg = load_config(path, env={k.upper(): v for k, v in options.items()})
    [entry] = cfg.chain
    dumps = [str(cfg.model_dump()), cfg.model_dump_json(), repr(entry.provider_options())]
    shown = [repr(cfg), str(cfg), repr(entry), str(entry), repr(entry.options), *dumps]
    for text in shown:
        assert "4815" not in text, text
    # ...and still reach the adapter, and count in the fingerprint.
    given = entry.provider_options()
    assert {k: getattr(given, k).get_secret_value() for k in options} == options
    other = load_config(path, env={k.upper(): v + "0" for k, v in options.items()}).chain[0]
    assert other.fingerprint() != entry.fingerprint()


def test_the_defaults_are_the_policies_own() -> None:
    from dataclasses import fields

    from policies.breaker import BreakerConfig
    from policies.outage import OutageShare
    from policies.quota import MonthlyWindow
    from policies.retry import RetryPolicy
    from router.config import BreakerSettings, RetrySettings

    cfg = load_config({"chain": [LOCAL]}, env={})
    assert cfg.retry.policy() == RetryPolicy()
    assert cfg.breaker.policy(BreakerConfig().probe_timeout) == BreakerConfig()
    assert cfg.breaker_policy().probe_timeout == cfg.acquire_timeout
    assert cfg.window(cfg.chain[0]) == MonthlyWindow()
    settings = set(RetrySettings.model_fields) | set(BreakerSettings.model_fields)
    # every tunable of the policies is configurable but quota_default (an exhausted block
    # with no reset time from the provider), which stays the policy's own
    unset = {f.name for f in fields(BreakerConfig)} | {f.name for f in fields(RetryPolicy)}
    assert unset - settings == {"quota_default"}
    tuned = load_config({"breaker": {"cooldown_max": 60}, "chain": [LOCAL]}, env={})
    assert tuned.breaker_policy().cooldown_max == 60
    assert cfg.outage_share() == OutageShare()  # blind 0: a replica blind to the fleet grants none
    fleet = {"fail_open_expected_replicas": 8, "fail_open_blind": 0.1, "chain": [LOCAL]}
    assert load_config(fleet, env={}).outage_share() == OutageShare(blind=0.1, expected=8)


def test_the_router_reaps_every_five_minutes_unless_told_otherwise() -> None:
    assert load_config({"chain": [LOCAL]}, env={}).reap_every == 300
    assert load_config({"reap_every": 0, "chain": [LOCAL]}, env={}).reap_every == 0
    assert load_config({"reap_every": "${R}", "chain": [LOCAL]}, env={"R": "60"}).reap_every == 60


@pytest.mark.parametrize("after", ["p100", "fast", 0, -1, 601, True, [1]])
def test_a_bad_hedge_is_refused_naming_file_and_field(tmp_path: Path, after: object) -> None:
    path = tmp_path / "chain.yaml"
    path.write_text(yaml.safe_dump({"chain": [{"name": "a", "provider": "local",
                                               "hedge": {"after": after}}]}))  # fmt: skip
    with pytest.raises(ConfigError, match=rf"^{path}: chain\[0\]\.hedge\.after: expected seconds"):
        load_config(path)


def test_hedge_in_seconds_percentile_or_from_the_environment() -> None:
    def after(value: object) -> object:
        cfg = load_config({"chain": [{"name": "a", "provider": "local",
                                      "hedge": {"after": value}}]}, env={"H": "0.5"})  # fmt: skip
        assert cfg.chain[0].hedge is not None
        return cfg.chain[0].hedge.after

    assert [after(2), after("p95"), after("${H}")] == [2.0, "p95", 0.5]
    assert EntryConfig(name="a", provider="local", hedge=HedgeConfig(after="p99")).hedge


def test_a_price_overrides_the_published_one_key_by_key(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "chain:\n"
        "  - {name: a, provider: e2b, price: {vcpu_hour: 0.04, gpu_hour: {T4: 0.5}}}\n"
        "  - {name: b, provider: runloop, resources: {vcpu: 4, memory_gib: 8}}\n",
    )
    a, b = load_config(path, env={}).chain
    ta, tb = a.tariff(), b.tariff()
    assert ta.price is not None
    assert (ta.price.vcpu_hour, ta.price.memory_gib_hour, dict(ta.price.gpu_hour)) == (
        0.04,
        0.0162,
        {"T4": 0.5},
    )
    assert tb.price is None
    assert (tb.size.vcpu, tb.size.memory_gib) == (4, 8)


def test_tenant_limits_are_the_default_under_each_override() -> None:
    from policies.quota import MonthlyWindow
    from policies.tenants import DailyWindow, TenantLimits

    config = load_config(
        {
            "timezone": "Europe/Paris",
            "reset_day": 5,
            "tenants": {
                "default": {"sessions": 10, "usd": 5.0},
                "overrides": {"vip": {"usd": None, "window": "day"}, "few": {"concurrent": 1}},
            },
            "chain": [{"name": "a", "provider": "local"}],
        },
        env={},
    )
    month = MonthlyWindow("Europe/Paris", 5)
    assert config.tenant_limits("anyone") == (TenantLimits(10, 5.0, None), month)
    assert config.tenant_limits("vip") == (
        TenantLimits(10, None, None),
        DailyWindow("Europe/Paris"),
    )
    assert config.tenant_limits("few") == (TenantLimits(10, 5.0, 1), month)
    bare = load_config({"chain": [{"name": "a", "provider": "local"}]}, env={})
    assert bare.tenant_limits("x") == (TenantLimits(), MonthlyWindow())
