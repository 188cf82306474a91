"""Every panel query and alert expression, evaluated by a real Prometheus scraping a router.

The router runs real acquisitions on the private Redis: a scripted entry
that fails (so requests fail over and its breaker opens) and the real local
provider, whose quota pool is driven to its limit. Prometheus scrapes the
router's exporter every second and evaluates the alert rules every second
(with their ``for:`` durations set to 0 s so they fire within the test).
"""

from __future__ import annotations

import json
import math
import re
import time
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from policies.quota import MonthlyWindow
from providers.errors import NoProviderAvailable, Unavailable
from router.metrics import instrument, serve
from tests.metrics.conftest import Clock, RouterFactory, chain_config
from tests.metrics.grafana import DASHBOARDS, GRAFANA, RULES, panel_queries, substitute
from tests.metrics.prometheus import BINARY, SKIP_REASON, Prometheus

pytestmark = [pytest.mark.slow, pytest.mark.skipif(BINARY is None, reason=SKIP_REASON)]


def rules_firing_at_once(tmp_path: Path) -> Path:
    """The shipped rules with every ``for:`` at 0 s."""
    text, count = re.subn(r"(?m)^(\s+for:) \S+$", r"\1 0s", RULES.read_text())
    assert count >= 7
    path = tmp_path / "rules-for-0s.yml"
    path.write_text(text)
    return path


def drive_traffic(router: Any, seconds: float) -> int:
    """Fail over once (opening flaky's breaker), then spend local's 12 sessions, then fail."""
    with router.acquire() as lease:
        assert lease.entry == "local"
        assert lease.failovers == ["flaky"]
    served = 1
    pause = seconds / 11
    while True:
        try:
            with router.acquire() as lease:
                assert lease.entry == "local"
                time.sleep(pause)  # live across a scrape, metering sandbox seconds
            served += 1
        except NoProviderAvailable:
            return served


def finite(result: list[dict[str, Any]]) -> bool:
    return any(math.isfinite(float(s["value"][1])) for s in result)


def firing(prom: Prometheus) -> set[tuple[str, str]]:
    alerts = prom.api("alerts")["alerts"]
    return {
        (a["labels"]["alertname"], a["labels"].get("pool") or a["labels"].get("entry", ""))
        for a in alerts
        if a["state"] == "firing"
    }


def test_panels_and_alerts_on_a_real_prometheus(
    make_router: RouterFactory, tmp_path: Path, redis_url: str, key_prefix: str
) -> None:
    config = chain_config(redis_url, key_prefix, tmp_path)
    config["chain"][1]["price"] = {"vcpu_hour": 3.6, "per_sandbox": 0.01}  # the cost row's
    config["chain"][1]["quota"]["usd"] = 100
    router = make_router([Unavailable("503 service unavailable")] * 3, config=config)
    registry = CollectorRegistry()
    instrument(router, registry)
    exporter = serve(router, 0, registry=registry)
    target = f"127.0.0.1:{exporter.server_port}"
    try:
        with Prometheus(tmp_path, [target], [rules_firing_at_once(tmp_path)]) as prom:
            assert prom.wait_for('up{job="sandbox-router"} == 1'), "never scraped the router"
            assert drive_traffic(router, seconds=5.5) == 12  # the local pool's limit
            time.sleep(2.5)  # a few scrapes after the last acquire

            check_variables(prom)
            empty = []
            for name in DASHBOARDS:
                board = json.loads((GRAFANA / "dashboards" / name).read_text())
                for panel, query in panel_queries(board):
                    expr = substitute(query["expr"])
                    result = prom.query(expr)  # raises on a parse error
                    if not finite(result):
                        empty.append(f"{name} / {panel['title']} / {query['refId']}: {expr}")
            assert not empty, "panels without data:\n" + "\n".join(empty)

            expected = {
                ("SandboxRouterQuotaExhausted", "local"),
                ("SandboxRouterQuotaAbove95Percent", "local"),
                ("SandboxRouterQuotaAbove80Percent", "local"),
                ("SandboxRouterBreakerOpen", "flaky"),
                ("SandboxRouterNoEntryAvailable", ""),
                ("SandboxRouterAcquireFailures", ""),
            }
            deadline = time.monotonic() + 20
            while not expected <= (now := firing(prom)) and time.monotonic() < deadline:
                time.sleep(0.5)
            assert expected <= now, f"missing: {expected - now}"
            assert ("SandboxRouterQuotaExhausted", "flaky") not in now  # it has quota left

            check_rules(prom)
    finally:
        exporter.shutdown()
        exporter.server_close()


def check_variables(prom: Prometheus) -> None:
    """The template variables' label_values() queries find the entries and pools."""
    values = {}
    for name in DASHBOARDS:
        board = json.loads((GRAFANA / "dashboards" / name).read_text())
        for variable in board["templating"]["list"]:
            if variable["type"] != "query":
                continue
            match = re.fullmatch(r"label_values\((.+),\s*(\w+)\)", variable["query"])
            assert match, variable["query"]
            selector, label = substitute(match[1]), match[2]
            found = prom.api(f"label/{label}/values", **{"match[]": selector})
            values[variable["name"]] = set(found)
    assert values == {"entry": {"flaky", "local"}, "pool": {"flaky", "local"}}


def check_rules(prom: Prometheus) -> None:
    """Every shipped alert expression parses and evaluates; every loaded rule is healthy."""
    import yaml

    shipped = yaml.safe_load(RULES.read_text())
    for group in shipped["groups"]:
        for rule in group["rules"]:
            prom.query(rule["expr"])
    loaded = prom.api("rules")["groups"]
    health = {r["name"]: r["health"] for g in loaded for r in g["rules"]}
    names = {r["alert"] for g in shipped["groups"] for r in g["rules"]}
    assert set(health) == names
    assert set(health.values()) == {"ok"}, health


def test_projected_overspend_fires_on_a_real_prometheus(
    make_router: RouterFactory, clock: Clock, tmp_path: Path, redis_url: str, key_prefix: str
) -> None:
    """An hour into its window, a pool that spent 3% of its budget heads for 20 times it."""
    start, reset = (t.timestamp() for t in MonthlyWindow().bounds(time.time()))
    clock.offset = start + 3600 - time.time()
    config = chain_config(redis_url, key_prefix, tmp_path)
    config["chain"][0]["price"] = {"per_sandbox": 0.01}
    config["chain"][0]["quota"]["usd"] = 1
    router = make_router(config=config)
    registry = CollectorRegistry()
    instrument(router, registry, clock=clock)
    exporter = serve(router, 0, registry=registry)
    try:
        for _ in range(3):
            with router.acquire() as lease:
                assert lease.entry == "flaky"
        with Prometheus(
            tmp_path, [f"127.0.0.1:{exporter.server_port}"], [rules_firing_at_once(tmp_path)]
        ) as prom:
            [projected] = prom.wait_for('sandbox_router_spend_projected_usd{pool="flaky"} > 1')
            month_hours = (reset - start) / 3600
            assert float(projected["value"][1]) == pytest.approx(0.03 * month_hours, rel=0.01)
            deadline = time.monotonic() + 20
            while ("SandboxRouterProjectedOverspend", "flaky") not in (now := firing(prom)):
                assert time.monotonic() < deadline, now
                time.sleep(0.5)
            assert ("SandboxRouterProjectedOverspend", "local") not in now
    finally:
        exporter.shutdown()
        exporter.server_close()
