"""A replica's outage share: the whole fleet never spends more than was left."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from policies.outage import Contact, OutageShare, outage_limits
from policies.quota import Limits


def contact(fleet: int, **used: float) -> Contact:
    return Contact(at=0.0, fleet=fleet, used={"p": used})


def test_a_fleet_of_eight_splits_what_was_left() -> None:
    limits = Limits(sessions=80, sandbox_seconds=1000.0, concurrent=16)
    got = outage_limits(limits, "p", contact(8, sessions=40, sandbox_seconds=200, concurrent=8),
                        OutageShare())  # fmt: skip
    assert got == Limits(sessions=5, sandbox_seconds=100.0, concurrent=1)


def test_unlimited_units_stay_unlimited_and_nothing_left_is_nothing() -> None:
    got = outage_limits(Limits(sessions=10), "p", contact(2, sessions=12), OutageShare())
    assert got == Limits(sessions=0, sandbox_seconds=None, concurrent=None)


def test_without_a_contact_the_blind_share_of_each_limit_applies() -> None:
    limits = Limits(sessions=80, concurrent=10)
    assert outage_limits(limits, "p", None, OutageShare(blind=0.25)) == Limits(20, None, 2)
    other_pool = contact(4, sessions=0)
    assert outage_limits(limits, "q", other_pool, OutageShare(blind=0.5)) == Limits(40, None, 5)


def test_floor_and_ceiling_clamp_the_fraction() -> None:
    assert OutageShare(ceiling=0.5).fraction(1) == 0.5
    assert OutageShare(floor=0.2).fraction(100) == 0.2
    assert OutageShare().fraction(0) == 1.0  # a fleet that lists nobody still has us


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"floor": -0.1}, "floor"),
        ({"ceiling": 1.5}, "ceiling"),
        ({"blind": 2.0}, "blind"),
        ({"floor": 0.6, "ceiling": 0.5}, "above ceiling"),
    ],
)
def test_bad_shares_are_refused(kwargs: dict[str, float], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        OutageShare(**kwargs)


@given(
    limit=st.integers(0, 10_000),
    used=st.integers(0, 12_000),
    fleet=st.integers(1, 200),
    ceiling=st.floats(0.0, 1.0),
)
def test_the_fleet_together_never_exceeds_what_was_left(
    limit: int, used: int, fleet: int, ceiling: float
) -> None:
    share = OutageShare(ceiling=ceiling)
    got = outage_limits(
        Limits(limit, float(limit), limit), "p",
        contact(fleet, sessions=used, sandbox_seconds=used, concurrent=used), share,
    )  # fmt: skip
    left = max(0, limit - used)
    for part in (got.sessions, got.sandbox_seconds, got.concurrent):
        assert part is not None
        assert 0 <= part * fleet <= left * (1 + 1e-9)
        assert part <= left * ceiling + 1e-9


def test_the_fleet_s_spend_since_the_contact_is_projected_to_the_outage() -> None:
    first = contact(4, sessions=10, sandbox_seconds=100, concurrent=3)
    second = first.then(10.0, 4, {"p": {"sessions": 30, "sandbox_seconds": 100, "concurrent": 5}})
    assert second.rate == {"p": {"sessions": 2.0, "sandbox_seconds": 0.0}}
    limits = Limits(sessions=80, sandbox_seconds=1000.0, concurrent=9)
    at_contact = outage_limits(limits, "p", second, OutageShare())
    assert at_contact == Limits(sessions=12, sandbox_seconds=225.0, concurrent=1)
    # 5 s after the contact the fleet has likely spent 10 more sessions
    later = outage_limits(limits, "p", second, OutageShare(), started=15.0)
    assert later == Limits(sessions=10, sandbox_seconds=225.0, concurrent=1)


def test_own_spend_and_a_margin_are_kept_back() -> None:
    lone = contact(1, sessions=0)
    assert outage_limits(Limits(sessions=6), "p", lone, OutageShare()).sessions == 6
    own = {"sessions": 1.0}  # this replica served one since its contact
    assert outage_limits(Limits(sessions=6), "p", lone, OutageShare(), own=own).sessions == 5
    busy = lone.then(1.0, 1, {"p": {"sessions": 4}})  # 4 a second
    assert outage_limits(Limits(sessions=10), "p", busy, OutageShare()).sessions == 6
    kept = outage_limits(Limits(sessions=10), "p", busy, OutageShare(), margin=0.5)
    assert kept.sessions == 4
