"""The warm-pool part of the store contract: the same answers on Redis, SQLite, memory."""

from __future__ import annotations

import pytest

from policies.breaker import Outcome
from policies.warm import WarmRecord
from router.state import StateStore
from tests.state.test_contract import CFG, NOW, ref


async def made(
    store: StateStore, r: object, lid: str, at: float, *, paused: bool = False, idle: float = 60
) -> WarmRecord:
    """A refill's create: reserve, commit, then put in the pool."""
    assert (await store.reserve(r, CFG, lid, at, 30)).granted  # type: ignore[arg-type]
    assert (await store.settle(r, CFG, lid, at, outcome=Outcome.SUCCESS, ttl=idle + 30)).applied  # type: ignore[arg-type]
    record = WarmRecord(f"sb-{lid}", at, at + idle, at + idle + 30, paused)
    assert await store.warm_put(r, lid, record, at)  # type: ignore[arg-type]
    return record


async def test_a_claim_hands_over_the_first_made_under_its_lease_id(store: StateStore) -> None:
    r = ref(sessions=2, concurrent=2)
    await made(store, r, "w2", NOW + 1)
    await made(store, r, "w1", NOW)
    got = await store.reserve(r, CFG, "l-new", NOW + 10, 30, warm=True)
    assert got.granted
    assert got.claimed is not None
    assert (got.claimed.lease_id, got.claimed.sandbox_id, got.claimed.paused) == (
        "w1",
        "sb-w1",
        False,
    )
    assert got.claimed.idle == pytest.approx(10)
    assert got.claimed.metered == pytest.approx(10)
    assert set(await store.warm_list(r, NOW + 10)) == {"w2"}
    assert await store.warm_take(r, "w1", NOW + 10) is None  # claimed: the refill kills nothing
    # sessions spent by the creates only; the claimed lease keeps its slot (2 of 2)
    snap = await store.snapshot([r], NOW + 10)
    assert snap.pools["p"].used == {"sessions": 2, "sandbox_seconds": 10, "concurrent": 2, "usd": 0}
    assert (await store.settle(r, CFG, "w1", NOW + 11, outcome=Outcome.SUCCESS, ttl=60)).applied
    assert await store.release(r, "w1", NOW + 21) == pytest.approx(10)


async def test_without_warm_or_with_none_ready_a_reserve_creates(store: StateStore) -> None:
    r = ref(sessions=5)
    await made(store, r, "w1", NOW)
    plain = await store.reserve(r, CFG, "l1", NOW + 1, 30)
    assert plain.granted
    assert plain.claimed is None
    assert (await store.reserve(r, CFG, "l2", NOW + 1, 30, warm=True)).claimed is not None
    empty = await store.reserve(r, CFG, "l3", NOW + 1, 30, warm=True)
    assert (empty.granted, empty.claimed) == (True, None)
    assert (await store.snapshot([r], NOW + 1)).pools["p"].used["sessions"] == 3


async def test_a_claimed_lease_given_back_refunds_the_slot_but_not_the_session(
    store: StateStore,
) -> None:
    r = ref(sessions=1, concurrent=1)
    await made(store, r, "w1", NOW)
    assert (await store.reserve(r, CFG, "l1", NOW + 2, 30, warm=True)).claimed is not None
    assert (await store.settle(r, CFG, "w1", NOW + 3, outcome=Outcome.NEUTRAL)).applied
    snap = await store.snapshot([r], NOW + 3)
    assert snap.pools["p"].used == {"sessions": 1, "sandbox_seconds": 2, "concurrent": 0, "usd": 0}


async def test_past_its_deadline_it_is_not_claimed_and_take_meters_it_once(
    store: StateStore,
) -> None:
    r = ref()
    await made(store, r, "w1", NOW, idle=60)
    assert (await store.reserve(r, CFG, "l1", NOW + 61, 30, warm=True)).claimed is None
    assert set(await store.warm_list(r, NOW + 61)) == {"w1"}  # the refill kills it
    assert await store.warm_take(r, "w1", NOW + 62) == pytest.approx(62)
    assert await store.warm_take(r, "w1", NOW + 63) is None
    assert await store.warm_list(r, NOW + 63) == {}
    snap = await store.snapshot([r], NOW + 63)
    assert snap.pools["p"].used["sandbox_seconds"] == pytest.approx(62)
    assert snap.entries["a"].live_leases == 1  # l1


