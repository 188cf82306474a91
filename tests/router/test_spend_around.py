"""What the router spends around leases, charged in usd and in the cost counter: hedge
losers and late creates, warm sandboxes' idle time, paused storage."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from emulators import available, emulator_class
from router import Router
from router.events import LateCreate, RouterEvent
from router.metrics import instrument
from router.testing import ScriptedProvider
from tests.polling import wait_until

# $0.01 a second for one vCPU, and $0.50 a sandbox.
PRICE = {"vcpu_hour": 36.0, "memory_gib_hour": 0.0, "per_sandbox": 0.5}
SIZE = {"vcpu": 1, "memory_gib": 1}


@pytest.fixture(params=["memory", "sqlite", "redis"])
def state(request: pytest.FixtureRequest, tmp_path: Path) -> dict[str, str]:
    """The store settings of each kind: the charges are the store's."""
    if request.param == "memory":
        return {"state_url": "memory://"}
    if request.param == "sqlite":
        return {"state_url": f"sqlite:///{tmp_path}/state.db"}
    return {
        "state_url": request.getfixturevalue("redis_url"),
        "key_prefix": request.getfixturevalue("key_prefix"),
    }


def of(events: list[RouterEvent], kind: type[Any]) -> list[Any]:
    return [e for e in events if isinstance(e, kind)]


def cost_counter(registry: CollectorRegistry, entry: str) -> float:
    value = registry.get_sample_value(
        "sandbox_router_cost_usd_total", {"entry": entry, "pool": entry}
    )
    return value or 0.0


def test_a_hedge_losers_sandbox_is_charged_to_its_pools_usd(
    new_router: Any, tmp_path: Path, state: dict[str, str]
) -> None:
    gate = threading.Event()
    slow = ScriptedProvider("slow", tmp_path, [gate])
    spare = ScriptedProvider("spare", tmp_path)
    chain = [
        {"name": "slow", "provider": "local", "hedge": {"after": 0.1}, "price": PRICE,
         "resources": SIZE, "quota": {"usd": 10, "budget_window": 60}},
        {"name": "spare", "provider": "local", "quota": {"sessions": 10}},
    ]  # fmt: skip
    events: list[RouterEvent] = []
    router = new_router(
        {**state, "create_timeout": 20, "chain": chain},
        providers={"slow": slow, "spare": spare},
        hooks=[events.append],
    )
    registry = CollectorRegistry()
    instrument(router, registry)
    try:
        with router.acquire() as lease:
            assert lease.entry == "spare"
            held = router.status().entries[0].usd_held
            assert held == pytest.approx(0.5 + 0.6)  # the loser's worst case, while it runs
    finally:
        gate.set()  # the vendor makes the loser's sandbox after all
    wait_until(lambda: of(events, LateCreate), seconds=10)
    [late] = of(events, LateCreate)
    assert late.outcome == "killed"
    assert late.cost == pytest.approx(0.5 + 0.01 * late.seconds)
    assert late.pool == "slow"
    view = router.status().entries[0]
    assert view.used["usd"] == pytest.approx(late.cost)
    assert view.usd_held == 0
    assert cost_counter(registry, "slow") == pytest.approx(late.cost)


@pytest.mark.slow
@pytest.mark.skipif(not available(["e2b"]), reason="needs the e2b SDK")
def test_a_late_create_on_the_e2b_emulator_is_charged(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, redis_url: str, key_prefix: str
) -> None:
    """E2B's SDK on its emulator: the create answers after the acquire gave up on it; the
    sandbox it made is killed, and its fee and seconds at E2B's rate are the pool's usd."""
    with emulator_class("e2b")() as emu:
        for key, value in emu.sdk_env().items():
            monkeypatch.setenv(key, value)
        e2b = {"name": "e2b", "provider": "e2b", "price": {"per_sandbox": 0.25},
               "quota": {"usd": 5}}  # fmt: skip
        local = {"name": "local", "provider": "local", "options": {"root": str(tmp_path)}}
        config = {"state_url": redis_url, "key_prefix": key_prefix, "retry": {"attempts": 1}}
        warm = Router.from_config({**config, "chain": [e2b]}, hooks=[])  # SDK imports
        with warm:
            with warm.acquire() as lease:
                assert lease.entry == "e2b"
            wait_until(lambda: warm.status().entries[0].used["usd"] > 0)
            before = warm.status().entries[0].used["usd"]
        events: list[RouterEvent] = []
        settings = {**config, "create_timeout": 1, "chain": [e2b, local]}
        with Router.from_config(settings, hooks=[events.append]) as router:
            emu.inject("create", delay=2.0, after=True)
            with router.acquire() as lease:
                assert lease.entry == "local"
            wait_until(lambda: of(events, LateCreate), seconds=15)
            [late] = of(events, LateCreate)
            assert late.outcome == "killed"
            rate = (2 * 0.0504 + 0.5 * 0.0162) / 3600  # E2B's default size and prices
            seconds = float(max(1, -(-late.seconds // 1)))  # whole seconds, rounded up
            assert late.cost == pytest.approx(0.25 + rate * seconds)
            used = router.status().entries[0].used["usd"]
            assert used - before == pytest.approx(late.cost)
            assert [r.id for r in emu.records() if r.alive] == []
