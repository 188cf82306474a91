"""One contract for every state store: the same decisions on Redis, SQLite, memory."""

from __future__ import annotations

import pytest

from policies.breaker import BreakerConfig, Outcome
from policies.fleet import Registration
from policies.quota import Limits, MonthlyWindow
from router.state import EntryRef, HeldLease, Spend, StateStore
from router.state.base import SessionBinding, SessionClaim

NOW = 1_790_000_000.0  # 2026-09-21, mid-window
CFG = BreakerConfig(failure_threshold=3, cooldown_base=10, cooldown_max=25, probe_timeout=5)


def ref(entry: str = "a", pool: str = "p", **limits: float) -> EntryRef:
    return EntryRef(entry, pool, Limits(**limits), MonthlyWindow(), fingerprint="fp1")  # type: ignore[arg-type]


async def test_sessions_limit_is_all_or_nothing(store: StateStore) -> None:
    r = ref(sessions=2)
    assert (await store.reserve(r, CFG, "l1", NOW, 30)).granted
    assert (await store.reserve(r, CFG, "l2", NOW, 30)).granted
    denied = await store.reserve(r, CFG, "l3", NOW, 30)
    assert not denied.granted
    assert (denied.reason, denied.unit, denied.used, denied.limit) == ("quota", "sessions", 2, 2)
    assert denied.until == MonthlyWindow().reset_at(NOW).timestamp()


async def test_refund_gives_back_the_session_and_the_slot(store: StateStore) -> None:
    r = ref(sessions=1, concurrent=1)
    assert (await store.reserve(r, CFG, "l1", NOW, 30)).granted
    settled = await store.settle(r, CFG, "l1", NOW + 1, outcome=Outcome.TRANSIENT)
    assert settled.applied
    assert not (await store.settle(r, CFG, "l1", NOW + 1, outcome=Outcome.TRANSIENT)).applied
    snap = await store.snapshot([r], NOW + 1)
    assert snap.pools["p"].used == {"sessions": 0, "sandbox_seconds": 0, "concurrent": 0, "usd": 0}
    assert (await store.reserve(r, CFG, "l2", NOW + 2, 30)).granted


async def test_concurrency_slot_freed_by_release_and_seconds_metered(store: StateStore) -> None:
    r = ref(concurrent=1)
    assert (await store.reserve(r, CFG, "l1", NOW, 30)).granted
    assert (await store.settle(r, CFG, "l1", NOW + 2, outcome=Outcome.SUCCESS, ttl=60)).applied
    assert (await store.reserve(r, CFG, "l2", NOW + 3, 30)).unit == "concurrent"
    assert await store.release(r, "l1", NOW + 12) == pytest.approx(10)
    assert await store.release(r, "l1", NOW + 13) is None
    snap = await store.snapshot([r], NOW + 13)
    assert snap.pools["p"].used["sandbox_seconds"] == pytest.approx(10)
    assert snap.pools["p"].used["sessions"] == 1
    assert (await store.reserve(r, CFG, "l2", NOW + 14, 30)).granted


async def test_expired_lease_frees_its_slot_and_is_charged_until_expiry(
    store: StateStore,
) -> None:
    r = ref(concurrent=1)
    await store.reserve(r, CFG, "l1", NOW, 30)
    await store.settle(r, CFG, "l1", NOW, outcome=Outcome.SUCCESS, ttl=20)
    assert await store.heartbeat(r, "l1", NOW + 10, 20)  # alive until NOW+30
    assert not (await store.reserve(r, CFG, "l2", NOW + 29, 30)).granted
    assert (await store.reserve(r, CFG, "l2", NOW + 31, 30)).granted
    assert not await store.heartbeat(r, "l1", NOW + 31, 20)
    snap = await store.snapshot([r], NOW + 31)
    assert snap.pools["p"].used["sandbox_seconds"] == pytest.approx(30)
    assert snap.pools["p"].used["concurrent"] == 1


