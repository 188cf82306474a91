"""The lease is committed while the caller already uses the sandbox.

acquire returns once the create is done; the reservation it made first holds
every unit until the commit lands. Heartbeats and the release wait for the
commit, and a commit that finds its reservation gone is told as a lost lease.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import redis

from tests.polling import wait_until
from tests.router.conftest import Clock, fired

CHAIN = [{"name": "flaky", "provider": "local", "quota": {"sessions": 10, "concurrent": 1}}]


def test_acquire_returns_before_its_commit_lands(make_router, scripted, redis_url, events) -> None:
    gate = threading.Event()
    flaky = scripted(script=[gate])
    router = make_router(providers={"flaky": flaky}, chain=CHAIN)
    pause = 1.2
    with ThreadPoolExecutor(1) as pool, redis.Redis.from_url(redis_url) as admin:
        acquiring = pool.submit(router.acquire)
        wait_until(lambda: flaky.creates == 1)  # reserved; the create waits for the gate
        admin.execute_command("CLIENT", "PAUSE", int(pause * 1000), "WRITE")
        paused_until = time.monotonic() + pause
        gate.set()
        lease = acquiring.result(10)
        returned = time.monotonic()
    assert returned < paused_until - 0.2, "acquire waited for the commit"
    lease.sandbox.run("true")
    lease.release()  # waits for the commit, then frees the slot
    view = router.status().entries[0]
    assert (view.live_leases, view.used["sessions"]) == (0, 1)
    assert flaky.alive() == []
    assert fired(events, "lease_lost") == fired(events, "state_error") == []


def test_a_commit_that_finds_its_reservation_gone_tells_the_lease_lost(
    make_router, scripted, clock: Clock, events
) -> None:
    gate = threading.Event()
    flaky = scripted(script=[gate])
    router = make_router(providers={"flaky": flaky}, chain=CHAIN)
    other = make_router(providers={"flaky": scripted()}, chain=CHAIN)
    with ThreadPoolExecutor(1) as pool:
        acquiring = pool.submit(router.acquire)
        wait_until(lambda: flaky.creates == 1)
        clock.advance(3600)  # far past the reservation's hold: another replica takes the slot
        with other.acquire() as theirs:
            gate.set()
            with acquiring.result(10) as lease:
                wait_until(lambda: fired(events, "lease_lost") != [])
                assert fired(events, "lease_lost") == [{"entry": "flaky", "lease_id": lease.id}]
                assert router.status().entries[0].live_leases == 1  # theirs, not ours
                assert lease.sandbox.run("echo still here").stdout == "still here\n"
            assert flaky.alive() == []  # the release still kills it
            assert theirs.sandbox.run("true").exit_code == 0
    view = router.status().entries[0]
    assert (view.live_leases, view.used["sessions"]) == (0, 2)
