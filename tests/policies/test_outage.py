"""A replica's outage share: the whole fleet never spends more than was left."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from policies.fleet import Registration
from policies.outage import Contact, OutageShare, outage_limits, spent_since
from policies.quota import Limits


def settled(fleet: int) -> Registration:
    """A view of ``fleet`` replicas, each of which has registered since this one joined."""
    return Registration(replicas=fleet, seq=10, joined=1, oldest=5)


def contact(fleet: int, **used: float) -> Contact:
    return Contact(fleet=settled(fleet), used={"p": used})


def test_a_fleet_of_eight_splits_what_was_left() -> None:
    limits = Limits(sessions=80, sandbox_seconds=1000.0, concurrent=16)
    got = outage_limits(limits, "p", contact(8, sessions=40, sandbox_seconds=200, concurrent=8),
                        OutageShare())  # fmt: skip
    assert got == Limits(sessions=5, sandbox_seconds=100.0, concurrent=1)


def test_unlimited_units_stay_unlimited_and_nothing_left_is_nothing() -> None:
    got = outage_limits(Limits(sessions=10), "p", contact(2, sessions=12), OutageShare())
    assert got == Limits(sessions=0, sandbox_seconds=None, concurrent=None)


def test_a_replica_that_has_not_seen_the_fleet_grants_nothing_by_default() -> None:
    limits = Limits(sessions=80, sandbox_seconds=100.0, concurrent=10)
    nothing = Limits(0, 0.0, 0)
    assert outage_limits(limits, "p", None, OutageShare()) == nothing  # never reached the store
    young = Contact(Registration(replicas=1, seq=3, joined=3, oldest=3), {"p": {}})
    assert outage_limits(limits, "p", young, OutageShare()) == nothing  # not settled
    other_pool = contact(4, sessions=0)
    assert outage_limits(limits, "q", other_pool, OutageShare()) == nothing


def test_the_blind_share_is_opt_in_and_counts_the_limit_not_what_was_left() -> None:
    limits = Limits(sessions=80, concurrent=10)
    assert outage_limits(limits, "p", None, OutageShare(blind=0.25)) == Limits(20, None, 2)
    young = Contact(Registration(replicas=8, seq=9, joined=9, oldest=2), {"p": {}})
    assert outage_limits(limits, "p", young, OutageShare(blind=0.5)) == Limits(40, None, 5)


def test_the_expected_fleet_is_the_least_a_share_divides_by() -> None:
    limits = Limits(sessions=80)
    alone = contact(1, sessions=20)
    assert outage_limits(limits, "p", alone, OutageShare()).sessions == 60
    assert outage_limits(limits, "p", alone, OutageShare(expected=8)).sessions == 7
    bigger = contact(12, sessions=20)
    assert outage_limits(limits, "p", bigger, OutageShare(expected=8)).sessions == 5


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
        ({"expected": 0}, "at least 1"),
        ({"expected": 2.5}, "whole number"),
        ({"expected": True}, "whole number"),
    ],
)
def test_bad_shares_are_refused(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        OutageShare(**kwargs)  # type: ignore[arg-type]


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


def test_own_spend_comes_off_the_share_whole() -> None:
    lone = contact(1, sessions=0)
    assert outage_limits(Limits(sessions=6), "p", lone, OutageShare()).sessions == 6
    own = {"sessions": 1.0}  # this replica served one since the fleet's oldest contact
    assert outage_limits(Limits(sessions=6), "p", lone, OutageShare(), own=own).sessions == 5
    four = contact(4, sessions=0)
    assert outage_limits(Limits(sessions=40), "p", four, OutageShare(), own=own).sessions == 9
    much = {"sessions": 30.0}
    assert outage_limits(Limits(sessions=40), "p", four, OutageShare(), own=much).sessions == 0


def test_own_spend_counts_from_the_span_the_oldest_contact_fell_in() -> None:
    spans = [(0, {"p": {"sessions": 1.0}}), (4, {"p": {"sessions": 2.0}}),
             (9, {"p": {"sessions": 3.0}, "q": {"sessions": 7.0}}), (15, {})]  # fmt: skip
    assert spent_since(spans, 9, "p") == {"sessions": 3.0}
    assert spent_since(spans, 8, "p") == {"sessions": 5.0}  # when in 4..9 is not known
    assert spent_since(spans, 3, "p") == {"sessions": 6.0}
    assert spent_since(spans, 20, "p") == {}
    assert spent_since(spans, 20, "q") == {}
    assert spent_since(spans, 9, "q") == {"sessions": 7.0}
