"""A warm sandbox one replica made is claimed by another through the vendor's SDK
(its connect by id, on the wire, against the vendor's emulator)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from emulators import emulator_class
from emulators.harness import Emulator
from tests.contract.conftest import VENDORS, build
from tests.router.conftest import fired


@pytest.fixture(params=VENDORS)
def vendor(request: pytest.FixtureRequest) -> Iterator[tuple[str, Emulator]]:
    with emulator_class(request.param)() as emu:
        yield request.param, emu


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
