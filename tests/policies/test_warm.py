"""When a warm pool is drained: `failing` for the router's own pools, `vendor_pool` for
one the vendor holds (every combination of breaker, block and used-up unit)."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from policies.breaker import EXHAUSTED, MISCONFIGURED, BreakerState, Circuit
from policies.quota import Limits
from policies.warm import REACH_FRESH, WarmRecord, failing, fresh, reach, vendor_pool

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


def _record(sandbox_id: str, *, paused: bool = False, deadline: float = NOW + 60) -> WarmRecord:
    return WarmRecord(sandbox_id, NOW - 10, deadline, deadline + 30, paused=paused)


def test_reach_connects_to_the_claimable_running_ones_and_lets_go_of_the_rest() -> None:
    records = {
        "l1": _record("new"),
        "l2": _record("recent"),
        "l3": _record("aging"),
        "l4": _record("parked", paused=True),
        "l5": _record("idle", deadline=NOW),
    }
    held = {
        "recent": NOW - 1,
        "aging": NOW - REACH_FRESH / 2 - 1,
        "parked": NOW - 1,
        "claimed": NOW - 1,
        "idle": NOW - 1,
    }
    assert reach(records, held, NOW) == (["aging", "new"], ["claimed", "idle", "parked"])


def test_a_handle_stands_in_for_a_connect_only_while_fresh() -> None:
    assert fresh(NOW - REACH_FRESH, NOW)
    assert not fresh(NOW - REACH_FRESH - 0.001, NOW)


ids = st.sampled_from([f"sb{i}" for i in range(6)])


@given(
    records=st.dictionaries(
        st.sampled_from([f"l{i}" for i in range(6)]),
        st.builds(
            _record,
            ids,
            paused=st.booleans(),
            deadline=st.floats(NOW - 5, NOW + 5, allow_nan=False),
        ),
    ),
    held=st.dictionaries(ids, st.floats(NOW - 2 * REACH_FRESH, NOW, allow_nan=False)),
)
def test_after_a_reach_every_claimable_running_sandbox_has_a_fresh_handle_and_no_other_has_one(
    records: dict[str, WarmRecord], held: dict[str, float]
) -> None:
    due, drop = reach(records, held, NOW)
    assert not set(due) & set(drop)
    assert set(drop) <= set(held)
    after = {sid: at for sid, at in held.items() if sid not in drop} | dict.fromkeys(due, NOW)
    claimable = {r.sandbox_id for r in records.values() if not r.paused and r.deadline > NOW}
    assert set(after) == claimable
    assert all(fresh(at, NOW + REACH_FRESH / 2) for at in after.values())
    assert reach(records, after, NOW) == ([], [])
