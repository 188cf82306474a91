"""Warm pools: claimed by any replica, refilled by one at a time within the pool's
limits, killed when idle too long, drained when the entry fails (real Redis)."""

from __future__ import annotations

import asyncio
import secrets
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from policies.warm import REACH_FRESH
from providers.base import (
    LABEL_ENTRY,
    LABEL_LEASE,
    LABEL_ROUTER,
    LABEL_WARM,
    Sandbox,
    SandboxSpec,
)
from providers.errors import NoProviderAvailable, Unavailable
from router.metrics import instrument
from router.testing import ScriptedProvider
from tests.polling import wait_until
from tests.router.conftest import Clock, fired


def view(router, name="flaky"):
    return next(v for v in router.status().entries if v.name == name)


def warm_chain(**warm: Any) -> list[dict[str, Any]]:
    quota = warm.pop("quota", {})
    extra = warm.pop("entry", {})
    return [{"name": "flaky", "provider": "local", "quota": quota, "warm": warm, **extra}]


@pytest.fixture
def pool(make_router, scripted):
    """Two replicas on one Redis, each with its own adapter on the same sandboxes;
    neither connects ahead unless ``reach_every`` says how often."""

    def make(script=(), provider=None, reach_every=0.0, **warm: Any):
        first, second = provider or scripted(), provider or scripted(script=list(script))
        chain = warm_chain(**warm)
        settings = {"warm_refill_every": 0, "warm_reach_every": reach_every}
        one = make_router(chain=chain, providers={"flaky": first}, **settings)
        two = make_router(chain=chain, providers={"flaky": second}, **settings)
        return one, two, first, second

    return make


def test_a_replica_claims_a_warm_sandbox_another_made(pool, events) -> None:
    one, two, maker, claimer = pool(size=2, max_idle=300, quota={"sessions": 10})
    assert one.fill_warm() == {"flaky": 2}
    assert len(maker.alive()) == 2
    assert two.warm_ready() == {"flaky": 2}
    with two.acquire() as lease:
        assert lease.sandbox.id in maker.created
        assert lease.sandbox.run("echo hi").stdout == "hi\n"
        assert claimer.creates == 0
        assert two.warm_ready() == {"flaky": 1}
    [hit] = fired(events, "warm_claimed")
    assert (hit["sandbox_id"], hit["paused"]) == (lease.sandbox.id, False)
    assert lease.sandbox.id not in maker.alive()  # released: killed like any lease
    assert view(two).used["sessions"] == 2  # spent by the creates, not again by the claim


def test_sessions_are_spent_when_created_and_seconds_run_from_the_create(
    pool, clock: Clock
) -> None:
    one, two, *_ = pool(size=1, max_idle=300, quota={"sessions": 5, "concurrent": 3})
    one.fill_warm()
    assert view(one).used == {"sessions": 1, "sandbox_seconds": 0, "concurrent": 1, "usd": 0}
    clock.advance(20)  # idle in the pool
    lease = two.acquire()
    assert view(two).used == {
        "sessions": 1,
        "sandbox_seconds": pytest.approx(20),
        "concurrent": 1,
        "usd": 0,
    }
    clock.advance(5)  # used by the caller
    lease.release()
    assert view(two).used == {
        "sessions": 1,
        "sandbox_seconds": pytest.approx(25),
        "concurrent": 0,
        "usd": 0,
    }


def test_refill_fills_up_to_size_and_never_past_the_pool_limits(pool) -> None:
    one, _, maker, _ = pool(size=5, max_idle=300, quota={"sessions": 10, "concurrent": 2})
    assert one.fill_warm() == {"flaky": 2}  # the concurrency limit
    assert one.fill_warm() == {"flaky": 2}
    assert maker.creates == 2
    assert view(one).used["concurrent"] == 2
    one.set_warm("flaky", 1)
    assert one.fill_warm() == {"flaky": 2}  # a smaller size kills nothing ready


def test_refill_never_spends_past_the_sessions_limit(pool) -> None:
    one, _, maker, _ = pool(size=5, max_idle=300, quota={"sessions": 3})
    assert one.fill_warm() == {"flaky": 3}
    assert one.fill_warm() == {"flaky": 3}
    assert maker.creates == 3
    assert view(one).used["sessions"] == 3


