"""The quota window and ledger rules (pure), exhaustively and as a state machine."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from policies import quota
from policies.quota import Grant, Limits, Meter, MonthlyWindow, PoolState, QuotaDenial


def ts(*args: int, tz: str = "UTC") -> float:
    from zoneinfo import ZoneInfo

    return datetime(*args, tzinfo=ZoneInfo(tz)).timestamp()  # type: ignore[misc]


@pytest.mark.parametrize(
    ("window", "now", "start", "end"),
    [
        (MonthlyWindow(), ts(2026, 11, 23, 12), "2026-11-01", "2026-12-01"),
        (MonthlyWindow(), ts(2026, 12, 31, 23, 59), "2026-12-01", "2027-01-01"),
        (MonthlyWindow(reset_day=15), ts(2026, 11, 14, 23), "2026-10-15", "2026-11-15"),
        (MonthlyWindow(reset_day=15), ts(2026, 11, 15), "2026-11-15", "2026-12-15"),
        (MonthlyWindow(reset_day=31), ts(2026, 2, 28, 1), "2026-02-28", "2026-03-31"),
        (MonthlyWindow(reset_day=31), ts(2028, 2, 28, 1), "2028-01-31", "2028-02-29"),
        (MonthlyWindow(reset_day=30), ts(2026, 3, 1), "2026-02-28", "2026-03-30"),
        (MonthlyWindow(reset_day=1), ts(2027, 1, 1), "2027-01-01", "2027-02-01"),
    ],
)
def test_window_bounds(window: MonthlyWindow, now: float, start: str, end: str) -> None:
    lo, hi = window.bounds(now)
    assert (lo.date().isoformat(), hi.date().isoformat()) == (start, end)
    assert window.key(now) == start
    assert window.reset_at(now) == hi


def test_window_follows_the_configured_timezone() -> None:
    berlin = MonthlyWindow("Europe/Berlin")
    # 23:30 UTC on 31 Oct is already 1 Nov in Berlin (UTC+1 after DST ends)
    now = datetime(2026, 10, 31, 23, 30, tzinfo=UTC).timestamp()
    assert berlin.key(now) == "2026-11-01"
    assert MonthlyWindow("UTC").key(now) == "2026-10-01"
    assert berlin.reset_at(now) == datetime(2026, 11, 30, 23, 0, tzinfo=UTC)


@pytest.mark.parametrize("day", [0, 32, -1])
def test_window_rejects_bad_reset_day(day: int) -> None:
    with pytest.raises(ValueError, match="reset_day"):
        MonthlyWindow(reset_day=day)


def test_window_rejects_unknown_zone() -> None:
    with pytest.raises(Exception, match="Mars"):
        MonthlyWindow("Mars/Olympus")


@pytest.mark.parametrize(
    ("used", "limits", "fraction"),
    [
        ({}, Limits(), 1.0),
        ({"sessions": 5}, Limits(sessions=10), 0.5),
        ({"sessions": 5, "concurrent": 3}, Limits(sessions=10, concurrent=4), 0.25),
        ({"sessions": 12}, Limits(sessions=10), 0.0),
        ({}, Limits(concurrent=0), 0.0),
    ],
)
def test_remaining_fraction(used: dict[str, float], limits: Limits, fraction: float) -> None:
    assert quota.remaining_fraction(used, limits) == pytest.approx(fraction)


def test_each_unit_denies_at_its_limit() -> None:
    for unit, limits in [
        ("sessions", Limits(sessions=1)),
        ("concurrent", Limits(concurrent=1)),
    ]:
        state = PoolState("w")
        assert isinstance(quota.reserve(state, limits, "a", "e", 0, 10), Grant)
        denial = quota.reserve(state, limits, "b", "e", 0, 10)
        assert denial == QuotaDenial(unit, 1, 1)
    state = PoolState("w", sandbox_seconds=5)
    assert quota.reserve(state, Limits(sandbox_seconds=5), "a", "e", 0, 10) == QuotaDenial(
        "sandbox_seconds", 5, 5
    )


def test_refund_of_a_live_lease_is_refused() -> None:
    state = PoolState("w")
    quota.reserve(state, Limits(), "a", "e", 0, 10)
    quota.commit(state, "a", 1, 60)
    assert not quota.refund(state, "a")
    assert state.sessions == 1
    assert "a" in state.leases


class LedgerMachine(RuleBasedStateMachine):
    """Random reserve/commit/refund/release/heartbeat/time sequences.

    Invariants: a grant never takes a unit past its limit, sessions count
    exactly the reservations not refunded, seconds only grow, and every lease
    is either tracked by the ledger or accounted for.
    """

    def __init__(self) -> None:
        super().__init__()
        self.limits = Limits(sessions=8, sandbox_seconds=400, concurrent=3)
        self.state = PoolState("w")
        self.now = 1000.0
        self.next_id = 0
        self.reserved: set[str] = set()
        self.live: set[str] = set()
        self.granted = 0
        self.refunded = 0
        self.seconds = 0.0

    @rule(hold=st.floats(1, 100))
    def reserve(self, hold: float) -> None:
        lid = f"l{self.next_id}"
        self.next_id += 1
        before = len([s for s in self.state.leases.values() if s.expires > self.now])
        verdict = quota.reserve(self.state, self.limits, lid, "e", self.now, hold)
        if isinstance(verdict, Grant):
            self.granted += 1
            self.reserved.add(lid)
            assert before < 3
        else:
            assert verdict.used >= verdict.limit

    @precondition(lambda self: self.reserved)
    @rule(data=st.data(), ttl=st.floats(1, 100))
    def commit(self, data: st.DataObject, ttl: float) -> None:
        lid = data.draw(st.sampled_from(sorted(self.reserved)))
        if quota.commit(self.state, lid, self.now, ttl):
            self.reserved.discard(lid)
            self.live.add(lid)

    @precondition(lambda self: self.reserved)
    @rule(data=st.data())
    def refund(self, data: st.DataObject) -> None:
        lid = data.draw(st.sampled_from(sorted(self.reserved)))
        if quota.refund(self.state, lid):
            self.refunded += 1
        self.reserved.discard(lid)

    @precondition(lambda self: self.live)
    @rule(data=st.data())
    def release(self, data: st.DataObject) -> None:
        lid = data.draw(st.sampled_from(sorted(self.live)))
        seconds = quota.release(self.state, lid, self.now)
        assert seconds is None or seconds >= 0
        self.live.discard(lid)

    @precondition(lambda self: self.live)
    @rule(data=st.data(), ttl=st.floats(1, 100))
    def heartbeat(self, data: st.DataObject, ttl: float) -> None:
        lid = data.draw(st.sampled_from(sorted(self.live)))
        slot = self.state.leases.get(lid)
        alive = quota.heartbeat(self.state, lid, self.now, ttl)
        assert alive.alive == (slot is not None and slot.expires > self.now)

    @rule(dt=st.floats(0, 120))
    def advance(self, dt: float) -> None:
        self.now += dt

    @invariant()
    def sessions_count_unrefunded_grants(self) -> None:
        assert self.state.sessions == self.granted - self.refunded
        assert self.state.sessions <= 8

    @invariant()
    def seconds_only_grow(self) -> None:
        assert self.state.sandbox_seconds >= self.seconds - 1e-9
        self.seconds = self.state.sandbox_seconds

    @invariant()
    def slots_never_exceed_the_limit(self) -> None:
        assert len(self.state.leases) <= 3


TestLedger = LedgerMachine.TestCase


METERS = [
    quota.Meter(0.01, 0.5, 0.0, 20.0, 15.0, kill=True),
    quota.Meter(0.03, 0.0, 60.0, 30.0, 45.0, kill=True),
    quota.Meter(0.0, 0.25, kill=True),
]


class UsdMachine(RuleBasedStateMachine):
    """Random priced reserve/commit/refund/release/heartbeat/time sequences, every lease
    ending when its budget cannot renew it (``kill``).

    Invariants: what was settled plus what is held never passes the budget; the pool's
    hold is its leases' holds; no lease is charged more than it held.
    """

    def __init__(self) -> None:
        super().__init__()
        self.limits = Limits(concurrent=4, usd=3.0)
        self.state = PoolState("w")
        self.now = 1000.0
        self.next_id = 0
        self.reserved: set[str] = set()
        self.live: set[str] = set()

    @rule(hold=st.floats(1, 60), meter=st.sampled_from(METERS), new=st.booleans())
    def reserve(self, hold: float, meter: quota.Meter, new: bool) -> None:
        lid = f"l{self.next_id}"
        self.next_id += 1
        before = self.state.usd + self.state.usd_held
        verdict = quota.reserve(self.state, self.limits, lid, "e", self.now, hold, new, meter)
        if isinstance(verdict, Grant):
            self.reserved.add(lid)
        elif verdict.unit == "usd":
            fee = meter.fee if new else 0.0
            assert before + meter.cost(meter.first, fee=False) + fee > 3.0

    @precondition(lambda self: self.reserved)
    @rule(data=st.data(), ttl=st.floats(1, 100))
    def commit(self, data: st.DataObject, ttl: float) -> None:
        lid = data.draw(st.sampled_from(sorted(self.reserved)))
        renewal = quota.commit(self.state, lid, self.now, ttl, "", self.limits)
        self.reserved.discard(lid)
        if renewal:
            self.live.add(lid)
            slot = self.state.leases[lid]
            assert not slot.priced or slot.expires - slot.started <= slot.paid() + 1e-9

    @precondition(lambda self: self.reserved)
    @rule(data=st.data())
    def refund(self, data: st.DataObject) -> None:
        lid = data.draw(st.sampled_from(sorted(self.reserved)))
        spent = self.state.usd
        quota.refund(self.state, lid)
        assert self.state.usd == spent
        self.reserved.discard(lid)

    @precondition(lambda self: self.live | self.reserved)
    @rule(data=st.data())
    def release(self, data: st.DataObject) -> None:
        lid = data.draw(st.sampled_from(sorted(self.live | self.reserved)))
        slot = self.state.leases.get(lid)
        held, spent = (slot.hold() if slot else 0.0), self.state.usd
        quota.release(self.state, lid, self.now)
        assert self.state.usd - spent <= held + 1e-9
        self.live.discard(lid)
        self.reserved.discard(lid)

    @precondition(lambda self: self.live)
    @rule(data=st.data(), ttl=st.floats(1, 100))
    def heartbeat(self, data: st.DataObject, ttl: float) -> None:
        lid = data.draw(st.sampled_from(sorted(self.live)))
        renewal = quota.heartbeat(self.state, lid, self.now, ttl, self.limits)
        slot = self.state.leases.get(lid)
        if renewal.short_at:
            assert slot is not None
            assert renewal.short_at == slot.started + slot.paid()
            assert slot.expires <= renewal.short_at

    @rule(dt=st.floats(0, 120))
    def advance(self, dt: float) -> None:
        self.now += dt
        spent, held = self.state.usd, self.state.usd_held
        quota.purge_expired(self.state, self.now)
        assert self.state.usd - spent <= held - self.state.usd_held + 1e-9

    @invariant()
    def never_past_the_budget(self) -> None:
        assert self.state.usd + self.state.usd_held <= 3.0 + 1e-9

    @invariant()
    def the_pool_holds_what_its_leases_hold(self) -> None:
        holds = sum(slot.hold() for slot in self.state.leases.values())
        assert self.state.usd_held == pytest.approx(holds, abs=1e-9)


TestUsd = UsdMachine.TestCase


@pytest.mark.parametrize(
    ("seconds", "step", "billed"),
    [(0, 0, 0), (-1, 60, 0), (10.5, 0, 10.5), (0.2, 1, 1), (60, 60, 60), (60.00000001, 60, 60),
     (61, 60, 120)],
)  # fmt: skip
def test_metered_rounds_up_to_whole_steps(seconds: float, step: float, billed: float) -> None:
    assert quota.metered(seconds, step) == billed


STEPS = st.sampled_from([0.0, 1.0, 60.0])


@pytest.mark.parametrize(
    ("step", "first", "ttl", "ends"),
    [(60.0, 2.0, 65.0, 60.0), (60.0, 2.0, 30.0, 0.0), (60.0, 59.5, 61.0, 60.0),
     (60.0, 60.0, 60.0, 0.0), (60.0, 61.0, 121.0, 120.0), (1.0, 2.5, 5.0, 3.0),
     (0.0, 2.0, 65.0, 2.0)],
)  # fmt: skip
def test_a_cover_ends_with_the_step_it_paid_for(
    step: float, first: float, ttl: float, ends: float
) -> None:
    """A lease the budget cannot renew runs to the end of the billing step its hold paid
    for (Daytona's minute), not to its cover's seconds; one inside that step needs no
    renewal at all (``ends`` 0: not short)."""
    meter = Meter(0.01, 0.0, step, first, 2.0, kill=True)
    state = PoolState("w")
    hold = meter.cost(first)
    quota.reserve(state, Limits(usd=hold), "l", "e", 0.0, 10, meter=meter)
    renewal = quota.commit(state, "l", 100.0, ttl, limits=Limits(usd=hold))
    assert renewal.alive
    assert renewal.short_at == (100.0 + ends if ends else 0.0)
    slot = state.leases["l"]
    assert slot.expires == 100.0 + (ends or ttl)
    assert quota.release(state, "l", 100.0 + ttl) == (ends or ttl)
    assert state.usd == pytest.approx(hold) if ends else state.usd <= hold
    assert state.usd_held == pytest.approx(0.0)


@given(
    rate=st.floats(0.0001, 1.0),
    step=STEPS,
    first=st.floats(0.5, 200.0),
    renew=st.floats(0.5, 200.0),
    ttl=st.floats(0.5, 500.0),
    late=st.floats(0.0, 300.0),
)
def test_a_lease_the_budget_cannot_renew_is_charged_exactly_its_hold(
    rate: float, step: float, first: float, renew: float, ttl: float, late: float
) -> None:
    """The budget holds the first cover only: the lease ends at the end of the steps
    that hold pays for (or its TTL, if sooner), and however late it is released, or
    purged once its app crashed, it is charged at most its hold: exactly it when it ran
    to the end."""
    meter = Meter(rate, 0.0, step, first, renew, kill=True)
    limits = Limits(usd=meter.cost(first))
    state = PoolState("w")
    assert isinstance(quota.reserve(state, limits, "l", "e", 0.0, 10, meter=meter), Grant)
    paid = quota.metered(first, step)
    renewal = quota.commit(state, "l", 0.0, ttl, limits=limits)
    slot = state.leases["l"]
    assert slot.paid() == paid
    if ttl <= paid + 1e-9:
        assert renewal.short_at == 0.0
        assert slot.expires == ttl
    else:
        assert renewal.short_at == paid
        assert slot.expires == paid
    assert quota.heartbeat(state, "l", slot.expires, ttl, limits).alive is False
    quota.purge_expired(state, slot.expires + late)
    assert state.usd <= limits.usd + 1e-12  # type: ignore[operator]
    if ttl > paid + 1e-9:
        assert state.usd == pytest.approx(limits.usd)
    assert state.usd_held == pytest.approx(0.0)


@given(
    rate=st.floats(0.0001, 1.0),
    step=STEPS,
    first=st.floats(0.5, 200.0),
    renew=st.floats(0.5, 200.0),
    ttl=st.floats(0.5, 2000.0),
)
def test_a_renewal_adds_whole_windows_until_the_paid_steps_reach_the_expiry(
    rate: float, step: float, first: float, renew: float, ttl: float
) -> None:
    """With room in the budget, the cover grows by the fewest whole windows whose paid
    steps reach the lease's expiry, and the pool holds exactly what they cost."""
    meter = Meter(rate, 0.0, step, first, renew)
    state = PoolState("w")
    quota.reserve(state, Limits(), "l", "e", 0.0, 10, meter=meter)
    assert quota.commit(state, "l", 0.0, ttl).short_at == 0.0
    slot = state.leases["l"]
    windows = round((slot.covered - first) / renew)
    assert slot.covered == pytest.approx(first + windows * renew)
    assert slot.paid() >= ttl - 1e-6
    if windows:
        assert quota.metered(slot.covered - renew, step) < ttl
    assert state.usd_held == pytest.approx(rate * slot.paid())