async def test_a_paused_one_holds_no_slot_until_claimed(store: StateStore) -> None:
    r = ref(concurrent=1)
    await made(store, r, "w1", NOW, paused=True)
    snap = await store.snapshot([r], NOW + 5)
    assert snap.pools["p"].used["concurrent"] == 0
    assert await store.lease_ids(r, NOW + 5) == set()
    assert await store.warm_kept(r, NOW + 5) == {"w1"}
    assert (await store.reserve(r, CFG, "l1", NOW + 5, 30)).granted  # takes the one slot
    full = await store.reserve(r, CFG, "l2", NOW + 6, 30, warm=True)
    assert (full.granted, full.unit, full.claimed) == (False, "concurrent", None)
    await store.settle(r, CFG, "l1", NOW + 7, outcome=Outcome.NEUTRAL)
    got = await store.reserve(r, CFG, "l3", NOW + 8, 30, warm=True)
    assert got.claimed is not None
    assert (got.claimed.lease_id, got.claimed.paused, got.claimed.metered) == ("w1", True, 0)
    assert await store.lease_ids(r, NOW + 8) == {"w1"}


async def test_an_open_breaker_or_used_seconds_hand_out_nothing(store: StateStore) -> None:
    r = ref(sandbox_seconds=100)
    await made(store, r, "w1", NOW)
    for i in range(3):
        await store.record(r, CFG, Outcome.TRANSIENT, NOW + 1 + i)
    denied = await store.reserve(r, CFG, "l1", NOW + 5, 30, warm=True)
    assert (denied.granted, denied.reason, denied.claimed) == (False, "open", None)
    probe = await store.reserve(r, CFG, "l2", NOW + 20, 30, warm=True)  # cooldown over
    assert (probe.granted, probe.probe, probe.claimed) == (True, True, None)
    await store.settle(r, CFG, "l2", NOW + 20, outcome=Outcome.SUCCESS, ttl=30)
    await store.set_usage(r, "sandbox_seconds", 100, NOW + 21)
    spent = await store.reserve(r, CFG, "l3", NOW + 21, 30, warm=True)
    assert (spent.granted, spent.unit, spent.claimed) == (False, "sandbox_seconds", None)


async def test_the_janitor_keeps_warm_and_leased_sandboxes(store: StateStore) -> None:
    r = ref()
    await made(store, r, "w1", NOW)
    await made(store, r, "w2", NOW, paused=True)
    await store.reserve(r, CFG, "l1", NOW, 30)
    assert await store.warm_kept(r, NOW + 1) == {"w1", "w2", "l1"}
    assert await store.warm_kept(r, NOW + 200) == set()  # every record and lease expired


async def test_a_put_needs_a_committed_lease(store: StateStore) -> None:
    r = ref()
    record = WarmRecord("sb", NOW, NOW + 60, NOW + 90)
    assert not await store.warm_put(r, "nope", record, NOW)
    await store.reserve(r, CFG, "l1", NOW, 30)
    assert not await store.warm_put(r, "l1", record, NOW)  # reserved, not committed
    assert await store.warm_list(r, NOW) == {}


async def test_a_record_put_again_is_the_one_kept(store: StateStore) -> None:
    """`policies.warm.put` replaces a lease's record; every store keeps the later one (the
    memory and SQLite stores kept the first: the Lua parity test found it)."""
    r = ref(sessions=2, concurrent=2)
    await made(store, r, "w1", NOW, idle=60)
    later = WarmRecord("sb-w1", NOW, NOW + 90, NOW + 120)
    assert await store.warm_put(r, "w1", later, NOW + 1)
    assert await store.warm_list(r, NOW + 1) == {"w1": later}
