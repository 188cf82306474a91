"""The committed dashboards are what grafana/generate.py builds, and are well formed."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from tests.metrics.grafana import DASHBOARDS, GRAFANA, panel_queries


def test_committed_dashboards_are_fresh() -> None:
    """Fails when generate.py changed and `python grafana/generate.py` was not rerun."""
    try:
        import grafana_foundation_sdk  # noqa: F401
    except ImportError:
        pytest.fail("grafana-foundation-sdk is not installed (pip install -e '.[test]')")
    result = subprocess.run(
        [sys.executable, str(GRAFANA / "generate.py"), "--check"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr


def test_check_mode_detects_a_stale_file(tmp_path) -> None:
    for name in DASHBOARDS:
        (tmp_path / name).write_text((GRAFANA / "dashboards" / name).read_text())
    run = [sys.executable, str(GRAFANA / "generate.py"), "--check", "--out", str(tmp_path)]
    assert subprocess.run(run, capture_output=True, timeout=60, check=False).returncode == 0
    stale = tmp_path / DASHBOARDS[0]
    stale.write_text(stale.read_text().replace("Breaker state", "Breaker"))
    stale.write_text(stale.read_text().replace("Days to reset", "Days"))
    result = subprocess.run(run, capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 1
    assert DASHBOARDS[0] in result.stderr


@pytest.mark.parametrize("name", DASHBOARDS)
def test_dashboard_shape(name: str) -> None:
    board = json.loads((GRAFANA / "dashboards" / name).read_text())
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    assert variables["entry"]["type"] == "query"
    assert "sandbox_router_entry_info" in variables["entry"]["query"]
    queries = panel_queries(board)
    assert len(queries) >= 6
    for panel, target in queries:
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        assert target["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        assert re.search(r"\bsandbox_router_\w+", target["expr"]), target["expr"]
    ids = [p["id"] for p in board["panels"]]
    assert ids == list(range(1, len(ids) + 1))


def test_required_panels() -> None:
    titles = {}
    for name in DASHBOARDS:
        board = json.loads((GRAFANA / "dashboards" / name).read_text())
        titles[name] = {panel["title"] for panel in board["panels"]}
    quota, routing = titles["sandbox-router-quota.json"], titles["sandbox-router-routing.json"]
    assert {"Used / limit", "Burn rate per day", "Projected exhaustion", "Days to reset"} <= quota
    assert {
        "Acquisitions by entry and outcome",
        "Failovers by reason",
        "Acquire latency",
        "Create latency by entry",
        "Breaker state",
        "Live leases",
    } <= routing


def test_provisioning_points_at_the_dashboards() -> None:
    import yaml

    providers = yaml.safe_load((GRAFANA / "dashboards" / "sandbox-router.yml").read_text())
    path = providers["providers"][0]["options"]["path"]
    assert path == "/etc/grafana/provisioning/dashboards"  # grafana/ mounted there
    sources = yaml.safe_load((GRAFANA / "datasources" / "sandbox-router.yml").read_text())
    assert sources["datasources"][0]["type"] == "prometheus"
