"""Timing, statistics and the private Redis the benchmarks run against."""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from tempfile import TemporaryDirectory
from typing import Any

import redis

from emulators.redis_server import RedisServer


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    index = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[index]


def summary_ms(values: list[float]) -> dict[str, float]:
    """p50/p99/mean of seconds, in milliseconds."""
    return {
        "p50_ms": round(percentile(values, 50) * 1000, 4),
        "p99_ms": round(percentile(values, 99) * 1000, 4),
        "mean_ms": round(statistics.fmean(values) * 1000, 4) if values else float("nan"),
        "n": len(values),
    }


def timed(fn: Callable[[], Any]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def warm_rounds(warmup: int, iterations: int) -> int:
    """Warm-up rounds before ``iterations`` measured ones: ``warmup``, but never more
    than are measured (a run of a few rounds, as the tests make, is timed for its
    shape, not its figures)."""
    return min(warmup, iterations)


async def paired(
    via_router: Callable[[], Awaitable[None]],
    directly: Callable[[], Awaitable[None]],
    iterations: int,
    warmup: int = 10,
    also: Mapping[str, Callable[[], Awaitable[None]]] | None = None,
) -> dict[str, Any]:
    """Router path vs direct path (and any in ``also``), interleaved round by round on one loop.

    Interleaving puts both paths under the same conditions, and the order
    rotates each round so that no path always runs first (right after the
    previous round); the overhead is the per-round difference. Each path in
    ``also`` runs in the same rounds and is reported as its name (its
    timings) and ``overhead_vs_<name>`` (the router's against it).
    ``cpu_overhead`` is the same difference in this process's CPU time (all
    its threads): what the router's own code costs, apart from waiting.
    """
    paths = {"router": via_router, "direct": directly, **(also or {})}
    for _ in range(warm_rounds(warmup, iterations)):  # imports, connections, caches hot
        for path in paths.values():
            await path()
    timings: dict[str, list[float]] = {name: [] for name in paths}
    cpu: dict[str, list[float]] = {name: [] for name in paths}
    names = list(paths)
    for i in range(iterations):
        for name in names[i % len(names) :] + names[: i % len(names)]:
            start, start_cpu = time.perf_counter(), time.process_time()
            await paths[name]()
            timings[name].append(time.perf_counter() - start)
            cpu[name].append(time.process_time() - start_cpu)
    routed = timings.pop("router")
    result: dict[str, Any] = {"router": summary_ms(routed)}
    result["cpu_overhead"] = summary_ms(
        [r - d for r, d in zip(cpu["router"], cpu["direct"], strict=True)]
    )
    for name, times in timings.items():
        key = "overhead" if name == "direct" else f"overhead_vs_{name}"
        result[name] = summary_ms(times)
        result[key] = summary_ms([r - d for r, d in zip(routed, times, strict=True)])
    result["ratio_p50"] = round(percentile(routed, 50) / percentile(timings["direct"], 50), 4)
    return result


@contextmanager
def scratch_dir() -> Iterator[Path]:
    """A temporary directory for local sandboxes and SQLite, on tmpfs when the
    machine has one, so the figures measure the router, not the disk (a
    mkdir + rmdir on this machine's ext4 costs ~0.3 ms, on tmpfs ~0.08 ms)."""
    shm = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None
    with TemporaryDirectory(prefix="sandbox-router-bench-", dir=shm) as tmp:
        yield Path(tmp)


@contextmanager
def private_redis() -> Iterator[str]:
    with TemporaryDirectory(prefix="bench-redis-") as tmp, RedisServer(Path(tmp)) as server:
        yield server.url


# Commands our Lua scripts run inside Redis. INFO commandstats counts them too,
# so a client round trip is an EVALSHA/EVAL or any command not in this set.
SCRIPT_INTERNAL = frozenset(
    f"cmdstat_{c}"
    for c in ("get", "set", "del", "exists", "expire", "hget", "hset", "hdel", "hexists",
              "hincrby", "hincrbyfloat", "hvals",
              "zadd", "zrem", "zcard", "zscore", "zrangebyscore")
)  # fmt: skip


def command_calls(client: redis.Redis) -> dict[str, int]:
    """Redis' own counters: client round trips and every command run (INFO commandstats).

    ``client`` is the measuring connection, opened before the first count so
    its handshake (HELLO, CLIENT SETINFO) is not counted between two counts.
    """
    stats = client.info("commandstats")
    stats.pop("cmdstat_info", None)  # the measuring client's own
    total = sum(v["calls"] for v in stats.values())
    trips = sum(v["calls"] for k, v in stats.items() if k not in SCRIPT_INTERNAL)
    return {"round_trips": trips, "commands": total}


def settled_calls(client: redis.Redis, quiet: float = 0.05) -> dict[str, int]:
    """`command_calls` once Redis has seen no new command for ``quiet`` seconds."""
    calls = command_calls(client)
    while True:
        time.sleep(quiet)
        again = command_calls(client)
        if again == calls:
            return calls
        calls = again


def local_chain(state_url: str, prefix: str, root: Path, **quota: int) -> dict[str, Any]:
    return {
        "state_url": state_url,
        "key_prefix": prefix,
        "chain": [
            {
                "name": "local",
                "provider": "local",
                "quota": quota or {"sessions": 10_000_000},
                "options": {"root": str(root), "isolation": "none"},
            }
        ],
    }
