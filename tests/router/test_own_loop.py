"""``async with Router...``: the router runs on the app's event loop.

No engine thread is started, calls made on the loop run in place, leases
heartbeat on that loop, and sync calls from other threads still reach it.
A router that already runs on its own thread stays there.
"""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import pytest

from providers.errors import InvalidArgument
from router import Router


def chain(redis_url: str, key_prefix: str, root: Path) -> dict[str, Any]:
    return {
        "state_url": redis_url,
        "key_prefix": key_prefix,
        "chain": [
            {"name": "local", "provider": "local", "quota": {"concurrent": 2},
             "options": {"root": str(root), "isolation": "none"}},
        ],
    }  # fmt: skip


def engine_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "sandbox-router"]


async def test_calls_on_the_loop_run_in_place(redis_url, key_prefix, tmp_path) -> None:
    before = engine_threads()
    async with Router.from_config(chain(redis_url, key_prefix, tmp_path), hooks=[]) as router:
        async with router.aacquire() as lease:
            result = await lease.sandbox.run("echo on the app loop")
            assert result.stdout == "on the app loop\n"
            status = await router.astatus()
            assert status.entries[0].live_leases == 1
        assert (await router.astatus()).entries[0].live_leases == 0
        assert engine_threads() == before


async def test_sync_calls_from_another_thread_reach_the_loop(
    redis_url, key_prefix, tmp_path
) -> None:
    async with Router.from_config(chain(redis_url, key_prefix, tmp_path), hooks=[]) as router:

        def from_a_worker_thread() -> str:
            with router.acquire() as lease:
                return lease.sandbox.run("echo from a thread").stdout

        assert await asyncio.to_thread(from_a_worker_thread) == "from a thread\n"
        assert (await router.astatus()).entries[0].used["sessions"] == 1


async def test_a_sync_call_on_the_loop_itself_is_refused(redis_url, key_prefix, tmp_path):
    async with Router.from_config(chain(redis_url, key_prefix, tmp_path), hooks=[]) as router:
        with pytest.raises(RuntimeError, match="use the async API"):
            router.status()
        assert (await router.astatus()).entries[0].name == "local"  # still usable


async def test_every_call_has_an_async_twin_for_the_lent_loop(redis_url, key_prefix, tmp_path):
    """A sync call on the lent loop is refused (it would block the loop it waits for),
    so an app lending its loop needs every call async: warm pools and quota
    corrections had no async twin."""
    settings = {"warm_refill_every": 0, "warm_reach_every": 0}
    config = {**chain(redis_url, key_prefix, tmp_path), **settings}
    async with Router.from_config(config, hooks=[]) as router:
        with pytest.raises(RuntimeError, match="use the async API"):
            router.set_warm("local", 1)
        await router.aset_warm("local", 1, max_idle=300)
        assert await router.afill_warm() == {"local": 1}
        assert await router.awarm_ready() == {"local": 1}
        async with router.aacquire() as lease:  # claims the warm sandbox: no new session
            assert (await lease.sandbox.run("echo warm")).stdout == "warm\n"
        assert await router.awarm_ready() == {"local": 0}
        assert (await router.astatus()).entries[0].used["sessions"] == 1
        await router.aset_usage("local", "sessions", 0)
        assert (await router.astatus()).entries[0].used["sessions"] == 0
        with pytest.raises(InvalidArgument, match="set_warm\\(entry='nowhere'\\)"):
            await router.aset_warm("nowhere", 1)


async def test_leases_are_heartbeated_on_the_lent_loop(redis_url, key_prefix, tmp_path):
    config = {**chain(redis_url, key_prefix, tmp_path), "lease_ttl": 5}
    async with Router.from_config(config, hooks=[]) as router, await router.aacquire() as lease:
        await asyncio.sleep(6.5)  # past the TTL: only heartbeats keep it
        assert (await router.astatus()).entries[0].live_leases == 1
        assert (await lease.sandbox.run("echo alive")).stdout == "alive\n"


async def test_quota_holds_on_the_lent_loop(redis_url, key_prefix, tmp_path) -> None:
    async with Router.from_config(chain(redis_url, key_prefix, tmp_path), hooks=[]) as router:
        leases = await asyncio.gather(*(router.aacquire() for _ in range(2)))
        with pytest.raises(Exception, match="concurrent"):
            await router.aacquire()
        for lease in leases:
            await lease.release()


def test_a_router_already_on_its_own_thread_stays_there(redis_url, key_prefix, tmp_path):
    router = Router.from_config(chain(redis_url, key_prefix, tmp_path), hooks=[])
    router.status()  # starts the engine thread; its connections belong to that loop
    assert engine_threads()

    async def main() -> str:
        async with router, await router.aacquire() as lease:
            return (await lease.sandbox.run("echo hop")).stdout

    assert asyncio.run(main()) == "hop\n"


async def test_one_lease_failing_its_renewal_stops_no_other(redis_url, key_prefix, tmp_path):
    """The sweeper renews every lease together; a bug in one keepalive is reported
    (a state_error event for the heartbeat) and the other leases stay alive."""
    events: list[Any] = []
    config = {**chain(redis_url, key_prefix, tmp_path), "lease_ttl": 5}
    async with Router.from_config(config, hooks=[events.append]) as router:
        broken, healthy = await router.aacquire(), await router.aacquire()

        async def keepalive(seconds: float) -> None:
            raise RuntimeError("keepalive bug")

        broken._held.sandbox.keepalive = keepalive  # type: ignore[method-assign]
        await asyncio.sleep(6.5)  # past the TTL: two sweeps
        assert (await router.astatus()).entries[0].live_leases == 2
        errors = [e.fields for e in events if e.name == "state_error"]
        assert errors
        assert all(e["operation"] == "heartbeat" for e in errors)
        assert "keepalive bug" in errors[0]["error"]
        assert (await healthy.sandbox.run("echo alive")).stdout == "alive\n"
        await broken.release()
        await healthy.release()
