"""Acquire + release cycles per second on the local provider (no process spawned)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

from benchmarks.common import local_chain
from router import Router


def cycles_per_second(state_url: str, root: Path, workers: int, seconds: float) -> dict[str, Any]:
    router = Router.from_config(local_chain(state_url, f"bench-tp-{workers}", root), hooks=[])

    async def run() -> int:
        async def worker(stop_at: float) -> int:
            done = 0
            while time.perf_counter() < stop_at:
                lease = await router.aacquire()
                await lease.release()
                done += 1
            return done

        for _ in range(10):
            await (await router.aacquire()).release()
        stop_at = time.perf_counter() + seconds
        counts = await asyncio.gather(*(worker(stop_at) for _ in range(workers)))
        return sum(counts)

    started = time.perf_counter()
    total = asyncio.run(run())
    elapsed = time.perf_counter() - started
    router.close()
    return {"workers": workers, "cycles": total, "per_second": round(total / elapsed, 1)}
