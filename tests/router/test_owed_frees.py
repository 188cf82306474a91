"""A release made while the store is unreachable: its slot-free is kept and tried again
until it lands, so the slot comes back without waiting for lease_ttl."""

from __future__ import annotations

import json

import pytest
import redis

from router import Router
from router.testing import ScriptedProvider
from tests.polling import wait_until
from tests.router.conftest import fired

pytestmark = pytest.mark.slow


@pytest.fixture
def make(aof_redis, key_prefix, tmp_path, new_router, events):
    """A router on ``aof_redis`` with one entry of ``slots`` concurrent leases."""

    def build(slots: int = 1) -> Router:
        return new_router(
            {
                "state_url": aof_redis.url + "?socket_timeout=0.5&socket_connect_timeout=0.5",
                "key_prefix": key_prefix,
                "chain": [{"name": "only", "provider": "local", "quota": {"concurrent": slots}}],
            },
            providers={"only": ScriptedProvider("only", tmp_path)},
            hooks=[events.append],
        )

    return build


def committed(url: str, prefix: str, lease_id: str) -> bool:
    """The lease's commit has landed (a reservation counts as live before it does)."""
    with redis.Redis.from_url(url) as admin:
        raw = admin.hget(f"{{{prefix}:only}}:lease", lease_id)
    return raw is not None and json.loads(raw)["live"] == 1


def test_a_free_that_failed_lands_once_the_store_is_back(
    make, aof_redis, events, key_prefix
) -> None:
    router = make()
    lease = router.acquire()
    wait_until(lambda: committed(aof_redis.url, key_prefix, lease.id))
    aof_redis.stop()
    lease.release()  # returns normally; its free fails
    wait_until(lambda: fired(events, "state_error"))
    aof_redis.start()  # same port; the AOF still holds the lease
    wait_until(lambda: fired(events, "released"), seconds=15)
    assert router.status().entries[0].live_leases == 0  # long before lease_ttl (300 s)
    with router.acquire() as again:  # concurrent: 1
        assert again.entry == "only"
    assert [e["operation"] for e in fired(events, "state_error")] == ["release"]


def test_close_says_how_many_frees_are_still_owed(make, aof_redis, events, key_prefix) -> None:
    router = make(slots=2)
    leases = [router.acquire() for _ in range(2)]
    wait_until(lambda: all(committed(aof_redis.url, key_prefix, x.id) for x in leases))
    aof_redis.stop()
    for lease in leases:
        lease.release()
    router.close()  # bounded: the store stays down
    assert fired(events, "frees_owed") == [{"count": 2}]
    assert fired(events, "released") == []


def test_a_background_task_that_fails_is_reported(make, aof_redis, events, key_prefix) -> None:
    router = make()
    lease = router.acquire()
    wait_until(lambda: committed(aof_redis.url, key_prefix, lease.id))
    with redis.Redis.from_url(aof_redis.url) as admin:
        admin.execute_command("ACL", "SETUSER", "default", "-evalsha", "-eval")
        lease.release()  # the store refuses the free's script (not a connection error)
        wait_until(lambda: fired(events, "task_failed"))
        admin.execute_command("ACL", "SETUSER", "default", "+@all")
    [failed] = fired(events, "task_failed")
    assert "NOPERM" in str(failed["error"])
