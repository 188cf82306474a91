"""What the router spends around leases, charged in usd and in the cost counter: hedge
losers and late creates, warm sandboxes' idle time, paused storage."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from emulators import available, emulator_class
from router import BudgetExceeded, NoProviderAvailable, Router
from router.events import (
    LateCreate,
    Paused,
    Reaped,
    Released,
    Resumed,
    RouterEvent,
    SessionLost,
    WarmClaimed,
    WarmCreated,
    WarmKilled,
)
from router.metrics import instrument
from router.testing import ScriptedProvider
from tests.contract.conftest import build
from tests.polling import wait_until
from tests.router.conftest import Clock

# $0.01 a second for one vCPU, and $0.50 a sandbox.
PRICE = {"vcpu_hour": 36.0, "memory_gib_hour": 0.0, "per_sandbox": 0.5}
SIZE = {"vcpu": 1, "memory_gib": 1}


@pytest.fixture(params=["memory", "sqlite", "redis"])
def state(request: pytest.FixtureRequest, tmp_path: Path) -> dict[str, str]:
    """The store settings of each kind: the charges are the store's."""
    if request.param == "memory":
        return {"state_url": "memory://"}
    if request.param == "sqlite":
        return {"state_url": f"sqlite:///{tmp_path}/state.db"}
    return {
        "state_url": request.getfixturevalue("redis_url"),
        "key_prefix": request.getfixturevalue("key_prefix"),
    }


def of(events: list[RouterEvent], kind: type[Any]) -> list[Any]:
    return [e for e in events if isinstance(e, kind)]


def cost_counter(registry: CollectorRegistry, entry: str) -> float:
    value = registry.get_sample_value(
        "sandbox_router_cost_usd_total", {"entry": entry, "pool": entry}
    )
    return value or 0.0


def test_a_hedge_losers_sandbox_is_charged_to_its_pools_usd(
    new_router: Any, tmp_path: Path, state: dict[str, str]
) -> None:
    gate = threading.Event()
    slow = ScriptedProvider("slow", tmp_path, [gate])
    spare = ScriptedProvider("spare", tmp_path)
    chain = [
        {"name": "slow", "provider": "local", "hedge": {"after": 0.1}, "price": PRICE,
         "resources": SIZE, "quota": {"usd": 10, "budget_window": 60}},
        {"name": "spare", "provider": "local", "quota": {"sessions": 10}},
    ]  # fmt: skip
    events: list[RouterEvent] = []
    router = new_router(
        {**state, "create_timeout": 20, "chain": chain},
        providers={"slow": slow, "spare": spare},
        hooks=[events.append],
    )
    registry = CollectorRegistry()
    instrument(router, registry)
    try:
        with router.acquire() as lease:
            assert lease.entry == "spare"
            held = router.status().entries[0].usd_held
            assert held == pytest.approx(0.5 + 0.6)  # the loser's worst case, while it runs
    finally:
        gate.set()  # the vendor makes the loser's sandbox after all
    wait_until(lambda: of(events, LateCreate), seconds=10)
    [late] = of(events, LateCreate)
    assert late.outcome == "killed"
    assert late.cost == pytest.approx(0.5 + 0.01 * late.seconds)
    assert late.pool == "slow"
    view = router.status().entries[0]
    assert view.used["usd"] == pytest.approx(late.cost)
    assert view.usd_held == 0
    assert cost_counter(registry, "slow") == pytest.approx(late.cost)