async def test_seconds_limit_admits_until_used_up(store: StateStore) -> None:
    r = ref(sandbox_seconds=5)
    await store.reserve(r, CFG, "l1", NOW, 30)
    await store.settle(r, CFG, "l1", NOW, outcome=Outcome.SUCCESS, ttl=60)
    assert (await store.reserve(r, CFG, "l2", NOW + 1, 30)).granted
    await store.release(r, "l1", NOW + 6)
    denied = await store.reserve(r, CFG, "l3", NOW + 7, 30)
    assert denied.unit == "sandbox_seconds"


async def test_pool_is_shared_by_entries(store: StateStore) -> None:
    a, b = ref("a", "shared", sessions=2), ref("b", "shared", sessions=2)
    assert (await store.reserve(a, CFG, "l1", NOW, 30)).granted
    assert (await store.reserve(b, CFG, "l2", NOW, 30)).granted
    assert (await store.reserve(a, CFG, "l3", NOW, 30)).unit == "sessions"
    snap = await store.snapshot([a, b], NOW)
    assert snap.entries["a"].live_leases == 1
    assert snap.entries["b"].live_leases == 1


async def test_new_window_starts_from_zero(store: StateStore) -> None:
    r = ref(sessions=1)
    await store.reserve(r, CFG, "l1", NOW, 30)
    await store.settle(r, CFG, "l1", NOW, outcome=Outcome.SUCCESS, ttl=30)
    await store.release(r, "l1", NOW + 5)
    assert not (await store.reserve(r, CFG, "l2", NOW + 6, 30)).granted
    next_window = MonthlyWindow().reset_at(NOW).timestamp() + 1
    assert (await store.reserve(r, CFG, "l3", next_window, 30)).granted


async def test_breaker_opens_then_admits_one_probe_then_closes(store: StateStore) -> None:
    r = ref()
    for i in range(3):
        assert (await store.reserve(r, CFG, f"l{i}", NOW + i, 30)).granted
        s = await store.settle(r, CFG, f"l{i}", NOW + i, outcome=Outcome.TRANSIENT)
    assert s.transition == ("closed", "open")
    denied = await store.reserve(r, CFG, "x", NOW + 5, 30)
    assert (denied.granted, denied.reason, denied.until) == (False, "open", NOW + 2 + 10)
    probe = await store.reserve(r, CFG, "p1", NOW + 13, 30)
    assert probe.granted
    assert probe.probe
    assert probe.transition == ("open", "half_open")
    second = await store.reserve(r, CFG, "p2", NOW + 13, 30)
    assert (second.granted, second.reason) == (False, "half_open")
    closed = await store.settle(r, CFG, "p1", NOW + 14, outcome=Outcome.SUCCESS, ttl=30)
    assert closed.transition == ("half_open", "closed")
    assert (await store.reserve(r, CFG, "p3", NOW + 14, 30)).granted


async def test_failed_probe_reopens_with_longer_capped_cooldown(store: StateStore) -> None:
    r = ref()
    for i in range(3):
        await store.reserve(r, CFG, f"l{i}", NOW, 30)
        await store.settle(r, CFG, f"l{i}", NOW, outcome=Outcome.TRANSIENT)
    t = NOW + 10
    for opening, cooldown in ((2, 20), (3, 25), (4, 25)):
        assert (await store.reserve(r, CFG, f"p{opening}", t, 30)).probe
        s = await store.settle(r, CFG, f"p{opening}", t, outcome=Outcome.TRANSIENT)
        assert s.transition == ("half_open", "open")
        snap = await store.snapshot([r], t)
        assert snap.entries["a"].breaker.openings == opening
        assert snap.entries["a"].breaker.open_until == pytest.approx(t + cooldown)
        t += cooldown


