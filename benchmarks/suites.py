"""The benchmark suites and the harness behind ``python -m benchmarks``: run them, print
one JSON summary.

Kept apart from ``benchmarks/__main__.py`` because the suites measure in
child processes started by ``spawn``, which import the parent's main module:
that module stays empty, so a measured child (its peak RSS, above all) holds
only what it measures, not every suite and SDK the harness imports."""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from benchmarks import (
    agents,
    code,
    failover,
    frameworks,
    gate,
    mcp_server,
    overhead,
    race,
    scaling,
    throughput,
    time_to_sandbox,
    tracing,
    transfer,
    vendors,
)
from benchmarks.common import private_redis, scratch_dir
from router.logs import configure_logging


def machine() -> dict[str, Any]:
    return {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
    }


def everything(q: bool, redis_url: str, root: Path) -> dict[str, Any]:
    """The router's own costs: overhead, hooks, tracing, round trips, throughput, races,
    scaling."""
    result: dict[str, Any] = {}
    sqlite_url = f"sqlite:///{root}/state.db"
    result["overhead"] = {
        "redis": overhead.local_overhead(redis_url, root / "o1", 50 if q else 500),
        "sqlite": overhead.local_overhead(sqlite_url, root / "o2", 50 if q else 300),
        "instant_vs_gate": gate.gate_cpu(
            redis_url, root / "gate", 20 if q else 50, 10 if q else 60
        ),
    }
    result["hooks"] = overhead.hooks_cost(redis_url, root / "hk", 50 if q else 300)
    result["tracing"] = tracing.tracing_cost(redis_url, root / "tr", 50 if q else 300)
    result["usd_budget"] = {
        "redis": overhead.budget_cost(redis_url, root / "usd1", 100 if q else 1000),
        "sqlite": overhead.budget_cost(sqlite_url, root / "usd2", 100 if q else 500),
    }
    result["tenant_budget"] = {
        "redis": overhead.tenant_cost(redis_url, root / "tn1", 100 if q else 1000),
        "sqlite": overhead.tenant_cost(sqlite_url, root / "tn2", 100 if q else 500),
    }
    result["vendor_overhead"] = vendors.overhead(redis_url, 20 if q else 100)
    result["failover"] = failover.failover_cost(redis_url, root / "fo", 20 if q else 100)
    result["round_trips"] = overhead.round_trips(redis_url, root / "rt", 20 if q else 200)
    result["throughput"] = {
        store: [
            throughput.cycles_per_second(url, root / f"tp-{store}", *shape, 1 if q else 5)
            for shape in ((1, 1), (1, 8), (2, 4))  # (replicas, tasks per replica)
        ]
        for store, url in (("redis", redis_url), ("sqlite", sqlite_url))
    }
    result["race"] = {
        store: race.race(url, root / f"race-{store}", 16, 100, 1 if q else 3)
        for store, url in (("redis", redis_url), ("sqlite", sqlite_url))
    }
    result["scaling"] = {
        "chain_length": scaling.chain_length(
            redis_url, root / "len", [1, 2, 4, 8, 16], 30 if q else 200
        ),
        "live_leases": scaling.live_leases(
            redis_url,
            root / "live",
            [10, 1000, 10_000] if q else [10, 1000, 10_000, 100_000],
            30 if q else 200,
        ),
    }
    return result


SUITES: dict[str, Callable[[bool, str, Path], dict[str, Any]]] = {
    "router": everything,
    "time_to_sandbox": lambda q, url, root: time_to_sandbox.time_to_sandbox(url, root, q),
    "transfer": lambda q, url, root: transfer.transfer(root, q),
    "code": lambda q, url, root: code.code(q),
    "mcp": lambda q, url, root: mcp_server.mcp_overhead(root, 30 if q else 500),
    "frameworks": lambda q, url, root: frameworks.frameworks(url, q),
    "agents": lambda q, url, root: agents.agents_overhead(url, 30 if q else 300),
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks")
    parser.add_argument("--quick", action="store_true", help="small sizes (a smoke run)")
    parser.add_argument("suites", nargs="*", help=f"of {', '.join(SUITES)} (default: all)")
    args = parser.parse_args(argv)
    if unknown := sorted(set(args.suites) - set(SUITES)):
        parser.error(f"no benchmark suite {', '.join(unknown)}; choose from {', '.join(SUITES)}")
    configure_logging("json", "warning")  # stdout carries only the JSON summary
    result: dict[str, Any] = {"machine": machine(), "quick": args.quick}
    started = time.perf_counter()
    with private_redis() as redis_url, scratch_dir() as root:
        for name in args.suites or list(SUITES):
            ran = SUITES[name](args.quick, redis_url, root / name)
            result.update(ran if name == "router" else {name: ran})
    result["seconds"] = round(time.perf_counter() - started, 1)
    json.dump(result, sys.stdout, indent=2)
    sys.stdout.write("\n")
    return 0
