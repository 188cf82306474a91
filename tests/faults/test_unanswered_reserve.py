"""A reservation the store made and never answered, because it went down right after.

The router, hearing nothing, books the same lease from its outage share (fail_open):
the unit is spent once, but the store also holds the reservation it never answered,
with its session counted. When the store is back, the hand-over gives that one back,
so the ledger counts what was granted, once (seen as 80 of 79 in a fleet outage).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
import redis

from emulators.redis_server import RedisServer
from router import Event, Router
from router.testing import ScriptedProvider
from tests.faults.test_fleet_outage import fleet_settled
from tests.redis_proxy import RedisProxy

pytestmark = pytest.mark.slow


def _config(port: int, journal: Path, prefix: str) -> dict[str, Any]:
    return {
        "state_url": f"redis://127.0.0.1:{port}/0?socket_timeout=0.3&socket_connect_timeout=0.3",
        "key_prefix": prefix,
        "on_state_error": "fail_open",
        "fleet_heartbeat": 0.1,
        "fail_open_journal": str(journal),
        "chain": [{"name": "only", "provider": "local", "quota": {"sessions": 10}}],
    }


async def _until(condition: Any, seconds: float = 10) -> None:
    for _ in range(int(seconds / 0.02)):
        if condition():
            return
        await asyncio.sleep(0.02)
    raise AssertionError("never happened")


async def test_a_reserve_the_store_made_but_never_answered_counts_once(
    aof_redis: RedisServer, tmp_path: Path, key_prefix: str
) -> None:
    events: list[Event] = []
    admin = redis.Redis.from_url(aof_redis.url)

    def sessions() -> int:
        keys = admin.keys(f"*{key_prefix}*usage*")
        return sum(int(admin.hget(k, "sessions") or 0) for k in keys)

    def heartbeats() -> int:
        return int(admin.get(f"{{{key_prefix}:fleet}}:seq") or 0)

    async with RedisProxy(("127.0.0.1", aof_redis.port)) as proxy:
        cfg = _config(proxy.port, tmp_path / "journal.db", key_prefix)
        provider = ScriptedProvider("only", tmp_path / "sandboxes")
        router = Router.from_config(cfg, providers={"only": provider}, hooks=[events.append])
        async with router:
            await (await router.aacquire()).release()
            await _until(lambda: fleet_settled(aof_redis.url, key_prefix))
            settled_at = heartbeats()
            await _until(lambda: heartbeats() > settled_at)  # the router has heard it
            proxy.stop_replies()
            acquiring = asyncio.ensure_future(router.aacquire(timeout=10))
            await _until(lambda: sessions() == 2)  # the store made the reservation
            aof_redis.stop()
            proxy.cut()  # before its answer left
            lease = await acquiring  # from the outage share
            await lease.release()
            aof_redis.start()  # the AOF replays: the unanswered reservation is there
            await _until(lambda: any(e.name == "outage_handed_over" for e in events))
            used = (await router.astatus()).entries[0].used["sessions"]
        admin.close()
    assert len(provider.created) == 2
    assert used == 2
