"""The memory of exhausted pools (pure): by example, and as a state machine against a model."""

from __future__ import annotations

import pytest
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from policies.exhausted import ExhaustedPools
from policies.quota import Limits

LIMITS = Limits(sessions=3)
RAISED = Limits(sessions=5)


def spent(recheck: float = 10.0) -> ExhaustedPools:
    pools = ExhaustedPools(recheck)
    pools.note("p", LIMITS, "sessions", 3, 3, until=100.0, version=2, now=0.0)
    return pools


def test_a_noted_pool_is_skipped_until_recheck() -> None:
    pools = spent()
    known = pools.lookup("p", LIMITS, 9.9)
    assert known is not None
    assert (known.unit, known.used, known.limit) == ("sessions", 3, 3)
    assert pools.lookup("p", LIMITS, 10.0) is None
    assert "p" not in pools


def test_the_window_end_forgets_it() -> None:
    pools = spent(recheck=1000)
    assert pools.lookup("p", LIMITS, 99.0) is not None
    assert pools.lookup("p", LIMITS, 100.0) is None


def test_other_limits_forget_it() -> None:
    assert spent().lookup("p", RAISED, 1.0) is None


def test_a_new_version_or_room_in_a_status_forgets_it() -> None:
    pools = spent()
    pools.observe("p", 2, {"sessions": 3})
    assert "p" in pools
    pools.observe("p", 3, {"sessions": 3})
    assert "p" not in pools
    pools = spent()
    pools.observe("p", 2, {"sessions": 2})  # a refund gave one back
    assert "p" not in pools
    pools.observe("q", 9, {})  # unknown pools are ignored


def test_concurrency_and_past_windows_are_never_remembered() -> None:
    pools = ExhaustedPools(10)
    pools.note("p", LIMITS, "concurrent", 2, 2, until=100.0, version=0, now=0.0)
    pools.note("q", LIMITS, "sessions", 3, 3, until=5.0, version=0, now=5.0)
    assert len(pools) == 0


def test_a_grant_forgets_it() -> None:
    pools = spent()
    pools.forget("p")
    assert "p" not in pools


def test_recheck_must_be_positive() -> None:
    with pytest.raises(ValueError, match="recheck"):
        ExhaustedPools(0)


class Machine(RuleBasedStateMachine):
    """Random notes, observations, grants and time against a plain model of the rules."""

    def __init__(self) -> None:
        super().__init__()
        self.pools = ExhaustedPools(recheck=7.0)
        self.now = 0.0
        self.model: dict[str, tuple[str, float, float, int, Limits, float]] = {}

    @rule(
        pool=st.sampled_from("ab"),
        unit=st.sampled_from(["sessions", "sandbox_seconds", "concurrent"]),
        until=st.floats(0, 50),
        version=st.integers(0, 3),
        limits=st.sampled_from([LIMITS, RAISED]),
    )
    def note(self, pool: str, unit: str, until: float, version: int, limits: Limits) -> None:
        self.pools.note(pool, limits, unit, 3, 3, until, version, self.now)
        if unit != "concurrent" and self.now < until:
            self.model[pool] = (unit, 3, until, version, limits, self.now)

    @rule(pool=st.sampled_from("ab"), version=st.integers(0, 3), used=st.sampled_from([2, 3, 4]))
    def observe(self, pool: str, version: int, used: float) -> None:
        self.pools.observe(pool, version, {"sessions": used, "sandbox_seconds": used})
        known = self.model.get(pool)
        if known is not None and (version != known[3] or used < known[1]):
            del self.model[pool]

    @rule(pool=st.sampled_from("ab"))
    def forget(self, pool: str) -> None:
        self.pools.forget(pool)
        self.model.pop(pool, None)

    @rule(seconds=st.floats(0, 10))
    def advance(self, seconds: float) -> None:
        self.now += seconds

    @rule(pool=st.sampled_from("ab"), limits=st.sampled_from([LIMITS, RAISED]))
    def lookup(self, pool: str, limits: Limits) -> None:
        got = self.pools.lookup(pool, limits, self.now)
        known = self.model.get(pool)
        fresh = (
            known is not None
            and self.now < known[2]
            and self.now - known[5] < 7.0
            and known[4] == limits
        )
        if known is not None and not fresh:
            del self.model[pool]
        assert (got is not None) == fresh
        if got is not None:
            assert known is not None
            assert (got.unit, got.until, got.version) == known[:1] + known[2:4]

    @invariant()
    def same_pools(self) -> None:
        assert {p for p in "ab" if p in self.pools} == set(self.model)


TestMachine = Machine.TestCase
