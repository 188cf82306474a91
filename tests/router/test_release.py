"""The release frees the slot beside the kill; the caller waits for the kill only.

The router's status waits for the slots it is still freeing, and so does
an acquire the pool refuses for concurrency meanwhile, so a program that
releases and acquires again on a pool of one never finds its own slot taken.
A cancelled release still kills its sandbox and frees its slot.
"""

from __future__ import annotations

import asyncio
import gc
import threading
import time
import warnings

import redis

from tests.polling import wait_until
from tests.router.conftest import fired
from tests.warned import warns

CHAIN = [{"name": "flaky", "provider": "local", "quota": {"sessions": 10, "concurrent": 1}}]


def test_release_returns_before_the_slot_is_freed(make_router, scripted, redis_url, events) -> None:
    flaky = scripted()
    router = make_router(providers={"flaky": flaky}, chain=CHAIN)
    lease = router.acquire()
    wait_until(lambda: router.status().entries[0].live_leases == 1)  # committed
    pause = 1.2
    with redis.Redis.from_url(redis_url) as admin:
        admin.execute_command("CLIENT", "PAUSE", int(pause * 1000), "WRITE")
        paused_until = time.monotonic() + pause
        lease.release()
        returned = time.monotonic()
        assert returned < paused_until - 0.2, "release waited for Redis"
        assert flaky.alive() == []  # the kill is what it waited for
        assert fired(events, "released") == []
        with router.acquire() as again:  # concurrent: 1; it waits for our own release
            acquired = time.monotonic()
            assert router.status().entries[0].live_leases == 1
    assert acquired > paused_until - 0.05, "acquire overtook the release before it"
    view = router.status().entries[0]  # after our releases, as acquire is
    assert (view.live_leases, view.used["sessions"]) == (0, 2)
    assert [e["lease_id"] for e in fired(events, "released")] == [lease.id, again.id]
    assert fired(events, "acquire_failed") == fired(events, "state_error") == []


async def test_a_full_pool_gives_its_slot_to_the_acquire_right_after_a_release(
    make_router, scripted, events
) -> None:
    """Released at once, a lease's free waits for its commit, so the next acquire's
    reserve may reach Redis first, find the pool full and wait for that free."""
    chain = [{"name": "flaky", "provider": "local", "quota": {"concurrent": 1}}]
    router = make_router(providers={"flaky": scripted()}, chain=chain)
    for _ in range(30):
        async with await router.aacquire() as lease:
            assert lease.entry == "flaky"
    await router.astatus()  # waits for the last release's free, still in flight
    assert len(fired(events, "acquired")) == len(fired(events, "released")) == 30
    assert fired(events, "acquire_failed") == []


def test_status_waits_for_the_slots_this_router_is_freeing(
    make_router, scripted, redis_url
) -> None:
    router = make_router(providers={"flaky": scripted()}, chain=CHAIN)
    lease = router.acquire()
    wait_until(lambda: router.status().entries[0].live_leases == 1)
    with redis.Redis.from_url(redis_url) as admin:
        admin.execute_command("CLIENT", "PAUSE", 800, "WRITE")  # reads still answered
        lease.release()
        assert router.status().entries[0].live_leases == 0


def test_a_cancelled_release_still_kills_and_frees(make_router, scripted, events) -> None:
    gate = threading.Event()
    flaky = scripted(kill_gate=gate)
    router = make_router(providers={"flaky": flaky}, chain=CHAIN)

    async def main() -> None:
        lease = await router.aacquire()
        releasing = asyncio.ensure_future(lease.release())
        await asyncio.sleep(0.2)
        assert not releasing.done(), "the release did not wait for the kill"
        releasing.cancel()
        await asyncio.gather(releasing, return_exceptions=True)
        assert flaky.alive() == [lease.sandbox.id]  # the kill still waits for the gate
        gate.set()
        async with await router.aacquire():
            pass

    asyncio.run(main())
    wait_until(lambda: flaky.alive() == [])
    assert flaky.alive() == []
    view = router.status().entries[0]
    assert (view.live_leases, view.used["sessions"]) == (0, 2)
    assert fired(events, "kill_failed") == []


def test_a_lease_dropped_unreleased_is_released_with_a_warning(make_router, scripted) -> None:
    """Its heartbeats would keep a dropped lease, and the sandbox it pays for, alive for
    as long as the router runs. A handle on its sandbox keeps it, as its owner would."""
    flaky = scripted()
    router = make_router(providers={"flaky": flaky}, chain=CHAIN)
    handle = router.acquire().sandbox
    gc.collect()
    assert handle.run("echo kept").stdout == "kept\n"
    kept = handle.id
    with warns(ResourceWarning, match="released on garbage collection"):
        del handle  # the last reference: the lease goes with it
    wait_until(lambda: flaky.alive() == [])
    assert flaky.alive() == []
    assert kept in flaky.created
    wait_until(lambda: router.status().entries[0].live_leases == 0)
    assert router.status().entries[0].live_leases == 0
    with router.acquire() as lease:
        pass
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        del lease  # released already: no warning
        gc.collect()


def test_a_sync_lease_keeps_what_the_async_lease_it_came_from_held(make_router, scripted):
    """`acquire` is derived from `aacquire`: the `AsyncLease` it awaits hands its sandbox
    over to the `Lease` (`Lease.of`), so that one going away releases nothing."""
    router = make_router(providers={"flaky": scripted()}, chain=CHAIN)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        lease = router.acquire()
        gc.collect()
        assert lease.sandbox.run("echo live").stdout == "live\n"
        assert router.status().entries[0].live_leases == 1
    assert [str(w.message) for w in caught if w.category is ResourceWarning] == []
    lease.release()


def test_concurrent_acquires_of_one_session_take_turns_on_one_sandbox(
    make_router, scripted
) -> None:
    """Acquires racing on a new session: the first creates and binds it, the others wait
    for each release in turn and get that same sandbox; no two leases hold it at once."""
    flaky = scripted()
    chain = [{"name": "flaky", "provider": "local", "quota": {"sessions": 10}}]
    router = make_router(providers={"flaky": flaky}, chain=chain)
    holding: list[int] = []
    overlapped: list[list[int]] = []

    async def main() -> list[str]:
        async def one(i: int) -> str:
            async with await router.aacquire(session="conv") as lease:
                holding.append(i)
                if len(holding) > 1:
                    overlapped.append(list(holding))
                await lease.sandbox.run("true")
                holding.remove(i)
                return lease.sandbox_id

        return await asyncio.gather(*(one(i) for i in range(3)))

    handed = asyncio.run(main())
    assert overlapped == []
    assert len(set(handed)) == 1
    assert flaky.creates == 1
    assert router.status().entries[0].used["sessions"] == 1
    with router.acquire(session="conv") as lease:
        assert lease.resumed
        assert [lease.sandbox_id] == flaky.alive() == handed[:1]
