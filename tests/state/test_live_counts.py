"""Each store keeps a count of the leases held per entry, so a snapshot (what the
balanced strategy reads on every acquire) costs the same at ten live leases
as at a hundred thousand.

The counts are kept by every call that adds or drops a lease (reserve,
refund, release, the purge of expired leases, a reconcile's held leases);
random operation sequences check them against the lease rows themselves
after every step, on Redis (the Lua scripts), SQLite and memory.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import secrets
import sqlite3
import tempfile
from collections.abc import Iterator
from itertools import accumulate
from pathlib import Path
from typing import Any

import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from policies.breaker import BreakerConfig, Outcome
from policies.quota import Limits, MonthlyWindow
from router.state import EntryRef, HeldLease, Spend, StateStore
from router.state.memory import MemoryStore
from router.state.redis import RedisStore
from router.state.scripts import RunnerName
from tests.state.conftest import make_store

CFG = BreakerConfig(failure_threshold=50, min_calls=1000)  # health is not under test here
LIMITS = Limits(sessions=40, concurrent=5)
REFS = [
    EntryRef("a", "p", LIMITS, MonthlyWindow(), "fp"),
    EntryRef("b", "p", LIMITS, MonthlyWindow(), "fp"),
]
START = 1_790_000_000.0
Slot = tuple[str, float]  # entry, expiry

lease_ids = st.sampled_from([f"l{i}" for i in range(8)])
ops = st.one_of(
    st.tuples(st.just("reserve"), st.integers(0, 1), lease_ids, st.integers(1, 60)),
    st.tuples(st.just("commit"), st.integers(0, 1), lease_ids, st.integers(1, 60)),
    st.tuples(st.just("refund"), st.integers(0, 1), lease_ids),
    st.tuples(st.just("release"), st.integers(0, 1), lease_ids),
    st.tuples(st.just("heartbeat"), st.integers(0, 1), lease_ids, st.integers(1, 60)),
    st.tuples(st.just("reconcile"), st.integers(0, 1), st.lists(lease_ids, max_size=3)),
    st.tuples(st.just("snapshot")),
    st.tuples(st.just("advance"), st.integers(0, 40)),
)


async def apply(store: StateStore, op: tuple[Any, ...], now: float) -> None:
    kind = op[0]
    if kind == "reserve":
        await store.reserve(REFS[op[1]], CFG, op[2], now, op[3])
    elif kind == "commit":
        await store.settle(REFS[op[1]], CFG, op[2], now, outcome=Outcome.SUCCESS, ttl=op[3])
    elif kind == "refund":
        await store.settle(REFS[op[1]], CFG, op[2], now, outcome=Outcome.TRANSIENT)
    elif kind == "release":
        await store.release(REFS[op[1]], op[2], now)
    elif kind == "heartbeat":
        await store.heartbeat(REFS[op[1]], op[2], now, op[3])
    elif kind == "reconcile":
        ref = REFS[op[1]]
        held = tuple(HeldLease(lid, ref.entry, now - 5, 30) for lid in dict.fromkeys(op[2]))
        await store.reconcile(secrets.token_hex(4), [Spend(ref, 1, 2.0, held)], now)


async def rows(store: StateStore, kind: str, db: Path) -> tuple[dict[str, int], list[Slot]]:
    """The store's kept counts per entry, and its lease rows themselves (white-box)."""
    if kind == "memory":
        assert isinstance(store, MemoryStore)
        tables: Any = store._tables
        slots = tables.slots["p"].values()
        return dict(tables.counts["p"]), [(s.entry, s.expires) for s in slots]
    if kind == "sqlite":
        return sqlite_rows(store.prefix, db)
    client: Any = store.client  # type: ignore[attr-defined]
    tag = f"{{{store.prefix}:p}}"
    expiry = {
        k.decode(): v for k, v in await client.zrange(f"{tag}:leases", 0, -1, withscores=True)
    }
    meta = await client.hgetall(f"{tag}:lease")
    assert set(expiry) == {k.decode() for k in meta}
    counts = await client.hgetall(f"{tag}:held")
    kept = {k.decode(): int(v) for k, v in counts.items() if int(v)}  # Redis keeps zeros
    return kept, [(json.loads(v)["entry"], expiry[k.decode()]) for k, v in meta.items()]


