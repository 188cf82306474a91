"""Paused storage's holds on every store: held at the pause, refused past the budget,
settled to the storage used, charged whole once lapsed, kept when the leases go."""

from __future__ import annotations

from dataclasses import replace

import pytest

from policies.breaker import BreakerConfig, Outcome
from policies.paused import LAPSE_GRACE, PausedHold
from policies.quota import Limits, Meter, MonthlyWindow, QuotaDenial
from policies.tenants import TenantDenial, TenantLimits
from router.state import EntryRef, StateStore, TenantRef

NOW = 1_790_000_000.0
CFG = BreakerConfig()
METER = Meter(0.01, 0.0, 0.0, 100.0, 50.0)  # a lease holds $1.00
HOUR = PausedHold("a", NOW, NOW + 3600, 0.0001)  # $0.36 of storage for an hour


def ref(usd: float | None = None) -> EntryRef:
    return EntryRef("a", "p", Limits(usd=usd), MonthlyWindow(), "fp")


async def usage(store: StateStore, r: EntryRef, now: float) -> tuple[float, float]:
    pool = (await store.snapshot([r], now)).pools["p"]
    return pool.used["usd"], pool.usd_held


async def test_a_pause_holds_its_storage_and_its_resume_settles_what_was_used(
    store: StateStore,
) -> None:
    r = ref(usd=1.0)
    assert await store.hold_paused(r, "sb", HOUR, NOW) is None
    assert await usage(store, r, NOW) == (0.0, pytest.approx(0.36))
    assert await store.settle_paused(r, "sb", NOW + 900) == pytest.approx(0.09)
    assert await usage(store, r, NOW + 900) == (pytest.approx(0.09), 0.0)
    assert await store.settle_paused(r, "sb", NOW + 901) is None  # settled once


async def test_a_pause_the_budget_cannot_hold_is_refused_and_changes_nothing(
    store: StateStore,
) -> None:
    r = ref(usd=1.2)
    assert (await store.reserve(r, CFG, "l1", NOW, 30, meter=METER)).granted
    await store.settle(r, CFG, "l1", NOW, outcome=Outcome.SUCCESS, ttl=60)
    denied = await store.hold_paused(r, "sb", HOUR, NOW + 10)
    assert denied == QuotaDenial("usd", pytest.approx(1.0), 1.2)  # type: ignore[arg-type]
    assert await usage(store, r, NOW + 10) == (0.0, pytest.approx(1.0))
    assert await store.settle_paused(r, "sb", NOW + 10) is None
    assert await store.hold_paused(r, "sb", PausedHold("a", NOW, NOW + 1800, 0.0001), NOW) is None


async def test_the_paused_hold_outlives_the_lease_it_was_paused_from(store: StateStore) -> None:
    """The lease is released after its sandbox is paused: the pool keeps the storage's
    hold (no lease is left, and still something is held), so nothing takes its room."""
    r = ref(usd=1.4)
    await store.reserve(r, CFG, "l1", NOW, 30, meter=METER)
    await store.settle(r, CFG, "l1", NOW, outcome=Outcome.SUCCESS, ttl=60)
    paused = PausedHold("a", NOW + 10, NOW + 3610, 0.0001)
    assert await store.hold_paused(r, "sb", paused, NOW + 10) is None  # 1.36 of 1.4
    await store.release(r, "l1", NOW + 10)
    assert await usage(store, r, NOW + 10) == (pytest.approx(0.1), pytest.approx(0.36))
    assert not (await store.reserve(r, CFG, "l2", NOW + 11, 30, meter=METER)).granted
    assert await store.settle_paused(r, "sb", NOW + 10 + 360) == pytest.approx(0.036)
    assert await usage(store, r, NOW + 370) == (pytest.approx(0.136), 0.0)
    assert (await store.reserve(r, CFG, "l2", NOW + 371, 30, meter=METER)).granted


async def test_a_lapsed_hold_is_charged_whole_never_more(store: StateStore) -> None:
    """Settled after its end (the janitor's reap), a hold is charged whole; one nobody
    settles a grace past its end (its sandbox gone unseen) is charged whole by the store."""
    r = ref(usd=2.0)
    assert await store.hold_paused(r, "sb", HOUR, NOW) is None
    assert await store.hold_paused(r, "sb2", PausedHold("a", NOW, NOW + 7200, 0.0001), NOW) is None
    assert await store.settle_paused(r, "sb", NOW + 5000) == pytest.approx(0.36)
    assert await usage(store, r, NOW + 5000) == (pytest.approx(0.36), pytest.approx(0.72))
    later = NOW + 7200 + LAPSE_GRACE
    assert await usage(store, r, later - 1) == (pytest.approx(0.36), pytest.approx(0.72))
    assert await usage(store, r, later) == (pytest.approx(1.08), 0.0)
    assert await store.settle_paused(r, "sb2", later + 1) is None  # charged once
    assert await usage(store, r, later + 1) == (pytest.approx(1.08), 0.0)


