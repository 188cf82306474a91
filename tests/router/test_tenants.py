"""Tenant limits through a real Router: on Redis and on SQLite, sync and async, with
sticky sessions, and through a real adapter on its emulator."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from emulators.harness import Emulator
from policies.quota import metered
from policies.tenants import DailyWindow
from providers.base import SandboxSpec
from providers.errors import ArgumentTypeError, InvalidArgument, NoProviderAvailable
from tests.contract.conftest import build
from tests.polling import wait_until
from tests.router.conftest import NOW, RouterFactory, fired
from tests.router.test_budget_vendors import billed, step

# $0.01 a second for one vCPU, $0.1 a sandbox.
PRICED = {
    "price": {"vcpu_hour": 36.0, "memory_gib_hour": 0.0, "per_sandbox": 0.1},
    "resources": {"vcpu": 1, "memory_gib": 1},
}


@pytest.fixture(params=["redis", "sqlite"])
def state_url(request: pytest.FixtureRequest, redis_url: str, tmp_path: Path) -> str:
    return redis_url if request.param == "redis" else f"sqlite:///{tmp_path}/tenants.db"


def chain(tmp_path: Path, **extra: Any) -> list[dict[str, Any]]:
    return [
        {"name": "a", "provider": "local", "options": {"root": str(tmp_path / "a")}, **extra},
        {"name": "b", "provider": "local", "options": {"root": str(tmp_path / "b")}, **extra},
    ]


def test_a_tenant_at_its_limit_is_refused_while_another_is_served(
    make_router: RouterFactory, state_url: str, tmp_path: Path
) -> None:
    router = make_router(
        chain=chain(tmp_path),
        state_url=state_url,
        tenants={"default": {"sessions": 2}, "overrides": {"vip": {"sessions": 5}}},
    )
    for _ in range(2):
        router.acquire(tenant="user-42").release()
    reset = datetime.fromtimestamp(DailyWindow().reset_at(NOW).timestamp(), UTC)
    month_end = router.config.tenant_limits("user-42")[1].reset_at(NOW)
    with pytest.raises(NoProviderAvailable) as refused:
        router.acquire(tenant="user-42", timeout=2)
    message = str(refused.value)
    assert f"tenant 'user-42' limit reached: sessions 2/2 until {month_end.isoformat()}" in message
    assert "b: not tried: tenant 'user-42'" in message  # one refusal stops the walk
    assert reset != month_end
    for _ in range(3):  # another tenant, an override, no tenant: each served
        router.acquire(tenant="vip").release()
        router.acquire().release()
    router.acquire(tenant="user-7").release()
    assert router.status().entries[0].used["sessions"] == 9  # the refusal spent nothing


def test_a_tenant_refused_spends_nothing_of_the_pool_and_a_pool_refused_nothing_of_it(
    make_router: RouterFactory, state_url: str, tmp_path: Path
) -> None:
    entry = {"name": "a", "provider": "local", "options": {"root": str(tmp_path / "a")},
             "quota": {"concurrent": 2}}  # fmt: skip
    router = make_router(chain=[entry], state_url=state_url, tenants={"default": {"concurrent": 1}})
    held = router.acquire(tenant="t1")
    with pytest.raises(NoProviderAvailable, match="tenant 't1' limit reached: concurrent 1/1"):
        router.acquire(tenant="t1", timeout=2)
    other = router.acquire(tenant="t2")  # the pool's second slot was not spent by t1
    with pytest.raises(NoProviderAvailable, match="quota exhausted: concurrent 2/2"):
        router.acquire(tenant="t3", timeout=2)
    held.release()
    router.acquire(tenant="t3").release()  # t3 was not counted when the pool refused it
    other.release()
    top = {t.tenant: t for t in router.tenants()}
    assert {name: t.sessions for name, t in top.items()} == {"t1": 1, "t2": 1, "t3": 1}


def test_a_tenant_usd_limit_holds_and_settles(
    make_router: RouterFactory, state_url: str, tmp_path: Path, clock: Any, events: list
) -> None:
    router = make_router(
        chain=chain(tmp_path, **PRICED),
        state_url=state_url,
        lease_ttl=5,  # within the lifetime: no renewal at the commit
        tenants={"default": {"usd": 0.5, "window": "day"}},
    )
    lease = router.acquire(SandboxSpec(lifetime=30), tenant="t")  # holds $0.40
    with pytest.raises(NoProviderAvailable, match=r"tenant 't' usd limit: \$0.4000 spent or held"):
        router.acquire(SandboxSpec(lifetime=30), tenant="t", timeout=2)
    clock.advance(4)  # within its lease TTL: no heartbeat needed
    lease.release()
    wait_until(lambda: fired(events, "released"))
    [spent] = router.tenants()
    assert (spent.tenant, spent.sessions, spent.usd_held) == ("t", 1, 0.0)
    assert spent.usd == pytest.approx(0.14)
    assert spent.window == DailyWindow().key(NOW + 4)
    router.acquire(SandboxSpec(lifetime=10), tenant="t").release()  # $0.2 fits in $0.36


def test_the_async_api_and_sticky_sessions_carry_the_tenant(
    make_router: RouterFactory, state_url: str, tmp_path: Path
) -> None:
    router = make_router(
        chain=chain(tmp_path), state_url=state_url, tenants={"default": {"concurrent": 1}}
    )

    async def run() -> None:
        lease = await router.aacquire(tenant="t", session="s1")
        with pytest.raises(NoProviderAvailable, match="tenant 't' limit reached: concurrent"):
            await router.aacquire(tenant="t", timeout=2)
        await lease.release()
        again = await router.aacquire(tenant="t", session="s1")  # the session's reconnect
        assert again.resumed
        with pytest.raises(NoProviderAvailable, match="tenant 't' limit reached: concurrent"):
            await router.aacquire(tenant="t", timeout=2)
        await again.release()

    asyncio.run(run())
    assert [(t.tenant, t.sessions, t.concurrent) for t in router.tenants()] == [("t", 1, 0)]


@pytest.mark.parametrize(
    ("tenant", "error", "message"),
    [
        ("", InvalidArgument, "acquire(tenant=''): a tenant is 1 to 128"),
        ("a:b", InvalidArgument, "acquire(tenant='a:b')"),
        ("x" * 129, InvalidArgument, "a tenant is 1 to 128"),
        (42, ArgumentTypeError, "acquire(tenant=...): expected a str, got int"),
    ],
)
def test_a_bad_tenant_is_refused_naming_the_argument(
    make_router: RouterFactory, tmp_path: Path, tenant: object, error: type, message: str
) -> None:
    router = make_router(chain=chain(tmp_path))
    with pytest.raises(error) as refused:
        router.acquire(tenant=tenant)  # type: ignore[arg-type]
    assert message in str(refused.value)


def test_tenants_is_never_a_metric_label(make_router: RouterFactory, tmp_path: Path) -> None:
    from prometheus_client import CollectorRegistry, generate_latest

    from router.metrics import instrument

    router = make_router(chain=chain(tmp_path), tenants={"default": {"sessions": 5}})
    registry = CollectorRegistry()
    instrument(router, registry=registry)
    router.acquire(tenant="user-secret-42").release()
    assert b"user-secret-42" not in generate_latest(registry)


def test_a_lease_ends_when_its_tenant_budget_cannot_renew_it(
    make_router: RouterFactory, tmp_path: Path, events: list, clock: Any
) -> None:
    """The pool has no usd limit; the tenant's $0.03 holds the first 2 s, not the TTL's
    4 s more: the lease is told at once and ended when its 2 s run out."""
    entry = {"name": "a", "provider": "local", "options": {"root": str(tmp_path / "a")},
             "price": {"vcpu_hour": 36.0, "memory_gib_hour": 0.0},
             "resources": {"vcpu": 1, "memory_gib": 1},
             "quota": {"budget_window": 2, "on_budget_end": "kill"}}  # fmt: skip
    from prometheus_client import CollectorRegistry, generate_latest

    from router.metrics import instrument

    router = make_router(chain=[entry], lease_ttl=5, tenants={"default": {"usd": 0.03}})
    registry = CollectorRegistry()
    instrument(router, registry=registry)
    lease = router.acquire(tenant="t")
    wait_until(lambda: fired(events, "budget_exhausted"))
    [told] = fired(events, "budget_exhausted")
    assert (told["ends"], told["budget"], told["tenant"], told["pool"]) == (
        NOW + 2,
        "tenant",
        "t",
        "a",
    )
    assert lease.budget_short == "tenant"
    exported = generate_latest(registry).decode()
    labels = 'action="kill",budget="tenant",entry="a",pool="a"'
    assert f"sandbox_router_budget_exhausted_total{{{labels}}} 1.0" in exported
    clock.advance(2)
    wait_until(lambda: lease.released)
    wait_until(lambda: fired(events, "released"))
    [spent] = router.tenants()
    assert (spent.usd, spent.usd_held) == (pytest.approx(0.02), 0.0)


def test_a_resumed_lease_counts_to_the_tenant_it_is_resumed_for(
    make_router: RouterFactory, scripted: Any
) -> None:
    flaky = scripted()
    router = make_router(
        providers={"flaky": flaky},
        chain=[{"name": "flaky", "provider": "local"}],
        tenants={"default": {"concurrent": 1}},
    )
    token = router.acquire(tenant="t").pause()
    held = router.acquire(tenant="t")  # the paused one holds no slot
    with pytest.raises(NoProviderAvailable, match="tenant 't' limit reached: concurrent 1/1"):
        router.resume(token, tenant="t", timeout=2)
    held.release()
    resumed = router.resume(token, tenant="t")
    assert [(t.tenant, t.concurrent) for t in router.tenants()] == [("t", 1)]
    resumed.release()
    with pytest.raises(InvalidArgument, match=r"resume\(tenant='a b'\)"):
        router.resume(token, tenant="a b")


def test_a_tenant_claims_a_warm_vendor_sandbox_its_usd_budget_covers(
    vendor: tuple[str, Emulator],
    make_router: RouterFactory,
    tmp_path: Path,
    events: list,
    clock: Any,
) -> None:
    """Each adapter on its emulator: a warm sandbox's claimed lease holds its 60 s cover
    ($0.60) against the tenant's usd; a tenant whose $0.50 cannot hold it claims
    nothing and is refused naming its usd limit, and the warm sandbox stays ready."""
    name, emu = vendor
    backend = build(name, emu, tmp_path)
    entry = {
        "name": "v", "provider": backend.kind,
        "price": {"vcpu_hour": 36.0, "memory_gib_hour": 0.0, "per_sandbox": 0.0},
        "resources": {"vcpu": 1, "memory_gib": 1},
        "quota": {"usd": 10.0, "budget_window": 60},
        "warm": {"size": 2, "max_idle": 100, "server": False},
    }  # fmt: skip
    router = make_router(
        chain=[entry], providers={"v": backend.provider}, warm_refill_every=0,
        warm_reach_every=0, lease_ttl=20,
        tenants={"default": {"usd": 1.0}, "overrides": {"poor": {"usd": 0.5}}},
    )  # fmt: skip
    assert router.fill_warm() == {"v": 2}
    made = {e["sandbox_id"] for e in fired(events, "warm_created")}
    with router.acquire(tenant="rich") as lease:
        assert lease.sandbox.id in made
        assert lease.sandbox.run("echo warm").stdout == "warm\n"
        [rich] = router.tenants()
        assert (rich.tenant, rich.usd_held, rich.concurrent) == ("rich", pytest.approx(0.6), 1)
        with pytest.raises(NoProviderAvailable) as refused:
            router.acquire(tenant="poor", timeout=2)
        assert "tenant 'poor' usd limit: $0.0000 spent or held of $0.5000" in str(refused.value)
        assert "window resets at" in str(refused.value)
        assert len(fired(events, "warm_claimed")) == 1
        assert router.warm_ready() == {"v": 1}
        clock.advance(10)
    wait_until(lambda: fired(events, "released"))
    [rich] = router.tenants()
    assert (rich.usd, rich.usd_held) == (pytest.approx(billed(name, 10)), 0.0)  # no fee
    assert len(emu.alive()) == 1  # the warm one left


def test_a_vendor_sandbox_is_killed_when_its_tenant_budget_cannot_renew_it(
    vendor: tuple[str, Emulator],
    make_router: RouterFactory,
    tmp_path: Path,
    events: list,
    clock: Any,
) -> None:
    """Each adapter on its emulator: the pool has room, the tenant's budget holds the first
    2 s window and not the renewal its TTL needs; the event names the tenant's budget,
    and the vendor's sandbox is killed where the billing step that window paid for ends
    (Daytona: the minute), charged to the tenant."""
    name, emu = vendor
    backend = build(name, emu, tmp_path)
    entry = {
        "name": "v", "provider": backend.kind,
        "price": {"vcpu_hour": 36.0, "memory_gib_hour": 0.0, "per_sandbox": 0.0},
        "resources": {"vcpu": 1, "memory_gib": 1},
        "quota": {"usd": 100.0, "budget_window": 2, "on_budget_end": "kill"},
    }  # fmt: skip
    ttl = 5 + step(name)  # past a billing step, so a renewal costs more
    router = make_router(
        chain=[entry], providers={"v": backend.provider}, lease_ttl=ttl,
        tenants={"default": {"usd": 1.5 * billed(name, 2)}},
    )  # fmt: skip
    lease = router.acquire(tenant="user-42")
    assert lease.sandbox.run("echo paid").stdout == "paid\n"
    wait_until(lambda: fired(events, "budget_exhausted"))
    [told] = fired(events, "budget_exhausted")
    paid = metered(2, step(name))
    assert (told["budget"], told["tenant"], told["ends"]) == ("tenant", "user-42", NOW + paid)
    assert [r.id for r in emu.alive()] == [lease.sandbox.id]
    clock.advance(paid)
    wait_until(lambda: lease.released)
    wait_until(lambda: emu.alive() == [])
    wait_until(lambda: fired(events, "released"))
    [spent] = router.tenants()
    assert (spent.usd, spent.usd_held) == (pytest.approx(billed(name, 2)), 0.0)
    assert router.status().entries[0].used["usd"] == pytest.approx(billed(name, 2))
