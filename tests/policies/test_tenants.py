"""The tenant ledger (`policies.tenants`) against its pool's, as a state machine."""

from __future__ import annotations

import functools
from datetime import datetime
from zoneinfo import ZoneInfo

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from policies import quota, tenants
from policies.quota import Limits, Meter, PoolState
from policies.tenants import DailyWindow, TenantLimits, TenantState, valid_name

START = 1_790_000_000.0
KILLED = [  # every meter ends its lease when a renewal does not fit: no overdraft
    Meter(0.013, 0.5, 0.0, 20.0, 15.0, kill=True),
    Meter(0.05, 0.1, 60.0, 30.0, 30.0, kill=True),
    Meter(0.0, 0.25, kill=True),
]


class PoolAndTenant(RuleBasedStateMachine):
    """One pool and one tenant, every lease the tenant's, each call made on both as a
    store makes it: the tenant purged first, asked by the pool's reserve last."""

    def __init__(self) -> None:
        super().__init__()
        self.now = START
        self.pool = PoolState("w")
        self.tenant = TenantState("w")
        self.pool_limits = Limits(sessions=30, concurrent=4, usd=6.0)
        self.limits = TenantLimits(sessions=8, usd=3.0, concurrent=3)
        self.ids = iter(range(10**6))

    def _touch(self, lid: str = "") -> None:
        """The tenant purged as a store call does: the lease it names kept while the
        pool holds it."""
        tenants.purge_expired(self.tenant, self.now, lid if lid in self.pool.leases else "")

    @rule(hold=st.integers(1, 60), meter=st.none() | st.sampled_from(KILLED), new=st.booleans())
    def reserve(self, hold: int, meter: Meter | None, new: bool) -> None:
        self._touch()
        lid = f"l{next(self.ids)}"
        admit = functools.partial(tenants.check, self.tenant, self.limits)
        verdict = quota.reserve(
            self.pool, self.pool_limits, lid, "a", self.now, hold, new, meter, admit
        )
        if isinstance(verdict, quota.Grant):
            tenants.add(self.tenant, lid, self.pool.leases[lid])
        else:
            assert lid not in self.pool.leases
            assert lid not in self.tenant.leases

    def _unexpired(self) -> list[str]:
        """The router commits or refunds a reservation only within its hold (a create
        past its budget is abandoned, `router.late_creates`): see `policies.tenants`."""
        return sorted(lid for lid, slot in self.pool.leases.items() if slot.expires > self.now)

    @precondition(lambda self: self._unexpired())
    @rule(data=st.data(), ttl=st.integers(1, 60))
    def commit(self, data: st.DataObject, ttl: int) -> None:
        lid = data.draw(st.sampled_from(self._unexpired()))
        self._touch(lid)
        also = tenants.budget(self.tenant, self.limits)
        quota.commit(self.pool, lid, self.now, ttl, "sb", self.pool_limits, also)
        tenants.mirror(self.tenant, lid, self.pool.leases.get(lid))

    @precondition(lambda self: self.pool.leases)
    @rule(data=st.data(), ttl=st.integers(1, 60))
    def heartbeat(self, data: st.DataObject, ttl: int) -> None:
        lid = data.draw(st.sampled_from(sorted(self.pool.leases)))
        self._touch(lid)
        also = tenants.budget(self.tenant, self.limits)
        quota.heartbeat(self.pool, lid, self.now, ttl, self.pool_limits, also)
        tenants.mirror(self.tenant, lid, self.pool.leases.get(lid))

    @precondition(lambda self: self.pool.leases)
    @rule(data=st.data())
    def release(self, data: st.DataObject) -> None:
        lid = data.draw(st.sampled_from(sorted(self.pool.leases)))
        self._touch(lid)
        quota.release(self.pool, lid, self.now)
        tenants.release(self.tenant, lid, self.now)

    @precondition(lambda self: self._unexpired())
    @rule(data=st.data())
    def refund(self, data: st.DataObject) -> None:
        lid = data.draw(st.sampled_from(self._unexpired()))
        self._touch(lid)
        assert quota.refund(self.pool, lid) == tenants.refund(self.tenant, lid)

    @rule(seconds=st.integers(0, 50))
    def advance(self, seconds: int) -> None:
        self.now += seconds

    @rule()
    def purge(self) -> None:
        """Another lease's reserve purges the pool (and nothing of the tenant)."""
        quota.purge_expired(self.pool, self.now)

    @rule(data=st.data())
    def gone(self, data: st.DataObject) -> None:
        """A call naming a lease its pool no longer holds (purged there): the tenant
        purges it too."""
        lid = data.draw(st.sampled_from(["l0", "l1", "l2"]))
        if lid not in self.pool.leases:
            self._touch(lid)
            assert quota.release(self.pool, lid, self.now) is None
            tenants.release(self.tenant, lid, self.now)

    @invariant()
    def within_limits(self) -> None:
        assert self.tenant.sessions <= (self.limits.sessions or 0)
        assert len(self.tenant.leases) <= (self.limits.concurrent or 0)
        assert self.tenant.usd + self.tenant.usd_held <= 3.0 + 1e-9  # no overdraft: kill

    @invariant()
    def holds_what_its_leases_hold(self) -> None:
        held = sum(slot.hold() for slot in self.tenant.leases.values())
        assert self.tenant.usd_held == pytest.approx(held, abs=1e-9)

    @invariant()
    def agrees_with_its_pool(self) -> None:
        """Purged at the same instant, the two ledgers hold the same leases, the same
        slots, and have settled the same dollars and sessions."""
        pool, tenant = PoolState("w"), TenantState("w")
        pool.leases = {lid: quota.LeaseSlot(**_fields(s)) for lid, s in self.pool.leases.items()}
        pool.usd, pool.usd_held, pool.sessions = (
            self.pool.usd,
            self.pool.usd_held,
            self.pool.sessions,
        )
        tenant.leases = {
            lid: quota.LeaseSlot(**_fields(s)) for lid, s in self.tenant.leases.items()
        }
        tenant.usd, tenant.usd_held = self.tenant.usd, self.tenant.usd_held
        tenant.sessions = self.tenant.sessions
        quota.purge_expired(pool, self.now)
        tenants.purge_expired(tenant, self.now)
        assert pool.leases == tenant.leases
        assert tenant.usd == pytest.approx(pool.usd, abs=1e-9)
        assert tenant.usd_held == pytest.approx(pool.usd_held, abs=1e-9)
        assert tenant.sessions == pool.sessions


