"""16 processes race for the last units of one pool, or of one tenant (sessions, slots,
dollars of leases and of paused storage): exactly the limit is granted."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from providers.errors import BudgetExceeded, NoProviderAvailable
from router import Router
from tests.forked import processes

pytestmark = pytest.mark.slow
PROCESSES = 16


def _config(state_url: str, prefix: str, root: str, quota: dict[str, int]) -> dict[str, object]:
    return {
        "state_url": state_url,
        "key_prefix": prefix,
        "chain": [
            {"name": "local", "provider": "local", "quota": quota,
             "options": {"root": root, "isolation": "none"}},
        ],
    }  # fmt: skip


def _worker(
    config: dict[str, object], start: Any, hold: bool, done: Any, tenant: str | None = None
) -> int:
    from router.logs import configure_logging

    configure_logging("json", "error")
    router = Router.from_config(config, hooks=[])
    granted = 0
    held = []
    start.wait(60)  # every process is ready: they race from here
    while True:
        try:
            lease = router.acquire(tenant=tenant)
        except NoProviderAvailable:
            break
        granted += 1
        if hold:
            held.append(lease)
        else:
            lease.release()
    done.wait(60)  # nobody releases a slot before every process has been refused
    for lease in held:
        lease.release()
    router.close()
    return granted


@pytest.fixture(params=["redis", "sqlite"])
def state_url(request: pytest.FixtureRequest, redis_url: str, tmp_path: Path) -> str:
    return redis_url if request.param == "redis" else f"sqlite:///{tmp_path}/race.db"


def _race(config: dict[str, object], hold: bool, tenant: str | None = None) -> list[int]:
    ctx = processes(__name__)
    with ctx.Manager() as manager, ctx.Pool(PROCESSES) as pool:
        start, done = manager.Barrier(PROCESSES), manager.Barrier(PROCESSES)
        return pool.starmap(_worker, [(config, start, hold, done, tenant)] * PROCESSES)


def test_exactly_the_sessions_left_are_granted(
    state_url: str, key_prefix: str, tmp_path: Path
) -> None:
    config = _config(state_url, key_prefix, str(tmp_path / "sb"), {"sessions": 100})
    granted = _race(config, hold=False)
    assert sum(granted) == 100
    with Router.from_config(config, hooks=[]) as router:
        assert router.status().entries[0].used["sessions"] == 100


def test_exactly_the_concurrency_slots_are_granted(
    state_url: str, key_prefix: str, tmp_path: Path
) -> None:
    config = _config(state_url, key_prefix, str(tmp_path / "sb"), {"concurrent": 10})
    granted = _race(config, hold=True)
    assert sum(granted) == 10
    with Router.from_config(config, hooks=[]) as router:
        view = router.status().entries[0]
        assert (view.used["sessions"], view.used["concurrent"]) == (10, 0)


# $0.1 a sandbox and $0.01 a second on one vCPU (local's size); a lease of lifetime 5 s
# holds $0.15 of the budget until its release settles it to its metered cost.
PRICE = {"vcpu_hour": 36.0, "per_sandbox": 0.1}
LIFETIME = 5.0


def _spender(
    config: dict[str, object], start: Any, tenant: str | None = None
) -> list[tuple[float, float]]:
    """Acquire and release until the budget keeps refusing; the (seconds, cost) of every
    lease released, as its `Released` event said."""
    from providers.base import SandboxSpec
    from router.events import Released
    from router.logs import configure_logging

    configure_logging("json", "error")
    released: list[tuple[float, float]] = []

    def hook(event: object) -> None:
        if isinstance(event, Released) and event.seconds is not None:
            assert event.cost is not None
            released.append((event.seconds, event.cost))

    router = Router.from_config(config, hooks=[hook])
    start.wait(60)
    began = time.time()
    refused = 0
    while refused < 5 and time.time() < began + 20:
        try:
            lease = router.acquire(spec=SandboxSpec(lifetime=LIFETIME), tenant=tenant)
        except NoProviderAvailable:
            refused += 1
            time.sleep(0.2)  # the holds of leases still running may settle below them
            continue
        refused = 0
        time.sleep(0.05)
        lease.release()
    router.close()
    return released


def _race_for_a_dollar(
    config: dict[str, object], whose: str, worker: Callable[..., list[Any]]
) -> tuple[list[Any], str | None]:
    """16 processes running ``worker`` at once, spending the pool's $1 (its ``quota``) or
    a tenant's (``whose``): what each returned, and the tenant."""
    tenant = None
    if whose == "tenant":
        config["tenants"] = {"default": {"usd": 1}}
        tenant = "user-42"
    ctx = processes(__name__)
    with ctx.Manager() as manager, ctx.Pool(PROCESSES) as pool:
        start = manager.Barrier(PROCESSES)
        results = pool.starmap(worker, [(config, start, tenant)] * PROCESSES)
    return [item for result in results for item in result], tenant


