"""The alert rules pass `promtool check rules` and their unit tests."""

from __future__ import annotations

import shutil
import subprocess

import pytest
import yaml

from tests.metrics.grafana import RULE_TESTS, RULES

PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(
    PROMTOOL is None,
    reason="promtool not found (Debian package `prometheus`; .ci/run installs it)",
)

REQUIRED = {
    "SandboxRouterQuotaAbove80Percent",
    "SandboxRouterQuotaAbove95Percent",
    "SandboxRouterQuotaExhausted",
    "SandboxRouterQuotaProjectedExhaustion",
    "SandboxRouterProjectedOverspend",
    "SandboxRouterBreakerOpen",
    "SandboxRouterNoEntryAvailable",
    "SandboxRouterStateStoreErrors",
}


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    assert PROMTOOL is not None
    return subprocess.run(
        [PROMTOOL, *args], capture_output=True, text=True, timeout=60, check=False
    )


@needs_promtool
def test_promtool_check_rules() -> None:
    result = promtool("check", "rules", str(RULES))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


@needs_promtool
def test_promtool_rule_unit_tests() -> None:
    result = promtool("test", "rules", str(RULE_TESTS))
    assert result.returncode == 0, result.stdout + result.stderr


@needs_promtool
def test_promtool_rejects_a_broken_rule(tmp_path) -> None:
    """The check is real: a rule with a bad expression fails it."""
    good = "max by (entry) (sandbox_router_breaker_state) == 2"
    broken = RULES.read_text().replace(good, "max by (entry) (sandbox_router_breaker_state == 2")
    assert broken != RULES.read_text()
    (tmp_path / "broken.yml").write_text(broken)
    assert promtool("check", "rules", str(tmp_path / "broken.yml")).returncode != 0


def test_every_required_alert_is_defined_and_tested() -> None:
    rules = yaml.safe_load(RULES.read_text())
    alerts = {r["alert"]: r for g in rules["groups"] for r in g["rules"]}
    assert set(alerts) >= REQUIRED
    for name, rule in alerts.items():
        assert rule["labels"]["severity"] in ("warning", "critical"), name
        assert rule["annotations"]["summary"], name
    tests = yaml.safe_load(RULE_TESTS.read_text())
    tested = {
        case["alertname"]
        for group in tests["tests"]
        for case in group["alert_rule_test"]
        if case.get("exp_alerts")
    }
    assert tested == set(alerts), f"alerts without a firing unit test: {set(alerts) - tested}"