async def test_auth_blocks_until_config_changes(store: StateStore) -> None:
    r = ref()
    await store.reserve(r, CFG, "l1", NOW, 30)
    await store.settle(r, CFG, "l1", NOW, outcome=Outcome.AUTH, detail="401 bad key")
    denied = await store.reserve(r, CFG, "l2", NOW + 10_000, 30)
    assert (denied.reason, denied.detail) == ("misconfigured", "401 bad key")
    changed = EntryRef("a", "p", r.limits, r.window, fingerprint="fp2")
    assert (await store.reserve(changed, CFG, "l3", NOW + 10_001, 30)).granted


@pytest.mark.parametrize(
    ("outcome", "until", "blocked_until"),
    [
        (Outcome.QUOTA, NOW + 500, NOW + 500),
        (Outcome.RATE_LIMITED, NOW + 7, NOW + 7),
        (Outcome.RATE_LIMITED, None, NOW + CFG.rate_limit_default),
        (Outcome.CAPACITY, None, NOW + CFG.capacity_cooldown),
    ],
)
async def test_provider_answers_block_until(
    store: StateStore, outcome: Outcome, until: float | None, blocked_until: float
) -> None:
    r = ref()
    await store.reserve(r, CFG, "l1", NOW, 30)
    await store.settle(r, CFG, "l1", NOW, outcome=outcome, until=until)
    denied = await store.reserve(r, CFG, "l2", NOW + 1, 30)
    assert (denied.granted, denied.until) == (False, pytest.approx(blocked_until))
    assert (await store.reserve(r, CFG, "l3", blocked_until, 30)).granted


async def test_capacity_block_lifts_when_a_lease_is_released(store: StateStore) -> None:
    r = ref()
    await store.reserve(r, CFG, "live", NOW, 30)
    await store.settle(r, CFG, "live", NOW, outcome=Outcome.SUCCESS, ttl=60)
    await store.reserve(r, CFG, "l2", NOW, 30)
    await store.settle(r, CFG, "l2", NOW, outcome=Outcome.CAPACITY)
    assert (await store.reserve(r, CFG, "l3", NOW + 1, 30)).reason == "capacity"
    await store.release(r, "live", NOW + 2)
    assert (await store.reserve(r, CFG, "l4", NOW + 2, 30)).granted


async def test_quota_denial_does_not_consume_the_probe(store: StateStore) -> None:
    r = ref(sessions=3)
    for i in range(3):
        await store.reserve(r, CFG, f"l{i}", NOW, 30)
        await store.settle(r, CFG, f"l{i}", NOW, outcome=Outcome.TRANSIENT)
    await store.set_usage(r, "sessions", 3, NOW)
    assert (await store.reserve(r, CFG, "p1", NOW + 11, 30)).reason == "quota"
    await store.set_usage(r, "sessions", 0, NOW + 11)
    assert (await store.reserve(r, CFG, "p2", NOW + 11, 30)).probe


async def test_an_operator_change_of_usage_moves_the_pools_limits_version(
    store: StateStore,
) -> None:
    """A replica remembering the pool as exhausted learns from the version it is stale."""
    r = ref(sessions=1)
    assert (await store.snapshot([r], NOW)).pools[r.pool].version == 0
    await store.set_usage(r, "sessions", 1, NOW)
    denied = await store.reserve(r, CFG, "l1", NOW, 30)
    assert (denied.reason, denied.version) == ("quota", 1)
    await store.set_usage(r, "sessions", 0, NOW)
    assert (await store.snapshot([r], NOW)).pools[r.pool].version == 2
    assert (await store.reserve(r, CFG, "l2", NOW, 30)).granted


async def test_record_outside_acquire(store: StateStore) -> None:
    r = ref()
    transitions = [await store.record(r, CFG, Outcome.TRANSIENT, NOW + i) for i in range(3)]
    assert transitions == [None, None, ("closed", "open")]


async def test_ping(store: StateStore) -> None:
    await store.ping()


