"""A failed kill is not the end of it: the router tries it again in the background, and
reaps, every ``reap_every`` seconds, what no live lease or session holds (an orphan of a
failed kill, a crash or a lost reply), with nobody calling the janitor.

Through the E2B adapter on its emulator, whose kills can be made to answer 500.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from emulators.e2b import E2BEmulator
from providers.base import LABEL_ENTRY, LABEL_LEASE, LABEL_ROUTER, SandboxSpec
from router import Router
from router.kills import KILL_RETRY_FOR
from tests.contract.conftest import build
from tests.polling import wait_until
from tests.router.conftest import Clock, fired

CHAIN = [{"name": "e2b", "provider": "e2b"}]


@pytest.fixture(scope="module")
def emu() -> Iterator[E2BEmulator]:
    with E2BEmulator() as running:
        yield running


@pytest.fixture
def e2b(emu: E2BEmulator, tmp_path: Path) -> Iterator[Any]:
    """A fresh E2B adapter on the emulator; nothing may outlive the test."""
    yield build("e2b", emu, tmp_path).provider
    emu.clear_faults()
    for record in emu.alive():
        emu.call(emu.core.kill(record.id))
    assert emu.alive() == []


def alive(emu: E2BEmulator) -> set[str]:
    return {record.id for record in emu.alive()}


def test_failed_kills_are_tried_again_until_they_land(
    emu: E2BEmulator, e2b: Any, make_router: Any, events: list[Any]
) -> None:
    router = make_router(chain=CHAIN, providers={"e2b": e2b})
    emu.inject("kill", status=500, times=None)
    leases = [router.acquire() for _ in range(8)]
    for lease in leases:
        lease.release()
    handed = {lease.sandbox_id for lease in leases}
    assert alive(emu) == handed  # every kill failed
    assert {e["sandbox_id"] for e in fired(events, "kill_failed")} == handed
    emu.clear_faults()
    wait_until(lambda: not alive(emu), 30)
    assert alive(emu) == set()
    assert fired(events, "reaped") == []  # the retries did it, not a janitor
    assert fired(events, "kill_abandoned") == []
    assert [e["attempt"] for e in fired(events, "kill_failed")].count(1) == 8


def test_a_kill_that_keeps_failing_is_given_up_then_reaped_by_the_router(
    emu: E2BEmulator, e2b: Any, make_router: Any, events: list[Any], clock: Clock
) -> None:
    router = make_router(chain=CHAIN, providers={"e2b": e2b}, reap_every=1)
    emu.inject("kill", status=500, times=None)
    with router.acquire() as lease:
        pass
    wait_until(lambda: len(fired(events, "kill_failed")) >= 2, 10)  # tried again
    clock.advance(KILL_RETRY_FOR + 1)
    wait_until(lambda: fired(events, "kill_abandoned"), 40)
    [gave_up] = fired(events, "kill_abandoned")
    assert (gave_up["entry"], gave_up["sandbox_id"]) == ("e2b", lease.sandbox_id)
    assert gave_up["attempts"] >= 2
    assert "500" in str(gave_up["error"]) or gave_up["error"]
    assert alive(emu) == {lease.sandbox_id}
    emu.clear_faults()
    wait_until(lambda: fired(events, "reaped"), 15)  # nobody called the janitor
    assert [e["sandbox_id"] for e in fired(events, "reaped")] == [lease.sandbox_id]
    assert alive(emu) == set()


def test_closing_the_router_tries_its_failed_kills_once_more_then_leaves_them_to_the_reaper(
    emu: E2BEmulator, e2b: Any, make_router: Any, events: list[Any]
) -> None:
    router = make_router(chain=CHAIN, providers={"e2b": e2b})
    emu.inject("kill", status=500, times=None)
    with router.acquire() as lease:
        pass
    router.close()
    [left] = fired(events, "kill_abandoned")
    assert (left["sandbox_id"], left["reason"]) == (lease.sandbox_id, "closed")
    assert alive(emu) == {lease.sandbox_id}
    emu.clear_faults()
    survivor = make_router(chain=CHAIN, providers={"e2b": build("e2b", emu, Path()).provider})
    assert survivor.reap().killed == [("e2b", lease.sandbox_id)]


def _orphan(emu: E2BEmulator, key_prefix: str, labels: dict[str, str]) -> str:
    """A sandbox made by an adapter of its own, as a crashed replica would leave it."""

    async def make() -> str:
        maker = build("e2b", emu, Path()).provider
        try:
            sandbox = await maker.create(SandboxSpec(labels=labels), timeout=10)
            return sandbox.id
        finally:
            await maker.aclose()

    return asyncio.run(make())


def test_the_router_reaps_an_orphan_by_itself(
    emu: E2BEmulator, e2b: Any, make_router: Any, key_prefix: str, events: list[Any]
) -> None:
    ours = {LABEL_ROUTER: key_prefix, LABEL_ENTRY: "e2b"}
    orphan = _orphan(emu, key_prefix, {**ours, LABEL_LEASE: "l-no-longer-exists"})
    stranger = _orphan(emu, key_prefix, {"team": "x"})
    router = make_router(chain=CHAIN, providers={"e2b": e2b}, reap_every=1)
    with router.acquire() as held:  # the router's background tasks start with it
        wait_until(lambda: fired(events, "reaped"), 15)
        assert alive(emu) == {held.sandbox_id, stranger}
        assert held.sandbox.run("echo kept").stdout == "kept\n"
    [reaped] = fired(events, "reaped")
    assert (reaped["sandbox_id"], reaped["lease_id"]) == (orphan, "l-no-longer-exists")


def test_one_replica_at_a_time_reaps_under_the_fleet_lock(
    emu: E2BEmulator, e2b: Any, make_router: Any, key_prefix: str, clock: Clock
) -> None:
    ours = {LABEL_ROUTER: key_prefix, LABEL_ENTRY: "e2b", LABEL_LEASE: "l-gone"}
    orphan = _orphan(emu, key_prefix, ours)
    router: Router = make_router(chain=CHAIN, providers={"e2b": e2b}, reap_every=1)
    store = router.store
    assert router._engine.run(store.lock("reaper", "another-replica", 60, clock()))
    with router.acquire():
        time.sleep(2.5)  # two periods: nothing to wait on, the point is that nothing happens
        assert orphan in alive(emu)  # another replica holds the reaper's lock
        router._engine.run(store.unlock("reaper", "another-replica"))
        wait_until(lambda: orphan not in alive(emu), 15)
    assert orphan not in alive(emu)
