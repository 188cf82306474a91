"""`sandbox-router demo` end to end on the emulators: the script's story holds."""

from __future__ import annotations

import json

import pytest

from emulators import available
from router.cli import main
from router.config import DEFAULT_CHAIN
from router.demo import roles, run_demo

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(len(available(list(DEFAULT_CHAIN))) < 2, reason="needs two emulators"),
]


def test_demo_serves_everything_and_fails_over_where_the_faults_are() -> None:
    summary = run_demo(live=False)
    names = available(list(DEFAULT_CHAIN))
    role = roles(names)
    phases = list(summary.served_by_phase)

    assert summary.errors == []
    assert summary.failed == 0
    assert sum(summary.served.values()) == summary.requests
    assert set(summary.served_by_phase[phases[0]]) == {names[0]}  # morning: the chain's head
    assert summary.failovers_by_phase[phases[1]].get(role["outage"], 0) >= 1
    assert role["outage"] not in summary.served_by_phase[phases[1]]
    assert summary.failovers_by_phase[phases[2]].get(role["storm"], 0) >= 1
    assert role["storm"] not in summary.served_by_phase[phases[2]]
    assert role["outage"] in summary.served_by_phase[phases[-1]]  # back once its breaker closed
    if "spent" in role:
        spent = summary.quota[role["spent"]]
        assert spent["used"] == spent["limit"]  # ran out during the storm
    for name, quota in summary.quota.items():
        if quota["limit"] is not None:
            assert quota["used"] <= quota["limit"], name
    for name in names:
        assert summary.alive_in_emulators[name] == 0, f"{name} left sandboxes alive"
        assert summary.created_in_emulators[name] == summary.quota[name]["used"], name


def test_demo_cli_prints_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["failed"] == 0
    assert summary["requests"] == sum(summary["served"].values())


def test_demo_exposes_metrics_meanwhile() -> None:
    import socket
    import threading
    import time
    import urllib.request

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    result: list[object] = []
    runner = threading.Thread(target=lambda: result.append(run_demo(live=False, metrics_port=port)))
    runner.start()
    seen = ""
    deadline = time.monotonic() + 60
    while runner.is_alive() and time.monotonic() < deadline and 'outcome="success"} 1' not in seen:
        try:
            seen = (
                urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5)
                .read()
                .decode()
            )
        except OSError:
            time.sleep(0.2)
    runner.join(120)
    assert 'sandbox_router_acquisitions_total{entry="' in seen
    assert result