async def test_a_repeated_call_id_gets_the_first_answer_and_applies_once(
    store: StateStore,
) -> None:
    r = ref(sessions=5)
    for _ in range(2):
        assert (await store.reserve(r, CFG, "l1", NOW, 30, call_id="reserve-1")).granted
    settled = [
        await store.settle(r, CFG, "l1", NOW, outcome=Outcome.TRANSIENT, call_id="settle-1")
        for _ in range(2)
    ]
    assert settled == [settled[0]] * 2
    assert settled[0].applied
    for _ in range(2):
        await store.record(r, CFG, Outcome.TRANSIENT, NOW, call_id="record-1")
    snap = await store.snapshot([r], NOW)
    assert snap.entries["a"].breaker.failures == 2  # one settle, one record
    assert snap.pools["p"].used["sessions"] == 0

    await store.reserve(r, CFG, "l2", NOW, 30)
    await store.settle(r, CFG, "l2", NOW, outcome=Outcome.SUCCESS, ttl=60)
    released = [await store.release(r, "l2", NOW + 4, call_id="release-1") for _ in range(2)]
    assert released == [pytest.approx(4)] * 2
    assert await store.release(r, "l2", NOW + 5) is None  # a new call finds it gone
    snap = await store.snapshot([r], NOW + 5)
    assert snap.pools["p"].used["sandbox_seconds"] == pytest.approx(4)


async def test_replicas_register_with_a_ttl_and_learn_the_fleet(store: StateStore) -> None:
    r = ref(sessions=10)
    await store.reserve(r, CFG, "l1", NOW, 30)
    first = await store.register_replica("r1", 10, [r], NOW)
    assert first.fleet == Registration(replicas=1, seq=1, joined=1, oldest=1)
    assert not first.fleet.settled  # one contact shows nobody has seen it yet
    assert first.pools["p"].used["sessions"] == 1
    second = await store.register_replica("r2", 10, [r], NOW + 1)
    assert second.fleet == Registration(replicas=2, seq=2, joined=2, oldest=1)
    again = await store.register_replica("r1", 10, [r], NOW + 9)
    assert again.fleet == Registration(replicas=2, seq=3, joined=1, oldest=2)  # settled
    assert again.fleet.settled
    late = await store.register_replica("r1", 10, [r], NOW + 12)
    assert late.fleet.replicas == 2  # r2 expired at 11, counted one TTL more
    assert late.fleet.oldest == 2  # and may still serve
    gone = await store.register_replica("r1", 10, [r], NOW + 21.5)
    assert (gone.fleet.replicas, gone.fleet.oldest) == (1, 5)
    await store.deregister_replica("r1", NOW + 22)
    other = await store.register_replica("r3", 10, [], NOW + 23)
    assert other.fleet == Registration(replicas=2, seq=6, joined=6, oldest=6)  # r1 left
    back = await store.register_replica("r1", 10, [], NOW + 24)
    assert back.fleet.joined == 7  # a replica that left and comes back joins anew
    await store.deregister_replica("nobody", NOW + 24)


async def test_an_outage_spend_is_reconciled_once_per_journal(store: StateStore) -> None:
    a, b = ref("a", "p", sessions=10, concurrent=5), ref("b", "q")
    held = HeldLease("held-1", "a", NOW - 5, 30, "sb-1")
    spends = [Spend(a, sessions=3, sandbox_seconds=40, leases=(held,)), Spend(b, sessions=1)]
    assert await store.reconcile("replica-1:7", spends, NOW) == 2
    assert await store.reconcile("replica-1:7", spends, NOW + 1) == 0  # a repeat counts once
    assert await store.reconcile("replica-2:1", [Spend(b, sessions=2)], NOW + 1) == 1
    snap = await store.snapshot([a, b], NOW + 1)
    assert snap.pools["p"].used == {"sessions": 3, "sandbox_seconds": 40, "concurrent": 1, "usd": 0}
    assert snap.pools["q"].used["sessions"] == 3
    assert await store.lease_ids(a, NOW + 1) == {"held-1"}
    assert await store.release(a, "held-1", NOW + 5) == pytest.approx(10)  # since it started
    assert await store.release(a, "held-1", NOW + 6) is None  # a repeated free frees nothing
    snap = await store.snapshot([a], NOW + 6)
    assert snap.pools["p"].used == {"sessions": 3, "sandbox_seconds": 50, "concurrent": 0, "usd": 0}