def test_only_one_replica_refills_at_a_time(pool) -> None:
    one, two, maker, other = pool(size=3, max_idle=300)

    async def hold_lock() -> bool:
        return await two.store.lock("warm:flaky", "someone", 60, two._clock())

    assert two._engine.run(hold_lock())
    assert one.fill_warm() == {}  # the holder refills it
    assert maker.creates == 0
    two._engine.run(two.store.unlock("warm:flaky", "someone"))
    with ThreadPoolExecutor(2) as threads:
        results = list(threads.map(lambda r: r.fill_warm(), (one, two)))
    assert maker.creates + other.creates == 3
    assert {"flaky": 3} in results


def test_an_open_breaker_drains_the_pool_and_hands_out_nothing(pool, events) -> None:
    errors = [Unavailable("down")] * 3
    one, two, maker, _ = pool(script=errors, size=2, max_idle=300)
    one.fill_warm()
    # a create the pool cannot serve (an env) fails three times: the breaker opens
    with pytest.raises(NoProviderAvailable, match="unavailable"):
        two.acquire(SandboxSpec(env={"A": "1"}))
    with pytest.raises(NoProviderAvailable, match="breaker open"):
        two.acquire()
    assert fired(events, "warm_claimed") == []
    assert one.fill_warm() == {"flaky": 0}
    assert maker.alive() == []
    reasons = [e["reason"] for e in fired(events, "warm_killed")]
    assert reasons == ["drained: open", "drained: open"]


def test_used_up_seconds_drain_the_pool(pool, events) -> None:
    one, two, maker, _ = pool(size=2, max_idle=300, quota={"sandbox_seconds": 100})
    one.fill_warm()
    one.set_usage("flaky", "sandbox_seconds", 100)
    with pytest.raises(NoProviderAvailable, match="sandbox_seconds"):
        two.acquire()
    assert one.fill_warm() == {"flaky": 0}
    assert maker.alive() == []
    assert [e["reason"] for e in fired(events, "warm_killed")] == ["drained: quota"] * 2


def test_warm_sandboxes_idle_past_max_idle_are_killed_and_replaced(
    pool, clock: Clock, events
) -> None:
    one, two, maker, other = pool(size=1, max_idle=30)
    one.fill_warm()
    [first] = maker.alive()
    clock.advance(31)
    assert two.fill_warm() == {"flaky": 1}
    [killed] = fired(events, "warm_killed")
    assert (killed["sandbox_id"], killed["reason"]) == (first, "max_idle")
    assert killed["metered"] == pytest.approx(31)
    assert maker.alive() == []
    assert len(other.alive()) == 1  # made by the replica that refilled
    assert view(one).used["sandbox_seconds"] == pytest.approx(31)


def test_a_dead_warm_sandbox_is_dropped_and_the_acquire_creates(pool, events) -> None:
    one, two, maker, claimer = pool(size=1, max_idle=300)
    one.fill_warm()
    [dead] = maker.alive()
    asyncio.run(maker.local.kill(dead))  # gone behind the router's back
    with two.acquire() as lease:
        assert lease.sandbox.id != dead
        assert lease.sandbox.run("echo ok").stdout == "ok\n"
    assert claimer.creates == 1
    [killed] = fired(events, "warm_killed")
    assert (killed["sandbox_id"], killed["reason"]) == (dead, "unreachable")
    assert [e["entry"] for e in fired(events, "warm_missed")] == ["flaky"]
    assert view(two).used["sessions"] == 2
    assert view(two).used["concurrent"] == 0


def test_an_acquire_the_pool_cannot_serve_creates(pool, events) -> None:
    one, two, _, claimer = pool(size=1, max_idle=300)
    one.fill_warm()
    with two.acquire(SandboxSpec(env={"A": "1"})):
        pass
    with two.acquire(labels={"team": "x"}):
        pass
    assert claimer.creates == 2
    assert fired(events, "warm_claimed") == fired(events, "warm_missed") == []
    assert two.warm_ready() == {"flaky": 1}


