"""Prices, metering and a lease's cost (pure): costs match the price table."""

from __future__ import annotations

import itertools
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from policies.ordering import Candidate, order
from policies.pricing import (
    DEFAULTS,
    ESTIMATE_SECONDS,
    Metering,
    Price,
    Resources,
    Tariff,
    estimate,
    lease_cost,
    metered,
    rate,
    resources,
    tariff,
    window_spend,
)

money = st.floats(0, 100, allow_nan=False)
seconds = st.floats(0, 30 * 24 * 3600, allow_nan=False)


def test_e2b_matches_its_published_example() -> None:
    """E2B's billing page: 8 vCPU and 4 GB cost $0.468 per hour while running."""
    t = tariff("e2b")
    res = resources(t, cpu=8, memory_mb=4096)
    assert lease_cost(t, res, 3600) == pytest.approx(0.468)
    assert rate(t.price, res) == pytest.approx(8 * 0.000014 + 4 * 0.0000045)


def test_e2b_bills_whole_seconds_of_its_default_size() -> None:
    t = tariff("e2b")
    assert t.size == Resources(2.0, 0.5)
    per_second = (2 * 0.0504 + 0.5 * 0.0162) / 3600
    assert lease_cost(t, t.size, 10) == pytest.approx(10 * per_second)
    assert lease_cost(t, t.size, 10.2) == pytest.approx(11 * per_second)


def test_modal_cpu_is_physical_cores_of_two_vcpus() -> None:
    t = tariff("modal")
    res = resources(t, cpu=1, memory_mb=1024)
    assert res.vcpu == 2
    # one core-second at the Sandbox rate, one GiB-second of memory
    assert lease_cost(t, res, 1) == pytest.approx(0.0000393 + 0.00000672)
    assert resources(t) == Resources(0.25, 0.125)  # Modal's default request, 0.125 cores


def test_daytona_bills_whole_minutes_rounded_up() -> None:
    t = tariff("daytona")
    minute = (0.0504 + 0.0162) / 60  # 1 vCPU, 1 GiB
    assert lease_cost(t, t.size, 1) == pytest.approx(minute)
    assert lease_cost(t, t.size, 60) == pytest.approx(minute)
    assert lease_cost(t, t.size, 61) == pytest.approx(2 * minute)
    assert lease_cost(t, t.size, 0) == 0


def test_gpus_by_type_and_count() -> None:
    t = tariff("modal", {"gpu_hour": {"A100": 2.0}})
    two = resources(t, cpu=1, memory_mb=1024, gpu="A100:2")
    one = resources(t, cpu=1, memory_mb=1024, gpu="A100")
    assert (two.gpu, two.gpus, one.gpus) == ("A100", 2, 1)
    assert rate(t.price, two) - rate(t.price, one) == pytest.approx(2.0 / 3600)
    assert t.price is not None
    assert t.price.gpu_hour["H100"] == 3.95
    unpriced = resources(t, gpu="B200")
    assert rate(t.price, unpriced) == rate(t.price, resources(t))  # an unpriced type is free


def test_local_is_free_and_runloop_unpriced() -> None:
    local = tariff("local")
    assert local.price == Price()
    assert lease_cost(local, local.size, 3600) == 0
    runloop = tariff("runloop")
    assert runloop.price is None
    assert "costs nothing" in runloop.source
    assert lease_cost(runloop, runloop.size, 3600) == 0
    assert window_spend(runloop, 3600, 5) == 0


def test_config_keys_override_the_default_one_by_one() -> None:
    t = tariff("e2b", {"vcpu_hour": 0.04, "per_sandbox": 0.001})
    assert t.price == Price(0.04, 0.0162, {}, 0.001, 0.0)
    assert t.source == "config over the vendor's published price"
    own = tariff("runloop", {"vcpu_hour": 0.1})
    assert own.price == Price(vcpu_hour=0.1)
    assert own.source == "config"


def test_the_entry_size_stands_in_for_a_spec_without_one() -> None:
    t = tariff("e2b", size=Resources(8, 16, "T4", 1))
    assert resources(t) == Resources(8, 16, "T4", 1)
    assert resources(t, cpu=1) == Resources(1, 16, "T4", 1)
    assert resources(t, memory_mb=512, gpu="L4") == Resources(8, 0.5, "L4", 1)