async def test_a_reconcile_refunds_the_reservations_nobody_heard_back_about(
    store: StateStore,
) -> None:
    """A reserve sent as the store went down: the store made it, the replica booked the same
    lease from its share. Its reservation is refunded, then the lease counted once, as
    held; one already committed, one never made and one never answered are left alone."""
    a = ref("a", "p", sessions=10, concurrent=5)
    assert (await store.reserve(a, CFG, "made", NOW, 30)).granted  # its answer lost
    assert (await store.reserve(a, CFG, "alone", NOW, 30)).granted  # the share refused it
    assert (await store.reserve(a, CFG, "live", NOW, 30)).granted
    assert (await store.settle(a, CFG, "live", NOW, outcome=Outcome.SUCCESS, ttl=60)).applied
    held = HeldLease("made", "a", NOW + 1, 30, "sb-1")
    spend = Spend(a, sessions=1, leases=(held,), unanswered=("made", "alone", "live", "never"))
    assert await store.reconcile("replica-1:1", [spend], NOW + 2) == 1
    snap = await store.snapshot([a], NOW + 2)
    assert snap.pools["p"].used == {"sessions": 2, "sandbox_seconds": 0, "concurrent": 2, "usd": 0}
    assert await store.lease_ids(a, NOW + 2) == {"made", "live"}
    assert await store.release(a, "made", NOW + 11) == pytest.approx(10)  # live since NOW + 1


async def test_a_session_kept_only_while_it_names_the_sandbox(store: StateStore) -> None:
    """A binding re-bound to another sandbox: only a lease on the one it names now may keep
    it (a heartbeat): the other's sandbox is nobody's to keep."""
    await store.bind_session("conv", "a", "sb-1", NOW + 60, NOW)
    await store.bind_session("conv", "a", "sb-2", NOW + 60, NOW)  # the later acquire
    assert not await store.bind_session("conv", "a", "sb-1", NOW + 90, NOW, kept=True)
    assert await store.session("conv", NOW) == SessionBinding("a", "sb-2", NOW + 60)
    assert await store.bind_session("conv", "a", "sb-2", NOW + 90, NOW, paused=True, kept=True)
    assert await store.session("conv", NOW) == SessionBinding("a", "sb-2", NOW + 90, True)
    assert not await store.bind_session("gone", "a", "sb-3", NOW + 90, NOW, kept=True)
    assert await store.session("gone", NOW) is None


async def test_a_session_binding_says_whether_its_sandbox_is_paused(store: StateStore) -> None:
    await store.bind_session("running", "a", "sb-1", NOW + 60, NOW)
    await store.bind_session("parked", "a", "sb-2", NOW + 60, NOW, paused=True)
    assert await store.session("running", NOW) == SessionBinding("a", "sb-1", NOW + 60)
    assert await store.session("parked", NOW) == SessionBinding("a", "sb-2", NOW + 60, True)
    assert await store.bound_sandboxes(NOW) == {("a", "sb-1"), ("a", "sb-2")}
    await store.bind_session("parked", "a", "sb-2", NOW + 90, NOW)  # woken: re-bound running
    assert await store.session("parked", NOW) == SessionBinding("a", "sb-2", NOW + 90, False)


