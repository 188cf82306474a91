"""The Lua scripts and the pure policies are one rule set written twice.

Hypothesis drives the same random operation sequences through the Redis
store (Lua) and the memory store (the pure Python policies) and requires
the same answer at every step and the same state at the end.
"""

from __future__ import annotations

import asyncio
import secrets
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from policies.breaker import BreakerConfig, Outcome
from policies.quota import Limits, MonthlyWindow
from policies.warm import WarmRecord
from router.state import EntryRef, HeldLease, Spend, StateStore, open_store

CFG = BreakerConfig(
    failure_threshold=3, min_calls=4, window_seconds=30, cooldown_base=5, cooldown_max=12,
    probe_timeout=4, capacity_cooldown=3, rate_limit_default=2, quota_default=50,
)  # fmt: skip
LIMITS = Limits(sessions=6, sandbox_seconds=120, concurrent=2)
REFS = [
    EntryRef("a", "p", LIMITS, MonthlyWindow(), "fp"),
    EntryRef("b", "p", LIMITS, MonthlyWindow(), "fp"),
]
START = 1_790_000_000.0

lease_ids = st.sampled_from([f"l{i}" for i in range(6)])
ops = st.one_of(
    st.tuples(st.just("reserve"), st.integers(0, 1), lease_ids, st.integers(1, 60)),
    st.tuples(
        st.just("settle"), st.integers(0, 1), lease_ids, st.sampled_from(list(Outcome)),
        st.integers(1, 60), st.none() | st.integers(1, 100),
    ),
    st.tuples(st.just("release"), st.integers(0, 1), lease_ids),
    st.tuples(st.just("heartbeat"), st.integers(0, 1), lease_ids, st.integers(1, 60)),
    st.tuples(st.just("record"), st.integers(0, 1), st.sampled_from(list(Outcome))),
    st.tuples(st.just("reconcile"), st.integers(0, 1), st.lists(lease_ids, max_size=3),
              st.integers(1, 60)),
    st.tuples(st.just("snapshot")),
    st.tuples(st.just("set_usage"), st.sampled_from(["sessions", "sandbox_seconds"]),
              st.integers(0, 8)),
    st.tuples(st.just("advance"), st.integers(0, 40)),
    st.tuples(st.just("claim"), st.integers(0, 1), lease_ids, st.integers(1, 60)),
    st.tuples(st.just("warm_put"), st.integers(0, 1), lease_ids, st.booleans(),
              st.integers(1, 60)),
    st.tuples(st.just("warm_take"), st.integers(0, 1), lease_ids),
    st.tuples(st.just("warm_list"), st.integers(0, 1)),
)  # fmt: skip


async def apply(store: StateStore, op: tuple[Any, ...], now: float) -> Any:
    kind = op[0]
    if kind == "reserve":
        return await store.reserve(REFS[op[1]], CFG, op[2], now, op[3])
    if kind == "settle":
        until = now + op[5] if op[5] else None
        return await store.settle(
            REFS[op[1]], CFG, op[2], now, outcome=op[3], ttl=op[4], detail="d", until=until
        )
    if kind == "release":
        return await store.release(REFS[op[1]], op[2], now)
    if kind == "heartbeat":
        return await store.heartbeat(REFS[op[1]], op[2], now, op[3])
    if kind == "record":
        return await store.record(REFS[op[1]], CFG, op[2], now, detail="d")
    if kind == "reconcile":
        ref = REFS[op[1]]
        held = tuple(HeldLease(lid, ref.entry, now - 3, op[3]) for lid in dict.fromkeys(op[2]))
        return await store.reconcile(f"j{now}", [Spend(ref, 1, 2.5, held)], now)
    if kind == "set_usage":  # bumps the limits version a quota denial and a snapshot carry
        return await store.set_usage(REFS[0], op[1], op[2], now)
    if kind == "snapshot":  # it purges expired leases, as reserve does
        return await store.snapshot(REFS, now)
    if kind == "claim":
        return await store.reserve(REFS[op[1]], CFG, op[2], now, op[3], warm=True)
    if kind == "warm_put":
        record = WarmRecord(f"sb-{op[2]}", now, now + op[4], now + op[4] + 20, op[3])
        return await store.warm_put(REFS[op[1]], op[2], record, now)
    if kind == "warm_take":
        return await store.warm_take(REFS[op[1]], op[2], now)
    if kind == "warm_list":
        return await store.warm_list(REFS[op[1]], now)
    return None


def normal(value: Any) -> Any:
    """Round floats: Lua's cjson keeps 14 significant digits."""
    if isinstance(value, float):
        return round(value, 2)
    if isinstance(value, tuple | list):
        return type(value)(normal(v) for v in value)
    if isinstance(value, dict):
        return {k: normal(v) for k, v in value.items()}
    if hasattr(value, "__dataclass_fields__"):
        return normal({k: getattr(value, k) for k in value.__dataclass_fields__})
    return value


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(st.lists(ops, max_size=30))
def test_redis_lua_agrees_with_the_pure_policies(redis_url: str, sequence: list[Any]) -> None:
    async def run() -> None:
        lua = open_store(redis_url, f"diff-{secrets.token_hex(4)}")
        pure = open_store("memory://", "diff")
        now = START
        try:
            for step, op in enumerate(sequence):
                if op[0] == "advance":
                    now += op[1]
                    continue
                got, want = await apply(lua, op, now), await apply(pure, op, now)
                assert normal(got) == normal(want), f"step {step}: {op}"
            assert normal(await lua.snapshot(REFS, now)) == normal(await pure.snapshot(REFS, now))
            for ref in REFS:
                assert await lua.warm_kept(ref, now) == await pure.warm_kept(ref, now)
        finally:
            await lua.close()

    asyncio.run(run())


@pytest.mark.parametrize("outcome", list(Outcome))
def test_every_outcome_is_known_to_lua(redis_url: str, outcome: Outcome) -> None:
    async def run() -> None:
        lua = open_store(redis_url, f"diff-{secrets.token_hex(4)}")
        pure = open_store("memory://", "diff")
        try:
            for store in (lua, pure):
                for _ in range(3):
                    await store.record(REFS[0], CFG, outcome, START, detail="x", until=START + 9)
            assert normal(await lua.snapshot(REFS, START)) == normal(
                await pure.snapshot(REFS, START)
            )
        finally:
            await lua.close()

    asyncio.run(run())
