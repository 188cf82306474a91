"""Redis refusing a write, or a cluster down, is a state-store failure.

Each refusal is made for real on a private ``redis-server``: too few
replicas (NOREPLICAS), a replica after a failover (READONLY), memory full
with ``noeviction`` (OOM), and a failed snapshot with
``stop-writes-on-bgsave-error`` (MISCONF). The store must raise
StateUnavailable, so the router's fail_closed/fail_open policy applies,
never a raw ResponseError that reads like a provider failure.
"""

from __future__ import annotations

import socket
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis

from emulators.redis_server import RedisServer
from policies.breaker import BreakerConfig
from policies.quota import Limits, MonthlyWindow
from providers.errors import StateUnavailable
from router.state import EntryRef, open_store
from router.state.redis import RedisStore
from router.state.scripts import RunnerName
from tests.polling import needs_script_noreplicas, wait_until

NOW = 1_790_000_000.0
REF = EntryRef("a", "p", Limits(sessions=5), MonthlyWindow(), fingerprint="f")


def noreplicas(admin: redis.Redis, workdir: Path) -> None:
    needs_script_noreplicas(admin)
    admin.config_set("min-replicas-to-write", 1)


def readonly(admin: redis.Redis, workdir: Path) -> None:
    admin.replicaof("127.0.0.1", 1)  # a failover made it a replica of a master it cannot reach


def oom(admin: redis.Redis, workdir: Path) -> None:
    admin.config_set("maxmemory-policy", "noeviction")
    admin.config_set("maxmemory", 1)


def misconf(admin: redis.Redis, workdir: Path) -> None:
    admin.config_set("save", "3600 1")
    workdir.rmdir()  # the snapshot cannot be written
    admin.bgsave()
    wait_until(lambda: admin.info("persistence")["rdb_last_bgsave_status"] == "err")


REFUSALS: dict[str, Callable[[redis.Redis, Path], None]] = {
    "NOREPLICAS": noreplicas,
    "READONLY": readonly,
    "OOM": oom,
    "MISCONF": misconf,
}


@pytest.fixture
def server(tmp_path: Path) -> Iterator[RedisServer]:
    workdir = tmp_path / "redis"
    workdir.mkdir()
    with RedisServer(workdir) as s:
        yield s


@pytest.mark.parametrize("runner", ["resp", "redis-py"])
@pytest.mark.parametrize("refusal", sorted(REFUSALS))
async def test_a_refused_write_is_state_unavailable(
    server: RedisServer, refusal: str, runner: RunnerName
) -> None:
    store = RedisStore(server.url, "refused", runner=runner)
    try:
        assert (await store.reserve(REF, BreakerConfig(), "l1", NOW, 30)).granted
        with redis.Redis(port=server.port) as admin:
            REFUSALS[refusal](admin, server.workdir)
        with pytest.raises(StateUnavailable, match=refusal):
            await store.reserve(REF, BreakerConfig(), "l2", NOW, 30)
        with pytest.raises(StateUnavailable, match=refusal):
            await store.bind_session("s", "a", "sb-1", NOW + 60, NOW)
    finally:
        await store.close()


async def test_a_cluster_that_cannot_be_reached_is_state_unavailable() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = s.getsockname()[1]
    store = open_store(f"redis+cluster://127.0.0.1:{dead}?socket_connect_timeout=0.5", "down")
    try:
        with pytest.raises(StateUnavailable, match="state store"):
            await store.reserve(REF, BreakerConfig(), "l1", NOW, 30)
        with pytest.raises(StateUnavailable, match="state store"):
            await store.snapshot([REF], NOW)
    finally:
        await store.close()