def test_estimate_uses_the_lifetime_else_five_minutes() -> None:
    t = tariff("daytona", {"per_sandbox": 0.01})
    assert estimate(t, t.size) == lease_cost(t, t.size, ESTIMATE_SECONDS)
    assert estimate(t, t.size, 30) == lease_cost(t, t.size, 60)


@given(seconds, st.sampled_from([None, 1.0, 60.0, 3600.0]))
def test_metering_never_bills_less_nor_a_whole_step_more(s: float, step: float | None) -> None:
    billed = metered(s, Metering(step=step))
    assert billed >= s - 1e-6 * max(s, 1)
    if step is None:
        assert billed == s
    else:
        assert billed < s + step + 1e-6
        assert math.isclose(billed / step, round(billed / step))


@given(money, money, money, st.floats(0.01, 64), st.floats(0.01, 256), seconds, seconds)
def test_cost_is_linear_in_time_and_resources(
    cpu: float, mem: float, fee: float, vcpu: float, gib: float, s1: float, s2: float
) -> None:
    t = Tariff(Price(cpu, mem, {}, fee), Metering(), Resources(vcpu, gib), "test")
    res = resources(t)
    assert lease_cost(t, res, s1) == pytest.approx((cpu * vcpu + mem * gib) * s1 / 3600 + fee)
    if s1 <= s2:
        assert lease_cost(t, res, s1) <= lease_cost(t, res, s2) + 1e-9
    double = Resources(2 * vcpu, 2 * gib)
    assert lease_cost(t, double, s1) - fee == pytest.approx(2 * (lease_cost(t, res, s1) - fee))


@given(st.sampled_from(sorted(DEFAULTS)), seconds, st.floats(0, 1e6, allow_nan=False))
def test_window_spend_prices_the_default_size(provider: str, s: float, sessions: float) -> None:
    t = tariff(provider)
    assert t.price is not None
    expected = rate(t.price, t.size) * s + t.price.per_sandbox * sessions
    assert window_spend(t, s, sessions) == pytest.approx(expected)


def test_cheapest_orders_by_price_ties_in_chain_order() -> None:
    cands = [
        Candidate("a", None, frozenset(), price=0.3),
        Candidate("b", None, frozenset(), price=0.1),
        Candidate("c", None, frozenset(), price=0.3),
        Candidate("d", None, frozenset(), price=0.0),
    ]
    assert order(cands, "cheapest")[0] == ["d", "b", "a", "c"]
    assert order(cands, "ordered")[0] == ["a", "b", "c", "d"]


def test_cheapest_skips_unconfigured_and_incapable_entries() -> None:
    cands = [
        Candidate("free", "no API key", frozenset({"pause"}), price=0.0),
        Candidate("cheap", None, frozenset(), price=0.1),
        Candidate("dear", None, frozenset({"pause"}), price=0.5),
    ]
    names, skipped = order(cands, "cheapest", ["pause"])
    assert names == ["dear"]
    assert skipped == {"free": "not configured: no API key", "cheap": "lacks capability pause"}


@given(
    st.lists(
        st.tuples(st.booleans(), st.booleans(), st.floats(0, 10, allow_nan=False)), max_size=12
    )
)
def test_cheapest_is_a_stable_sort_of_the_usable(rows: list[tuple[bool, bool, float]]) -> None:
    cands = [
        Candidate(
            f"e{i}",
            None if configured else "missing",
            frozenset({"x"}) if capable else frozenset(),
            price=price,
        )
        for i, (configured, capable, price) in enumerate(rows)
    ]
    names, skipped = order(cands, "cheapest", ["x"])
    usable = [c for c in cands if c.unconfigured is None and "x" in c.capabilities]
    assert names == [c.name for c in sorted(usable, key=lambda c: c.price)]
    assert set(names) | set(skipped) == {c.name for c in cands}
    assert not set(names) & set(skipped)
    prices = [next(c.price for c in cands if c.name == n) for n in names]
    assert prices == sorted(prices)
    for a, b in itertools.pairwise(names):
        pa = next(c.price for c in cands if c.name == a)
        pb = next(c.price for c in cands if c.name == b)
        if pa == pb:
            assert int(a[1:]) < int(b[1:])
