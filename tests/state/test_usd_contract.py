"""The usd unit on every store: holds, settles, refunds, expiries, renewals, hand-overs."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from policies.breaker import BreakerConfig, Outcome
from policies.quota import Limits, Meter, MonthlyWindow
from router.state import EntryRef, HeldLease, Spend, StateStore, open_store

NOW = 1_790_000_000.0
CFG = BreakerConfig()
# $0.01 a second with a $0.5 fee, a first cover of 100 s, renewed by 50 s.
METER = Meter(0.01, 0.5, 0.0, 100.0, 50.0)


def ref(usd: float | None = None) -> EntryRef:
    return EntryRef("a", "p", Limits(usd=usd), MonthlyWindow(), "fp")


async def usage(store: StateStore, r: EntryRef, now: float) -> tuple[float, float]:
    pool = (await store.snapshot([r], now)).pools["p"]
    return pool.used["usd"], pool.usd_held


async def test_a_hold_is_the_fee_and_the_first_cover_and_admits_only_what_fits(
    store: StateStore,
) -> None:
    r = ref(usd=3.2)
    assert (await store.reserve(r, CFG, "l1", NOW, 30, meter=METER)).granted  # holds 1.5
    assert (await store.reserve(r, CFG, "l2", NOW, 30, meter=METER)).granted  # 3.0 held
    denied = await store.reserve(r, CFG, "l3", NOW, 30, meter=METER)
    assert (denied.granted, denied.reason, denied.unit) == (False, "quota", "usd")
    assert (denied.used, denied.limit) == (pytest.approx(3.0), 3.2)
    assert await usage(store, r, NOW) == (0.0, pytest.approx(3.0))
    cheap = Meter(0.001, 0.0, 0.0, 100.0, 50.0)  # holds 0.1: fits
    assert (await store.reserve(r, CFG, "l4", NOW, 30, meter=cheap)).granted


async def test_release_settles_the_hold_to_the_metered_cost(store: StateStore) -> None:
    r = ref(usd=10)
    await store.reserve(r, CFG, "l1", NOW, 30, meter=METER)
    await store.settle(r, CFG, "l1", NOW + 1, outcome=Outcome.SUCCESS, ttl=60)
    assert await store.release(r, "l1", NOW + 21) == pytest.approx(20)
    assert await usage(store, r, NOW + 21) == (pytest.approx(0.5 + 0.2), 0.0)


async def test_a_refund_gives_the_hold_back_and_charges_nothing(store: StateStore) -> None:
    r = ref(usd=1.5)
    await store.reserve(r, CFG, "l1", NOW, 30, meter=METER)
    assert (await store.settle(r, CFG, "l1", NOW + 1, outcome=Outcome.TRANSIENT)).applied
    assert await usage(store, r, NOW + 1) == (0.0, 0.0)
    assert (await store.reserve(r, CFG, "l2", NOW + 2, 30, meter=METER)).granted


async def test_a_reservation_released_uncommitted_is_charged_its_fee(store: StateStore) -> None:
    """A late create's sandbox was made: its session stays spent, so does its fee."""
    r = ref(usd=10)
    await store.reserve(r, CFG, "l1", NOW, 30, meter=METER)
    assert await store.release(r, "l1", NOW + 5) == 0
    assert await usage(store, r, NOW + 5) == (pytest.approx(0.5), 0.0)


async def test_a_reconnect_holds_and_pays_no_fee(store: StateStore) -> None:
    r = ref(usd=10)
    await store.reserve(r, CFG, "l1", NOW, 30, meter=METER, new_session=False)
    assert await usage(store, r, NOW) == (0.0, pytest.approx(1.0))
    await store.settle(r, CFG, "l1", NOW, outcome=Outcome.SUCCESS, ttl=60)
    await store.release(r, "l1", NOW + 10)
    assert await usage(store, r, NOW + 10) == (pytest.approx(0.1), 0.0)


