"""Counters from real acquisitions, gauges from the real shared state (Redis)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from contextlib import ExitStack
from datetime import UTC, datetime
from pathlib import Path
from zoneinfo import ZoneInfo

import httpx
import pytest
import redis
import yaml
from prometheus_client import CollectorRegistry, Counter, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from policies.quota import MonthlyWindow
from providers.errors import AuthError, NoProviderAvailable, SandboxError, Unavailable
from router.cli import run_exporter
from router.metrics import ENTRY_STATES, instrument, multiprocess_registry, serve
from tests.metrics.conftest import Clock, RouterFactory, chain_config, free_port
from tests.polling import wait_until

REPO = Path(__file__).resolve().parents[2]


def sample(registry: CollectorRegistry, name: str, **labels: str) -> float | None:
    return registry.get_sample_value(name, labels)


def states(registry: CollectorRegistry, entry: str) -> dict[str, float | None]:
    return {
        s: sample(registry, "sandbox_router_entry_state", entry=entry, state=s)
        for s in ENTRY_STATES
    }


def test_a_failover_is_counted_and_the_breaker_state_exported(
    make_router: RouterFactory, clock: Clock
) -> None:
    router = make_router([Unavailable("503")] * 3)
    registry = CollectorRegistry()
    instrument(router, registry, clock=clock)
    with router.acquire() as lease:
        assert lease.entry == "local"
        assert sample(registry, "sandbox_router_live_leases", entry="local") == 1
    # the slot is freed (and the release counted) just after the release returns
    wait_until(lambda: sample(registry, "sandbox_router_releases_total", entry="local") == 1)
    assert sample(registry, "sandbox_router_acquisitions_total", entry="local",
                  outcome="success") == 1  # fmt: skip
    assert sample(registry, "sandbox_router_failovers_total", from_entry="flaky",
                  to_entry="local", reason="unavailable") == 1  # fmt: skip
    assert sample(registry, "sandbox_router_create_failures_total", entry="flaky",
                  reason="unavailable") == 3  # fmt: skip
    assert sample(registry, "sandbox_router_refunds_total", entry="flaky",
                  reason="unavailable") == 3  # fmt: skip
    assert sample(registry, "sandbox_router_breaker_transitions_total", entry="flaky",
                  from_state="closed", to_state="open") == 1  # fmt: skip
    assert sample(registry, "sandbox_router_create_seconds_count", entry="flaky",
                  outcome="failure") == 3  # fmt: skip
    assert sample(registry, "sandbox_router_create_seconds_count", entry="local",
                  outcome="success") == 1  # fmt: skip
    assert sample(registry, "sandbox_router_acquire_seconds_count", entry="local") == 1
    assert sample(registry, "sandbox_router_releases_total", entry="local") == 1
    assert sample(registry, "sandbox_router_live_leases", entry="local") == 0

    assert sample(registry, "sandbox_router_breaker_state", entry="flaky") == 2
    assert states(registry, "flaky") == {s: float(s == "open") for s in ENTRY_STATES}
    assert sample(registry, "sandbox_router_entry_available", entry="flaky") == 0
    assert sample(registry, "sandbox_router_breaker_state", entry="local") == 0
    assert sample(registry, "sandbox_router_entry_available", entry="local") == 1
    assert sample(registry, "sandbox_router_state_up") == 1

    clock.advance(121)  # the cooldown is over: the next acquire probes it
    assert sample(registry, "sandbox_router_breaker_state", entry="flaky") == 1
    assert states(registry, "flaky")["half_open"] == 1
    assert sample(registry, "sandbox_router_entry_available", entry="flaky") == 1


def test_blocks_are_a_separate_labelled_state(make_router: RouterFactory) -> None:
    router = make_router([AuthError("401 bad key")])
    registry = CollectorRegistry()
    instrument(router, registry)
    with router.acquire() as lease:
        assert lease.entry == "local"
    assert sample(registry, "sandbox_router_failovers_total", from_entry="flaky",
                  to_entry="local", reason="auth") == 1  # fmt: skip
    assert sample(registry, "sandbox_router_breaker_state", entry="flaky") == 3
    assert states(registry, "flaky") == {s: float(s == "misconfigured") for s in ENTRY_STATES}
    assert sample(registry, "sandbox_router_entry_available", entry="flaky") == 0


def test_a_refused_spec_ends_the_acquire_and_is_counted(make_router: RouterFactory) -> None:
    router = make_router([SandboxError("no such image")])
    registry = CollectorRegistry()
    instrument(router, registry)
    with pytest.raises(SandboxError):
        router.acquire()
    assert sample(registry, "sandbox_router_acquisitions_total", entry="flaky",
                  outcome="sandbox_error") == 1  # fmt: skip
    assert sample(registry, "sandbox_router_failovers_total", from_entry="flaky",
                  to_entry="local", reason="sandbox_error") is None  # fmt: skip


def test_no_provider_and_quota_exhaustion(make_router: RouterFactory) -> None:
    router = make_router()
    registry = CollectorRegistry()
    instrument(router, registry)
    # pre-set at zero, so the first failure is an increase Prometheus can see
    assert sample(registry, "sandbox_router_acquisitions_total", entry="none",
                  outcome="no_provider") == 0  # fmt: skip
    assert sample(registry, "sandbox_router_state_errors_total", operation="reserve",
                  mode="fail_closed") == 0  # fmt: skip
    router.set_usage("flaky", "sessions", 100)
    router.set_usage("local", "sessions", 12)
    with pytest.raises(NoProviderAvailable):
        router.acquire()
    assert sample(registry, "sandbox_router_acquisitions_total", entry="none",
                  outcome="no_provider") == 1  # fmt: skip
    assert sample(registry, "sandbox_router_acquire_seconds_count", entry="none") == 1
    assert sample(registry, "sandbox_router_quota_adjustments_total", pool="local",
                  unit="sessions") == 1  # fmt: skip
    for entry in ("flaky", "local"):
        assert sample(registry, "sandbox_router_quota_remaining", pool=entry,
                      unit="sessions") == 0  # fmt: skip
        assert sample(registry, "sandbox_router_entry_available", entry=entry) == 0
        assert sample(registry, "sandbox_router_breaker_state", entry=entry) == 0  # health is fine


def test_quota_gauges_are_the_shared_ledger(make_router: RouterFactory, clock: Clock) -> None:
    router = make_router()
    registry = CollectorRegistry()
    instrument(router, registry, clock=clock)
    with router.acquire() as first, router.acquire() as second:
        assert (first.entry, second.entry) == ("flaky", "flaky")
        assert sample(registry, "sandbox_router_live_leases", entry="flaky") == 2
        assert sample(registry, "sandbox_router_quota_used", pool="flaky",
                      unit="concurrent") == 2  # fmt: skip
        assert sample(registry, "sandbox_router_quota_remaining", pool="flaky",
                      unit="concurrent") == 3  # fmt: skip
        clock.advance(30)
    now = clock()
    v = {
        unit: sample(registry, "sandbox_router_quota_used", pool="flaky", unit=unit)
        for unit in ("sessions", "sandbox_seconds", "concurrent")
    }
    assert v["sessions"] == 2
    assert v["sandbox_seconds"] == pytest.approx(60, abs=2)
    assert v["concurrent"] == 0
    assert sample(registry, "sandbox_router_quota_limit", pool="flaky", unit="sessions") == 100
    assert sample(registry, "sandbox_router_quota_remaining", pool="flaky",
                  unit="sessions") == 98  # fmt: skip
    assert sample(registry, "sandbox_router_quota_used", pool="local", unit="sessions") == 0
    start, reset = MonthlyWindow("UTC", 1).bounds(now)
    assert sample(registry, "sandbox_router_quota_window_start_timestamp_seconds",
                  pool="flaky") == start.timestamp()  # fmt: skip
    assert sample(registry, "sandbox_router_quota_window_reset_timestamp_seconds",
                  pool="flaky") == reset.timestamp()  # fmt: skip
    projected = sample(registry, "sandbox_router_quota_projected_exhaustion_timestamp_seconds",
                       pool="flaky", unit="sessions")  # fmt: skip
    expected = now + 98 / (2 / (now - start.timestamp()))
    assert projected == pytest.approx(expected, rel=1e-3)
    assert sample(registry, "sandbox_router_entry_info", entry="flaky", provider="scripted",
                  pool="flaky") == 1  # fmt: skip


def _redis_calls(client: redis.Redis) -> dict[str, int]:
    stats = client.info("commandstats")
    return {k: v["calls"] for k, v in stats.items() if k != "cmdstat_info"}


def _delta(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    return {k: n - before.get(k, 0) for k, n in after.items() if n != before.get(k, 0)}


def test_one_state_read_per_scrape(make_router: RouterFactory, redis_url: str) -> None:
    """A scrape costs exactly the Redis commands of one Router.status(), whatever the gauges."""
    router = make_router()
    registry = CollectorRegistry()
    instrument(router, registry)
    with router.acquire():
        pass
    client = redis.Redis.from_url(redis_url)
    router.status()  # warm: connections made
    before = _redis_calls(client)
    router.status()
    one_read = _delta(before, _redis_calls(client))
    before = _redis_calls(client)
    text = generate_latest(registry).decode()
    scrape = _delta(before, _redis_calls(client))
    client.close()
    assert text.count("sandbox_router_quota_used{") == 8  # two pools, four units
    assert one_read, "status() read nothing from Redis?"
    assert scrape == one_read


def _start_exporter(config: Path, stack: ExitStack) -> str:
    proc = subprocess.Popen(
        [sys.executable, "-m", "router.cli", "metrics", "--config", str(config), "--port", "0"],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )

    def stop() -> None:
        proc.terminate()
        proc.wait(10)
        assert proc.stdout is not None
        assert proc.stderr is not None
        proc.stdout.close()
        proc.stderr.close()

    stack.callback(stop)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line.startswith("serving http://"), line + (proc.stderr.read() if proc.stderr else "")
    return line.split()[1]


def _gauges(url: str, prefix: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = httpx.get(url, timeout=10).text
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name.startswith(prefix) and "projected" not in s.name
    }


def test_two_router_processes_sharing_redis_report_identical_quota_gauges(
    make_router: RouterFactory, redis_url: str, key_prefix: str, tmp_path: Path
) -> None:
    config = tmp_path / "chain.yaml"
    config.write_text(yaml.safe_dump(chain_config(redis_url, key_prefix, tmp_path)))
    app = make_router()  # the app: same Redis and prefix, drives the traffic
    with ExitStack() as stack:
        urls = [_start_exporter(config, stack) for _ in range(2)]
        for _ in range(2):
            with app.acquire():
                pass
        held = [stack.enter_context(app.acquire()) for _ in range(3)]
        assert {lease.entry for lease in held} == {"flaky"}
        first, second = (_gauges(url, "sandbox_router_quota") for url in urls)
        assert first == second
        used = {labels: v for (name, labels), v in first.items()
                if name == "sandbox_router_quota_used"}  # fmt: skip
        assert used[(("pool", "flaky"), ("unit", "sessions"))] == 5
        assert used[(("pool", "flaky"), ("unit", "concurrent"))] == 3
        leases = [_gauges(url, "sandbox_router_live_leases") for url in urls]
        assert leases[0] == leases[1]
        assert leases[0][("sandbox_router_live_leases", (("entry", "flaky"),))] == 3


def test_instrument_into_an_existing_registry(make_router: RouterFactory) -> None:
    registry = CollectorRegistry()
    requests = Counter("app_requests", "the app's own metric", registry=registry)
    requests.inc()
    router = make_router()
    metrics = instrument(router, registry)
    assert instrument(router, registry) is metrics  # idempotent
    assert router.hooks.count(metrics.hook) == 1
    with router.acquire():
        pass
    text = generate_latest(registry).decode()
    assert "app_requests_total 1.0" in text
    assert 'sandbox_router_acquisitions_total{entry="flaky",outcome="success"} 1.0' in text
    assert 'sandbox_router_quota_used{pool="flaky",unit="sessions"} 1.0' in text

    other = make_router()
    with pytest.raises(ValueError, match="another router's state"):
        instrument(other, registry)
    assert instrument(other, registry, state=False) is metrics  # counting only is fine
    with other.acquire():
        pass
    assert sample(registry, "sandbox_router_acquisitions_total", entry="flaky",
                  outcome="success") == 2  # fmt: skip


def test_labels_never_carry_ids_sessions_or_secrets(
    make_router: RouterFactory, redis_url: str
) -> None:
    router = make_router([Unavailable("503 for sess-secret-42")] * 3)
    registry = CollectorRegistry()
    instrument(router, registry)
    seen = []
    with router.acquire(session="sess-secret-42", labels={"team": "t-secret"}) as lease:
        seen += [lease.sandbox_id, lease.id]
    with router.acquire(session="sess-secret-42") as lease:
        seen += [lease.sandbox_id, lease.id]
    assert sample(registry, "sandbox_router_acquisitions_total", entry="local",
                  outcome="resumed") == 1  # fmt: skip
    values = {
        value
        for family in registry.collect()
        for s in family.samples
        for value in s.labels.values()
    }
    for forbidden in [*seen, "sess-secret-42", "t-secret", redis_url]:
        assert not any(forbidden in value for value in values), forbidden
    assert values <= {
        "flaky", "local", "none", "scripted", "success", "resumed", "failure", "no_provider",
        "unavailable", "closed", "open", "half_open", "fail_closed", "sessions",
        "sandbox_seconds", "concurrent", "usd", *ENTRY_STATES,
        "reserve", "commit", "refund", "release", "heartbeat", "session", "snapshot",
        "0.5", "0.95",  # create_latency_seconds' quantiles
    } | {s.labels.get("le", "") for f in registry.collect() for s in f.samples}  # fmt: skip


def test_state_store_down(make_router: RouterFactory, key_prefix: str, tmp_path: Path) -> None:
    dead = f"redis://127.0.0.1:{free_port()}/0"
    router = make_router(config=chain_config(dead, key_prefix, tmp_path))
    registry = CollectorRegistry()
    instrument(router, registry)
    assert sample(registry, "sandbox_router_state_up") == 0
    assert sample(registry, "sandbox_router_entry_info", entry="local", provider="local",
                  pool="local") == 1  # fmt: skip
    assert sample(registry, "sandbox_router_quota_used", pool="local", unit="sessions") is None
    assert sample(registry, "sandbox_router_breaker_state", entry="local") is None


def test_serve_and_run_exporter(make_router: RouterFactory) -> None:
    router = make_router()
    registry = CollectorRegistry()
    server = serve(router, 0, registry=registry)  # instruments the router into it
    try:
        with router.acquire():
            pass
        text = httpx.get(f"http://127.0.0.1:{server.server_port}/metrics", timeout=10).text
        assert "sandbox_router_state_up 1.0" in text
        assert 'sandbox_router_acquisitions_total{entry="flaky",outcome="success"} 1.0' in text
    finally:
        server.shutdown()
        server.server_close()

    stop, said = threading.Event(), []
    ready = threading.Event()

    def announce(line: str) -> None:
        said.append(line)
        ready.set()

    other = make_router()
    thread = threading.Thread(
        target=run_exporter,
        args=(other, 0),
        kwargs={"registry": CollectorRegistry(), "stop": stop, "announce": announce},
    )
    thread.start()
    try:
        assert ready.wait(10)
        url = said[0].split()[1]
        assert url.startswith("http://127.0.0.1:")
        assert "sandbox_router_quota_used" in httpx.get(url, timeout=10).text
    finally:
        stop.set()
        thread.join(10)
    assert not thread.is_alive()
    with pytest.raises(httpx.ConnectError):
        httpx.get(url, timeout=2)


WORKER = """
import json, sys
from router import Router
from router.metrics import instrument
router = Router.from_config(json.loads(sys.argv[1]), hooks=[])
instrument(router)
for _ in range(int(sys.argv[2])):
    with router.acquire():
        pass