def _fields(slot: quota.LeaseSlot) -> dict[str, object]:
    return {name: getattr(slot, name) for name in slot.__dataclass_fields__}


TestPoolAndTenant = PoolAndTenant.TestCase
TestPoolAndTenant.settings = settings(max_examples=200, stateful_step_count=40, deadline=None)


def test_a_day_runs_midnight_to_midnight_in_its_timezone_dst_included() -> None:
    paris = ZoneInfo("Europe/Paris")
    day = DailyWindow("Europe/Paris")
    noon = datetime(2026, 3, 29, 12, tzinfo=paris).timestamp()  # the spring-forward day
    start, end = day.bounds(noon)
    assert (start, end) == (
        datetime(2026, 3, 29, tzinfo=paris),
        datetime(2026, 3, 30, tzinfo=paris),
    )
    assert end.timestamp() - start.timestamp() == 23 * 3600
    assert day.key(noon) == "d2026-03-29"
    assert day.reset_at(noon) == end
    assert day.key(end.timestamp()) == "d2026-03-30"
    assert day.key(end.timestamp() - 0.001) == "d2026-03-29"
    with pytest.raises(Exception):  # noqa: B017, PT011 - ZoneInfo's own error
        DailyWindow("Mars/Olympus")


@pytest.mark.parametrize(
    ("name", "valid"),
    [("user-42", True), ("a", True), ("Org.team_1@x+y", True), ("x" * 128, True),
     ("", False), ("-a", False), ("a:b", False), ("a b", False), ("x" * 129, False),
     ("é", False), (42, False)],
)  # fmt: skip
def test_a_tenant_name_is_short_and_plain(name: object, valid: bool) -> None:
    assert valid_name(name) is valid
