"""The Lua scripts and the pure policies are one rule set written twice.

Hypothesis drives the same random operation sequences through the Redis
store (Lua) and the memory store (the pure Python policies) and requires
the same answer at every step and the same state at the end. The session
rules, a handful of states and calls, are checked exhaustively instead: every
call from every kind of binding.
"""

from __future__ import annotations

import asyncio
import itertools
import secrets
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from policies.breaker import BreakerConfig, Outcome
from policies.paused import PausedHold
from policies.quota import Limits, Meter, MonthlyWindow
from policies.tenants import DailyWindow, TenantLimits
from policies.warm import WarmRecord
from router.state import EntryRef, HeldLease, Spend, StateStore, TenantRef, open_store

CFG = BreakerConfig(
    failure_threshold=3, min_calls=4, window_seconds=30, cooldown_base=5, cooldown_max=12,
    probe_timeout=4, capacity_cooldown=3, rate_limit_default=2, quota_default=50,
)  # fmt: skip
LIMITS = Limits(sessions=6, sandbox_seconds=120, concurrent=2, usd=3.0)
# Priced leases: per second with a fee (overdrawn when short), per second and per minute
# killed when short, a fee only.
METERS = [
    Meter(0.013, 0.5, 0.0, 20.0, 15.0),
    Meter(0.021, 0.0, 0.0, 30.0, 30.0, kill=True),
    Meter(0.05, 0.1, 60.0, 30.0, 30.0, kill=True),
    Meter(0.0, 0.25),
]
REFS = [
    EntryRef("a", "p", LIMITS, MonthlyWindow(), "fp"),
    EntryRef("b", "p", LIMITS, MonthlyWindow(), "fp"),
]
START = 1_790_000_000.0
# Two tenants over two pools: t1 by the month, t2 by the day (its tight usd budget makes
# renewals short), and a pool entry without a tenant beside them.
T1 = TenantRef("t1", TenantLimits(sessions=4, usd=2.5, concurrent=2), MonthlyWindow())
T2 = TenantRef("t2", TenantLimits(sessions=None, usd=1.2, concurrent=3), DailyWindow())
TREFS = [
    EntryRef("a", "p", LIMITS, MonthlyWindow(), "fp", T1),
    EntryRef("c", "q", Limits(usd=4.0), MonthlyWindow(), "fp", T1),
    EntryRef("a", "p", LIMITS, MonthlyWindow(), "fp", T2),
    EntryRef("c", "q", Limits(usd=4.0), MonthlyWindow(), "fp"),
]

lease_ids = st.sampled_from([f"l{i}" for i in range(6)])
replicas = st.sampled_from(["r0", "r1", "r2"])
ops = st.one_of(
    st.tuples(st.just("reserve"), st.integers(0, 1), lease_ids, st.integers(1, 60),
              st.none() | st.sampled_from(METERS), st.booleans()),
    st.tuples(
        st.just("settle"), st.integers(0, 1), lease_ids, st.sampled_from(list(Outcome)),
        st.integers(1, 60), st.none() | st.integers(1, 100),
    ),
    st.tuples(st.just("release"), st.integers(0, 1), lease_ids),
    st.tuples(st.just("heartbeat"), st.integers(0, 1), lease_ids, st.integers(1, 60)),
    st.tuples(st.just("record"), st.integers(0, 1), st.sampled_from(list(Outcome))),
    st.tuples(st.just("reconcile"), st.integers(0, 1), st.lists(lease_ids, max_size=3),
              st.integers(1, 60), st.none() | st.sampled_from(METERS)),
    st.tuples(st.just("snapshot")),
    st.tuples(st.just("set_usage"), st.sampled_from(["sessions", "sandbox_seconds", "usd"]),
              st.integers(0, 8)),
    st.tuples(st.just("advance"), st.integers(0, 40)),
    st.tuples(st.just("claim"), st.integers(0, 1), lease_ids, st.integers(1, 60)),
    st.tuples(st.just("warm_put"), st.integers(0, 1), lease_ids, st.booleans(),
              st.integers(1, 60)),
    st.tuples(st.just("warm_take"), st.integers(0, 1), lease_ids),
    st.tuples(st.just("warm_list"), st.integers(0, 1)),
    st.tuples(st.just("register"), replicas, st.sampled_from([5, 10, 30])),
    st.tuples(st.just("deregister"), replicas),
)  # fmt: skip