router.close()
"""


def test_multiprocess_mode_sums_the_workers(
    make_router: RouterFactory,
    redis_url: str,
    key_prefix: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Like gunicorn workers: each process counts into PROMETHEUS_MULTIPROC_DIR."""
    directory = tmp_path / "multiproc"
    directory.mkdir()
    config = json.dumps(chain_config(redis_url, key_prefix, tmp_path))
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(directory)}
    workers = [
        subprocess.Popen([sys.executable, "-c", WORKER, config, "3"], cwd=REPO, env=env)
        for _ in range(2)
    ]
    assert [w.wait(60) for w in workers] == [0, 0]
    router = make_router()
    registry = multiprocess_registry(router, directory)
    assert sample(registry, "sandbox_router_acquisitions_total", entry="flaky",
                  outcome="success") == 6  # fmt: skip
    assert sample(registry, "sandbox_router_create_seconds_count", entry="flaky",
                  outcome="success") == 6  # fmt: skip
    assert sample(registry, "sandbox_router_quota_used", pool="flaky", unit="sessions") == 6

    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(directory))
    server = serve(router, 0)  # what `sandbox-router metrics` does in multiprocess mode
    try:
        text = httpx.get(f"http://127.0.0.1:{server.server_port}/metrics", timeout=10).text
    finally:
        server.shutdown()
        server.server_close()
    assert 'sandbox_router_acquisitions_total{entry="flaky",outcome="success"} 6.0' in text
    assert 'sandbox_router_quota_used{pool="flaky",unit="sessions"} 6.0' in text

    monkeypatch.delenv("PROMETHEUS_MULTIPROC_DIR")
    with pytest.raises(ValueError, match="PROMETHEUS_MULTIPROC_DIR"):
        multiprocess_registry(router)


