"""The router's CPU per cycle against a hand-written redis-py gate, in one run.

The gate is what a team would write instead of the router for one provider:
one Lua script that checks the session quota and the concurrency limit and
reserves (INCR + ZADD), one that releases (ZREM), through redis-py's
asyncio client. Both paths drive the same instant provider
(`router.testing.ScriptedProvider`: a local sandbox on tmpfs) on the same
loop: the gate reserves, creates, releases, kills; the router acquires and
releases. What differs is the router's own work: breaker, quota windows,
lease heartbeat registry, events, its socket.

CPU is the process's CPU time (all threads) over a block of cycles, the
background work a cycle leaves (the router's commit and free) included:
each block ends when Redis has answered them. Blocks of the two paths
alternate; the figures are medians over the blocks, and ``cpu_ratio`` is
the median of the ratios of adjacent blocks (a router block over the gate
block beside it): this machine's speed drifts by a third within a minute,
and a pair of neighbouring blocks sees the same speed.
"""

from __future__ import annotations

import asyncio
import secrets
import statistics
import time
from pathlib import Path
from typing import Any

import redis.asyncio as aioredis

from providers.base import SandboxSpec
from router import Router
from router.testing import ScriptedProvider

RESERVE = """
local used = tonumber(redis.call('GET', KEYS[1]) or '0')
if used >= tonumber(ARGV[1]) then return 0 end
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', ARGV[3])
if redis.call('ZCARD', KEYS[2]) >= tonumber(ARGV[2]) then return 0 end
redis.call('INCR', KEYS[1])
redis.call('ZADD', KEYS[2], ARGV[4], ARGV[5])
return 1
"""

RELEASE = """
return redis.call('ZREM', KEYS[1], ARGV[1])
"""


async def _blocks(paths: dict[str, Any], cycles: int, blocks: int) -> dict[str, list[float]]:
    cpu: dict[str, list[float]] = {name: [] for name in paths}
    wall: dict[str, list[float]] = {name: [] for name in paths}
    names = list(paths)
    for block in range(blocks):
        for name in names[block % 2 :] + names[: block % 2]:
            start, start_cpu = time.perf_counter(), time.process_time()
            for _ in range(cycles):
                await paths[name]()
            await asyncio.sleep(0.005)  # the block's background writes land
            cpu[name].append((time.process_time() - start_cpu) / cycles)
            wall[name].append((time.perf_counter() - start - 0.005) / cycles)
    return {**{f"cpu_{k}": v for k, v in cpu.items()}, **{f"wall_{k}": v for k, v in wall.items()}}


def gate_cpu(redis_url: str, root: Path, cycles: int, blocks: int) -> dict[str, Any]:
    """Router CPU microseconds per acquire+release against the gate's, and their ratio."""

    async def run() -> dict[str, Any]:
        provider = ScriptedProvider("gate", root / "gate")
        config = {
            "state_url": redis_url,
            "key_prefix": f"bench-gate-{secrets.token_hex(3)}",
            "chain": [{"name": "instant", "provider": "local",
                       "quota": {"sessions": 10**9, "concurrent": 1000}}],
        }  # fmt: skip
        client = aioredis.Redis.from_url(redis_url)
        reserve, release = client.register_script(RESERVE), client.register_script(RELEASE)
        keys = (f"gate:{secrets.token_hex(3)}:sessions", f"gate:{secrets.token_hex(3)}:leases")
        spec = SandboxSpec()

        async def gate() -> None:
            now = time.time()
            lease = secrets.token_hex(8)
            if not await reserve(keys=keys, args=[10**9, 1000, now, now + 60, lease]):
                raise RuntimeError("the gate refused")
            sandbox = await provider.create(spec, timeout=10)
            await release(keys=keys[1:], args=[lease])
            await sandbox.kill()

        routed = ScriptedProvider("instant", root / "router")
        async with Router.from_config(config, hooks=[], providers={"instant": routed}) as router:

            async def via_router() -> None:
                async with await router.aacquire():
                    pass

            paths = {"router": via_router, "gate": gate}
            await _blocks(paths, 20, 2)  # warm: scripts loaded, connections open
            got = await _blocks(paths, cycles, blocks)
        await client.aclose()
        await provider.aclose()
        return got

    got = asyncio.run(run())
    us = {k: round(statistics.median(v) * 1e6, 1) for k, v in got.items()}
    pairs = [r / g for r, g in zip(got["cpu_router"], got["cpu_gate"], strict=True)]
    return {
        "router_cpu_us": us["cpu_router"],
        "gate_cpu_us": us["cpu_gate"],
        "cpu_ratio": round(statistics.median(pairs), 3),
        "cpu_ratio_of_medians": round(us["cpu_router"] / us["cpu_gate"], 3),
        "router_wall_us": us["wall_router"],
        "gate_wall_us": us["wall_gate"],
        "overhead_wall_us": round(us["wall_router"] - us["wall_gate"], 1),
        "target_cpu_ratio": 1.3,
        "cycles_per_block": cycles,
        "blocks": blocks,
    }
