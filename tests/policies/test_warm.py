"""When a warm pool is drained: `failing` for the router's own pools, `vendor_pool` for
one the vendor holds (every combination of breaker, block and used-up unit)."""

from __future__ import annotations

import itertools

import pytest

from policies.breaker import EXHAUSTED, MISCONFIGURED, BreakerState, Circuit
from policies.quota import Limits
from policies.warm import failing, vendor_pool

NOW = 1000.0
LIMITS = Limits(sessions=10, sandbox_seconds=100.0, concurrent=2)

BREAKERS = {
    "closed": (BreakerState(), None),
    "open": (BreakerState(circuit=Circuit.OPEN, open_until=NOW + 5), "open"),
    "open, cooled": (BreakerState(circuit=Circuit.OPEN, open_until=NOW - 1), None),
    "half-open": (BreakerState(circuit=Circuit.HALF_OPEN), None),
    "misconfigured": (BreakerState(block=MISCONFIGURED), MISCONFIGURED),
    "exhausted": (BreakerState(block=EXHAUSTED, block_until=NOW + 60), EXHAUSTED),
    "exhausted, reset": (BreakerState(block=EXHAUSTED, block_until=NOW - 1), None),
    "rate limited": (BreakerState(block="rate_limited", block_until=NOW + 60), None),
}
USED = {
    "nothing": ({}, None, None),
    "sessions": ({"sessions": 10.0}, None, "sessions"),
    "seconds": ({"sandbox_seconds": 100.0}, "quota", "quota"),
    "concurrent": ({"concurrent": 2.0}, None, None),
}


@pytest.mark.parametrize(("breaker", "used"), list(itertools.product(BREAKERS, USED)))
def test_what_drains_a_pool(breaker: str, used: str) -> None:
    health, broken = BREAKERS[breaker]
    spent, ours, vendors = USED[used]
    assert failing(health, spent, LIMITS, NOW) == (broken or ours)
    why = broken or vendors
    assert vendor_pool(3, health, spent, LIMITS, NOW) == ((0, why) if why else (3, None))


def test_unlimited_units_never_drain() -> None:
    spent = {"sessions": 1e9, "sandbox_seconds": 1e9, "concurrent": 1e9}
    assert failing(BreakerState(), spent, Limits(), NOW) is None
    assert vendor_pool(4, BreakerState(), spent, Limits(), NOW) == (4, None)