async def test_one_holder_at_a_time(store: StateStore) -> None:
    """A claim holds a session until its holder lets go; a second claimer is told who has
    it, and gets it once let go (the binding as the first left it)."""
    assert await store.claim_session("conv", "h1", NOW + 30, NOW) == SessionClaim(False)
    assert await store.session("conv", NOW) is None  # a claim for a create names no sandbox
    assert await store.bound_sandboxes(NOW) == set()
    assert not await store.bind_session("conv", "a", "sb-2", NOW + 60, NOW, holder="h2")
    assert await store.bind_session("conv", "a", "sb-1", NOW + 60, NOW, holder="h1")
    held = SessionBinding("a", "sb-1", NOW + 60, holder="h1")
    assert await store.claim_session("conv", "h2", NOW + 30, NOW) == SessionClaim(True, held)
    assert await store.claim_session("conv", "h1", NOW + 30, NOW) == SessionClaim(False, held)
    assert not await store.release_session("conv", "h2", NOW + 900, NOW)  # not its holder
    assert await store.release_session("conv", "h1", NOW + 900, NOW, paused=True)
    kept = SessionBinding("a", "sb-1", NOW + 900, paused=True)
    assert await store.session("conv", NOW) == kept
    assert await store.claim_session("conv", "h2", NOW + 30, NOW) == SessionClaim(False, kept)
    assert await store.session("conv", NOW) == SessionBinding("a", "sb-1", NOW + 30, True, "h2")
    assert not await store.bind_session("conv", "a", "sb-1", NOW + 60, NOW, kept=True, holder="h1")
    assert await store.bind_session("conv", "a", "sb-1", NOW + 60, NOW, kept=True, holder="h2")
    assert await store.release_session("conv", "h2", NOW + 900, NOW, sandbox_id="sb-1")
    assert await store.session("conv", NOW) == SessionBinding("a", "sb-1", NOW + 900, False)


async def test_a_dead_holders_claim_ends_with_it(store: StateStore) -> None:
    """A claim lasts only as long as its acquire may: past it, the session is free, and a
    claim that named no sandbox is simply gone."""
    await store.claim_session("conv", "h1", NOW + 30, NOW)
    assert await store.claim_session("conv", "h2", NOW + 31, NOW + 30) == SessionClaim(False)
    assert await store.release_session("conv", "h2", NOW + 900, NOW + 30)  # nothing to keep
    assert await store.claim_session("conv", "h3", NOW + 60, NOW + 30) == SessionClaim(False)
    assert await store.release_session("conv", "h3", NOW + 900, NOW + 30, drop=True)
    assert await store.take_session("conv", NOW + 30) is None


async def test_taking_a_session_forgets_it_and_says_who_held_it(store: StateStore) -> None:
    await store.bind_session("conv", "a", "sb-1", NOW + 60, NOW, holder="h1")
    taken = await store.take_session("conv", NOW)
    assert taken == SessionBinding("a", "sb-1", NOW + 60, holder="h1")
    assert await store.session("conv", NOW) is None
    assert not await store.bind_session("conv", "a", "sb-1", NOW + 60, NOW, kept=True, holder="h1")
    assert not await store.release_session("conv", "h1", NOW + 900, NOW)  # its holder: kill
    assert await store.take_session("conv", NOW) is None


async def test_letting_go_of_a_sandbox_the_session_does_not_name_forgets_it(
    store: StateStore,
) -> None:
    """The holder's bind never landed (its session names no sandbox, or its old one): the
    binding goes, and the answer says the holder's sandbox is not the session's."""
    await store.claim_session("conv", "h1", NOW + 30, NOW)
    assert not await store.release_session("conv", "h1", NOW + 900, NOW, sandbox_id="sb-1")
    assert await store.claim_session("conv", "h2", NOW + 30, NOW) == SessionClaim(False)
    await store.bind_session("old", "a", "sb-0", NOW + 60, NOW, holder="h1")
    assert not await store.release_session("old", "h2", NOW + 900, NOW, sandbox_id="sb-1")
    assert await store.session("old", NOW) is not None  # not its holder: nothing changes
    assert not await store.release_session("old", "h1", NOW + 900, NOW, sandbox_id="sb-1")
    assert await store.session("old", NOW) is None
