"""The benchmarks still run (tiny sizes; no timing is asserted here).

``python -m benchmarks`` is run by hand for RESULTS.md; this keeps each
benchmark working between those runs and checks the figures that are exact
(round trips, race overspend) rather than timed.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks import (
    agents,
    code,
    frameworks,
    gate,
    mcp_server,
    overhead,
    race,
    scaling,
    throughput,
    time_to_sandbox,
    tracing,
    vendors,
)
from benchmarks.suites import main as benchmarks_main
from emulators import available


def test_round_trips_are_two_per_acquire_and_one_per_release(redis_url: str, tmp_path: Path):
    counted = overhead.round_trips(redis_url, tmp_path, 5)
    assert counted["acquire"]["round_trips"] == 2
    assert counted["release"]["round_trips"] == 1


def test_overhead_pairs_both_apis(redis_url: str, tmp_path: Path) -> None:
    result = overhead.local_overhead(redis_url, tmp_path, 3)
    for api in ("sync", "async"):
        assert result[api]["router"]["n"] == result[api]["direct"]["n"] == 3
        assert result[api]["cpu_overhead"]["n"] == 3
        assert result[api]["ratio_p50"] > 0


def test_hooks_cost_pairs_a_hooked_router_with_a_bare_one(redis_url: str, tmp_path: Path):
    result = overhead.hooks_cost(redis_url, tmp_path, 3)
    assert result["router"]["n"] == result["direct"]["n"] == result["overhead"]["n"] == 3


def test_tenant_cost_pairs_a_tenant_limited_router_with_a_bare_one(
    redis_url: str, tmp_path: Path
) -> None:
    result = overhead.tenant_cost(redis_url, tmp_path, 3)
    assert result["off_cpu"]["n"] == result["on_cpu"]["n"] == 3
    assert result["cpu_ratio_p50"] > 0


def test_tracing_cost_pairs_a_traced_router_with_an_untraced_one(redis_url: str, tmp_path: Path):
    result = tracing.tracing_cost(redis_url, tmp_path, 3)
    assert result["traced_cycle"]["router"]["n"] == result["traced_cycle"]["direct"]["n"] == 3
    assert result["span"]["untraced_ns"] > 0
    assert result["span"]["traced_us"] > 0


@pytest.mark.slow
def test_mcp_overhead_pairs_each_transport_with_the_direct_call(tmp_path: Path) -> None:
    pytest.importorskip("mcp", reason='needs the mcp SDK (pip install "sandbox-router[mcp]")')
    result = mcp_server.mcp_overhead(tmp_path, 3)
    for transport in ("stdio", "http"):
        assert result[transport]["router"]["n"] == result[transport]["direct"]["n"] == 3
        assert result[transport]["overhead"]["n"] == 3
    assert result["protocol"]["http"] == "2025-11-25"  # HTTP sessions need the handshake


@pytest.mark.slow
def test_the_agents_row_pairs_the_routers_backend_with_the_sdks_vendor_clients(
    redis_url: str,
) -> None:
    pytest.importorskip("agents", reason='needs openai-agents (pip install "sandbox-router[all]")')
    result = agents.agents_overhead(redis_url, 3)
    for vendor in agents.VENDORS:
        assert result[vendor]["router"]["n"] == result[vendor]["direct"]["n"] == 3


@pytest.mark.parametrize(("replicas", "tasks"), [(1, 1), (2, 3)])
def test_throughput_counts_cycles(redis_url: str, tmp_path: Path, replicas: int, tasks: int):
    result = throughput.cycles_per_second(redis_url, tmp_path, replicas, tasks, 0.3)
    assert result["workers"] == replicas * tasks
    assert result["cycles"] > replicas * tasks
    assert result["per_second"] > 0


def test_balanced_ratio_times_both_pools_in_turn(redis_url: str, tmp_path: Path) -> None:
    result = scaling.balanced_ratio(redis_url, tmp_path, 50, 10, 3)
    assert result["live_10"]["n"] == result["live_50"]["n"] == 3
    assert result["ratio"] > 0


@pytest.mark.slow
def test_the_race_neither_overspends_nor_underspends(redis_url: str, tmp_path: Path) -> None:
    result = race.race(redis_url, tmp_path, 4, 20, 1)
    assert result["overspend"] == 0
    assert result["underspend"] == 0


@pytest.mark.slow
@pytest.mark.skipif(not available(list(vendors.DIRECT)), reason="no emulator available")
def test_vendor_overhead_runs_for_every_emulator(redis_url: str) -> None:
    result = vendors.overhead(redis_url, 2)
    assert set(result) == set(available(list(vendors.DIRECT)))
    for name, apis in result.items():
        for api in ("sync", "async"):
            assert apis[api]["router"]["n"] == apis[api]["direct"]["n"] == 2, name
        assert apis["async"]["adapter"]["n"] == apis["async"]["overhead_vs_adapter"]["n"] == 2
    for api in ("sync", "async") if "daytona" in result else ():
        daytona = result["daytona"][api]  # its exec path (streams merged) is timed beside
        assert daytona["exec"]["n"] == daytona["overhead_vs_exec"]["n"] == 2


def test_gate_row_pairs_the_router_with_a_redis_py_gate(redis_url: str, tmp_path: Path) -> None:
    result = gate.gate_cpu(redis_url, tmp_path, 5, 2)
    assert result["router_cpu_us"] > 0
    assert result["gate_cpu_us"] > 0
    assert result["cpu_ratio"] > 0


def test_skip15_times_a_chain_of_one_and_of_sixteen(redis_url: str, tmp_path: Path) -> None:
    result = time_to_sandbox.skip15(redis_url, tmp_path, 3)
    assert result["chain1"]["n"] == result["chain16_skip15"]["n"] == 3
    assert result["ratio"] > 0


@pytest.mark.slow
def test_warm_rows_claim_across_replicas_and_from_daytonas_pool(redis_url: str) -> None:
    """Every warm acquire is a hit: the sessions spent are the pool's 2 and at most one
    refill per claim (2 warm-up, 2 timed); a miss would create, spending one more."""
    across = time_to_sandbox.warm(redis_url, 2, size=2)
    assert across["n"] == 2
    assert across["sessions_spent"] <= 2 + 4
    vendor = time_to_sandbox.vendor_warm(redis_url, 2, size=2)
    assert (vendor["n"], vendor["server"]) == (2, True)


@pytest.mark.slow
def test_the_paused_warm_row_resumes_what_it_claims(redis_url: str) -> None:
    """Parked paused, each claim resumes: it takes E2B's published resume time."""
    paused = time_to_sandbox.warm(redis_url, 2, size=2, pause=True)
    assert paused["n"] == 2
    assert "resume" in paused["resume_profile"]
    assert paused["p50_ms"] >= 200  # a log-normal draw around 1 s, never near zero


@pytest.mark.slow
def test_the_code_suite_times_the_kernel_and_a_fresh_interpreter_everywhere() -> None:
    result = code.code(True, iterations=2)
    assert set(result) == {"local", *available(["modal", "runloop", "e2b", "daytona"])}
    for name, timed in result.items():
        assert timed["kernel"]["n"] == timed["fresh"]["n"] == 2, name
        assert timed["speedup_p50"] > 0, name
    if "e2b" in result:
        assert result["e2b"]["native"]["n"] == 2


@pytest.mark.slow
def test_the_frameworks_suite_pairs_each_backend_with_the_vendors(redis_url: str) -> None:
    result = frameworks.frameworks(redis_url, True, iterations=2)
    assert set(result) == {"deepagents_e2b", "smolagents_e2b", "deepagents_daytona"}
    for name, row in result.items():
        if "skipped" in row:
            continue
        router, vendor = [k for k, v in row.items() if isinstance(v, dict)]
        assert row[router]["wall"]["n"] == row[vendor]["cpu"]["n"] == 2, name
        assert row["ratio_p50"] > 0, name


def test_the_suites_are_named_on_the_command_line() -> None:
    with pytest.raises(SystemExit):
        benchmarks_main(["no_such_suite"])