# The ledger calls alone, every lease priced: the usd rules (holds, covers, renewals
# refused or overdrawn, settles, expiries, hand-overs) get the whole sequence.
usd_ops = st.one_of(
    st.tuples(st.just("reserve"), st.integers(0, 1), lease_ids, st.integers(1, 60),
              st.sampled_from(METERS), st.booleans()),
    st.tuples(
        st.just("settle"), st.integers(0, 1), lease_ids,
        st.sampled_from([Outcome.SUCCESS, Outcome.SUCCESS, Outcome.TRANSIENT]),
        st.integers(1, 60), st.none(),
    ),
    st.tuples(st.just("release"), st.integers(0, 1), lease_ids),
    st.tuples(st.just("heartbeat"), st.integers(0, 1), lease_ids, st.integers(1, 60)),
    st.tuples(st.just("reconcile"), st.integers(0, 1), st.lists(lease_ids, max_size=2),
              st.integers(1, 60), st.sampled_from(METERS)),
    st.tuples(st.just("snapshot")),
    st.tuples(st.just("set_usage"), st.just("usd"), st.integers(0, 3)),
    st.tuples(st.just("advance"), st.integers(0, 40)),
    # warm pools in a priced pool: their holds settled by a claim priced by its meter
    st.tuples(st.just("claim"), st.integers(0, 1), lease_ids, st.integers(1, 60),
              st.none() | st.sampled_from(METERS)),
    st.tuples(st.just("warm_put"), st.integers(0, 1), lease_ids, st.booleans(),
              st.integers(1, 60)),
    st.tuples(st.just("warm_take"), st.integers(0, 1), lease_ids),
)  # fmt: skip


# Paused storage's holds beside the leases': held or refused, settled, re-held, lapsed
# past the grace and charged by a snapshot or the next call.
paused_ops = st.one_of(
    st.tuples(st.just("reserve"), st.integers(0, 1), lease_ids, st.integers(1, 60),
              st.sampled_from(METERS), st.booleans()),
    st.tuples(st.just("settle"), st.integers(0, 1), lease_ids, st.just(Outcome.SUCCESS),
              st.integers(1, 60), st.none()),
    st.tuples(st.just("release"), st.integers(0, 1), lease_ids),
    st.tuples(st.just("hold_paused"), st.integers(0, 1), st.sampled_from(["sa", "sb", "sc"]),
              st.integers(1, 120), st.sampled_from([0.001, 0.013])),
    st.tuples(st.just("settle_paused"), st.integers(0, 1), st.sampled_from(["sa", "sb", "sc"])),
    st.tuples(st.just("snapshot")),
    st.tuples(st.just("advance"), st.integers(0, 90)),
    st.tuples(st.just("advance"), st.just(90_000)),
)  # fmt: skip


