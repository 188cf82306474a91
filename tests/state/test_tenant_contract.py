"""Tenant limits on every store: counted with the pool in one call, settled with it."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest

from policies.breaker import BreakerConfig, Outcome
from policies.quota import Limits, Meter, MonthlyWindow
from policies.tenants import DailyWindow, TenantLimits
from policies.warm import WarmRecord
from router.state import EntryRef, HeldLease, Spend, StateStore, TenantRef

NOW = 1_790_000_000.0  # 2026-09-21T13:33:20Z
CFG = BreakerConfig()
METER = Meter(0.01, 0.5, 0.0, 100.0, 50.0)  # holds 1.5 at first, 0.5 more each renewal
MONTH = MonthlyWindow()
UNLIMITED = Limits()


def ref(
    tenant: str | None = "t1",
    *,
    pool: str = "p",
    limits: Limits = UNLIMITED,
    sessions: int | None = None,
    concurrent: int | None = None,
    usd: float | None = None,
    window: MonthlyWindow | DailyWindow = MONTH,
) -> EntryRef:
    entry = EntryRef("a-" + pool, pool, limits, MONTH, "fp")
    if tenant is None:
        return entry
    return replace(entry, tenant=TenantRef(tenant, TenantLimits(sessions, usd, concurrent), window))


async def spent(store: StateStore, tenant: str, now: float, window: object = MONTH) -> tuple:
    found = {t.tenant: t for t in await store.tenants(window, now, 10)}  # type: ignore[arg-type]
    t = found.get(tenant)
    return (0, 0.0, 0.0, 0) if t is None else (t.sessions, t.usd, t.usd_held, t.concurrent)


async def test_a_tenant_at_its_sessions_limit_is_refused_and_spends_no_pool(
    store: StateStore,
) -> None:
    r = ref(sessions=2)
    assert (await store.reserve(r, CFG, "l1", NOW, 30)).granted
    assert (await store.reserve(r, CFG, "l2", NOW, 30)).granted
    denied = await store.reserve(r, CFG, "l3", NOW, 30)
    assert (denied.granted, denied.reason, denied.unit, denied.used, denied.limit) == (
        False, "tenant", "sessions", 2, 2,
    )  # fmt: skip
    assert denied.detail == "t1"
    assert denied.until == MONTH.reset_at(NOW).timestamp()
    pool = (await store.snapshot([r], NOW)).pools["p"]
    assert (pool.used["sessions"], pool.used["concurrent"]) == (2, 2)  # l3 took nothing
    other = ref("t2", sessions=2)
    assert (await store.reserve(other, CFG, "l4", NOW, 30)).granted  # another tenant is served
    assert (await store.reserve(ref(None), CFG, "l5", NOW, 30)).granted  # no tenant: no limit


async def test_a_pool_that_refuses_spends_nothing_of_the_tenant(store: StateStore) -> None:
    r = ref(limits=Limits(sessions=1), sessions=5)
    assert (await store.reserve(r, CFG, "l1", NOW, 30)).granted
    denied = await store.reserve(r, CFG, "l2", NOW, 30)
    assert (denied.reason, denied.unit) == ("quota", "sessions")
    assert await spent(store, "t1", NOW) == (1, 0.0, 0.0, 1)


async def test_concurrent_frees_on_release_and_a_refund_gives_the_session_back(
    store: StateStore,
) -> None:
    r = ref(concurrent=1, sessions=2)
    await store.reserve(r, CFG, "l1", NOW, 30)
    other_pool = ref(pool="q", concurrent=1, sessions=2)  # a tenant spans pools
    denied = await store.reserve(other_pool, CFG, "l2", NOW, 30)
    assert (denied.reason, denied.unit) == ("tenant", "concurrent")
    assert (await store.settle(r, CFG, "l1", NOW, outcome=Outcome.TRANSIENT)).applied
    assert await spent(store, "t1", NOW) == (0, 0.0, 0.0, 0)
    assert (await store.reserve(other_pool, CFG, "l3", NOW, 30)).granted
    await store.settle(other_pool, CFG, "l3", NOW, outcome=Outcome.SUCCESS, ttl=60)
    assert await store.release(other_pool, "l3", NOW + 5) == 5
    assert await spent(store, "t1", NOW + 5) == (1, 0.0, 0.0, 0)
    assert (await store.reserve(r, CFG, "l4", NOW + 5, 30)).granted


async def test_usd_holds_across_pools_and_settles_to_the_metered_cost(store: StateStore) -> None:
    a, b = ref(usd=3.2), ref(pool="q", usd=3.2)
    assert (await store.reserve(a, CFG, "l1", NOW, 30, meter=METER)).granted  # holds 1.5
    assert (await store.reserve(b, CFG, "l2", NOW, 30, meter=METER)).granted  # 3.0 held
    denied = await store.reserve(a, CFG, "l3", NOW, 30, meter=METER)
    assert (denied.reason, denied.unit, denied.limit) == ("tenant", "usd", 3.2)
    assert denied.used == pytest.approx(3.0)
    pool = (await store.snapshot([a], NOW)).pools["p"]
    assert pool.usd_held == pytest.approx(1.5)  # the refused hold went nowhere
    await store.settle(a, CFG, "l1", NOW, outcome=Outcome.SUCCESS, ttl=60)
    await store.release(a, "l1", NOW + 20)
    assert await spent(store, "t1", NOW + 20) == (2, pytest.approx(0.7), pytest.approx(1.5), 1)
    assert not (await store.reserve(a, CFG, "l3", NOW + 20, 30, meter=METER)).granted  # 3.7
    cheap = Meter(0.001, 0.0, 0.0, 100.0, 50.0)  # holds 0.1: fits beside 0.7 + 1.5
    assert (await store.reserve(a, CFG, "l4", NOW + 20, 30, meter=cheap)).granted


async def test_an_expired_lease_is_charged_to_its_tenant_until_its_expiry(
    store: StateStore,
) -> None:
    r = ref(usd=10, concurrent=1)
    await store.reserve(r, CFG, "l1", NOW, 30, meter=METER)
    await store.settle(r, CFG, "l1", NOW, outcome=Outcome.SUCCESS, ttl=40)
    assert (await store.reserve(r, CFG, "l2", NOW + 41, 30)).granted  # its slot is free
    assert await spent(store, "t1", NOW + 41) == (2, pytest.approx(0.9), 0.0, 1)


async def test_a_renewal_the_tenant_budget_cannot_hold_leaves_the_lease_short(
    store: StateStore,
) -> None:
    kill = replace(METER, kill=True)
    r = ref(usd=1.7)  # 1.5 held at first: no room for a 0.5 renewal
    await store.reserve(r, CFG, "l1", NOW, 30, meter=kill)
    settled = await store.settle(r, CFG, "l1", NOW, outcome=Outcome.SUCCESS, ttl=60)
    assert settled.short_at == 0.0  # 60 s fit in the first 100 s
    renewal = await store.heartbeat(r, "l1", NOW + 50, 60)
    assert (renewal.alive, renewal.short_at, renewal.short_of) == (True, NOW + 100, "tenant")
    roomy = ref(usd=5.0)
    renewal = await store.heartbeat(roomy, "l1", NOW + 60, 60)
    assert (renewal.alive, renewal.short_at, renewal.short_of) == (True, 0.0, None)
    assert await spent(store, "t1", NOW + 60) == (1, 0.0, pytest.approx(2.0), 1)


@pytest.mark.parametrize(
    ("pool_usd", "tenant_usd", "short"),
    [(1.5, 5.0, "pool"), (5.0, 1.5, "tenant"), (1.5, 1.5, "pool")],
    ids=["pool", "tenant", "both"],
)
async def test_a_short_renewal_says_whose_budget_is_short(
    store: StateStore, pool_usd: float, tenant_usd: float, short: str
) -> None:
    """The commit (its TTL past a 10 s lifetime) and a heartbeat say which budget could
    not hold the renewal: the pool's when it is short (asked first), else the tenant's."""
    r = ref(limits=Limits(usd=pool_usd), usd=tenant_usd)
    no_fee = Meter(0.01, 0.0, 0.0, 100.0, 50.0, kill=True)
    assert (await store.reserve(r, CFG, "l1", NOW, 30, meter=no_fee)).granted  # $1.00 held
    lifetime = replace(no_fee, first=10.0)  # $0.10 more: no room for a $0.50 renewal
    assert (await store.reserve(r, CFG, "l2", NOW, 30, meter=lifetime)).granted
    settled = await store.settle(r, CFG, "l2", NOW, outcome=Outcome.SUCCESS, ttl=60)
    assert (settled.short_at, settled.short_of) == (NOW + 10, short)
    await store.settle(r, CFG, "l1", NOW, outcome=Outcome.SUCCESS, ttl=60)
    renewal = await store.heartbeat(r, "l1", NOW + 50, 60)
    assert (renewal.short_at, renewal.short_of) == (NOW + 100, short)


async def test_a_day_window_resets_at_midnight_in_its_timezone(store: StateStore) -> None:
    day = DailyWindow("Europe/Paris")
    r = ref(sessions=1, window=day)
    assert (await store.reserve(r, CFG, "l1", NOW, 30)).granted
    assert not (await store.reserve(r, CFG, "l2", NOW + 60, 30)).granted
    midnight = day.reset_at(NOW).timestamp()
    assert (await store.reserve(r, CFG, "l3", midnight, 30)).granted
    assert await spent(store, "t1", midnight, day) == (1, 0.0, 0.0, 1)


async def test_tenants_lists_the_top_spenders_of_the_window(store: StateStore) -> None:
    for i, tenant in enumerate(["small", "big", "none"]):
        r = ref(tenant, usd=100)
        meter = None if tenant == "none" else METER
        await store.reserve(r, CFG, f"l{i}", NOW, 30, meter=meter)
        await store.settle(r, CFG, f"l{i}", NOW, outcome=Outcome.SUCCESS, ttl=600)
        await store.release(r, f"l{i}", NOW + (100 if tenant == "big" else 10))
    top = await store.tenants(MONTH, NOW + 100, 2)
    assert [(t.tenant, t.sessions) for t in top] == [("big", 1), ("small", 1)]
    assert [t.usd for t in top] == [pytest.approx(1.5), pytest.approx(0.6)]


async def test_an_outage_hand_over_counts_to_its_tenant_once(store: StateStore) -> None:
    r = ref(usd=10, concurrent=2)
    await store.reserve(r, CFG, "unanswered", NOW, 30, meter=METER)  # the store made it
    held = (HeldLease("h1", r.entry, NOW - 5, 60, meter=METER),)
    spend = Spend(r, sessions=2, sandbox_seconds=10, leases=held, unanswered=("unanswered",),
                  usd=0.6)  # fmt: skip
    assert await store.reconcile("j1", [spend, Spend(ref(None), sessions=1)], NOW) == 2
    assert await store.reconcile("j1", [spend], NOW) == 0  # once
    # 2 sessions and $0.6 handed over; h1 held ($0.5 fee + 100 s at $0.01); the unanswered
    # reservation refunded.
    assert await spent(store, "t1", NOW) == (2, pytest.approx(0.6), pytest.approx(1.5), 1)
    pool = (await store.snapshot([r], NOW)).pools["p"]
    assert pool.used["sessions"] == 3
    await store.release(r, "h1", NOW + 10)
    assert await spent(store, "t1", NOW + 10) == (2, pytest.approx(0.6 + 0.65), 0.0, 0)  # 15 s


async def warm_made(store: StateStore, r: EntryRef, lid: str, paused: bool) -> None:
    """A refill's priced warm sandbox (no tenant: the pool's), ready from NOW."""
    assert (await store.reserve(r, CFG, lid, NOW, 30, meter=replace(METER, first=130))).granted
    await store.settle(r, CFG, lid, NOW, outcome=Outcome.SUCCESS, ttl=130)
    assert await store.warm_put(r, lid, WarmRecord(f"sb-{lid}", NOW, NOW + 100, NOW + 130, paused),
                                NOW)  # fmt: skip


@pytest.mark.parametrize("paused", [False, True], ids=["running", "paused"])
async def test_a_warm_claim_holds_its_cover_against_the_tenant_usd_budget(
    store: StateStore, paused: bool
) -> None:
    """A claim's cover (100 s at $0.01, no fee: $1.00) is held against its tenant's usd
    in the claim's call: one claim fits $1.50, the second is refused for the tenant's
    usd and claims nothing, another tenant claims it, and the release settles it."""
    pool = ref(None, limits=Limits(usd=100))
    for lid in ("w1", "w2"):
        await warm_made(store, pool, lid, paused)
    t1, t2 = ref("t1", limits=Limits(usd=100), usd=1.5), ref("t2", limits=Limits(usd=100), usd=1.0)
    got = await store.reserve(t1, CFG, "l1", NOW + 10, 30, warm=True, meter=METER)
    assert got.claimed is not None
    assert got.claimed.lease_id == "w1"
    assert await spent(store, "t1", NOW + 10) == (0, 0.0, pytest.approx(1.0), 1)
    denied = await store.reserve(t1, CFG, "l2", NOW + 10, 30, warm=True, meter=METER)
    assert (denied.granted, denied.reason, denied.unit, denied.detail) == (
        False, "tenant", "usd", "t1",
    )  # fmt: skip
    assert (denied.used, denied.limit) == (pytest.approx(1.0), 1.5)
    assert set(await store.warm_list(pool, NOW + 10)) == {"w2"}  # nothing claimed for t1
    assert await spent(store, "t1", NOW + 10) == (0, 0.0, pytest.approx(1.0), 1)
    other = await store.reserve(t2, CFG, "l3", NOW + 10, 30, warm=True, meter=METER)
    assert other.claimed is not None
    assert other.claimed.lease_id == "w2"  # $1.00 fits $1.00
    await store.settle(t1, CFG, "w1", NOW + 10, outcome=Outcome.SUCCESS, ttl=60)
    await store.release(t1, "w1", NOW + 30)
    assert await spent(store, "t1", NOW + 30) == (0, pytest.approx(0.2), 0.0, 0)


async def test_two_claims_racing_for_a_tenants_last_dollar_get_one(store: StateStore) -> None:
    pool = ref(None, limits=Limits(usd=100))
    for lid in ("w1", "w2", "w3"):
        await warm_made(store, pool, lid, False)
    t = ref("t1", limits=Limits(usd=100), usd=1.9)
    got = await asyncio.gather(
        *(store.reserve(t, CFG, f"l{i}", NOW + 5, 30, warm=True, meter=METER) for i in range(2))
    )
    assert sorted(r.granted for r in got) == [False, True]
    assert sum(r.claimed is not None for r in got) == 1
    assert len(await store.warm_list(pool, NOW + 5)) == 2
    assert (await spent(store, "t1", NOW + 5))[2] == pytest.approx(1.0)
