"""usd budgets through the real adapters on their emulators: what the vendor made is
what is held, settled and ended."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from emulators.harness import Emulator
from policies.pricing import METERING
from policies.quota import metered
from providers.errors import BudgetExceeded, LeaseError, NoProviderAvailable
from router import Router
from tests.contract.conftest import build
from tests.polling import wait_until
from tests.router.conftest import NOW, Clock, fired

RATE = 0.01  # USD a second: one vCPU at $36 an hour


def step(name: str) -> float:
    """The vendor's billing step (Daytona: a minute; none known for Runloop)."""
    known = METERING.get(name)
    return (known.step if known else None) or 0.0


def billed(name: str, seconds: float) -> float:
    return RATE * metered(seconds, step(name))


def priced(
    vendor: tuple[str, Emulator],
    tmp_path: Path,
    make_router,
    usd: float,
    window: float,
    ttl: float = 5,
    paused_gib_hour: float = 0.0,
    pause_ttl: float = 3600,
    tenants: dict[str, object] | None = None,
    **quota: object,
) -> Router:
    """A router on the vendor's adapter, its pool's budget ``usd``, leases renewed
    ``window`` seconds at a time, paused storage at ``paused_gib_hour``, ``tenants`` the
    config's."""
    name, emu = vendor
    backend = build(name, emu, tmp_path)
    price = {"vcpu_hour": 36.0, "memory_gib_hour": 0.0, "per_sandbox": 0.0}
    entry = {
        "name": "v",
        "provider": backend.kind,
        "price": {**price, "paused_gib_hour": paused_gib_hour},
        "resources": {"vcpu": 1, "memory_gib": 1},
        "quota": {"usd": usd, "budget_window": window, **quota},
    }
    settings = {"tenants": tenants} if tenants is not None else {}
    return make_router(
        chain=[entry], providers={"v": backend.provider}, lease_ttl=ttl, pause_ttl=pause_ttl,
        **settings,
    )  # fmt: skip


def test_the_vendor_sandbox_is_killed_when_the_budget_cannot_renew_it(
    vendor: tuple[str, Emulator], make_router, tmp_path: Path, events, clock: Clock
) -> None:
    """The budget covers a lease's first window, not the renewals its TTL needs: the
    app is told at once, the vendor's sandbox is killed where the window's billing steps
    end (Daytona: the minute it paid for), and the pool is charged what the vendor bills
    for it."""
    name, emu = vendor
    ttl = 5 + step(name)  # past a billing step, so a renewal costs more
    router = priced(
        vendor, tmp_path, make_router, 1.5 * billed(name, 2), 2, ttl=ttl, on_budget_end="kill"
    )
    lease = router.acquire()
    assert lease.sandbox.run("echo paid").stdout == "paid\n"
    wait_until(lambda: fired(events, "budget_exhausted"))
    paid = metered(2, step(name))
    assert fired(events, "budget_exhausted")[0]["ends"] == NOW + paid
    assert [r.id for r in emu.alive()] == [lease.sandbox.id]
    clock.advance(paid)
    wait_until(lambda: lease.released)
    wait_until(lambda: emu.alive() == [])
    with pytest.raises(LeaseError):
        lease.sandbox.run("true")
    wait_until(lambda: fired(events, "released"))
    assert fired(events, "released")[0]["cost"] == pytest.approx(billed(name, 2))
    view = router.status().entries[0]
    assert view.used["usd"] == pytest.approx(billed(name, 2))
    assert view.usd_held == 0


@pytest.mark.parametrize("vendor", ["daytona"], indirect=True)
def test_a_minute_billed_lease_runs_out_the_minute_it_paid_for(
    vendor: tuple[str, Emulator], make_router, tmp_path: Path, events, clock: Clock
) -> None:
    """Daytona charges a whole minute at its start: a lease whose 2 s window the budget
    cannot renew keeps its sandbox, for no more money, until that minute ends, and is
    charged that minute, what it held."""
    name, emu = vendor
    router = priced(
        vendor, tmp_path, make_router, 1.5 * billed(name, 2), 2, ttl=65, on_budget_end="kill"
    )
    lease = router.acquire()
    wait_until(lambda: fired(events, "budget_exhausted"))
    assert fired(events, "budget_exhausted")[0]["ends"] == NOW + 60
    clock.advance(30)  # well past its 2 s window, inside its minute
    assert lease.sandbox.run("echo still").stdout == "still\n"
    assert not lease.released
    assert lease.budget_exhausted is not None
    assert router.status().entries[0].usd_held == pytest.approx(billed(name, 60))
    clock.advance(30)
    wait_until(lambda: lease.released)
    wait_until(lambda: emu.alive() == [])
    wait_until(lambda: fired(events, "released"))
    assert fired(events, "released")[0]["cost"] == pytest.approx(RATE * 60)
    view = router.status().entries[0]
    assert (view.used["usd"], view.usd_held) == (pytest.approx(RATE * 60), 0)