# The ledger calls with tenants: each lease's calls go through the same tenant's entry
# (its index), as the router makes them; ``tenants`` reads both windows' spend.
tenant_ops = st.one_of(
    st.tuples(st.just("t_reserve"), st.integers(0, 3), lease_ids, st.integers(1, 60),
              st.none() | st.sampled_from(METERS), st.booleans()),
    st.tuples(
        st.just("t_settle"), st.integers(0, 3), lease_ids,
        st.sampled_from([Outcome.SUCCESS, Outcome.SUCCESS, Outcome.TRANSIENT]),
        st.integers(1, 60),
    ),
    st.tuples(st.just("t_release"), st.integers(0, 3), lease_ids),
    st.tuples(st.just("t_heartbeat"), st.integers(0, 3), lease_ids, st.integers(1, 60)),
    st.tuples(st.just("t_reconcile"), st.integers(0, 3), st.lists(lease_ids, max_size=2),
              st.lists(lease_ids, max_size=2), st.integers(1, 60),
              st.none() | st.sampled_from(METERS)),
    st.tuples(st.just("t_claim"), st.integers(0, 3), lease_ids, st.integers(1, 60),
              st.none() | st.sampled_from(METERS)),
    st.tuples(st.just("t_warm_put"), st.integers(0, 3), lease_ids, st.booleans(),
              st.integers(1, 60)),
    st.tuples(st.just("tenants")),
    st.tuples(st.just("t_snapshot")),
    st.tuples(st.just("advance"), st.integers(0, 40)),
    st.tuples(st.just("advance"), st.integers(0, 40_000)),
)  # fmt: skip


# Paused storage held for a tenant (or not: index 3) beside its leases, refused by either
# budget, settled naming the hold's tenant or not, lapsed past the grace.
paused_sandboxes = st.sampled_from(["sa", "sb"])
tenant_paused_ops = st.one_of(
    st.tuples(st.just("t_reserve"), st.integers(0, 3), lease_ids, st.integers(1, 60),
              st.sampled_from(METERS), st.just(True)),
    st.tuples(st.just("t_settle"), st.integers(0, 3), lease_ids, st.just(Outcome.SUCCESS),
              st.integers(1, 60)),
    st.tuples(st.just("t_release"), st.integers(0, 3), lease_ids),
    st.tuples(st.just("t_hold_paused"), st.integers(0, 3), paused_sandboxes,
              st.integers(1, 120), st.sampled_from([0.001, 0.013])),
    st.tuples(st.just("t_settle_paused"), st.integers(0, 3), paused_sandboxes),
    st.tuples(st.just("t_paused_tenant"), st.integers(0, 3), paused_sandboxes),
    st.tuples(st.just("tenants")),
    st.tuples(st.just("advance"), st.integers(0, 90)),
    st.tuples(st.just("advance"), st.just(90_000)),
)  # fmt: skip