async def test_an_expired_lease_is_charged_until_its_expiry(store: StateStore) -> None:
    r = ref(usd=10)
    await store.reserve(r, CFG, "l1", NOW, 30, meter=METER)
    await store.settle(r, CFG, "l1", NOW, outcome=Outcome.SUCCESS, ttl=40)
    assert await usage(store, r, NOW + 41) == (pytest.approx(0.5 + 0.4), 0.0)
    assert await store.release(r, "l1", NOW + 50) is None


async def test_heartbeats_renew_the_cover_while_the_budget_holds_it(store: StateStore) -> None:
    r = ref(usd=2.0)
    await store.reserve(r, CFG, "l1", NOW, 30, meter=METER)  # 1.5 held: 100 s covered
    assert (await store.settle(r, CFG, "l1", NOW, outcome=Outcome.SUCCESS, ttl=60)).short_at == 0
    renewed = await store.heartbeat(r, "l1", NOW + 50, 60)  # to NOW+110: one renewal, 0.5
    assert (renewed.alive, renewed.short_at) == (True, 0.0)
    assert await usage(store, r, NOW + 50) == (0.0, pytest.approx(2.0))
    short = await store.heartbeat(r, "l1", NOW + 100, 60)  # to NOW+160: 0.5 more, no room
    assert short.alive
    assert short.short_at == pytest.approx(NOW + 200)  # overdrawn: the cover grew anyway
    assert await usage(store, r, NOW + 100) == (0.0, pytest.approx(2.5))
    assert not (await store.reserve(r, CFG, "l2", NOW + 100, 30, meter=METER)).granted
    await store.release(r, "l1", NOW + 120)
    assert await usage(store, r, NOW + 120) == (pytest.approx(0.5 + 1.2), 0.0)


async def test_a_kill_lease_that_cannot_renew_expires_with_its_cover(store: StateStore) -> None:
    r = ref(usd=1.6)
    kill = Meter(0.01, 0.5, 0.0, 100.0, 50.0, kill=True)
    await store.reserve(r, CFG, "l1", NOW, 30, meter=kill)
    await store.settle(r, CFG, "l1", NOW, outcome=Outcome.SUCCESS, ttl=60)
    short = await store.heartbeat(r, "l1", NOW + 50, 60)
    assert short.short_at == pytest.approx(NOW + 100)
    assert await usage(store, r, NOW + 50) == (0.0, pytest.approx(1.5))
    # The app crashed: charged to the cover's end, never past it.
    assert await usage(store, r, NOW + 130) == (pytest.approx(1.5), 0.0)
    assert not await store.heartbeat(r, "l1", NOW + 131, 60)


async def test_a_commit_past_a_short_lifetime_renews_at_once(store: StateStore) -> None:
    r = ref(usd=0.7)
    short = Meter(0.01, 0.5, 0.0, 10.0, 50.0, kill=True)  # lifetime 10 s: 0.6 held
    await store.reserve(r, CFG, "l1", NOW, 30, meter=short)
    settled = await store.settle(r, CFG, "l1", NOW, outcome=Outcome.SUCCESS, ttl=60)
    assert settled.applied
    assert settled.short_at == pytest.approx(NOW + 10)
    assert await usage(store, r, NOW + 11) == (pytest.approx(0.6), 0.0)