def test_window_dates_follow_the_config(make_router: RouterFactory, clock: Clock) -> None:
    router = make_router(timezone="Europe/Berlin", reset_day=15)
    registry = CollectorRegistry()
    instrument(router, registry, clock=clock)
    start = sample(registry, "sandbox_router_quota_window_start_timestamp_seconds", pool="local")
    reset = sample(registry, "sandbox_router_quota_window_reset_timestamp_seconds", pool="local")
    assert start is not None
    assert reset is not None
    assert start <= clock() < reset
    for ts in (start, reset):
        local = datetime.fromtimestamp(ts, UTC).astimezone(ZoneInfo("Europe/Berlin"))
        assert (local.day, local.hour, local.minute) == (15, 0, 0)


def test_serve_without_a_registry_serves_each_router_its_own(make_router: RouterFactory) -> None:
    """As the demo does, run after run in one process: no clash in a shared registry."""
    for _ in range(2):
        router = make_router()
        server = serve(router, 0)
        try:
            with router.acquire():
                pass
            url = f"http://127.0.0.1:{server.server_port}/metrics"
            text = httpx.get(url, timeout=10).text
        finally:
            server.shutdown()
            server.server_close()
        assert 'sandbox_router_acquisitions_total{entry="flaky",outcome="success"} 1.0' in text


