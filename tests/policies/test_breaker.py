"""The breaker and block rules (pure), by example and as a state machine."""

from __future__ import annotations

import pytest
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from policies.breaker import BreakerConfig, BreakerState, Outcome, admit, clear_capacity, record
from policies.outcome import classify
from providers.errors import (
    AuthError,
    CapacityExceeded,
    NotFound,
    QuotaExceeded,
    RateLimited,
    SandboxError,
    Unavailable,
)

CFG = BreakerConfig(
    failure_threshold=3, failure_rate=0.5, window_seconds=60, min_calls=6,
    cooldown_base=10, cooldown_max=35, probe_timeout=5, capacity_cooldown=7,
)  # fmt: skip


def failures(state: BreakerState, n: int, t: float = 0.0) -> list[tuple[str, str] | None]:
    return [record(state, CFG, Outcome.TRANSIENT, t) for _ in range(n)]


def test_consecutive_failures_open_the_circuit() -> None:
    s = BreakerState()
    assert failures(s, 3) == [None, None, ("closed", "open")]
    assert (s.circuit, s.open_until, s.openings) == ("open", 10, 1)
    assert admit(s, CFG, 9.9, "").reason == "open"


def test_success_resets_the_consecutive_count() -> None:
    s = BreakerState()
    failures(s, 2)
    record(s, CFG, Outcome.SUCCESS, 0)
    failures(s, 2)
    assert s.circuit == "closed"


def test_failure_rate_over_the_window_opens_with_min_calls() -> None:
    s = BreakerState()
    for i in range(6):
        outcome = Outcome.TRANSIENT if i % 2 else Outcome.SUCCESS
        transition = record(s, CFG, outcome, i)
    assert transition == ("closed", "open")  # 3 of 6 failed: rate 0.5 with min_calls 6


def test_old_events_leave_the_window() -> None:
    s = BreakerState()
    for i in range(5):
        record(s, CFG, Outcome.TRANSIENT if i % 2 else Outcome.SUCCESS, i)
    assert record(s, CFG, Outcome.TRANSIENT, 100) is None  # the first five aged out


def test_half_open_admits_exactly_one_probe() -> None:
    s = BreakerState()
    failures(s, 3)
    first = admit(s, CFG, 10, "")
    assert (first.allowed, first.probe, first.transition) == (True, True, ("open", "half_open"))
    second = admit(s, CFG, 10, "")
    assert (second.allowed, second.reason, second.until) == (False, "half_open", 15)
    third = admit(s, CFG, 15, "")  # the probe was lost (timed out): another may go
    assert third.allowed
    assert third.probe


def test_probe_success_closes_failure_reopens_longer_up_to_the_cap() -> None:
    s = BreakerState()
    failures(s, 3)
    t = 10.0
    for openings, cooldown in [(2, 20), (3, 30), (4, 35), (5, 35)]:
        admit(s, CFG, t, "")
        assert record(s, CFG, Outcome.TRANSIENT, t) == ("half_open", "open")
        assert (s.openings, s.open_until) == (openings, t + cooldown)
        t += cooldown
    admit(s, CFG, t, "")
    assert record(s, CFG, Outcome.SUCCESS, t) == ("half_open", "closed")
    assert (s.openings, s.failures) == (0, 0)


def test_cooldown_deadline_only_extends() -> None:
    s = BreakerState(circuit="closed", open_until=500.0)
    failures(s, 3, t=0)
    assert s.open_until == 500.0


def test_auth_blocks_until_fingerprint_changes() -> None:
    s = BreakerState()
    record(s, CFG, Outcome.AUTH, 0, fingerprint="a", detail="401")
    assert admit(s, CFG, 1e9, "a").reason == "misconfigured"
    assert admit(s, CFG, 1e9, "b").allowed
    assert s.block == ""


@pytest.mark.parametrize(
    ("outcome", "until", "end"),
    [(Outcome.QUOTA, 900.0, 900.0), (Outcome.QUOTA, None, CFG.quota_default),
     (Outcome.RATE_LIMITED, 30.0, 30.0), (Outcome.RATE_LIMITED, None, CFG.rate_limit_default),
     (Outcome.CAPACITY, None, 7.0)],
)  # fmt: skip
def test_blocks_end_at_their_deadline(outcome: Outcome, until: float | None, end: float) -> None:
    s = BreakerState()
    record(s, CFG, outcome, 0, until=until)
    assert admit(s, CFG, end - 0.001, "").allowed is False
    assert admit(s, CFG, end, "").allowed
    assert s.circuit == "closed"


