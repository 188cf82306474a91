"""How acquire cost grows with chain length and with the pool's live leases."""

from __future__ import annotations

import asyncio
import secrets
import time
from pathlib import Path
from typing import Any

from benchmarks.common import summary_ms, timed
from policies.breaker import BreakerConfig, Outcome
from router import Router
from router.state import open_store


def chain_length(redis_url: str, root: Path, lengths: list[int], n: int) -> list[dict[str, Any]]:
    """The serving entry is last; every entry before it is out of quota (one skip each)."""
    curve = []
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
        with Router.from_config(config, hooks=[]) as router:
            for _ in range(10):
                router.acquire().release()
            times = [timed(lambda r=router: r.acquire().release()) for _ in range(n)]  # type: ignore[misc]
        curve.append({"entries": length, **summary_ms(times)})
    return curve


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
