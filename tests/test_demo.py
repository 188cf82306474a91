"""`sandbox-router demo` end to end on the emulators: the script's story holds.

The demo takes about nine seconds, so the module runs it once, as a user
would (the installed command, ``--json`` and ``--metrics-port``), reads the
exporter while it runs, and each test checks one part of what it did.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from emulators import available
from emulators.harness import free_port
from router.config import DEFAULT_CHAIN
from router.demo import roles

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(len(available(list(DEFAULT_CHAIN))) < 2, reason="needs two emulators"),
]


@dataclass
class DemoRun:
    returncode: int
    summary: dict[str, Any]
    metrics_seen: str


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> DemoRun:
    port = free_port()
    env = {**os.environ, "XDG_STATE_HOME": str(tmp_path_factory.mktemp("state"))}
    exe = Path(sys.executable).parent / "sandbox-router"
    proc = subprocess.Popen(
        [str(exe), "demo", "--json", "--metrics-port", str(port)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip
    seen: list[str] = [""]

    def scrape() -> None:
        while proc.poll() is None and 'outcome="success"} 1' not in seen[0]:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
                    seen[0] = r.read().decode()
            except OSError:
                time.sleep(0.2)

    scraper = threading.Thread(target=scrape, daemon=True)
    scraper.start()
    try:
        out, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
        proc.wait()
    scraper.join(10)
    assert out, f"the demo printed nothing (exit {proc.returncode}):\n{err}"
    return DemoRun(proc.returncode, json.loads(out), seen[0])


def test_demo_serves_everything_and_fails_over_where_the_faults_are(demo: DemoRun) -> None:
    summary = demo.summary
    names = available(list(DEFAULT_CHAIN))
    role = roles(names)
    phases = list(summary["served_by_phase"])

    assert summary["errors"] == []
    assert summary["failed"] == 0
    assert sum(summary["served"].values()) == summary["requests"]
    assert set(summary["served_by_phase"][phases[0]]) == {names[0]}  # morning: the chain's head
    assert summary["failovers_by_phase"][phases[1]].get(role["outage"], 0) >= 1
    assert role["outage"] not in summary["served_by_phase"][phases[1]]
    assert summary["failovers_by_phase"][phases[2]].get(role["storm"], 0) >= 1
    assert role["storm"] not in summary["served_by_phase"][phases[2]]
    assert role["outage"] in summary["served_by_phase"][phases[-1]]  # back once its breaker closed
    if "spent" in role:
        spent = summary["quota"][role["spent"]]
        assert spent["used"] == spent["limit"]  # ran out during the storm
    for name, quota in summary["quota"].items():
        if quota["limit"] is not None:
            assert quota["used"] <= quota["limit"], name
    for name in names:
        assert summary["alive_in_emulators"][name] == 0, f"{name} left sandboxes alive"
        assert summary["created_in_emulators"][name] == summary["quota"][name]["used"], name


def test_demo_cli_prints_json(demo: DemoRun) -> None:
    assert demo.returncode == 0
    assert demo.summary["failed"] == 0
    assert demo.summary["requests"] == sum(demo.summary["served"].values())


def test_demo_exposes_metrics_meanwhile(demo: DemoRun) -> None:
    assert 'sandbox_router_acquisitions_total{entry="' in demo.metrics_seen