def test_the_janitor_keeps_recorded_warm_sandboxes_and_reaps_unrecorded_ones(
    pool, make_router
) -> None:
    one, two, maker, _ = pool(size=2, max_idle=300)
    one.fill_warm()
    ours = {
        LABEL_ROUTER: one.config.key_prefix, LABEL_ENTRY: "flaky", LABEL_WARM: "1",
        LABEL_LEASE: "l-" + secrets.token_hex(8),
    }  # fmt: skip
    stray = asyncio.run(maker.local.create(SandboxSpec(labels=ours))).id  # its refill died
    report = two.reap()
    assert report.killed == [("flaky", stray)]
    assert report.kept == 2
    assert len(maker.alive()) == 2


class Pausing(ScriptedProvider):
    """Scripted sandboxes, paused for real (their local processes stopped), resumes recorded."""

    def __init__(self, root: Path) -> None:
        super().__init__("flaky", root)
        self.resumed: list[str] = []

    async def resume(self, sandbox_id: str, *, timeout: float) -> Sandbox:
        self.resumed.append(sandbox_id)
        return await super().resume(sandbox_id, timeout=timeout)


def test_a_paused_warm_sandbox_holds_no_slot_and_is_resumed_on_claim(
    pool, tmp_path: Path, make_router, events
) -> None:
    pausing = Pausing(tmp_path)
    one, two, *_ = pool(
        provider=pausing, size=1, max_idle=300, pause=True,
        quota={"concurrent": 1}, entry={"capabilities": ["pause", "files"]},
    )  # fmt: skip
    assert one.fill_warm() == {"flaky": 1}
    [made] = pausing.created
    assert pausing.paused() == [made]
    assert view(one).used["concurrent"] == 0
    assert two.reap().kept == 1  # recorded, though no lease holds it
    with two.acquire() as lease:
        assert lease.sandbox.id == made
        assert (pausing.resumed, pausing.paused()) == ([made], [])
        assert view(two).used["concurrent"] == 1
    [hit] = fired(events, "warm_claimed")
    assert (hit["paused"], hit["metered"]) == (True, 0)


def test_the_background_refill_replaces_a_claimed_sandbox(make_router, scripted) -> None:
    maker = scripted()
    router = make_router(
        chain=warm_chain(size=1, max_idle=300), providers={"flaky": maker}, warm_refill_every=60
    )
    router.fill_warm()  # starts the loop
    with router.acquire() as lease:
        assert lease.sandbox.id == maker.created[0]
        wait_until(lambda: maker.creates == 2)  # the claim woke the refill at once
    wait_until(lambda: router.warm_ready() == {"flaky": 1})  # its create has to land first
    assert router.warm_ready() == {"flaky": 1}


def test_fill_warm_waits_for_the_background_pass_in_flight(make_router, scripted) -> None:
    gate = threading.Event()
    maker = scripted(script=[gate], capabilities=["files"])
    local = {"name": "local", "provider": "local"}
    router = make_router(
        chain=[*warm_chain(size=1, max_idle=300), local], providers={"flaky": maker}
    )
    with router.acquire(requires=["pty"]):  # served by `local`; it starts the refill loop
        wait_until(lambda: maker.creates == 1)  # whose pass now holds the pool's lock
    with ThreadPoolExecutor(1) as pool:
        filled = pool.submit(router.fill_warm)
        gate.set()
        assert filled.result(timeout=10) == {"flaky": 1}
    assert maker.creates == 1


def test_warm_hits_misses_idle_seconds_and_the_ready_gauge_are_exported(pool, clock: Clock) -> None:
    one, two, *_ = pool(size=1, max_idle=300)
    registry = CollectorRegistry()
    instrument(two, registry, clock=clock)
    one.fill_warm()
    assert registry.get_sample_value("sandbox_router_warm_ready", {"entry": "flaky"}) == 1
    clock.advance(7)
    with two.acquire(), two.acquire():  # a hit, then a miss
        pass

    def value(name: str, **labels: str) -> float | None:
        return registry.get_sample_value(f"sandbox_router_{name}", {"entry": "flaky", **labels})

    assert value("warm_hits_total") == 1
    assert value("warm_misses_total") == 1
    assert value("warm_idle_seconds_total", state="running") == pytest.approx(7)
    assert value("warm_ready") == 0