async def apply(store: StateStore, op: tuple[Any, ...], now: float) -> Any:
    kind = op[0]
    if kind == "t_reserve":
        return await store.reserve(TREFS[op[1]], CFG, op[2], now, op[3], meter=op[4],
                                   new_session=op[5])  # fmt: skip
    if kind == "t_settle":
        return await store.settle(TREFS[op[1]], CFG, op[2], now, outcome=op[3], ttl=op[4])
    if kind == "t_release":
        return await store.release(TREFS[op[1]], op[2], now)
    if kind == "t_heartbeat":
        return await store.heartbeat(TREFS[op[1]], op[2], now, op[3])
    if kind == "t_reconcile":  # an outage's hand-over: spend, held leases, unanswered
        ref = TREFS[op[1]]
        held = tuple(
            HeldLease(lid, ref.entry, now - 3, op[4], meter=op[5]) for lid in dict.fromkeys(op[2])
        )
        spend = Spend(ref, 1, 2.5, held, tuple(dict.fromkeys(op[3])), usd=0.75)
        return await store.reconcile(f"j{now}", [spend], now)
    if kind == "t_claim":
        return await store.reserve(TREFS[op[1]], CFG, op[2], now, op[3], warm=True, meter=op[4])
    if kind == "t_warm_put":
        record = WarmRecord(f"sb-{op[2]}", now, now + op[4], now + op[4] + 20, op[3])
        return await store.warm_put(TREFS[op[1]], op[2], record, now)
    if kind == "t_snapshot":  # purges the pools, not the tenants
        return await store.snapshot([TREFS[0], TREFS[3]], now)
    if kind == "tenants":
        return [await store.tenants(t.window, now, 5) for t in (T1, T2)]
    if kind == "t_hold_paused":
        hold = PausedHold(TREFS[op[1]].entry, now, now + op[3], op[4])
        return await store.hold_paused(TREFS[op[1]], op[2], hold, now)
    if kind == "t_settle_paused":
        return await store.settle_paused(TREFS[op[1]], op[2], now)
    if kind == "t_paused_tenant":
        return await store.paused_tenant(TREFS[op[1]], op[2])
    if kind == "reserve":
        return await store.reserve(REFS[op[1]], CFG, op[2], now, op[3], meter=op[4],
                                   new_session=op[5])  # fmt: skip
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
        held = tuple(
            HeldLease(lid, ref.entry, now - 3, op[3], meter=op[4]) for lid in dict.fromkeys(op[2])
        )
        return await store.reconcile(f"j{now}", [Spend(ref, 1, 2.5, held, usd=0.75)], now)
    if kind == "set_usage":  # bumps the limits version a quota denial and a snapshot carry
        return await store.set_usage(REFS[0], op[1], op[2], now)
    if kind == "snapshot":  # it purges expired leases, as reserve does
        return await store.snapshot(REFS, now)
    if kind == "claim":
        meter = op[4] if len(op) > 4 else None
        return await store.reserve(REFS[op[1]], CFG, op[2], now, op[3], warm=True, meter=meter)
    if kind == "warm_put":
        record = WarmRecord(f"sb-{op[2]}", now, now + op[4], now + op[4] + 20, op[3])
        return await store.warm_put(REFS[op[1]], op[2], record, now)
    if kind == "warm_take":
        return await store.warm_take(REFS[op[1]], op[2], now)
    if kind == "hold_paused":
        hold = PausedHold(REFS[op[1]].entry, now, now + op[3], op[4])
        return await store.hold_paused(REFS[op[1]], op[2], hold, now)
    if kind == "settle_paused":
        return await store.settle_paused(REFS[op[1]], op[2], now)
    if kind == "warm_list":
        return await store.warm_list(REFS[op[1]], now)
    if kind == "register":
        return await store.register_replica(op[1], op[2], REFS, now)
    if kind == "deregister":
        return await store.deregister_replica(op[1], now)
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
    agree(redis_url, sequence)


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(st.lists(usd_ops, max_size=30))
def test_redis_lua_agrees_on_usd(redis_url: str, sequence: list[Any]) -> None:
    agree(redis_url, sequence)


