"""Hostile or broken config files: a clear ConfigError naming the file and field, fast.

Each case goes through `load_config` (what `Router.from_config` calls) and
the ones a user meets on the command line through ``sandbox-router config
check`` too. The time bounds are generous behaviour checks (a refusal, not
minutes of work); precise figures belong in the benchmarks.
"""

from __future__ import annotations

import time
import tracemalloc
from pathlib import Path

import pytest

from providers.errors import ConfigError
from router import Router
from router.cli import main
from router.config import load_config

CHAIN = "chain:\n  - {name: a, provider: local}\n"


def write(tmp_path: Path, data: str | bytes) -> Path:
    path = tmp_path / "chain.yaml"
    if isinstance(data, str):
        path.write_text(data)
    else:
        path.write_bytes(data)
    return path


def refused(path: Path) -> str:
    """The error `load_config` gives, checked to come fast and to name the file.

    Fast in this thread's CPU time: the wall clock also counts the other workers
    and mypy sharing the cores (5.2 s once in CI for a refusal that takes 1 s).
    """
    tracemalloc.start()
    started = time.thread_time()
    try:
        with pytest.raises(ConfigError) as info:
            load_config(path, env={})
    finally:
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    assert time.thread_time() - started < 5
    assert peak < 64 * 1024 * 1024
    assert str(path) in str(info.value)
    return str(info.value)


def alias_bomb() -> str:
    """Nine levels of ten aliases each: a billion strings once expanded."""
    lines = ["a0: &a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    for i in range(1, 10):
        refs = ", ".join([f"*a{i - 1}"] * 10)
        lines.append(f"a{i}: &a{i} [{refs}]")
    return "\n".join(lines) + "\n" + CHAIN.replace("{name: a,", "{name: a, capabilities: *a9,")


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (alias_bomb(), "aliases expanded"),
        (b"chain: [\xff\xfe\xfa]\n", "not UTF-8 text"),
        (b"\x7fELF\x02\x01\x01\x00\x00\x00\x00\x00" * 64, "binary file"),
        ("chain: " + "[" * 10_000 + "]" * 10_000 + "\n", "nested deeper than"),
        (
            "chain:\n" + "".join("  " * i + f"- k{i}:\n" for i in range(1, 200)),
            "nested deeper than",
        ),
    ],
    ids=["alias-bomb", "non-utf8", "binary", "deep-flow", "deep-block"],
)
def test_hostile_files_are_refused_fast(tmp_path: Path, data: str | bytes, message: str) -> None:
    path = write(tmp_path, data)
    assert message in refused(path)


def test_a_huge_file_is_refused_before_it_is_read_whole(tmp_path: Path) -> None:
    path = tmp_path / "chain.yaml"
    with path.open("w") as f:
        f.write(CHAIN)
        line = "# " + "x" * 1022 + "\n"
        for _ in range(50 * 1024):  # 50 MB of comments
            f.write(line)
    assert "larger than" in refused(path)


def test_a_deep_mapping_from_code_is_refused() -> None:
    deep: list[object] = []
    for _ in range(10_000):
        deep = [deep]
    with pytest.raises(ConfigError, match="nested deeper than"):
        load_config({"chain": [{"name": "a", "provider": "local", "capabilities": deep}]}, env={})


def test_the_cli_and_the_router_refuse_them_too(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write(tmp_path, alias_bomb())
    assert main(["config", "check", str(path)]) == 2
    err = capsys.readouterr().err
    assert "aliases expanded" in err
    assert "Traceback" not in err
    with pytest.raises(ConfigError, match="aliases expanded"):
        Router.from_config(path)


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("redis://host:notaport/0", "state_url: the port is not a number"),
        ("redis://host:70000/0", "state_url: the port must be between 1 and 65535"),
        ("ftp://files.example.com/x", "state_url: unsupported scheme 'ftp'"),
        ("redis://host:6379/zero", "state_url: the database must be a number"),
        ("redis://host:6379/0?socket_timeout=soon", "state_url: socket_timeout must be a number"),
        ("redis+sentinel://h:26379", "state_url: name the Sentinel service"),
        ("redis+sentinel://h:26379,h2:nope/main", "state_url: the port is not a number"),
        ("sqlite://relative/state.db", "state_url: expected sqlite:///absolute/path"),
        ("sqlite:///", "state_url: expected sqlite:///absolute/path"),
        ("unix://", "state_url: expected unix:///path/to/redis.sock"),
        ("just-a-string", "state_url: expected a URL"),
    ],
)
def test_the_state_url_is_checked_fully(tmp_path: Path, url: str, message: str) -> None:
    path = write(tmp_path, f"state_url: '{url}'\n{CHAIN}")
    assert message in refused(path)