def test_a_sticky_session_is_bound_to_the_warm_sandbox_it_claimed(pool) -> None:
    one, two, maker, claimer = pool(size=1, max_idle=300)
    one.fill_warm()
    with two.acquire(session="chat-1") as first:
        assert first.sandbox.id == maker.created[0]
    with one.acquire(session="chat-1") as again:
        assert again.resumed
        assert again.sandbox.id == first.sandbox.id
    assert claimer.creates == 0


def test_a_replica_connects_ahead_so_its_claim_connects_nothing(pool, events) -> None:
    one, two, _, claimer = pool(size=2, max_idle=300, quota={"sessions": 10}, reach_every=3600)
    assert one.fill_warm() == {"flaky": 2}
    assert two.fill_warm() == {"flaky": 2}  # the pool is full: it makes none, reaches both
    assert (claimer.creates, claimer.connects) == (0, 2)
    with two.acquire() as lease:
        assert lease.sandbox.run("echo hi").stdout == "hi\n"
    assert claimer.connects == 2
    [hit] = fired(events, "warm_claimed")
    assert (hit["sandbox_id"], hit["reached"]) == (lease.sandbox.id, True)
    two.fill_warm()
    assert claimer.connects == 2  # its other handle is still fresh


def test_the_replica_that_made_a_warm_sandbox_claims_it_through_its_own_handle(
    pool, events
) -> None:
    one, _, maker, _ = pool(size=1, max_idle=300, reach_every=3600)
    one.fill_warm()
    with one.acquire() as lease:
        assert lease.sandbox.run("true").exit_code == 0
    assert maker.connects == 0
    assert [hit["reached"] for hit in fired(events, "warm_claimed")] == [True]


def test_without_reaching_a_replica_keeps_no_handle_even_of_what_it_made(pool, events) -> None:
    one, _, maker, _ = pool(size=1, max_idle=300)  # warm_reach_every: 0, nothing lets go
    one.fill_warm()
    with one.acquire() as lease:
        assert lease.sandbox.run("true").exit_code == 0
    assert maker.connects == 1
    assert [hit["reached"] for hit in fired(events, "warm_claimed")] == [False]


def test_a_handle_connected_too_long_ago_is_not_trusted_and_the_claim_connects(
    pool, events, clock: Clock
) -> None:
    one, two, _, claimer = pool(size=1, max_idle=300, reach_every=3600)
    one.fill_warm()
    two.fill_warm()
    clock.advance(REACH_FRESH + 1)
    with two.acquire() as lease:
        assert lease.sandbox.run("true").exit_code == 0
    assert claimer.connects == 2
    assert [hit["reached"] for hit in fired(events, "warm_claimed")] == [False]


def test_a_paused_warm_sandbox_is_never_connected_ahead(pool, events) -> None:
    one, two, maker, claimer = pool(size=1, max_idle=300, pause=True, reach_every=3600)
    one.fill_warm()
    two.fill_warm()
    assert claimer.connects == 0
    assert maker.paused()  # a connect would have woken it
    with two.acquire() as lease:
        assert lease.sandbox.run("true").exit_code == 0
    assert [(hit["paused"], hit["reached"]) for hit in fired(events, "warm_claimed")] == [
        (True, False)
    ]


def test_a_replica_connects_ahead_in_the_background(pool, events) -> None:
    one, two, _, claimer = pool(size=1, max_idle=300, reach_every=0.05)
    one.fill_warm()
    with two.acquire():  # starts its loops; its first pass is a tick later, so this claim connects
        pass
    one.fill_warm()
    wait_until(lambda: len(claimer.connected) >= 2)  # answered, so the handle is held
    assert claimer.connects == 2
    with two.acquire():
        pass
    assert [hit["reached"] for hit in fired(events, "warm_claimed")][-1] is True