@pytest.mark.slow
@pytest.mark.skipif(not available(["e2b"]), reason="needs the e2b SDK")
def test_a_late_create_on_the_e2b_emulator_is_charged(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, redis_url: str, key_prefix: str
) -> None:
    """E2B's SDK on its emulator: the create answers after the acquire gave up on it; the
    sandbox it made is killed, and its fee and seconds at E2B's rate are the pool's usd."""
    with emulator_class("e2b")() as emu:
        for key, value in emu.sdk_env().items():
            monkeypatch.setenv(key, value)
        e2b = {"name": "e2b", "provider": "e2b", "price": {"per_sandbox": 0.25},
               "quota": {"usd": 5}}  # fmt: skip
        local = {"name": "local", "provider": "local", "options": {"root": str(tmp_path)}}
        config = {"state_url": redis_url, "key_prefix": key_prefix, "retry": {"attempts": 1}}
        warm = Router.from_config({**config, "chain": [e2b]}, hooks=[])  # SDK imports
        with warm:
            with warm.acquire() as lease:
                assert lease.entry == "e2b"
            wait_until(lambda: warm.status().entries[0].used["usd"] > 0)
            before = warm.status().entries[0].used["usd"]
        events: list[RouterEvent] = []
        settings = {**config, "create_timeout": 1, "chain": [e2b, local]}
        with Router.from_config(settings, hooks=[events.append]) as router:
            emu.inject("create", delay=2.0, after=True)
            with router.acquire() as lease:
                assert lease.entry == "local"
            wait_until(lambda: of(events, LateCreate), seconds=15)
            [late] = of(events, LateCreate)
            assert late.outcome == "killed"
            rate = (2 * 0.0504 + 0.5 * 0.0162) / 3600  # E2B's default size and prices
            seconds = float(max(1, -(-late.seconds // 1)))  # whole seconds, rounded up
            assert late.cost == pytest.approx(0.25 + rate * seconds)
            used = router.status().entries[0].used["usd"]
            assert used - before == pytest.approx(late.cost)
            assert [r.id for r in emu.records() if r.alive] == []


@pytest.fixture
def priced(new_router: Any, tmp_path: Path, state: dict[str, str]):
    """A router on the store of ``state`` with one priced entry (scripted local) and a
    $3 budget; a fake clock; its events and a registry counting them."""
    clock = Clock()
    events: list[RouterEvent] = []

    def make(
        settings: dict[str, Any] | None = None, **entry: Any
    ) -> tuple[Router, ScriptedProvider, CollectorRegistry]:
        scripted = ScriptedProvider("e", tmp_path)
        config = {
            **state,
            **(settings or {}),
            "lease_ttl": 20,
            "warm_refill_every": 0,
            "warm_reach_every": 0,
            "chain": [
                {"name": "e", "provider": "local", "price": PRICE, "resources": SIZE,
                 "quota": {"usd": 3.0, "budget_window": 60}, **entry}
            ],
        }  # fmt: skip
        router = new_router(
            config, providers={"e": scripted}, clock=clock, sleep=clock.sleep,
            hooks=[events.append],
        )  # fmt: skip
        registry = CollectorRegistry()
        instrument(router, registry)
        return router, scripted, registry

    make.clock = clock  # type: ignore[attr-defined]
    make.events = events  # type: ignore[attr-defined]
    return make


def test_warm_sandboxes_hold_their_stay_and_a_claim_charges_their_idle_time(priced) -> None:
    """Each warm sandbox holds $0.50 + 120 s at $0.01 from before its create: two would
    pass the $3, so the refill makes one. Claimed after 30 s: its fee and 30 s charged,
    the lease holds its own 60 s; released 10 s later: 10 s more."""
    router, scripted, registry = priced(warm={"size": 2, "max_idle": 100})
    assert router.fill_warm() == {"e": 1}
    view = router.status().entries[0]
    assert view.usd_held == pytest.approx(0.5 + 1.2)
    priced.clock.advance(30)
    lease = router.acquire()
    assert lease.sandbox_id in scripted.created
    view = router.status().entries[0]
    assert view.used["usd"] == pytest.approx(0.5 + 0.30, abs=0.001)
    assert view.usd_held == pytest.approx(0.60)
    [claimed] = of(priced.events, WarmClaimed)
    assert claimed.cost == pytest.approx(0.80, abs=0.001)
    priced.clock.advance(10)
    lease.release()
    wait_until(lambda: of(priced.events, Released))
    view = router.status().entries[0]
    assert view.used["usd"] == pytest.approx(0.90, abs=0.001)
    assert view.usd_held == 0
    assert cost_counter(registry, "e") == pytest.approx(view.used["usd"])


def test_a_warm_sandbox_killed_idle_is_charged_its_wait(priced) -> None:
    router, scripted, registry = priced(warm={"size": 1, "max_idle": 100})
    assert router.fill_warm() == {"e": 1}
    priced.clock.advance(101)  # past max_idle: the next pass kills it
    router.fill_warm()
    [killed] = of(priced.events, WarmKilled)
    assert killed.reason == "max_idle"
    assert killed.cost == pytest.approx(0.5 + 1.01, abs=0.001)
    assert scripted.created[0] not in scripted.alive()
    view = router.status().entries[0]
    assert view.used["usd"] == pytest.approx(killed.cost)
    assert cost_counter(registry, "e") == pytest.approx(killed.cost)


STORED = {**PRICE, "paused_gib_hour": 3.6}  # $0.001 a GiB-second; the entry holds 1 GiB


def test_a_paused_sandboxs_storage_is_held_from_its_pause_and_settled_at_its_resume(
    priced,
) -> None:
    """pause_ttl 1000 s: the pause holds $1 of storage against the $3, so beside it one
    more lease ($0.50 + 60 s at $0.01) fits and a second does not; the resume 100 s
    later settles the hold to $0.10."""
    router, _, registry = priced(settings={"pause_ttl": 1000}, price=STORED)
    lease = router.acquire()
    token = lease.pause()
    wait_until(lambda: of(priced.events, Released))
    view = router.status().entries[0]
    spent = view.used["usd"]
    assert (spent, view.usd_held) == (pytest.approx(0.5), pytest.approx(1.0))
    other = router.acquire()
    with pytest.raises(NoProviderAvailable, match="usd budget"):
        router.acquire(timeout=1)
    other.release()
    wait_until(lambda: len(of(priced.events, Released)) == 2)
    spent = router.status().entries[0].used["usd"]
    priced.clock.advance(100)
    resumed = router.resume(token)
    [event] = of(priced.events, Resumed)
    assert (event.cost, event.pool) == (pytest.approx(0.1), "e")
    view = router.status().entries[0]
    assert view.used["usd"] == pytest.approx(spent + 0.1)
    assert view.usd_held == pytest.approx(0.6)  # the resumed lease's window, no fee
    resumed.release()
    wait_until(lambda: len(of(priced.events, Released)) == 3)
    assert router.status().entries[0].usd_held == 0
    assert cost_counter(registry, "e") == pytest.approx(router.status().entries[0].used["usd"])


def test_a_pause_the_budget_cannot_hold_is_refused_and_the_lease_runs_on(priced) -> None:
    """pause_ttl 2000 s: $2 of storage beside the lease's $1.10 passes the $3: the pause is
    refused naming the pool's budget, nothing is paused, bound or spent, and the lease
    goes on as before."""
    router, scripted, _ = priced(settings={"pause_ttl": 2000}, price=STORED)
    lease = router.acquire()
    with pytest.raises(BudgetExceeded) as refused:
        lease.pause()
    assert str(refused.value) == (
        f"pause of lease {lease.id} on e refused: usd budget of pool 'e': $1.1000 "
        "spent or held of $3.0000, no room for its paused storage's hold ($2.0000 for "
        "2000s); nothing was paused"
    )
    assert not lease.released
    assert lease.sandbox.run("echo on").stdout == "on\n"
    assert scripted.paused() == []
    assert of(priced.events, Paused) == []
    assert router.status().entries[0].usd_held == pytest.approx(1.1)
    assert router.reap().killed == []  # its lease holds it
    lease.release()
    wait_until(lambda: of(priced.events, Released))
    assert router.status().entries[0].usd_held == 0


def test_a_sticky_sessions_paused_sandbox_holds_its_storage_until_its_reconnect(
    priced,
) -> None:
    """A session's sandbox paused between uses (session_idle_ttl 1000 s) holds $1 of
    storage; the session's next acquire, 100 s on, wakes it and settles $0.10."""
    router, scripted, registry = priced(settings={"session_idle_ttl": 1000}, price=STORED)
    lease = router.acquire(session="s1")
    lease.release()
    assert scripted.paused() == [lease.sandbox_id]
    wait_until(lambda: of(priced.events, Released))
    view = router.status().entries[0]
    spent = view.used["usd"]
    assert view.usd_held == pytest.approx(1.0)
    priced.clock.advance(100)
    again = router.acquire(session="s1")
    assert again.sandbox_id == lease.sandbox_id
    [resumed] = of(priced.events, Resumed)
    assert (resumed.session, resumed.cost, resumed.pool) == ("s1", pytest.approx(0.1), "e")
    view = router.status().entries[0]
    assert view.used["usd"] == pytest.approx(spent + 0.1)
    assert view.usd_held == pytest.approx(0.6)
    router.close_session("s1")  # its release kills it then, paused or not: nothing held
    again.release()
    assert scripted.alive() == []
    wait_until(lambda: len(of(priced.events, Released)) == 2)
    assert router.status().entries[0].usd_held == 0
    assert cost_counter(registry, "e") == pytest.approx(router.status().entries[0].used["usd"])


def test_a_sticky_sessions_lapsed_pause_is_charged_at_its_reap(priced) -> None:
    router, _, registry = priced(settings={"session_idle_ttl": 100}, price=STORED)
    lease = router.acquire(session="s1")
    lease.release()
    wait_until(lambda: of(priced.events, Released))
    spent = router.status().entries[0].used["usd"]
    assert router.reap().killed == []  # its session holds it
    priced.clock.advance(101)
    assert router.reap().killed == [("e", lease.sandbox_id)]
    [reaped] = of(priced.events, Reaped)
    assert reaped.cost == pytest.approx(0.1)
    view = router.status().entries[0]
    assert (view.used["usd"], view.usd_held) == (pytest.approx(spent + 0.1), 0)
    assert cost_counter(registry, "e") == pytest.approx(spent + 0.1)


def test_a_sticky_session_whose_pause_the_budget_cannot_hold_is_lost(priced) -> None:
    """session_idle_ttl 3500 s: $3.50 of storage does not fit the $3, so the session's
    sandbox is neither paused unpaid nor left running: it is killed, and the session's
    next acquire makes a new one."""
    router, scripted, _ = priced(settings={"session_idle_ttl": 3500}, price=STORED)
    lease = router.acquire(session="s1")
    lease.release()
    [lost] = of(priced.events, SessionLost)
    assert (lost.session, lost.sandbox_id) == ("s1", lease.sandbox_id)
    assert "usd budget of pool 'e'" in lost.reason
    assert scripted.alive() == []
    wait_until(lambda: of(priced.events, Released))
    assert router.status().entries[0].usd_held == 0
    with router.acquire(session="s1") as again:
        assert again.sandbox_id != lease.sandbox_id


def test_a_tenants_pause_is_held_by_its_budget_and_its_reap_charges_it(priced) -> None:
    """A tenant's lease pauses: its storage is held by the tenant too ($0.10 for 100 s,
    refused to a tenant with $0.05 left, naming it, though the pool has room); the
    janitor, which knows the sandbox and not who paused it, charges the tenant at the
    reap."""
    tenants = {"default": {"usd": 10.0}, "overrides": {"poor": {"usd": 1.15}}}
    router, scripted, _ = priced(settings={"pause_ttl": 100, "tenants": tenants}, price=STORED)
    refused = router.acquire(tenant="poor")  # holds its $0.50 fee and a window of $0.60
    with pytest.raises(BudgetExceeded, match=r"usd budget of tenant 'poor': .* no room"):
        refused.pause()
    assert refused.sandbox.run("echo on").stdout == "on\n"
    refused.release()
    lease = router.acquire(tenant="u1")
    lease.pause()
    wait_until(lambda: len(of(priced.events, Released)) == 2)
    [u1] = [t for t in router.tenants() if t.tenant == "u1"]
    assert u1.usd_held == pytest.approx(0.1)
    priced.clock.advance(101)
    assert router.reap().killed == [("e", lease.sandbox_id)]
    assert lease.sandbox_id not in scripted.alive()
    [after] = [t for t in router.tenants() if t.tenant == "u1"]
    assert (after.usd, after.usd_held) == (pytest.approx(u1.usd + 0.1), 0.0)


def test_a_paused_sandbox_whose_token_lapsed_is_charged_at_its_reap(priced) -> None:
    """Never resumed, so no resume charged it: the janitor kills it once its token lapses
    (pause_ttl 100 s) and charges the pool its 100 s of paused storage, once."""
    router, scripted, registry = priced(settings={"pause_ttl": 100}, price=STORED)
    lease = router.acquire()
    lease.pause()
    wait_until(lambda: of(priced.events, Released))
    spent = router.status().entries[0].used["usd"]
    assert router.reap().killed == []  # its token holds it
    priced.clock.advance(101)
    assert router.reap().killed == [("e", lease.sandbox_id)]
    assert lease.sandbox_id not in scripted.alive()
    [reaped] = of(priced.events, Reaped)
    assert reaped.cost == pytest.approx(0.1)
    assert router.status().entries[0].used["usd"] == pytest.approx(spent + 0.1)
    assert router.reap().killed == []
    assert router.status().entries[0].used["usd"] == pytest.approx(spent + 0.1)
    assert cost_counter(registry, "e") == pytest.approx(spent + 0.1)


def test_a_lapsed_pause_on_the_e2b_emulator_is_charged_at_its_reap(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, redis_url: str, key_prefix: str
) -> None:
    """E2B's SDK on its emulator: the sandbox paused there, listed paused, is killed by the
    janitor once its token lapses, and its storage for the token's 2 s is the pool's."""
    with emulator_class("e2b")() as emu:
        for key, value in emu.sdk_env().items():
            monkeypatch.setenv(key, value)
        e2b = {"name": "e2b", "provider": "e2b", "resources": {"vcpu": 1, "memory_gib": 1},
               "price": {"vcpu_hour": 0, "memory_gib_hour": 0, "paused_gib_hour": 3.6}}  # fmt: skip
        config = {"state_url": redis_url, "key_prefix": key_prefix, "pause_ttl": 2, "chain": [e2b]}
        events: list[RouterEvent] = []
        with Router.from_config(config, hooks=[events.append]) as router:
            lease = router.acquire()
            lease.pause()
            assert [r.paused for r in emu.alive()] == [True]
            assert router.reap().killed == []
            wait_until(lambda: router.reap().killed == [("e2b", lease.sandbox_id)], seconds=15)
            [reaped] = of(events, Reaped)
            assert reaped.cost == pytest.approx(0.002)
            assert router.status().entries[0].used["usd"] == pytest.approx(0.002)
        assert emu.alive() == []


def test_a_paused_warm_sandboxs_storage_is_charged_at_its_claim(priced) -> None:
    price = {**PRICE, "paused_gib_hour": 3.6}
    router, _, registry = priced(price=price, warm={"size": 1, "max_idle": 100, "pause": True})
    assert router.fill_warm() == {"e": 1}
    [created] = of(priced.events, WarmCreated)
    assert created.cost == pytest.approx(0.5, abs=0.001)  # its fee, and its seconds to pause
    priced.clock.advance(40)
    with router.acquire():
        pass
    [claimed] = of(priced.events, WarmClaimed)
    assert claimed.paused
    assert claimed.cost == pytest.approx(0.04, abs=0.001)  # 40 s of 1 GiB paused
    wait_until(lambda: of(priced.events, Released))
    used = router.status().entries[0].used["usd"]
    assert used == pytest.approx(0.5 + 0.04, abs=0.002)
    assert cost_counter(registry, "e") == pytest.approx(used)


def test_a_paused_warm_sandbox_holds_its_storage_from_its_park(priced) -> None:
    """Parked paused, a warm sandbox holds its storage for its whole stay (120 s of 1 GiB:
    $0.12) before the vendor pauses it (its lease, and its hold, end with the pause);
    its claim settles the hold to what it used."""
    price = {**PRICE, "paused_gib_hour": 3.6}
    router, scripted, _ = priced(price=price, warm={"size": 1, "max_idle": 100, "pause": True})
    assert router.fill_warm() == {"e": 1}
    assert scripted.paused() != []
    assert router.status().entries[0].usd_held == pytest.approx(0.12)
    priced.clock.advance(40)
    with router.acquire():
        pass
    wait_until(lambda: of(priced.events, Released))
    view = router.status().entries[0]
    assert view.usd_held == 0
    assert view.used["usd"] == pytest.approx(0.5 + 0.04, abs=0.002)


def test_a_warm_sandbox_whose_storage_the_budget_cannot_hold_is_parked_running(
    priced,
) -> None:
    """$1 a second paused: 120 s of storage would pass the $3 budget, so the warm sandbox
    is parked running, which its lease's hold already covers; nothing is paused."""
    price = {**PRICE, "paused_gib_hour": 3600.0}
    router, scripted, _ = priced(price=price, warm={"size": 1, "max_idle": 100, "pause": True})
    assert router.fill_warm() == {"e": 1}
    [created] = of(priced.events, WarmCreated)
    assert not created.paused
    assert scripted.paused() == []
    assert router.status().entries[0].usd_held == pytest.approx(1.70)


@pytest.mark.skipif(not available(["e2b"]), reason="needs the e2b SDK")
def test_a_warm_e2b_sandbox_is_held_and_charged_through_its_sdk(
    make_router: Any, tmp_path: Path, events: list[RouterEvent], clock: Clock
) -> None:
    """E2B's SDK on its emulator, a Redis ledger: one replica makes the warm sandbox the
    budget covers, another claims it by connecting through the SDK; its fee and idle
    seconds are charged, whole seconds as E2B bills them."""
    with emulator_class("e2b")() as emu:
        maker, claimer = build("e2b", emu, tmp_path), build("e2b", emu, tmp_path)
        entry = {
            "name": "v", "provider": "e2b", "price": PRICE, "resources": SIZE,
            "quota": {"usd": 3.0, "budget_window": 60}, "warm": {"size": 2, "max_idle": 100},
        }  # fmt: skip
        settings = {"warm_refill_every": 0, "warm_reach_every": 0, "lease_ttl": 20}
        one = make_router(chain=[entry], providers={"v": maker.provider}, **settings)
        two = make_router(chain=[entry], providers={"v": claimer.provider}, **settings)
        assert one.fill_warm() == {"v": 1}  # $0.50 + 120 s each: two would pass the $3
        assert one.status().entries[0].usd_held == pytest.approx(1.7)
        clock.advance(30)
        with two.acquire() as lease:
            assert lease.sandbox.run("echo warm").stdout == "warm\n"
            view = two.status().entries[0]
            assert view.used["usd"] == pytest.approx(0.80)
            assert view.usd_held == pytest.approx(0.60)
            clock.advance(10)
        wait_until(lambda: of(events, Released))
        [claimed] = of(events, WarmClaimed)
        assert claimed.cost == pytest.approx(0.80)
        [released] = of(events, Released)
        assert released.cost == pytest.approx(0.10)  # no second fee
        view = two.status().entries[0]
        assert (view.used["usd"], view.usd_held) == (pytest.approx(0.90), 0)
        assert emu.alive() == []


@pytest.mark.skipif(not available(["e2b"]), reason="needs the e2b SDK")
def test_a_paused_warm_e2b_sandbox_holds_its_storage_through_its_sdk(
    make_router: Any, tmp_path: Path, events: list[RouterEvent], clock: Clock
) -> None:
    """E2B's SDK on its emulator, a Redis ledger: one replica parks a warm sandbox paused,
    its storage held for its whole stay (120 s of 1 GiB: $0.12) before E2B pauses it;
    another replica's claim resumes it through the SDK and settles the hold to the
    40 s it waited ($0.04)."""
    with emulator_class("e2b")() as emu:
        maker, claimer = build("e2b", emu, tmp_path), build("e2b", emu, tmp_path)
        entry = {
            "name": "v", "provider": "e2b", "price": {**PRICE, "paused_gib_hour": 3.6},
            "resources": SIZE, "quota": {"usd": 3.0, "budget_window": 60},
            "warm": {"size": 1, "max_idle": 100, "pause": True},
        }  # fmt: skip
        settings = {"warm_refill_every": 0, "warm_reach_every": 0, "lease_ttl": 20}
        one = make_router(chain=[entry], providers={"v": maker.provider}, **settings)
        two = make_router(chain=[entry], providers={"v": claimer.provider}, **settings)
        assert one.fill_warm() == {"v": 1}
        assert [r.paused for r in emu.alive()] == [True]
        assert one.status().entries[0].usd_held == pytest.approx(0.12)
        clock.advance(40)
        with two.acquire() as lease:
            assert lease.sandbox.run("echo warm").stdout == "warm\n"
        wait_until(lambda: of(events, Released))
        [claimed] = of(events, WarmClaimed)
        assert (claimed.paused, claimed.cost) == (True, pytest.approx(0.04))
        assert two.status().entries[0].usd_held == 0
        assert emu.alive() == []
