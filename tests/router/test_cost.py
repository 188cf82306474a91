"""Money through a real Router on real Redis: `cheapest`, each lease's cost, the window's spend."""

from __future__ import annotations

import pytest

from providers.base import SandboxSpec
from providers.errors import Unavailable
from tests.polling import wait_until
from tests.router.conftest import Clock, fired

DEAR = {"vcpu_hour": 1.0, "memory_gib_hour": 0.5, "per_sandbox": 0.01}
CHEAP = {"vcpu_hour": 0.1, "memory_gib_hour": 0.05}
SIZE = {"vcpu": 2, "memory_gib": 4}


def chain() -> list[dict[str, object]]:
    return [
        {"name": "dear", "provider": "local", "price": DEAR, "resources": SIZE},
        {"name": "cheap", "provider": "local", "price": CHEAP, "resources": SIZE},
    ]


def test_cheapest_picks_the_cheaper_entry_and_fails_over_past_it_when_down(
    make_router, scripted, events
) -> None:
    cheap = scripted("cheap", script=[Unavailable("down")] * 9)
    router = make_router(
        providers={"dear": scripted("dear"), "cheap": cheap},
        strategy="cheapest",
        chain=chain(),
        retry={"attempts": 1},
    )
    with router.acquire() as lease:
        assert lease.entry == "dear"  # cheap was tried first and is down
    assert fired(events, "failover")[0] == {
        "from_entry": "cheap",
        "to_entry": "dear",
        "reason": "unavailable",
    }
    for _ in range(2):
        with router.acquire() as lease:
            assert lease.entry == "dear"
    view = next(v for v in router.status().entries if v.name == "cheap")
    assert view.state == "open"  # three failures: its breaker keeps acquires off it
    tried = cheap.creates
    with router.acquire() as lease:
        assert lease.entry == "dear"
    assert cheap.creates == tried  # an open entry is not tried


def test_cheapest_serves_from_the_cheaper_entry_when_it_is_up(make_router, scripted) -> None:
    router = make_router(
        providers={"dear": scripted("dear"), "cheap": scripted("cheap")},
        strategy="cheapest",
        chain=chain(),
    )
    with router.acquire() as lease:
        assert lease.entry == "cheap"
    ordered = make_router(
        providers={"dear": scripted("dear"), "cheap": scripted("cheap")}, chain=chain()
    )
    with ordered.acquire() as lease:
        assert lease.entry == "dear"  # ordered keeps the chain order, price or not


def test_a_released_lease_carries_its_cost(make_router, scripted, events, clock: Clock) -> None:
    router = make_router(providers={"dear": scripted("dear")}, chain=chain()[:1])
    with router.acquire(SandboxSpec(cpu=4, memory_mb=2048)):
        clock.advance(36)
    with router.acquire():  # no size in the spec: the entry's resources
        clock.advance(72)
    wait_until(lambda: len(fired(events, "released")) == 2)
    first, second = fired(events, "released")
    assert first["seconds"] == pytest.approx(36)
    assert first["cost"] == pytest.approx((4 * 1.0 + 2 * 0.5) * 36 / 3600 + 0.01)
    assert second["cost"] == pytest.approx((2 * 1.0 + 4 * 0.5) * 72 / 3600 + 0.01)
    assert first["pool"] == second["pool"] == "dear"


def test_status_shows_each_price_and_the_window_spend(make_router, scripted, clock) -> None:
    router = make_router(
        providers={"dear": scripted("dear"), "free": scripted("free")},
        chain=[
            chain()[0],
            {"name": "free", "provider": "runloop", "options": {"api_key": "k" * 20}},
        ],
    )
    with router.acquire():
        clock.advance(120)
    with router.acquire():
        clock.advance(60)
    dear, free = router.status().entries
    assert dear.price is not None
    assert dear.price.vcpu_hour == 1.0
    assert dear.hourly_usd == pytest.approx(2 * 1.0 + 4 * 0.5)
    assert dear.spend_usd == pytest.approx(4.0 * 180 / 3600 + 2 * 0.01)
    assert free.price is None
    assert "costs nothing" in free.price_source
    assert free.spend_usd == 0