@settings(
    max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(st.lists(paused_ops, max_size=20))
def test_redis_lua_agrees_on_paused_storage(redis_url: str, sequence: list[Any]) -> None:
    agree(redis_url, sequence)


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(st.lists(tenant_ops, max_size=30))
def test_redis_lua_agrees_on_tenants(redis_url: str, sequence: list[Any]) -> None:
    agree(redis_url, [*sequence, ("tenants",)])


@settings(
    max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(st.lists(tenant_paused_ops, min_size=4, max_size=20))
@example(  # a tenant's copy settled by another tenant's call, then lapsed: charged whole
    [("t_hold_paused", 0, "sa", 100, 0.001), ("t_settle_paused", 2, "sa"),
     ("advance", 90_000), ("t_hold_paused", 0, "sb", 100, 0.001)],
)  # fmt: skip
def test_redis_lua_agrees_on_tenants_paused_storage(redis_url: str, sequence: list[Any]) -> None:
    agree(redis_url, [*sequence, ("tenants",)])


def agree(redis_url: str, sequence: list[Any]) -> None:
    """Run ``sequence`` on Redis and on memory: the same answers, the same state."""

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
            refs = [*REFS, TREFS[3]]
            assert normal(await lua.snapshot(refs, now)) == normal(await pure.snapshot(refs, now))
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


HOLDERS, SANDBOXES = ("", "h0", "h1"), ("", "sb0", "sb1")
# Every kind of binding a session can have: none, a claim for a create, a sandbox (paused
# or not) held by nobody or by h0 or h1, and one that expired.
STATES: list[list[tuple[Any, ...]]] = [
    [],
    [("claim", "h0")],
    *[[("bind", "sb0", paused, holder)] for paused in (False, True) for holder in HOLDERS],
    [("bind", "sb0", False, "h0"), ("expire",)],
]
STEPS = [
    ("claim", holder) for holder in HOLDERS
] + [
    ("bind", sandbox, paused, holder, kept)
    for sandbox in SANDBOXES for paused in (False, True) for holder in HOLDERS
    for kept in (False, True)
] + [
    ("release", holder, sandbox, paused, drop)
    for holder in HOLDERS for sandbox in SANDBOXES for paused in (None, False, True)
    for drop in (False, True)
] + [("take",), ("session",)]  # fmt: skip


async def step(store: StateStore, session: str, op: tuple[Any, ...], now: float) -> Any:
    """One session call of ``op``'s kind on ``session`` (times relative to ``now``)."""
    kind, *args = op
    if kind == "claim":
        return await store.claim_session(session, args[0], now + 30, now)
    if kind == "bind":
        sandbox, paused, holder, *kept = args
        return await store.bind_session(
            session, "a", sandbox, now + 60, now, paused=paused, holder=holder,
            kept=bool(kept and kept[0]),
        )  # fmt: skip
    if kind == "release":
        holder, sandbox, paused, drop = args
        return await store.release_session(
            session, holder, now + 90, now, sandbox_id=sandbox, paused=paused, drop=drop
        )
    if kind == "take":
        return await store.take_session(session, now)
    return await store.session(session, now)


def test_every_session_step_from_every_state_agrees(redis_url: str) -> None:
    """One holder at a time (`policies.sessions`): each session script against its rule,
    for every call from every kind of binding (each case a session of its own), then what
    is left: the binding read, and what a claim finds (a claim's holder included)."""

    async def run() -> None:
        lua = open_store(redis_url, f"diff-{secrets.token_hex(4)}")
        pure = open_store("memory://", "diff")
        try:
            for case, (state, op) in enumerate(itertools.product(STATES, STEPS)):
                session, now = f"s{case}", START
                for setup in state:
                    if setup == ("expire",):
                        now += 60
                        continue
                    for store in (lua, pure):
                        await step(store, session, setup, START)
                got, want = await step(lua, session, op, now), await step(pure, session, op, now)
                assert normal(got) == normal(want), (state, op)
                for check in (("session",), ("claim", "last")):
                    got = await step(lua, session, check, now)
                    assert normal(got) == normal(await step(pure, session, check, now)), (state, op)
            assert await lua.bound_sandboxes(START) == await pure.bound_sandboxes(START)
        finally:
            await lua.close()

    asyncio.run(run())


@pytest.mark.parametrize("paused", [False, True], ids=["running", "paused"])
@pytest.mark.parametrize("meter", [None, *METERS[:3]], ids=["unpriced", "fee", "kill", "step"])
def test_a_priced_warm_claim_agrees(redis_url: str, paused: bool, meter: Meter | None) -> None:
    """The usd path of a warm claim, surely taken: a priced warm sandbox put in the pool,
    claimed after a wait by an acquire of each meter (its cover fitting or not), then a
    second one that the budget may refuse."""
    sequence = [
        ("reserve", 0, "l0", 30, METERS[0], True),
        ("settle", 0, "l0", Outcome.SUCCESS, 40, None),
        ("warm_put", 0, "l0", paused, 50),
        ("reserve", 0, "l1", 30, METERS[0], True),
        ("settle", 0, "l1", Outcome.SUCCESS, 40, None),
        ("warm_put", 0, "l1", paused, 50),
        ("advance", 17),
        ("claim", 0, "l2", 20, meter),
        ("snapshot",),
        ("claim", 0, "l3", 20, meter),
        ("release", 0, "l0"),
        ("warm_take", 0, "l1"),
    ]
    agree(redis_url, sequence)
