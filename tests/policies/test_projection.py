"""Projected month-end spend (`policies.quota.projected_spend`)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from policies.quota import MonthlyWindow, projected_spend

DAY = 86400.0


@pytest.mark.parametrize(
    ("spent", "now", "expected"),
    [
        (10.0, 10 * DAY, 30.0),  # a third of a 30-day window: three times as much
        (10.0, 15 * DAY, 20.0),
        (10.0, 30 * DAY, 10.0),  # the window's end: what was spent
        (10.0, 31 * DAY, 10.0),  # past it
        (10.0, 0.0, 10.0),  # at its start: no rate to go on
        (0.0, 10 * DAY, 0.0),
        (-1.0, 10 * DAY, 0.0),  # a ledger overwritten below 0 projects nothing
    ],
)
def test_projected_spend(spent: float, now: float, expected: float) -> None:
    assert projected_spend(spent, 0.0, 30 * DAY, now) == pytest.approx(expected)


@given(
    spent=st.floats(0, 1e6),
    elapsed=st.floats(1.0, 31 * DAY),
    left=st.floats(0, 31 * DAY),
)
def test_projection_grows_with_time_left_and_never_falls_below_the_spend(
    spent: float, elapsed: float, left: float
) -> None:
    now = 1e9
    projected = projected_spend(spent, now - elapsed, now + left, now)
    assert projected >= spent
    later = projected_spend(spent, now - elapsed, now + left + DAY, now)
    assert later >= projected
    # the same spend over a longer past is a slower rate: a smaller projection
    assert projected_spend(spent, now - elapsed - DAY, now + left, now) <= projected


def test_a_pool_window_projects_to_its_reset() -> None:
    """From a pool's window bounds, as `Router.status` and the metrics take them."""
    window = MonthlyWindow("UTC", 1)
    start, end = (t.timestamp() for t in window.bounds(1_700_000_000.0))  # 2023-11-14
    now = start + 10 * DAY  # November has 30 days
    assert projected_spend(5.0, start, end, now) == pytest.approx(15.0)