def test_a_shorter_block_never_shortens_a_longer_one() -> None:
    s = BreakerState()
    record(s, CFG, Outcome.RATE_LIMITED, 0, until=100)
    record(s, CFG, Outcome.RATE_LIMITED, 1, until=20)
    record(s, CFG, Outcome.CAPACITY, 1)
    assert (s.block, s.block_until) == ("rate_limited", 100)


def test_capacity_lifts_on_release() -> None:
    s = BreakerState()
    record(s, CFG, Outcome.CAPACITY, 0)
    clear_capacity(s)
    assert admit(s, CFG, 1, "").allowed


def test_neutral_outcomes_release_the_probe_without_counting() -> None:
    s = BreakerState()
    failures(s, 3)
    admit(s, CFG, 10, "")
    assert record(s, CFG, Outcome.NEUTRAL, 10) is None
    assert (s.circuit, s.failures, s.probe_until) == ("half_open", 0, 0)
    assert admit(s, CFG, 10, "").probe


def test_state_round_trips_through_json_shapes() -> None:
    s = BreakerState()
    failures(s, 2)
    assert BreakerState.from_dict(s.to_dict()) == s
    assert BreakerState.from_dict({"window": {}}).window == []  # Lua's cjson empty table
    assert BreakerState.from_dict(None) == BreakerState()


@pytest.mark.parametrize(
    ("error", "outcome", "retry_same", "fail_over"),
    [
        (Unavailable("x"), Outcome.TRANSIENT, True, True),
        (TimeoutError(), Outcome.TRANSIENT, True, True),
        (RateLimited("x"), Outcome.RATE_LIMITED, False, True),
        (CapacityExceeded("x"), Outcome.CAPACITY, False, True),
        (QuotaExceeded("x"), Outcome.QUOTA, False, True),
        (AuthError("x"), Outcome.AUTH, False, True),
        (NotFound("x"), Outcome.NEUTRAL, False, True),
        (SandboxError("x"), Outcome.NEUTRAL, False, False),
        (KeyError("bug"), Outcome.TRANSIENT, False, True),
    ],
)
def test_classify(error: Exception, outcome: Outcome, retry_same: bool, fail_over: bool) -> None:
    v = classify(error)
    assert (v.outcome, v.retry_same, v.fail_over) == (outcome, retry_same, fail_over)


class BreakerMachine(RuleBasedStateMachine):
    """Random outcomes and admissions over advancing time.

    Invariants: deadlines never shrink, the cooldown never exceeds its cap, at
    most one probe is admitted per probe window while half-open, a closed or
    half-open circuit is never admitted past an active block.
    """

    def __init__(self) -> None:
        super().__init__()
        self.s = BreakerState()
        self.now = 0.0
        self.open_until = 0.0
        self.probe_at: float | None = None

    @rule(dt=st.floats(0, 40))
    def advance(self, dt: float) -> None:
        self.now += dt

    @rule()
    def admit(self) -> None:
        circuit, block, block_until = self.s.circuit, self.s.block, self.s.block_until
        a = admit(self.s, CFG, self.now, "fp")
        if a.allowed and block:
            assert self.now >= block_until
        if circuit == "open" and self.now < self.s.open_until:
            assert not a.allowed
        if a.allowed and self.probe_at is not None:
            assert self.now >= self.probe_at + CFG.probe_timeout  # one probe at a time
        if a.probe:
            self.probe_at = self.now

    @rule(
        outcome=st.sampled_from([o for o in Outcome if o is not Outcome.AUTH]),
        until=st.none() | st.floats(0, 200),
    )
    def record(self, outcome: Outcome, until: float | None) -> None:
        record(self.s, CFG, outcome, self.now, until=until)
        self.probe_at = None  # the probe came back, whatever it said

    @invariant()
    def deadlines_only_extend(self) -> None:
        assert self.s.open_until >= self.open_until
        self.open_until = self.s.open_until

    @invariant()
    def cooldown_is_capped(self) -> None:
        if self.s.circuit == "open":
            assert self.s.open_until - self.now <= CFG.cooldown_max

    @invariant()
    def half_open_has_at_most_one_probe_window(self) -> None:
        if self.s.circuit == "half_open":
            assert self.s.probe_until <= self.now + CFG.probe_timeout


TestBreaker = BreakerMachine.TestCase