def test_config_check_reports_a_bad_state_url(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write(tmp_path, f"state_url: redis://host:notaport/0\n{CHAIN}")
    assert main(["config", "check", str(path)]) == 2
    assert "state_url: the port is not a number" in capsys.readouterr().err


def test_a_state_url_error_never_shows_the_password(tmp_path: Path) -> None:
    # A forgotten host makes the password parse as the port.
    path = write(tmp_path, f"state_url: 'redis://:hunter2/0'\n{CHAIN}")
    message = refused(path)
    assert "hunter2" not in message
    assert "state_url" in message


@pytest.mark.parametrize(
    ("text", "field"),
    [
        ("chain:\n  - {name: a, provider: local, quota: {sessions: true}}",
         "chain[0].quota.sessions"),
        ("chain:\n  - {name: a, provider: local, quota: {concurrent: false}}",
         "chain[0].quota.concurrent"),
        ("chain:\n  - {name: a, provider: local, quota: {sandbox_seconds: true}}",
         "chain[0].quota.sandbox_seconds"),
        ("pools: {p: {reset_day: true}}\nchain:\n  - {name: a, provider: local, quota_pool: p}",
         "pools.p.reset_day"),
        (f"lease_ttl: true\n{CHAIN}", "lease_ttl"),
        (f"reset_day: true\n{CHAIN}", "reset_day"),
        (f"retry: {{attempts: true}}\n{CHAIN}", "retry.attempts"),
        (f"breaker: {{failure_rate: true}}\n{CHAIN}", "breaker.failure_rate"),
        (f"version: true\n{CHAIN}", "version"),
        ("chain:\n  - {name: a, provider: local, enabled: 1}", "chain[0].enabled"),
        ("chain:\n  - {name: a, provider: local, options: {cpu_seconds: true}}",
         "chain[0].options.cpu_seconds"),
        (f"lease_ttl: .inf\n{CHAIN}", "lease_ttl"),
        (f"pause_ttl: 0\n{CHAIN}", "pause_ttl"),
        (f"pause_ttl: true\n{CHAIN}", "pause_ttl"),
        (f"session_pause: 1\n{CHAIN}", "session_pause"),
        ("chain:\n  - {name: a, provider: local, quota: {sessions: '5'}}",
         "chain[0].quota.sessions"),
    ],
)  # fmt: skip
def test_a_bool_is_not_a_number(tmp_path: Path, text: str, field: str) -> None:
    message = refused(write(tmp_path, text))
    assert f"{field}: " in message


def test_env_substitution_still_makes_numbers_and_booleans(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "lease_ttl: ${TTL}\nfail_open_blind: ${SHARE}\nretry: {attempts: '${TRIES}'}\n"
        "chain:\n  - {name: a, provider: local, enabled: '${ON}', quota: {sessions: '${N}'}}\n"
        "  - {name: b, provider: local, quota: {sessions: '${UNSET:-}'}}",
    )
    env = {"TTL": "30", "SHARE": "0.5", "TRIES": "4", "ON": "false", "N": "12"}
    cfg = load_config(path, env=env)
    assert (cfg.lease_ttl, cfg.fail_open_blind, cfg.retry.attempts) == (30.0, 0.5, 4)
    assert cfg.chain[0].enabled is False
    assert [e.quota.sessions if e.quota else "-" for e in cfg.chain] == [12, None]
    with pytest.raises(ConfigError, match=r"chain\[0\]\.quota\.sessions: .*integer"):
        load_config(path, env={**env, "N": "twelve"})


@pytest.mark.parametrize(
    "text",
    [
        f"state_url: 4815162342\n{CHAIN}",
        f"state_url: [redis://:s3cr3t-4815162342@h/0]\n{CHAIN}",
        "chain:\n  - {name: a, provider: e2b, options: {api_key: [s3cr3t-4815162342]}}",
        "chain:\n  - {name: a, provider: e2b, options: {api_url: 4815162342}}",
        "chain:\n  - {name: a, provider: modal, options: {token_secret: 4815162342}}",
    ],
)
def test_a_wrong_typed_secret_is_not_echoed(tmp_path: Path, text: str) -> None:
    message = refused(write(tmp_path, text))
    assert "4815162342" not in message


@pytest.mark.parametrize(
    ("text", "field", "says"),
    [
        ("chain:\n  - {name: a, provider: local, quota: {usd: -1}}", "chain[0].quota.usd",
         "greater than or equal to 0"),
        ("chain:\n  - {name: a, provider: local, quota: {usd: true}}", "chain[0].quota.usd",
         "valid number"),
        ("pools: {p: {usd: 5, budget_window: 0}}\n"
         "chain:\n  - {name: a, provider: local, quota_pool: p}",
         "pools.p.budget_window", "greater than or equal to 1"),
        ("chain:\n  - {name: a, provider: local, quota: {on_budget_end: stop}}",
         "chain[0].quota.on_budget_end", "'warn' or 'kill'"),
        ("chain:\n  - {name: d, provider: daytona, quota: {usd: 5}, warm: {size: 1}}",
         "chain[0].warm.server", "pool 'd' has a usd budget"),
    ],
)  # fmt: skip
def test_a_usd_budget_is_checked(tmp_path: Path, text: str, field: str, says: str) -> None:
    message = refused(write(tmp_path, text))
    assert "chain.yaml" in message
    assert f"{field}: " in message
    assert says in message


@pytest.mark.parametrize(
    ("text", "field", "says"),
    [
        ("tenants: {default: {usd: -1}}\n" + CHAIN, "tenants.default.usd",
         "greater than or equal to 0"),
        ("tenants: {default: {sessions: 1.5}}\n" + CHAIN, "tenants.default.sessions",
         "valid integer"),
        ("tenants: {default: {concurrent: true}}\n" + CHAIN, "tenants.default.concurrent",
         "valid integer"),
        ("tenants: {default: {window: week}}\n" + CHAIN, "tenants.default.window",
         "'month' or 'day'"),
        ("tenants: {default: {usd: 1, budget: 2}}\n" + CHAIN, "tenants.default.budget",
         "unknown key"),
        ("tenants: {overrides: {'a:b': {usd: 1}}}\n" + CHAIN, "tenants.overrides.a:b",
         "should match pattern"),
        ("tenants: {overrides: {vip: {sessions: -2}}}\n" + CHAIN,
         "tenants.overrides.vip.sessions", "greater than or equal to 0"),
        ("tenants: {limits: {usd: 1}}\n" + CHAIN, "tenants.limits",
         "unknown key"),
    ],
)  # fmt: skip
def test_tenant_limits_are_checked(tmp_path: Path, text: str, field: str, says: str) -> None:
    message = refused(write(tmp_path, text))
    assert f"{field}" in message
    assert says in message


def test_a_router_held_warm_pool_may_share_a_usd_budget(tmp_path: Path) -> None:
    """Its warm sandboxes hold and are charged like leases (docs/money.md)."""
    text = (
        "chain:\n  - {name: a, provider: local, quota: {usd: 5}, warm: {size: 1}}\n"
        "  - {name: d, provider: daytona, quota: {usd: 5}, warm: {size: 1, server: false}}\n"
    )
    config = load_config(write(tmp_path, text))
    assert [e.warm is not None for e in config.chain] == [True, True]
