"""Timing, statistics and the private Redis the benchmarks run against."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterator
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


@contextmanager
def private_redis() -> Iterator[str]:
    with TemporaryDirectory(prefix="bench-redis-") as tmp, RedisServer(Path(tmp)) as server:
        yield server.url


# Commands our Lua scripts run inside Redis. INFO commandstats counts them too,
# so a client round trip is an EVALSHA/EVAL or any command not in this set.
SCRIPT_INTERNAL = frozenset(
    f"cmdstat_{c}"
    for c in ("get", "set", "del", "expire", "hget", "hset", "hdel", "hexists", "hincrby",
              "hincrbyfloat",
              "zadd", "zrem", "zcard", "zscore", "zrangebyscore")
)  # fmt: skip


def command_calls(url: str) -> dict[str, int]:
    """Redis' own counters: client round trips and every command run (INFO commandstats)."""
    stats = redis.Redis.from_url(url).info("commandstats")
    for ours in ("cmdstat_info", "cmdstat_client|setinfo"):  # this measuring client's own
        stats.pop(ours, None)
    total = sum(v["calls"] for v in stats.values())
    trips = sum(v["calls"] for k, v in stats.items() if k not in SCRIPT_INTERNAL)
    return {"round_trips": trips, "commands": total}


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
