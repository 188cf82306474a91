"""Acquire + release cycles per second on the local provider (no process spawned).

Each replica is a process with one router running on its own loop (``async
with``), its workers tasks on that loop; sandboxes are directories on tmpfs
when there is one. One process runs Python on one core at a time, so "8
workers on 2 cores" is measured both ways: 8 tasks in one replica, and 2
replicas of 4 tasks sharing the store, as a fleet would.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import time
from pathlib import Path
from typing import Any

from benchmarks.common import local_chain
from router import Router


def _replica(config: dict[str, Any], start_at: float, seconds: float, tasks: int) -> int:
    from router.logs import configure_logging

    configure_logging("json", "warning")

    async def run() -> int:
        async with Router.from_config(config, hooks=[]) as router:

            async def worker(stop_at: float) -> int:
                done = 0
                while time.perf_counter() < stop_at:
                    lease = await router.aacquire()
                    await lease.release()
                    done += 1
                return done

            for _ in range(20):  # connections open, scripts loaded
                await (await router.aacquire()).release()
            await asyncio.sleep(max(0.0, start_at - time.time()))
            stop_at = time.perf_counter() + seconds
            return sum(await asyncio.gather(*(worker(stop_at) for _ in range(tasks))))

    return asyncio.run(run())


def cycles_per_second(
    state_url: str, root: Path, replicas: int, tasks: int, seconds: float
) -> dict[str, Any]:
    config = local_chain(state_url, f"bench-tp-{replicas}x{tasks}", root)
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(replicas) as pool:
        start_at = time.time() + 2.0  # every replica imported and warmed up
        counts = pool.starmap(_replica, [(config, start_at, seconds, tasks)] * replicas)
    total = sum(counts)
    return {
        "workers": replicas * tasks,
        "replicas": replicas,
        "tasks_per_replica": tasks,
        "cycles": total,
        "per_second": round(total / seconds, 1),
    }
