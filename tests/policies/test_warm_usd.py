"""Warm pools in a pool with a usd budget (`policies.warm` over `policies.quota`)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from policies import quota, warm
from policies.quota import Limits, Meter, PoolState
from policies.warm import WarmRecord

# $0.01 a second, $0.50 a sandbox; a warm sandbox's first cover is its whole stay (100 s).
WARM = Meter(0.01, 0.5, 0.0, 100.0, 60.0)
LEASE = Meter(0.01, 0.5, 0.0, 60.0, 60.0)  # the acquire's: 60 s, renewed by 60 s


def made(pool: PoolState, limits: Limits, lease_id: str, now: float, *, paused: bool = False):
    """The refill's reservation, commit and put of one warm sandbox."""
    granted = quota.reserve(pool, limits, lease_id, "e", now, 10.0, meter=WARM)
    if isinstance(granted, quota.QuotaDenial):
        return granted
    quota.commit(pool, lease_id, now, 100.0, f"sb-{lease_id}", limits)
    records: dict[str, WarmRecord] = {}
    record = WarmRecord(f"sb-{lease_id}", now, now + 80.0, now + 100.0, paused)
    assert warm.put(pool, records, lease_id, record)
    return records


def test_a_warm_sandbox_holds_its_fee_and_whole_stay_from_its_reservation() -> None:
    pool, limits = PoolState("w"), Limits(usd=3.0)
    records = made(pool, limits, "w1", 0.0)
    assert pool.usd_held == pytest.approx(0.5 + 1.0)
    # a second one's $1.50 would pass the $3 with the first's: refused at its reservation
    assert isinstance(made(pool, Limits(usd=2.9), "w2", 0.0), quota.QuotaDenial)
    assert isinstance(records, dict)


def test_a_claim_charges_the_idle_time_and_holds_the_leases_cover() -> None:
    pool, limits = PoolState("w"), Limits(usd=3.0)
    records = made(pool, limits, "w1", 0.0)
    claim = warm.claim(pool, limits, records, "e", 30.0, 10.0, LEASE)
    assert claim is not None
    assert claim.metered == 30.0
    assert pool.usd == pytest.approx(0.5 + 0.30)  # the fee and 30 idle seconds
    assert pool.usd_held == pytest.approx(0.60)  # the lease's 60 s, no second fee
    quota.commit(pool, "w1", 31.0, 20.0, "sb-w1", limits)
    assert quota.release(pool, "w1", 41.0) == 10.0
    assert pool.usd == pytest.approx(0.5 + 0.30 + 0.10)
    assert pool.usd_held == 0


def test_a_claim_the_budget_cannot_cover_is_skipped() -> None:
    pool, limits = PoolState("w"), Limits(usd=1.6)
    records = made(pool, limits, "w1", 0.0)
    # after its settlement $0.50 + $0.30 spent; the lease's $0.60 cover would pass $1.60 by
    # nothing, a $0.90 one would: the claim is skipped, the record stays
    dear = Meter(0.015, 0.0, 0.0, 60.0, 60.0)
    assert warm.claim(pool, limits, records, "e", 30.0, 10.0, dear) is None
    assert set(records) == {"w1"}
    assert pool.usd == 0
    assert warm.claim(pool, limits, records, "e", 30.0, 10.0, LEASE) is not None


def test_a_paused_warm_sandbox_is_charged_until_its_pause_and_its_claim_holds_a_cover() -> None:
    pool, limits = PoolState("w"), Limits(usd=3.0)
    pool_records = made(pool, limits, "w1", 0.0, paused=True)
    assert isinstance(pool_records, dict)
    assert pool.usd == pytest.approx(0.5)
    assert pool.usd_held == 0
    claim = warm.claim(pool, limits, pool_records, "e", 50.0, 10.0, LEASE)
    assert claim is not None
    assert claim.paused
    assert pool.usd_held == pytest.approx(0.60)


def test_taking_a_warm_sandbox_to_kill_it_settles_its_idle_time() -> None:
    pool, limits = PoolState("w"), Limits(usd=3.0)
    records = made(pool, limits, "w1", 0.0)
    assert warm.take(pool, records, "w1", 80.0) == 80.0
    assert pool.usd == pytest.approx(0.5 + 0.80)
    assert pool.usd_held == 0


@given(
    claims=st.lists(st.tuples(st.floats(0, 99), st.booleans()), max_size=6),
    budget=st.floats(0.5, 6.0),
)
def test_warm_sandboxes_and_their_claims_never_pass_the_budget(
    claims: list[tuple[float, bool]], budget: float
) -> None:
    """Spent plus held stays within the budget whatever is made and claimed, when."""
    pool, limits = PoolState("w"), Limits(usd=budget)
    records: dict[str, WarmRecord] = {}
    for i, (_when, paused) in enumerate(claims):
        more = made(pool, limits, f"w{i}", 0.0, paused=paused)
        if isinstance(more, dict):
            records.update(more)
        assert pool.usd + pool.usd_held <= budget + 1e-9
    for when, _ in sorted(claims):
        warm.claim(pool, limits, records, "e", when, 10.0, LEASE)
        assert pool.usd + pool.usd_held <= budget + 1e-9
