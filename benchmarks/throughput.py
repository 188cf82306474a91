"""Acquire + release cycles per second on the local provider (no process spawned).

The router runs on the benchmark's loop (``async with``), the workers are
tasks on it; sandboxes are directories on tmpfs when there is one.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

from benchmarks.common import local_chain
from router import Router


def cycles_per_second(state_url: str, root: Path, workers: int, seconds: float) -> dict[str, Any]:
    config = local_chain(state_url, f"bench-tp-{workers}", root)

    async def run() -> tuple[int, float]:
        async with Router.from_config(config, hooks=[]) as router:

            async def worker(stop_at: float) -> int:
                done = 0
                while time.perf_counter() < stop_at:
                    lease = await router.aacquire()
                    await lease.release()
                    done += 1
                return done

            for _ in range(20):
                await (await router.aacquire()).release()
            started = time.perf_counter()
            counts = await asyncio.gather(*(worker(started + seconds) for _ in range(workers)))
            return sum(counts), time.perf_counter() - started

    total, elapsed = asyncio.run(run())
    return {"workers": workers, "cycles": total, "per_second": round(total / elapsed, 1)}