def test_no_vendor_sandbox_is_made_past_what_the_budget_covers(
    vendor: tuple[str, Emulator], make_router, tmp_path: Path, events, clock: Clock
) -> None:
    """Two windows' worth, each lease holding one: two leases are held, the third acquire
    is refused before any create, and a release gives its unspent hold back."""
    name, emu = vendor
    router = priced(vendor, tmp_path, make_router, 2.5 * billed(name, 5), 5)
    held = [router.acquire(), router.acquire()]
    with pytest.raises(NoProviderAvailable, match="usd budget"):
        router.acquire(timeout=1)
    assert len(emu.alive()) == 2
    assert len(fired(events, "created")) == 2
    held[0].release()
    with router.acquire() as again:
        assert again.sandbox.run("true").exit_code == 0
    held[1].release()
    wait_until(lambda: emu.alive() == [])
    assert router.status().entries[0].usd_held == 0


@pytest.mark.parametrize("vendor", ["daytona", "e2b", "runloop"], indirect=True)
def test_a_vendor_pause_holds_its_storage_first_and_its_resume_settles_it(
    vendor: tuple[str, Emulator], make_router, tmp_path: Path, events, clock: Clock
) -> None:
    """Storage at $0.01 a GiB-second, a budget with room for a lease's window and $0.20:
    a pause for 100 s ($1) is refused, the vendor's sandbox running on under its live
    lease; one for 10 s ($0.10) is held from the pause (two routers, one pool), and the
    resume 5 s later settles it to $0.05."""
    name, emu = vendor
    vendor_says = build(name, emu, tmp_path).provider

    def paused() -> list[bool]:
        return [info.state == "paused" for info in asyncio.run(vendor_says.list())]

    usd = billed(name, 2) + 0.2
    long = priced(vendor, tmp_path, make_router, usd, 2, paused_gib_hour=36.0, pause_ttl=100)
    lease = long.acquire()
    with pytest.raises(BudgetExceeded, match=r"usd budget of pool 'v': .* no room for its paus"):
        lease.pause()
    assert paused() == [False]
    assert lease.sandbox.run("echo on").stdout == "on\n"
    assert not fired(events, "paused")
    lease.release()
    wait_until(lambda: emu.alive() == [])
    short = priced(vendor, tmp_path, make_router, usd, 2, paused_gib_hour=36.0, pause_ttl=10)
    token = short.acquire().pause()
    assert paused() == [True]
    wait_until(lambda: len(fired(events, "released")) == 2)
    assert short.status().entries[0].usd_held == pytest.approx(0.1)
    clock.advance(5)
    resumed = short.resume(token)
    assert fired(events, "resumed")[0]["cost"] == pytest.approx(0.05)
    assert paused() == [False]
    clock.advance(3)
    resumed.release()
    wait_until(lambda: len(fired(events, "released")) == 3)
    view = short.status().entries[0]
    assert view.used["usd"] == pytest.approx(0.05 + billed(name, 3))
    assert view.usd_held == 0


@pytest.mark.parametrize("vendor", ["daytona", "e2b", "runloop"], indirect=True)
def test_a_tenants_vendor_pause_is_held_and_settled_by_its_tenant_too(
    vendor: tuple[str, Emulator], make_router, tmp_path: Path, events, clock: Clock
) -> None:
    """The pool has room; tenant 'poor' has no room for $0.10 of paused storage past its
    lease's window: its pause is refused naming it, the vendor's sandbox running on.
    Tenant 'u1''s pause holds the storage in its own ledger, and a resume that names no
    tenant (the hold's is found) charges it the 5 s used."""
    name, _ = vendor
    tenants = {"default": {"usd": 100.0}, "overrides": {"poor": {"usd": billed(name, 2) + 0.05}}}
    router = priced(
        vendor, tmp_path, make_router, 100.0, 2, paused_gib_hour=36.0, pause_ttl=10,
        tenants=tenants,
    )  # fmt: skip
    lease = router.acquire(tenant="poor")
    with pytest.raises(BudgetExceeded, match=r"usd budget of tenant 'poor': .* no room for its"):
        lease.pause()
    assert lease.sandbox.run("echo on").stdout == "on\n"
    lease.release()
    token = router.acquire(tenant="u1").pause()
    wait_until(lambda: len(fired(events, "released")) == 2)
    [u1] = [t for t in router.tenants() if t.tenant == "u1"]
    assert u1.usd_held == pytest.approx(0.1)
    clock.advance(5)
    router.resume(token).release()
    wait_until(lambda: len(fired(events, "released")) == 3)
    [after] = [t for t in router.tenants() if t.tenant == "u1"]
    assert (after.usd, after.usd_held) == (pytest.approx(u1.usd + 0.05), 0.0)