def sqlite_rows(prefix: str, db: Path) -> tuple[dict[str, int], list[Slot]]:
    if not db.exists():  # the store opens its file at its first call
        return {}, []
    with contextlib.closing(sqlite3.connect(db)) as conn:
        kept = conn.execute(
            "SELECT entry, leases FROM held WHERE ns=? AND pool='p'", (prefix,)
        ).fetchall()
        leases = conn.execute(
            "SELECT entry, expires FROM leases WHERE ns=? AND pool='p'", (prefix,)
        ).fetchall()
    return dict(kept), leases


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(sequence=st.lists(ops, max_size=30))
@pytest.mark.parametrize("kind", ["redis-resp", "sqlite", "memory"])
def test_kept_counts_match_the_leases_after_every_step(
    redis_url: str, kind: str, sequence: list[Any]
) -> None:
    async def run(tmp: Path) -> None:
        store = make_store(kind, redis_url, f"counts-{secrets.token_hex(4)}", tmp)
        advances = [op[1] if op[0] == "advance" else 0 for op in sequence]
        times = list(accumulate(advances, initial=START))[:-1]  # each op's, "advance" moves it
        try:
            for step, (op, now) in enumerate(zip(sequence, times, strict=True)):
                _, before = await rows(store, kind, tmp / "state.db")
                await apply(store, op, now)
                kept, leases = await rows(store, kind, tmp / "state.db")
                held = collections.Counter(entry for entry, _ in leases)
                assert kept == dict(held), f"step {step}: {op}"
                if op[0] == "snapshot":
                    live = collections.Counter(e for e, expires in before if expires > now)
                    snap = await store.snapshot(REFS, now)
                    assert {r.entry: snap.entries[r.entry].live_leases for r in REFS} == {
                        r.entry: live[r.entry] for r in REFS
                    }, f"step {step}"
                    assert snap.pools["p"].used["concurrent"] == sum(live.values())
        finally:
            await store.close()

    with tempfile.TemporaryDirectory(prefix="counts-") as tmp:
        asyncio.run(run(Path(tmp)))


@pytest.fixture
def lfu(redis_url: str) -> Iterator[redis.Redis]:
    """The test Redis counting every access to a key exactly (LFU, log factor 0, no decay)."""
    with redis.Redis.from_url(redis_url) as admin:
        names = ("maxmemory-policy", "lfu-log-factor", "lfu-decay-time")
        saved = {n: admin.config_get(n)[n] for n in names}
        admin.config_set("maxmemory-policy", "allkeys-lfu")
        admin.config_set("lfu-log-factor", 0)
        admin.config_set("lfu-decay-time", 0)
        try:
            yield admin
        finally:
            for name, value in saved.items():
                admin.config_set(name, value)


@pytest.mark.parametrize("runner", ["resp", "redis-py"])
async def test_a_redis_snapshot_does_not_read_the_leases(
    lfu: redis.Redis, redis_url: str, key_prefix: str, runner: RunnerName
) -> None:
    store = RedisStore(redis_url, key_prefix, runner=runner)
    try:
        held = tuple(HeldLease(f"l{i}", "a", START, 3600) for i in range(50))
        await store.reconcile("fill", [Spend(REFS[0], leases=held)], START)
        await store.snapshot(REFS, START)  # loads the script
        meta = f"{{{key_prefix}:p}}:lease"
        before = lfu.object("freq", meta)
        snap = await store.snapshot(REFS, START + 1)
        assert snap.entries["a"].live_leases == 50
        assert snap.pools["p"].used["concurrent"] == 50
        assert lfu.object("freq", meta) == before  # not one access to the lease slots
    finally:
        await store.close()


async def test_redis_counts_leases_written_before_the_counts_once(
    redis_url: str, key_prefix: str
) -> None:
    store = RedisStore(redis_url, key_prefix)
    try:
        held = tuple(HeldLease(f"l{i}", REFS[i % 2].entry, START, 3600) for i in range(5))
        await store.reconcile("fill", [Spend(REFS[0], leases=held)], START)
        await store.client.delete(f"{{{key_prefix}:p}}:held")  # as an older router left it
        await store.release(REFS[0], "l0", START + 1)
        snap = await store.snapshot(REFS, START + 2)
        assert {e: s.live_leases for e, s in snap.entries.items()} == {"a": 2, "b": 2}
    finally:
        await store.close()


async def test_sqlite_counts_leases_written_before_the_counts_once(tmp_path: Path) -> None:
    store = make_store("sqlite", "", "old", tmp_path)
    held = tuple(HeldLease(f"l{i}", REFS[i % 2].entry, START, 3600) for i in range(5))
    await store.reconcile("fill", [Spend(REFS[0], leases=held)], START)
    await store.close()
    with contextlib.closing(sqlite3.connect(tmp_path / "state.db")) as conn, conn:
        conn.execute("DROP TABLE held")  # as an older router left the file
        conn.execute("PRAGMA user_version=0")
    store = make_store("sqlite", "", "old", tmp_path)
    try:
        await store.release(REFS[0], "l0", START + 1)
        snap = await store.snapshot(REFS, START + 2)
        assert {e: s.live_leases for e, s in snap.entries.items()} == {"a": 2, "b": 2}
    finally:
        await store.close()