async def test_a_step_billed_lease_runs_out_the_step_it_paid_for(store: StateStore) -> None:
    """Billed by the minute, renewed 2 s at a time: the first hold pays a whole minute,
    so the lease's cover ends at that minute's end, not 2 s in; it is charged the
    minute, what it held."""
    r = ref(usd=0.9)
    minute = Meter(0.01, 0.0, 60.0, 2.0, 2.0, kill=True)  # holds $0.60
    await store.reserve(r, CFG, "l1", NOW, 30, meter=minute)
    inside = await store.settle(r, CFG, "l1", NOW, outcome=Outcome.SUCCESS, ttl=30)
    assert (inside.applied, inside.short_at) == (True, 0.0)  # 30 s: inside the paid minute
    assert (await store.heartbeat(r, "l1", NOW + 25, 30)).short_at == 0.0  # to 55 s
    short = await store.heartbeat(r, "l1", NOW + 40, 30)  # to 70 s: a minute more, no room
    assert short.short_at == pytest.approx(NOW + 60)
    assert await usage(store, r, NOW + 40) == (0.0, pytest.approx(0.6))
    assert await store.heartbeat(r, "l1", NOW + 59, 30)  # alive until the minute ends
    assert await usage(store, r, NOW + 61) == (pytest.approx(0.6), 0.0)  # crashed: the minute


async def test_a_handed_over_lease_is_held_and_its_outage_spend_added(store: StateStore) -> None:
    r = ref(usd=5)
    held = HeldLease("l9", "a", NOW - 10, 60, "sb", METER)
    assert await store.reconcile("j1", [Spend(r, 1, 5.0, (held,), usd=0.25)], NOW) == 1
    spent, hold = await usage(store, r, NOW)
    assert spent == pytest.approx(0.25)
    assert hold == pytest.approx(1.5)  # covers 100 s from its start: past NOW + 60
    await store.release(r, "l9", NOW + 10)
    assert await usage(store, r, NOW + 10) == (pytest.approx(0.25 + 0.5 + 0.2), 0.0)


async def test_an_operator_sets_the_spend(store: StateStore) -> None:
    r = ref(usd=1)
    await store.set_usage(r, "usd", 0.9, NOW)
    assert (await store.reserve(r, CFG, "l1", NOW, 30, meter=METER)).unit == "usd"
    assert (await store.reserve(r, CFG, "l2", NOW, 30)).granted  # unpriced: holds nothing


async def test_a_database_from_before_usd_is_migrated(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    with sqlite3.connect(path) as db:
        db.executescript(
            """
            CREATE TABLE usage (ns TEXT NOT NULL, pool TEXT NOT NULL, window TEXT NOT NULL,
                sessions INTEGER NOT NULL DEFAULT 0, sandbox_seconds REAL NOT NULL DEFAULT 0,
                PRIMARY KEY (ns, pool, window));
            CREATE TABLE leases (ns TEXT NOT NULL, pool TEXT NOT NULL, lease_id TEXT NOT NULL,
                entry TEXT NOT NULL, started REAL NOT NULL, expires REAL NOT NULL,
                ttl REAL NOT NULL, live INTEGER NOT NULL, counted INTEGER NOT NULL,
                sandbox_id TEXT NOT NULL, PRIMARY KEY (ns, pool, lease_id));
            INSERT INTO usage VALUES ('sandbox-router', 'p', '2026-09-01', 2, 7.5);
            INSERT INTO leases VALUES ('sandbox-router', 'p', 'old', 'a', 0, 1e12, 60, 1, 1, 'sb');
            CREATE TABLE held (ns TEXT NOT NULL, pool TEXT NOT NULL, entry TEXT NOT NULL,
                leases INTEGER NOT NULL, PRIMARY KEY (ns, pool, entry));
            INSERT INTO held VALUES ('sandbox-router', 'p', 'a', 1);
            PRAGMA user_version=1;
            """
        )
    store = open_store(f"sqlite:///{path}", "sandbox-router")
    r = ref(usd=1)
    try:
        snap = (await store.snapshot([r], NOW)).pools["p"]
        assert snap.used == {"sessions": 2, "sandbox_seconds": 7.5, "concurrent": 1, "usd": 0}
        assert (await store.reserve(r, CFG, "l1", NOW, 30, meter=METER)).unit == "usd"
        assert await store.release(r, "old", NOW) is not None  # unpriced: charges nothing
        assert await usage(store, r, NOW) == (0.0, 0.0)
    finally:
        await store.close()