def test_released_leases_add_their_cost_by_entry_and_pool(
    make_router: RouterFactory, clock: Clock, redis_url: str, key_prefix: str, tmp_path: Path
) -> None:
    config = chain_config(redis_url, key_prefix, tmp_path)
    config["chain"][0]["price"] = {"vcpu_hour": 3.6, "per_sandbox": 0.25}
    config["chain"][0]["resources"] = {"vcpu": 2, "memory_gib": 1}
    router = make_router(config=config)
    registry = CollectorRegistry()
    instrument(router, registry, clock=clock)
    assert sample(registry, "sandbox_router_cost_usd_total", entry="flaky", pool="flaky") == 0
    with router.acquire() as lease:
        assert lease.entry == "flaky"
        clock.advance(10)
    # 2 vCPU at $3.60 an hour for 10 s (and the few real milliseconds the clock adds), plus
    # the sandbox fee
    labels = {"entry": "flaky", "pool": "flaky"}
    wait_until(lambda: sample(registry, "sandbox_router_cost_usd_total", **labels))
    cost = sample(registry, "sandbox_router_cost_usd_total", **labels)
    assert cost == pytest.approx(2 * 0.001 * 10 + 0.25, abs=0.002)


def test_projected_month_end_spend_per_pool(
    make_router: RouterFactory, clock: Clock, redis_url: str, key_prefix: str, tmp_path: Path
) -> None:
    """The pool's settled usd, gone on at this window's average rate to its reset."""
    config = chain_config(redis_url, key_prefix, tmp_path)
    config["chain"][0]["price"] = {"per_sandbox": 0.5}
    config["chain"][0]["quota"]["usd"] = 10
    router = make_router(config=config)
    registry = CollectorRegistry()
    instrument(router, registry, clock=clock)
    assert sample(registry, "sandbox_router_spend_projected_usd", pool="flaky") == 0
    assert sample(registry, "sandbox_router_spend_projected_usd", pool="local") == 0
    with router.acquire() as lease:
        assert lease.entry == "flaky"
    wait_until(lambda: sample(registry, "sandbox_router_quota_used", pool="flaky", unit="usd"))
    now = clock()
    start, reset = (t.timestamp() for t in MonthlyWindow("UTC", 1).bounds(now))
    expected = 0.5 + 0.5 / (now - start) * (reset - now)
    projected = sample(registry, "sandbox_router_spend_projected_usd", pool="flaky")
    assert projected == pytest.approx(expected, rel=1e-3)
    assert sample(registry, "sandbox_router_quota_limit", pool="flaky", unit="usd") == 10
    assert sample(registry, "sandbox_router_spend_projected_usd", pool="local") == 0
