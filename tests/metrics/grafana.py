"""Helpers to read the committed dashboards and rules (grafana/)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

GRAFANA = Path(__file__).resolve().parents[2] / "grafana"
DASHBOARDS = ["sandbox-router-quota.json", "sandbox-router-routing.json"]
RULES = GRAFANA / "prometheus" / "sandbox-router.rules.yml"
RULE_TESTS = GRAFANA / "prometheus" / "sandbox-router.rules.test.yml"

# What Grafana substitutes before a query reaches Prometheus ("All" selected).
VARIABLES = {
    "$__rate_interval": "1m",
    "$__interval": "15s",
    "$entry": ".*",
    "$pool": ".*",
}


def panel_queries(board: dict[str, Any]) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """(panel, target) for every query of every panel, rows included."""
    found = []
    for panel in board["panels"]:
        for inner in [panel, *panel.get("panels", [])]:
            for target in inner.get("targets") or []:
                found.append((inner, target))
    return found


def substitute(expr: str) -> str:
    for name, value in VARIABLES.items():
        expr = expr.replace(name, value)
    if re.search(r"\$\w+", expr):
        raise AssertionError(f"unsubstituted variable in {expr!r}")
    return expr
