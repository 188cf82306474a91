"""A warm sandbox one replica made is claimed by another through the vendor's SDK
(its connect by id, on the wire, against the vendor's emulator)."""

from __future__ import annotations

import time
from pathlib import Path

from emulators import emulator_class
from emulators.harness import Emulator
from tests.contract.conftest import build
from tests.router.conftest import fired


def test_another_replica_claims_it_through_the_vendor_sdk(
    vendor: tuple[str, Emulator], make_router, tmp_path: Path, events
) -> None:
    name, emu = vendor
    maker, claimer = build(name, emu, tmp_path), build(name, emu, tmp_path)
    warm = {"size": 1, "max_idle": 120, "server": False}  # held by the router, not Daytona
    chain = [{"name": "v", "provider": maker.kind, "warm": warm}]
    one = make_router(chain=chain, providers={"v": maker.provider}, warm_refill_every=0)
    two = make_router(chain=chain, providers={"v": claimer.provider}, warm_refill_every=0)
    assert one.fill_warm() == {"v": 1}
    [made] = fired(events, "warm_created")
    with two.acquire() as lease:
        assert lease.sandbox.id == made["sandbox_id"]
        assert lease.sandbox.run("echo warm").stdout == "warm\n"
    assert [e["sandbox_id"] for e in fired(events, "warm_claimed")] == [made["sandbox_id"]]
    assert emu.alive() == []


def test_a_pool_daytona_holds_is_sized_drained_while_failing_and_ended(
    make_router, tmp_path: Path, events
) -> None:
    """``warm.server`` (Daytona's default): the refill sizes Daytona's own pool, an
    acquire's create is served from it, an exhausted entry's pool goes to 0, and a
    dropped ``warm`` ends it; nothing is claimed from the store."""
    with emulator_class("daytona")() as emu:
        backend = build("daytona", emu, tmp_path)
        warm = {"name": "v", "provider": "daytona", "warm": {"size": 2}, "quota": {"sessions": 5}}
        router = make_router(chain=[warm], providers={"v": backend.provider}, warm_refill_every=0)
        assert router.fill_warm() == {"v": 0}  # Daytona makes them in the background
        deadline = time.monotonic() + 20
        while router.fill_warm() != {"v": 2}:
            assert time.monotonic() < deadline, "Daytona's pool never held 2"
            time.sleep(0.1)
        assert [(e["size"], e["reason"]) for e in fired(events, "warm_sized")] == [(2, None)]
        assert router.warm_ready() == {"v": 2}
        with router.acquire() as lease:
            assert emu.core.boxes[lease.sandbox.id].from_pool is not None
        assert fired(events, "warm_claimed") == fired(events, "warm_missed") == []

        router.set_usage("v", "sessions", 5)
        router.fill_warm()
        [pool] = emu.warm_pools.pools.values()
        assert (fired(events, "warm_sized")[-1]["size"], pool.size) == (0, 0)
        assert fired(events, "warm_sized")[-1]["reason"] is not None
        router.set_usage("v", "sessions", 0)
        router.fill_warm()
        assert pool.size == 2
        router.set_warm("v", 0)
        router.fill_warm()
        assert (fired(events, "warm_sized")[-1]["size"], pool.size) == (0, 0)
        assert router.warm_ready() == {}
