"""Paused storage's holds (pure): beside the leases' holds, never past the budget, each
settled to at most what it held."""

from __future__ import annotations

import pytest
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from policies import paused, quota
from policies.paused import LAPSE_GRACE, PausedHold
from policies.quota import Grant, Limits, Meter, PoolState, QuotaDenial

HOUR = PausedHold("e", 0.0, 3600.0, 0.0001)  # $0.36


def test_a_hold_is_refused_when_the_budget_has_no_room_and_nothing_changes() -> None:
    pool, holds = PoolState("w", usd=0.5), {}
    assert paused.hold(pool, holds, "sb", HOUR, Limits(usd=0.8)) == QuotaDenial("usd", 0.5, 0.8)
    assert (pool.usd, pool.usd_held, holds) == (0.5, 0.0, {})
    assert paused.hold(pool, holds, "sb", HOUR, Limits(usd=0.87)) is None
    assert pool.usd_held == pytest.approx(0.36)


@pytest.mark.parametrize(
    ("now", "charged"), [(-5.0, 0.0), (0.0, 0.0), (900.0, 0.09), (3600.0, 0.36), (9e9, 0.36)]
)
def test_a_settle_charges_the_storage_used_never_past_the_holds_end(
    now: float, charged: float
) -> None:
    pool, holds = PoolState("w"), {}
    paused.hold(pool, holds, "sb", HOUR, Limits())
    assert paused.settle(pool, holds, "sb", now) == pytest.approx(charged)
    assert (pool.usd, pool.usd_held) == (pytest.approx(charged), 0.0)
    assert paused.settle(pool, holds, "sb", now) is None


def test_a_sandbox_paused_again_settles_its_first_hold_counting_what_that_frees() -> None:
    pool, holds = PoolState("w"), {}
    paused.hold(pool, holds, "sb", HOUR, Limits())
    again = PausedHold("e", 1800.0, 5400.0, 0.0001)
    assert paused.hold(pool, holds, "sb", again, Limits(usd=0.54)) is None  # 0.18 freed
    assert (pool.usd, pool.usd_held) == (pytest.approx(0.18), pytest.approx(0.36))


def test_only_holds_a_grace_past_their_end_are_purged() -> None:
    pool, holds = PoolState("w"), {}
    paused.hold(pool, holds, "a", HOUR, Limits())
    paused.hold(pool, holds, "b", PausedHold("e", 0.0, 7200.0, 0.0001), Limits())
    assert paused.purge_expired(pool, holds, 3600.0 + LAPSE_GRACE - 1) == 0
    assert paused.purge_expired(pool, holds, 3600.0 + LAPSE_GRACE) == 1
    assert (set(holds), pool.usd, pool.usd_held) == ({"b"}, pytest.approx(0.36), 0.72)


METER = Meter(0.01, 0.2, 0.0, 30.0, 30.0, kill=True)
SANDBOXES = st.sampled_from(["sa", "sb", "sc"])


class PausedMachine(RuleBasedStateMachine):
    """Leases and paused holds in one pool, at random: what was spent plus what is held
    never passes the budget, the pool holds what its leases and holds hold, and no hold
    is charged more than it held."""

    def __init__(self) -> None:
        super().__init__()
        self.limits = Limits(usd=2.0)
        self.pool = PoolState("w")
        self.holds: dict[str, PausedHold] = {}
        self.now = 0.0
        self.next_id = 0

    @rule(ttl=st.floats(1, 60))
    def lease(self, ttl: float) -> None:
        lid = f"l{self.next_id}"
        self.next_id += 1
        if isinstance(
            quota.reserve(self.pool, self.limits, lid, "e", self.now, 10, meter=METER), Grant
        ):
            quota.commit(self.pool, lid, self.now, ttl, limits=self.limits)

    @precondition(lambda self: self.pool.leases)
    @rule(data=st.data())
    def release(self, data: st.DataObject) -> None:
        lid = data.draw(st.sampled_from(sorted(self.pool.leases)))
        quota.release(self.pool, lid, self.now)

    @rule(sandbox=SANDBOXES, seconds=st.floats(1, 5000), rate=st.floats(0.00001, 0.001))
    def pause(self, sandbox: str, seconds: float, rate: float) -> None:
        new = PausedHold("e", self.now, self.now + seconds, rate)
        before = self.pool.usd + self.pool.usd_held
        denial = paused.hold(self.pool, self.holds, sandbox, new, self.limits)
        if denial is not None:
            assert self.pool.usd + self.pool.usd_held == before
            assert self.holds.get(sandbox) != new

    @rule(sandbox=SANDBOXES)
    def settle(self, sandbox: str) -> None:
        found = self.holds.get(sandbox)
        charged = paused.settle(self.pool, self.holds, sandbox, self.now)
        assert (charged is None) == (found is None)
        if found is not None:
            assert 0.0 <= charged <= found.held() + 1e-12  # type: ignore[operator]

    @rule(dt=st.sampled_from([0.0, 10.0, 600.0, 5000.0, LAPSE_GRACE]))
    def advance(self, dt: float) -> None:
        self.now += dt
        quota.purge_expired(self.pool, self.now)
        paused.purge_expired(self.pool, self.holds, self.now)

    @invariant()
    def never_past_the_budget(self) -> None:
        assert self.pool.usd + self.pool.usd_held <= 2.0 + 1e-9

    @invariant()
    def the_pool_holds_what_its_leases_and_pauses_hold(self) -> None:
        held = sum(s.hold() for s in self.pool.leases.values())
        held += sum(h.held() for h in self.holds.values())
        assert self.pool.usd_held == pytest.approx(held, abs=1e-9)


TestPaused = PausedMachine.TestCase