async def test_a_sandbox_paused_again_settles_its_first_hold(store: StateStore) -> None:
    r = ref(usd=0.55)
    await store.hold_paused(r, "sb", HOUR, NOW)
    again = PausedHold("a", NOW + 1800, NOW + 5400, 0.0001)
    assert await store.hold_paused(r, "sb", again, NOW + 1800) is None  # 0.18 freed: 0.54
    assert await usage(store, r, NOW + 1800) == (pytest.approx(0.18), pytest.approx(0.36))


T = TenantRef("t", TenantLimits(usd=0.5), MonthlyWindow())


def tenant_ref(usd: float | None = None, tenant: TenantRef = T) -> EntryRef:
    return replace(ref(usd), tenant=tenant)


async def tenant_usage(store: StateStore, now: float) -> tuple[float, float] | None:
    found = [t for t in await store.tenants(MonthlyWindow(), now, 10) if t.tenant == "t"]
    return (found[0].usd, found[0].usd_held) if found else None


async def test_a_tenants_pause_is_held_against_its_budget_too(store: StateStore) -> None:
    """The pool has room, the tenant has not: refused by the tenant, nothing held by
    either; with room it is held by both, named by the hold, and settled by both."""
    tight = tenant_ref(5.0, TenantRef("t", TenantLimits(usd=0.3), MonthlyWindow()))
    denied = await store.hold_paused(tight, "sb", HOUR, NOW)
    assert denied == TenantDenial("usd", 0.0, 0.3)
    assert await usage(store, tight, NOW) == (0.0, 0.0)
    assert await store.paused_tenant(tight, "sb") is None
    r = tenant_ref(5.0)
    assert await store.hold_paused(r, "sb", HOUR, NOW) is None
    assert await store.paused_tenant(ref(), "sb") == "t"
    assert await tenant_usage(store, NOW) == (0.0, pytest.approx(0.36))
    assert await store.settle_paused(r, "sb", NOW + 900) == pytest.approx(0.09)
    assert await tenant_usage(store, NOW + 900) == (pytest.approx(0.09), 0.0)
    assert await usage(store, r, NOW + 900) == (pytest.approx(0.09), 0.0)
    assert await store.paused_tenant(r, "sb") is None


async def test_a_tenants_pause_and_lease_share_its_budget(store: StateStore) -> None:
    """A lease holding $1.00 of the tenant's $1.20 leaves no room for $0.36 of storage;
    its release settles what it cost and the pause fits."""
    r = tenant_ref(5.0, TenantRef("t", TenantLimits(usd=1.2), MonthlyWindow()))
    assert (await store.reserve(r, CFG, "l1", NOW, 30, meter=METER)).granted
    await store.settle(r, CFG, "l1", NOW, outcome=Outcome.SUCCESS, ttl=60)
    denied = await store.hold_paused(r, "sb", HOUR, NOW + 10)
    assert denied == TenantDenial("usd", pytest.approx(1.0), 1.2)  # type: ignore[arg-type]
    await store.release(r, "l1", NOW + 10)  # $0.10 spent
    assert (
        await store.hold_paused(r, "sb", PausedHold("a", NOW + 10, NOW + 3610, 0.0001), NOW + 10)
        is None
    )
    assert await tenant_usage(store, NOW + 10) == (pytest.approx(0.1), pytest.approx(0.36))


async def test_a_tenants_copy_settled_without_it_lapses_charged_whole(store: StateStore) -> None:
    """A settle that does not name the tenant charges the pool what was used; the
    tenant's copy is charged whole by its next call a grace past the hold's end."""
    r = tenant_ref(5.0)
    assert await store.hold_paused(r, "sb", HOUR, NOW) is None
    assert await store.settle_paused(ref(5.0), "sb", NOW + 900) == pytest.approx(0.09)
    assert await tenant_usage(store, NOW + 900) == (0.0, pytest.approx(0.36))
    later = NOW + 3600 + LAPSE_GRACE
    assert (
        await store.hold_paused(r, "sc", PausedHold("a", later, later + 60, 0.0001), later) is None
    )
    assert await tenant_usage(store, later) == (pytest.approx(0.36), pytest.approx(0.006))
