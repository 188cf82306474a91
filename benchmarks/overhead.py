"""What the router adds to acquire + run + release, against the same calls made directly."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from benchmarks.common import command_calls, local_chain, summary_ms, timed
from providers.base import SandboxSpec
from providers.local import LocalOptions, LocalProvider
from router import Router


def local_overhead(state_url: str, root: Path, iterations: int) -> dict[str, Any]:
    """Paired, interleaved iterations: router path vs the provider called directly."""
    router = Router.from_config(local_chain(state_url, "bench-overhead", root / "r"), hooks=[])
    direct = LocalProvider("direct", LocalOptions(root=root / "d", isolation="none"))
    loop = asyncio.new_event_loop()

    def via_router() -> None:
        with router.acquire() as lease:
            lease.sandbox.run("true")

    async def directly() -> None:
        sandbox = await direct.create(SandboxSpec())
        await sandbox.run("true")
        await sandbox.kill()

    for _ in range(20):  # warm up: scripts loaded, connections open, caches hot
        via_router()
        loop.run_until_complete(directly())
    routed, raw = [], []
    for _ in range(iterations):
        routed.append(timed(via_router))
        raw.append(timed(lambda: loop.run_until_complete(directly())))
    loop.close()
    router.close()
    diffs = [r - d for r, d in zip(routed, raw, strict=True)]
    return {
        "provider": "local",
        "router": summary_ms(routed),
        "direct": summary_ms(raw),
        "overhead": summary_ms(diffs),
        "ratio_p50": round(summary_ms(routed)["p50_ms"] / summary_ms(raw)["p50_ms"], 4),
    }


def round_trips(redis_url: str, root: Path, iterations: int) -> dict[str, Any]:
    """Redis commands per acquire and per release, from Redis' own counters."""
    router = Router.from_config(local_chain(redis_url, "bench-rtt", root), hooks=[])
    router.acquire().release()  # scripts loaded (EVALSHA misses would count)
    leases = []
    before = command_calls(redis_url)
    for _ in range(iterations):
        leases.append(router.acquire())
    middle = command_calls(redis_url)
    for lease in leases:
        lease.release()
    after = command_calls(redis_url)
    router.close()

    def per_op(a: dict[str, int], b: dict[str, int]) -> dict[str, float]:
        return {k: (b[k] - a[k]) / iterations for k in a}

    return {
        "acquire": per_op(before, middle),
        "release": per_op(middle, after),
        "target_round_trips": {"acquire": 2, "release": 1},
        "note": "round trips = EVALSHA + commands our scripts never run; commands includes "
        "those run inside the scripts",
    }
