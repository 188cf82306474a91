"""A create the router stops waiting for, through each vendor's adapter on its emulator.

The vendor makes the sandbox and then answers after the router's create
deadline, or drops the connection without answering: the acquire fails over
to ``local`` at once, and the router itself (no janitor run) counts the
sandbox the vendor made (its session stays spent, its seconds metered) and
kills it. A create whose connection drops before the vendor made anything is
refunded once the lookup by its lease label finds nothing.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from providers.base import LABEL_LEASE, SandboxSpec
from router import Router
from router.events import LateCreate, Refund, RouterEvent
from tests.contract.conftest import Backend
from tests.polling import until

# (the emulator's create fault, the late create's outcome, sandboxes the vendor made)
FAULTS = {
    "answers-late": ({"after": True, "delay": 2.5}, "killed", 1),
    "made-then-dropped": ({"after": True, "drop": True}, "found", 1),
    "dropped-before-making": ({"drop": True}, "failed", 0),
}


def _router(
    vendor: Backend, tmp_path: Path, events: list[RouterEvent], state: str = "memory://"
) -> Router:
    config = {
        "state_url": state,
        "create_timeout": 1,
        "retry": {"attempts": 1},
        "chain": [
            {"name": vendor.name, "provider": vendor.kind},
            {"name": "local", "provider": "local", "options": {"root": str(tmp_path / "local")}},
        ],
    }
    providers = {vendor.name: vendor.provider}
    return Router.from_config(config, providers=providers, hooks=[events.append])


@pytest.mark.parametrize("fault", list(FAULTS))
async def test_a_create_the_router_stopped_waiting_for_is_counted_and_killed(
    vendor: Backend, tmp_path: Path, fault: str
) -> None:
    inject, outcome, made = FAULTS[fault]
    assert vendor.emulator is not None
    events: list[RouterEvent] = []
    router = _router(vendor, tmp_path, events)
    async with router:
        vendor.emulator.inject("create", **inject)
        async with await router.aacquire() as lease:
            assert (lease.entry, lease.failovers) == ("local", [vendor.name])

        def ended() -> list[LateCreate]:
            return [e for e in events if isinstance(e, LateCreate)]

        await until(ended, seconds=30)
        [late] = ended()
        assert (late.entry, late.outcome) == (vendor.name, outcome)
        ours = [r for r in vendor.emulator.records() if r.labels.get(LABEL_LEASE) == late.lease_id]
        assert len(ours) == made
        assert [r.id for r in ours] == ([late.sandbox_id] if made else [])
        assert vendor.emulator.alive() == []  # killed by the router: no janitor ran
        [view] = [v for v in (await router.astatus()).entries if v.name == vendor.name]
        assert view.used["sessions"] == made  # spent when the vendor made one, else refunded
        assert (view.used["sandbox_seconds"] > 0) == bool(made)  # metered until killed
        assert view.used["concurrent"] == 0
        refunds = [e for e in events if isinstance(e, Refund) and e.entry == vendor.name]
        assert len(refunds) == 1 - made


async def test_a_create_cancelled_after_the_vendor_made_it_is_killed(vendor: Backend) -> None:
    """Cancelled while its answer is on the way (the vendor made the sandbox), the adapter
    lets the request finish and kills what it made: its id is only in that answer."""
    emu = vendor.emulator
    assert emu is not None
    emu.inject("create", after=True, delay=1.0)
    creating = asyncio.ensure_future(vendor.provider.create(SandboxSpec(), timeout=10))
    await until(emu.records)
    creating.cancel()
    with pytest.raises(asyncio.CancelledError):
        await creating
    await until(lambda: emu.records() and not emu.alive(), seconds=15)


@pytest.mark.parametrize("kill", ["kills", "kill-fails-once"])
async def test_a_create_the_router_cut_off_at_close_is_metered_until_killed(
    vendor: Backend, tmp_path: Path, kill: str
) -> None:
    """Closing, the router cuts off a create the vendor has not answered yet; the adapter
    lets the request finish and kills what it made, and tells the router what that was
    and how long it lived, so its seconds are charged: a lookup by label would have found
    nothing yet, or nothing any more. When the adapter's kill fails, the router's own
    kills retry it."""
    emu = vendor.emulator
    assert emu is not None
    events: list[RouterEvent] = []
    state = f"sqlite:///{tmp_path / 'state.db'}"
    router = _router(vendor, tmp_path, events, state)
    async with router:
        emu.inject("create", delay=2.0)  # the vendor makes it only after the router closed
        if kill == "kill-fails-once":
            emu.inject("kill", status=500)
        async with await router.aacquire() as lease:
            assert (lease.entry, lease.failovers) == ("local", [vendor.name])
    [late] = [e for e in events if isinstance(e, LateCreate)]
    [made] = [r for r in emu.records() if r.labels.get(LABEL_LEASE) == late.lease_id]
    assert (late.entry, late.outcome, late.sandbox_id) == (vendor.name, "killed", made.id)
    assert (late.seconds or 0.0) > 0
    assert emu.alive() == []
    async with _router(vendor, tmp_path, [], state) as reader:
        [view] = [v for v in (await reader.astatus()).entries if v.name == vendor.name]
    assert view.used["sessions"] == 1
    assert view.used["sandbox_seconds"] == pytest.approx(late.seconds)
    assert view.used["concurrent"] == 0