@pytest.mark.parametrize("whose", ["pool", "tenant"])
def test_the_last_dollar_is_never_overspent(
    state_url: str, key_prefix: str, tmp_path: Path, whose: str
) -> None:
    """A pool's budget, or one tenant's (its pool unlimited)."""
    quota = {"usd": 1} if whose == "pool" else {}
    config = _config(state_url, key_prefix, str(tmp_path / "sb"), quota)
    config["chain"][0]["price"] = PRICE  # type: ignore[index]
    leases, tenant = _race_for_a_dollar(config, whose, _spender)
    for seconds, cost in leases:  # the price table: the fee plus $0.01 a second
        assert cost == pytest.approx(0.1 + 0.01 * seconds, abs=1e-12)
    spent = math.fsum(cost for _, cost in leases)
    assert spent <= 1.0 + 1e-9
    assert spent > 1.0 - 0.15  # used: no room was left for one more lease's hold
    with Router.from_config(config, hooks=[]) as router:
        view = router.status().entries[0]
        assert view.used["usd"] == pytest.approx(spent, abs=1e-9)
        assert view.usd_held == 0.0
        if tenant is not None:
            [settled] = router.tenants()
            assert (settled.usd, settled.usd_held) == (pytest.approx(spent, abs=1e-9), 0.0)


def test_a_tenant_s_last_units_are_never_exceeded(
    state_url: str, key_prefix: str, tmp_path: Path
) -> None:
    """Its sessions exactly; its concurrent slots while the pool has room for more."""
    config = _config(state_url, key_prefix, str(tmp_path / "sb"), {"concurrent": 100})
    config["tenants"] = {"default": {"sessions": 40, "concurrent": 7}}
    granted = _race(config, hold=True, tenant="user-42")
    assert sum(granted) == 7
    granted = _race(config, hold=False, tenant="user-42")
    assert sum(granted) == 40 - 7
    with Router.from_config(config, hooks=[]) as router:
        [spent] = router.tenants()
        assert (spent.tenant, spent.sessions, spent.concurrent) == ("user-42", 40, 0)
        assert router.status().entries[0].used["sessions"] == 40  # the refusals spent none
        router.acquire(tenant="user-7").release()  # another tenant is served


def _pauser(config: dict[str, object], start: Any, tenant: str | None) -> list[str]:
    """Acquire and pause until the budget refuses a pause (11 at most: more than the
    budget holds); the tokens of those made."""
    from router.logs import configure_logging

    configure_logging("json", "error")
    router = Router.from_config(config, hooks=[])
    tokens = []
    start.wait(60)
    while len(tokens) <= 10:
        lease = router.acquire(tenant=tenant)
        try:
            tokens.append(lease.pause())
        except BudgetExceeded:
            lease.release()
            break
    router.close()
    return tokens


@pytest.mark.parametrize("whose", ["pool", "tenant"])
def test_the_last_dollar_of_paused_storage_is_never_overspent(
    state_url: str, key_prefix: str, tmp_path: Path, whose: str
) -> None:
    """Storage alone is priced: a pause holds $0.10 (1 GiB for pause_ttl 10 s at $36 a
    GiB-hour) of a $1 budget, its pool's or its tenant's: 16 processes pausing at once
    make exactly 10 pauses, and their resumes settle no more than was held."""
    config = _config(
        state_url, key_prefix, str(tmp_path / "sb"), {"usd": 1} if whose == "pool" else {}
    )
    config["chain"][0]["price"] = {"paused_gib_hour": 36.0}  # type: ignore[index]
    config["chain"][0]["resources"] = {"vcpu": 1, "memory_gib": 1}  # type: ignore[index]
    config["pause_ttl"] = 10
    tokens, tenant = _race_for_a_dollar(config, whose, _pauser)
    assert len(tokens) == 10
    with Router.from_config(config, hooks=[]) as router:
        ledger = router.tenants()[0] if tenant else router.status().entries[0]
        assert ledger.usd_held == pytest.approx(1.0)
        for token in tokens:
            router.resume(token).release()
        ledger = router.tenants()[0] if tenant else router.status().entries[0]
        spent = ledger.usd if tenant else ledger.used["usd"]
        assert (ledger.usd_held, 0 < spent <= 1.0) == (0.0, True)
