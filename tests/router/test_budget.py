"""usd budgets through a real Router on real Redis: a lease held, settled, ended."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from providers.base import SandboxSpec
from providers.errors import LeaseError, NoProviderAvailable
from tests.polling import wait_until
from tests.router.conftest import NOW, Clock, fired

# $0.01 a second for one vCPU, nothing per sandbox.
ENTRY = {
    "name": "dear",
    "provider": "local",
    "price": {"vcpu_hour": 36.0, "memory_gib_hour": 0.0},
    "resources": {"vcpu": 1, "memory_gib": 1},
}


def budget(make_router, scripted, usd: float, **quota: object):
    entry = {**ENTRY, "quota": {"usd": usd, "budget_window": 2, **quota}}
    return make_router(providers={"dear": scripted("dear")}, chain=[entry], lease_ttl=5)


def test_a_lease_ends_when_its_budget_cannot_renew_it(
    make_router, scripted, events, clock: Clock
) -> None:
    """Its first 2 s ($0.02) fit the $0.03; the lease TTL (5 s) needs 4 s more, which do
    not: it is told at once, and ended when its 2 s run out."""
    router = budget(make_router, scripted, 0.03, on_budget_end="kill")
    lease = router.acquire()
    wait_until(lambda: fired(events, "budget_exhausted"))
    [told] = fired(events, "budget_exhausted")
    assert told == {
        "entry": "dear", "lease_id": lease.id, "pool": "dear", "ends": NOW + 2, "action": "kill",
        "budget": "pool", "tenant": None,
    }  # fmt: skip
    assert lease.budget_exhausted == datetime.fromtimestamp(NOW + 2, UTC)
    assert lease.budget_short == "pool"
    clock.advance(2)
    wait_until(lambda: lease.released)
    with pytest.raises(LeaseError):
        lease.sandbox.run("true")
    wait_until(lambda: fired(events, "released"))
    [released] = fired(events, "released")
    assert released["seconds"] == pytest.approx(2)
    assert released["cost"] == pytest.approx(0.02)
    view = router.status().entries[0]
    assert view.used["usd"] == pytest.approx(0.02)
    assert view.usd_held == 0


def test_a_warned_lease_runs_on_and_nothing_new_is_admitted(
    make_router, scripted, events, clock: Clock
) -> None:
    router = budget(make_router, scripted, 0.03)
    lease = router.acquire()
    wait_until(lambda: fired(events, "budget_exhausted"))
    assert fired(events, "budget_exhausted")[0]["action"] == "warn"
    view = router.status().entries[0]
    assert view.usd_held == pytest.approx(0.06)  # its cover grew anyway: an overdraft
    with pytest.raises(NoProviderAvailable, match=r"usd budget: \$0.0600 spent or held"):
        router.acquire(timeout=1)
    clock.advance(5)
    assert not lease.released
    lease.release()
    wait_until(lambda: fired(events, "released"))
    assert fired(events, "released")[0]["cost"] == pytest.approx(0.05)
    assert router.status().entries[0].used["usd"] == pytest.approx(0.05)


def test_a_lifetime_is_held_and_the_lease_settles_to_what_it_ran(
    make_router, scripted, events, clock: Clock
) -> None:
    router = budget(make_router, scripted, 1.0, budget_window=60)
    lease = router.acquire(SandboxSpec(lifetime=30))  # holds 30 s: $0.30
    assert router.status().entries[0].usd_held == pytest.approx(0.30)
    clock.advance(4)  # within its lease TTL: no heartbeat needed
    lease.release()
    wait_until(lambda: fired(events, "released"))
    assert fired(events, "released")[0]["cost"] == pytest.approx(0.04)
    view = router.status().entries[0]
    assert (view.used["usd"], view.usd_held) == (pytest.approx(0.04), 0.0)
    assert not fired(events, "budget_exhausted")


def test_holds_refuse_what_the_budget_cannot_cover(make_router, scripted) -> None:
    router = budget(make_router, scripted, 0.25, budget_window=10)  # $0.10 a lease
    held = [router.acquire(), router.acquire()]
    with pytest.raises(NoProviderAvailable, match="usd budget"):
        router.acquire(timeout=1)
    held[0].release()
    router.acquire().release()  # its hold given back: room again
    held[1].release()
