"""What the router adds to acquire + run + release, against the same calls made directly."""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from pathlib import Path
from typing import Any

import redis
from prometheus_client import CollectorRegistry

from benchmarks.common import (
    command_calls,
    local_chain,
    paired,
    percentile,
    settled_calls,
    summary_ms,
)
from providers.base import SandboxSpec
from providers.local import LocalOptions, LocalProvider
from router import Router
from router.events import log_hook
from router.logs import configure_logging
from router.metrics import instrument


def local_overhead(state_url: str, root: Path, iterations: int) -> dict[str, Any]:
    """Both APIs against the local provider called directly, pair by pair.

    ``sync``: ``Router.acquire`` (the router's loop runs on its own thread,
    so each call is a hand-off). ``async``: ``async with Router...`` on the
    benchmark's loop, where calls run in place.
    """
    direct = LocalProvider("direct", LocalOptions(root=root / "direct", isolation="none"))

    async def directly() -> None:
        sandbox = await direct.create(SandboxSpec())
        await sandbox.run("true")
        await sandbox.kill()

    async def sync_api() -> dict[str, Any]:
        config = local_chain(state_url, "bench-overhead-sync", root / "sync")
        with Router.from_config(config, hooks=[]) as router:

            async def via_router() -> None:
                with router.acquire() as lease:
                    lease.sandbox.run("true")

            return await paired(via_router, directly, iterations)

    async def async_api() -> dict[str, Any]:
        config = local_chain(state_url, "bench-overhead-async", root / "async")
        async with Router.from_config(config, hooks=[]) as router:

            async def via_router() -> None:
                async with await router.aacquire() as lease:
                    await lease.sandbox.run("true")

            return await paired(via_router, directly, iterations)

    return {"provider": "local", "sync": asyncio.run(sync_api()), "async": asyncio.run(async_api())}


def hooks_cost(state_url: str, root: Path, iterations: int) -> dict[str, Any]:
    """What the default hooks add to a cycle: a log line per event, and metrics.

    The other figures run with ``hooks=[]``. Here a router with `log_hook`
    (at info, its lines written to /dev/null) and `instrument` (a registry
    of its own) is paired against one without, async API; its ``overhead``
    is the hooks' cost.
    """

    async def pair() -> dict[str, Any]:
        bare = Router.from_config(local_chain(state_url, "bench-bare", root / "bare"), hooks=[])
        hooked = Router.from_config(
            local_chain(state_url, "bench-hooked", root / "hooked"), hooks=[log_hook]
        )
        instrument(hooked, CollectorRegistry())
        async with bare, hooked:

            async def cycle(router: Router) -> None:
                async with await router.aacquire() as lease:
                    await lease.sandbox.run("true")

            return await paired(lambda: cycle(hooked), lambda: cycle(bare), iterations)

    configure_logging("json", "info")
    try:
        with open(os.devnull, "w") as devnull, contextlib.redirect_stderr(devnull):
            return asyncio.run(pair())
    finally:
        configure_logging("json", "warning")


def budget_cost(state_url: str, root: Path, iterations: int) -> dict[str, Any]:
    """What a usd budget adds to acquire + release: CPU per cycle with and without.

    Two routers on one store, one loop, in the same interleaved rounds: ``off``
    has an unpriced entry and a sessions limit; ``on`` prices it and gives its
    pool a usd budget (each lease's meter computed, its hold reserved, renewed
    and settled in the scripts). The ratio is of their p50 CPU time per cycle
    (this process, every thread): the target is at most 1.15.
    """
    off = local_chain(state_url, "bench-usd-off", root / "off")
    on = local_chain(state_url, "bench-usd-on", root / "on")
    on["chain"][0]["price"] = {"vcpu_hour": 0.05, "memory_gib_hour": 0.01, "per_sandbox": 1e-6}
    on["chain"][0]["quota"] = {"sessions": 10_000_000, "usd": 1e9}

    async def run() -> dict[str, Any]:
        async with (
            Router.from_config(off, hooks=[]) as bare,
            Router.from_config(on, hooks=[]) as priced,
        ):
            routers = {"off": bare, "on": priced}
            cpu: dict[str, list[float]] = {name: [] for name in routers}
            for i in range(iterations + 10):
                names = list(routers)[i % 2 :] + list(routers)[: i % 2]
                for name in names:
                    start = time.process_time()
                    lease = await routers[name].aacquire()
                    await lease.release()
                    if i >= 10:  # warm-up: connections, scripts loaded
                        cpu[name].append(time.process_time() - start)
            off_p50, on_p50 = percentile(cpu["off"], 50), percentile(cpu["on"], 50)
            return {
                "off_cpu": summary_ms(cpu["off"]),
                "on_cpu": summary_ms(cpu["on"]),
                "cpu_ratio_p50": round(on_p50 / off_p50, 4),
                "target": 1.15,
            }

    return asyncio.run(run())


def tenant_cost(state_url: str, root: Path, iterations: int) -> dict[str, Any]:
    """What usd and tenant limits add to acquire + release: CPU per cycle with and without.

    As `budget_cost`, but ``on`` also names a tenant on every acquire (one of
    100, in turn) with sessions, usd and concurrent limits in the config, so
    each reservation, commit and release counts and settles the tenant in the
    same script or transaction as its pool. The target is at most 1.15.
    """
    off = local_chain(state_url, "bench-tenant-off", root / "off")
    on = local_chain(state_url, "bench-tenant-on", root / "on")
    on["chain"][0]["price"] = {"vcpu_hour": 0.05, "memory_gib_hour": 0.01, "per_sandbox": 1e-6}
    on["chain"][0]["quota"] = {"sessions": 10_000_000, "usd": 1e9}
    on["tenants"] = {"default": {"sessions": 10_000_000, "usd": 1e6, "concurrent": 50}}
    tenants = [f"user-{i}" for i in range(100)]

    async def run() -> dict[str, Any]:
        async with (
            Router.from_config(off, hooks=[]) as bare,
            Router.from_config(on, hooks=[]) as limited,
        ):
            cpu: dict[str, list[float]] = {"off": [], "on": []}
            for i in range(iterations + 10):
                for name in ("off", "on")[i % 2 :] + ("off", "on")[: i % 2]:
                    start = time.process_time()
                    if name == "on":
                        lease = await limited.aacquire(tenant=tenants[i % len(tenants)])
                    else:
                        lease = await bare.aacquire()
                    await lease.release()
                    if i >= 10:  # warm-up: connections, scripts loaded
                        cpu[name].append(time.process_time() - start)
            off_p50, on_p50 = percentile(cpu["off"], 50), percentile(cpu["on"], 50)
            return {
                "off_cpu": summary_ms(cpu["off"]),
                "on_cpu": summary_ms(cpu["on"]),
                "cpu_ratio_p50": round(on_p50 / off_p50, 4),
                "target": 1.15,
            }

    return asyncio.run(run())


def round_trips(redis_url: str, root: Path, iterations: int) -> dict[str, Any]:
    """Redis commands per acquire and per release, from Redis' own counters."""
    router = Router.from_config(local_chain(redis_url, "bench-rtt", root), hooks=[])
    router.acquire().release()  # scripts loaded (EVALSHA misses would count)
    leases = []
    counter = redis.Redis.from_url(redis_url)
    before = settled_calls(counter)  # the warm-up's release, posted, lands first
    for _ in range(iterations):
        leases.append(router.acquire())
    middle = settled_calls(counter)  # the last commits land after acquire returns
    for lease in leases:
        lease.release()
    after = command_calls(counter)
    counter.close()
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
