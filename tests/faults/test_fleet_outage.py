"""A fleet of fail_open replicas through a Redis outage: never past the quota, and
every unit granted during the outage written back once Redis returns."""

from __future__ import annotations

import multiprocessing
import time
from pathlib import Path
from typing import Any

import pytest

from emulators.redis_server import RedisServer
from providers.errors import NoProviderAvailable, StateUnavailable
from router import Router
from router.testing import ScriptedProvider
from tests.polling import wait_until

pytestmark = pytest.mark.slow

QUOTA = 80
REPLICAS = 8


def config(url: str, tmp: Path) -> dict[str, Any]:
    return {
        "state_url": url + "?socket_timeout=0.3&socket_connect_timeout=0.3",
        "key_prefix": "fleet",
        "on_state_error": "fail_open",
        "fleet_heartbeat": 0.25,
        "fail_open_journal": str(tmp / "journal.db"),
        "chain": [{"name": "only", "provider": "local", "quota": {"sessions": QUOTA}}],
    }


def _replica(cfg: dict[str, Any], root: str, ready: Any, go: Any, stop: Any, granted: Any) -> None:
    """Acquire and release every 0.15 s until told to stop; count what was granted."""
    with Router.from_config(
        cfg, providers={"only": ScriptedProvider("only", Path(root))}, hooks=[]
    ) as router:
        router.acquire().release()  # in the fleet from here on (it heartbeats)
        with granted.get_lock():
            granted.value += 1
            ready.value += 1
        go.wait()
        while not stop.is_set():
            try:
                router.acquire(timeout=5).release()
            except (NoProviderAvailable, StateUnavailable):
                pass
            else:
                with granted.get_lock():
                    granted.value += 1
            time.sleep(0.15)


def test_eight_replicas_through_a_redis_kill_stay_within_quota_and_write_back(
    aof_redis: RedisServer, tmp_path: Path
) -> None:
    ctx = multiprocessing.get_context("spawn")
    go, stop = ctx.Event(), ctx.Event()
    ready, granted = ctx.Value("i", 0), ctx.Value("i", 0)
    cfg = config(aof_redis.url, tmp_path)
    workers = [
        ctx.Process(target=_replica, args=(cfg, str(tmp_path / f"sb{i}"), ready, go, stop, granted))
        for i in range(REPLICAS)
    ]
    for worker in workers:
        worker.start()
    wait_until(lambda: ready.value == REPLICAS, seconds=120)
    time.sleep(0.5)  # each has seen the whole fleet
    go.set()
    time.sleep(1.0)  # ~50 sessions granted, the rest left
    before_kill = granted.value
    aof_redis.stop()  # SIGKILL
    time.sleep(4)
    during = granted.value - before_kill
    aof_redis.start()  # same port; the AOF replays
    time.sleep(3)  # heartbeats hand the journals over
    stop.set()
    for worker in workers:
        worker.join(60)
        assert worker.exitcode == 0
    print(f"\nfleet outage: before {before_kill}, during {during}, total {granted.value}")
    assert 0 < before_kill < QUOTA
    assert during > 0  # the outage did not stop the fleet
    assert granted.value <= QUOTA
    with Router.from_config(cfg, providers={"only": ScriptedProvider("only", tmp_path)},
                            hooks=[]) as reader:  # fmt: skip
        assert reader.status().entries[0].used["sessions"] == granted.value
