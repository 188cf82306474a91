"""16 processes race for the last 100 units of a pool: no overspend, no underspend."""

from __future__ import annotations

import multiprocessing
import secrets
import time
from pathlib import Path
from typing import Any

from benchmarks.common import local_chain
from providers.errors import NoProviderAvailable
from router import Router


def _worker(config: dict[str, Any], start_at: float) -> tuple[int, int]:
    router = Router.from_config(config, hooks=[])
    granted = refused = 0
    time.sleep(max(0.0, start_at - time.time()))
    while True:
        try:
            router.acquire().release()
            granted += 1
        except NoProviderAvailable:
            refused += 1
            break
    router.close()
    return granted, refused


def race(state_url: str, root: Path, processes: int, units: int, repeats: int) -> dict[str, Any]:
    runs = []
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(processes) as pool:
        for _ in range(repeats):
            config = local_chain(state_url, f"race-{secrets.token_hex(3)}", root, sessions=units)
            start_at = time.time() + 3.0
            results = pool.starmap(_worker, [(config, start_at)] * processes)
            granted = sum(g for g, _ in results)
            refused = sum(r for _, r in results)
            runs.append({
                "granted": granted,
                "overspend": max(0, granted - units),
                "underspend": units - granted if refused and granted < units else 0,
            })  # fmt: skip
    return {
        "processes": processes,
        "units": units,
        "runs": runs,
        "overspend": max(r["overspend"] for r in runs),
        "underspend": max(r["underspend"] for r in runs),
    }
