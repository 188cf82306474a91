"""How acquire cost grows with chain length and with the pool's live leases."""

from __future__ import annotations

import asyncio
import secrets
import time
from pathlib import Path
from typing import Any

from benchmarks.common import percentile, summary_ms, timed
from policies.breaker import BreakerConfig, Outcome
from router import Router
from router.state import EntryRef, HeldLease, Spend, open_store
from router.testing import ScriptedProvider


def chain_length(redis_url: str, root: Path, lengths: list[int], n: int) -> list[dict[str, Any]]:
    """The serving entry is last; every entry before it is out of quota (one skip each).

    One router per length, all open at once and timed round by round in turn
    (the order rotating), so each length runs under the same conditions: timed
    one after the other, drift on a shared machine moved a ratio by 0.15.
    """
    routers = []
    for length in lengths:
        chain: list[dict[str, Any]] = [
            {"name": f"spent{i}", "provider": "local", "quota": {"sessions": 0},
             "options": {"root": str(root), "isolation": "none"}}
            for i in range(length - 1)
        ]  # fmt: skip
        chain.append({"name": "serving", "provider": "local",
                      "options": {"root": str(root), "isolation": "none"}})  # fmt: skip
        config = {"state_url": redis_url, "key_prefix": f"len-{secrets.token_hex(3)}",
                  "chain": chain}  # fmt: skip
        routers.append(Router.from_config(config, hooks=[]))
    times: list[list[float]] = [[] for _ in lengths]
    try:
        for router in routers:
            for _ in range(10):
                router.acquire().release()
        for i in range(n):
            for k in [*range(i % len(routers), len(routers)), *range(i % len(routers))]:
                times[k].append(timed(lambda r=routers[k]: r.acquire().release()))  # type: ignore[misc]
    finally:
        for router in routers:
            router.close()
    return [{"entries": length, **summary_ms(t)} for length, t in zip(lengths, times, strict=True)]


def live_leases(redis_url: str, root: Path, counts: list[int], n: int) -> list[dict[str, Any]]:
    """Acquire + release while the pool already holds ``count`` live leases."""
    prefix = f"leases-{secrets.token_hex(3)}"
    config = {"state_url": redis_url, "key_prefix": prefix,
              "chain": [{"name": "local", "provider": "local",
                         "options": {"root": str(root), "isolation": "none"}}]}  # fmt: skip
    curve = []
    held = 0
    with Router.from_config(config, hooks=[]) as router:
        ref = router._entries["local"].ref  # white-box: fill the ledger without sandboxes
        store = open_store(redis_url, prefix)

        async def fill(upto: int) -> None:
            nonlocal held
            now = time.time()
            cfg = BreakerConfig()
            while held < upto:
                batch = [f"filler-{held + i}" for i in range(min(500, upto - held))]
                await asyncio.gather(*(store.reserve(ref, cfg, lid, now, 3600) for lid in batch))
                await asyncio.gather(*(
                    store.settle(ref, cfg, lid, now, outcome=Outcome.SUCCESS, ttl=3600)
                    for lid in batch
                ))  # fmt: skip
                held += len(batch)

        loop = asyncio.new_event_loop()
        for count in counts:
            loop.run_until_complete(fill(count))
            times = [timed(lambda: router.acquire().release()) for _ in range(n)]
            curve.append({"live_leases": count, **summary_ms(times)})
        loop.run_until_complete(store.close())
        loop.close()
    return curve


def balanced_ratio(redis_url: str, root: Path, big: int, small: int, n: int) -> dict[str, Any]:
    """A balanced acquire at ``big`` live leases in its pool over one at ``small``.

    Two routers on one Redis (their own key prefixes), an instant provider,
    timed round by round in turn so both run under the same conditions. The
    leases are filled straight through the store (a reconcile of held
    leases, ``fill`` at a time), not through real acquires.
    """
    sizes = {"small": small, "big": big}
    routers: dict[str, Router] = {}
    for name, count in sizes.items():
        config = {"state_url": redis_url, "key_prefix": f"balanced-{secrets.token_hex(3)}",
                  "strategy": "balanced",
                  "chain": [{"name": "instant", "provider": "local",
                             "quota": {"concurrent": 10 * big + 10}}]}  # fmt: skip
        router = Router.from_config(
            config, hooks=[], providers={"instant": ScriptedProvider("instant", root / name)}
        )
        asyncio.run(_fill(router, count))
        routers[name] = router
    times: dict[str, list[float]] = {name: [] for name in sizes}
    try:
        for name in sizes:  # warm up: connections, scripts loaded
            for _ in range(3):
                routers[name].acquire().release()
        for i in range(n):
            for name in list(sizes)[i % 2 :] + list(sizes)[: i % 2]:
                start = time.perf_counter()
                lease = routers[name].acquire()
                times[name].append(time.perf_counter() - start)
                lease.release()
    finally:
        for router in routers.values():
            router.close()
    ratio = percentile(times["big"], 50) / percentile(times["small"], 50)
    return {
        f"live_{small}": summary_ms(times["small"]),
        f"live_{big}": summary_ms(times["big"]),
        "ratio": round(ratio, 3),
    }


async def _fill(router: Router, count: int, batch: int = 10_000) -> None:
    """Give the router's only pool ``count`` live leases for an hour, through its store."""
    cfg = router.config
    entry = cfg.chain[0]
    ref = EntryRef(entry.name, entry.pool, cfg.pool_quota(entry).limits(), cfg.window(entry))
    store = open_store(cfg.resolved_state_url(), cfg.key_prefix, tenants=cfg.counts_tenants)
    try:
        now = time.time()
        for first in range(0, count, batch):
            held = tuple(
                HeldLease(f"filler-{i}", entry.name, now, 3600.0)
                for i in range(first, min(count, first + batch))
            )
            await store.reconcile(f"fill-{first}", [Spend(ref, leases=held)], now)
    finally:
        await store.close()
