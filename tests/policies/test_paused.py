"""Paused storage's holds (pure): beside the leases' holds, never past the budget, each
settled to at most what it held."""

from __future__ import annotations

import pytest
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from policies import paused, quota
from policies.paused import LAPSE_GRACE, PausedHold
from policies.quota import Grant, Limits, Meter, PoolState, QuotaDenial
from policies.tenants import TenantDenial, TenantLimits, TenantState

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


def test_a_tenants_pause_is_held_against_its_budget_too_all_or_nothing() -> None:
    """The pool has room, the tenant has not: refused, neither ledger changes; with room
    in both, both hold it and the settle charges both the same."""
    pool, holds, tenant = PoolState("w"), {}, TenantState("w", usd=0.5)
    mine = PausedHold("e", 0.0, 3600.0, 0.0001, tenant="t")
    tight, room = (tenant, TenantLimits(usd=0.8)), (tenant, TenantLimits(usd=0.9))
    assert paused.hold(pool, holds, "sb", mine, Limits(usd=5.0), tight) == TenantDenial(
        "usd", 0.5, 0.8
    )
    assert (pool.usd_held, holds, tenant.usd_held, tenant.paused) == (0.0, {}, 0.0, {})
    assert paused.hold(pool, holds, "sb", mine, Limits(usd=5.0), room) is None
    assert (pool.usd_held, tenant.usd_held) == (pytest.approx(0.36), pytest.approx(0.36))
    assert paused.settle(pool, holds, "sb", 900.0, tenant) == pytest.approx(0.09)
    assert (pool.usd, tenant.usd) == (pytest.approx(0.09), pytest.approx(0.59))
    assert (pool.usd_held, tenant.usd_held, tenant.paused) == (0.0, 0.0, {})


def test_a_tenants_copy_settled_without_it_lapses_charged_whole() -> None:
    """A settle that cannot name the tenant (its budget unknown there) charges the pool
    what was used; the tenant's copy is charged whole a grace past its end."""
    pool, holds, tenant = PoolState("w"), {}, TenantState("w")
    mine = PausedHold("e", 0.0, 3600.0, 0.0001, tenant="t")
    paused.hold(pool, holds, "sb", mine, Limits(), (tenant, TenantLimits()))
    assert paused.settle(pool, holds, "sb", 900.0) == pytest.approx(0.09)
    assert paused.purge_expired(tenant, tenant.paused, 3600.0 + LAPSE_GRACE - 1) == 0
    assert paused.purge_expired(tenant, tenant.paused, 3600.0 + LAPSE_GRACE) == 1
    assert (tenant.usd, tenant.usd_held, pool.usd) == pytest.approx((0.36, 0.0, 0.09))


METER = Meter(0.01, 0.2, 0.0, 30.0, 30.0, kill=True)
SANDBOXES = st.sampled_from(["sa", "sb", "sc"])


class PausedMachine(RuleBasedStateMachine):
    """Leases and paused holds in one pool, some of them a tenant's, at random: what was
    spent plus what is held never passes the pool's budget nor the tenant's, each holds
    what its leases and holds hold, and no hold is charged more than it held."""

    def __init__(self) -> None:
        super().__init__()
        self.limits = Limits(usd=2.0)
        self.pool = PoolState("w")
        self.holds: dict[str, PausedHold] = {}
        self.tenant = TenantState("w")
        self.tenant_limits = TenantLimits(usd=0.8)
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

    @rule(
        sandbox=SANDBOXES,
        seconds=st.floats(1, 5000),
        rate=st.floats(0.00001, 0.001),
        tenants=st.booleans(),
    )
    def pause(self, sandbox: str, seconds: float, rate: float, tenants: bool) -> None:
        new = PausedHold("e", self.now, self.now + seconds, rate, "t" if tenants else None)
        before = (self.pool.usd + self.pool.usd_held, self.tenant.usd + self.tenant.usd_held)
        also = (self.tenant, self.tenant_limits) if tenants else None
        denial = paused.hold(self.pool, self.holds, sandbox, new, self.limits, also)
        if denial is not None:
            after = (self.pool.usd + self.pool.usd_held, self.tenant.usd + self.tenant.usd_held)
            assert after == before
            assert self.holds.get(sandbox) != new

    @rule(sandbox=SANDBOXES, named=st.booleans())
    def settle(self, sandbox: str, named: bool) -> None:
        found = self.holds.get(sandbox)
        tenant = self.tenant if named and found is not None and found.tenant else None
        charged = paused.settle(self.pool, self.holds, sandbox, self.now, tenant)
        assert (charged is None) == (found is None)
        if found is not None:
            assert 0.0 <= charged <= found.held() + 1e-12  # type: ignore[operator]

    @rule(dt=st.sampled_from([0.0, 10.0, 600.0, 5000.0, LAPSE_GRACE]))
    def advance(self, dt: float) -> None:
        self.now += dt
        quota.purge_expired(self.pool, self.now)
        paused.purge_expired(self.pool, self.holds, self.now)
        paused.purge_expired(self.tenant, self.tenant.paused, self.now)

    @invariant()
    def never_past_the_budget(self) -> None:
        assert self.pool.usd + self.pool.usd_held <= 2.0 + 1e-9
        assert self.tenant.usd + self.tenant.usd_held <= 0.8 + 1e-9

    @invariant()
    def the_tenant_holds_its_copies(self) -> None:
        held = sum(h.held() for h in self.tenant.paused.values())
        assert self.tenant.usd_held == pytest.approx(held, abs=1e-9)

    @invariant()
    def the_pool_holds_what_its_leases_and_pauses_hold(self) -> None:
        held = sum(s.hold() for s in self.pool.leases.values())
        held += sum(h.held() for h in self.holds.values())
        assert self.pool.usd_held == pytest.approx(held, abs=1e-9)


TestPaused = PausedMachine.TestCase
