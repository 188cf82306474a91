"""A create that outlives the acquire deadline: the caller fails over, and the
sandbox the provider finishes later is counted and killed by the router."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from emulators import available, emulator_class
from providers.base import LABEL_ROUTER, Sandbox, SandboxInfo, SandboxSpec
from providers.errors import Unavailable
from router import Router
from router.testing import ScriptedProvider
from tests.polling import wait_until
from tests.router.conftest import Clock, fired

PROVIDERS = available(["daytona", "runloop", "e2b", "modal"])


@pytest.mark.slow
@pytest.mark.parametrize("name", PROVIDERS)
def test_a_vendor_create_answered_late_is_counted_on_redis_and_killed(
    name: str, redis_url: str, key_prefix: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The vendor's SDK on its emulator, a Redis ledger, the sync API: no janitor runs."""
    with emulator_class(name)() as emu:
        for key, value in emu.sdk_env().items():
            monkeypatch.setenv(key, value)
        config = {
            "state_url": redis_url,
            "key_prefix": key_prefix,
            "create_timeout": 1,
            "retry": {"attempts": 1},
            "chain": [
                {"name": name, "provider": name},
                {"name": "local", "provider": "local", "options": {"root": str(tmp_path)}},
            ],
        }
        # Warm up (SDK imports: a second or more) so the faulty create below reaches
        # the emulator within its 1 s even on a loaded machine.
        warm_router = Router.from_config({**config, "create_timeout": 30}, hooks=[])
        with warm_router, warm_router.acquire() as lease:
            assert lease.entry == name
        warm = {r.id for r in emu.records()}
        with Router.from_config(config, hooks=[]) as router:

            def late() -> list[Any]:
                return [
                    r
                    for r in emu.records()
                    if r.labels.get(LABEL_ROUTER) == key_prefix and r.id not in warm
                ]

            emu.inject("create", delay=2.0, after=True)
            with router.acquire() as lease:
                assert lease.entry == "local"
                assert lease.failovers == [name]
            wait_until(lambda: late() and not any(r.alive for r in late()), seconds=15)
            assert len(late()) == 1, "the provider never finished the abandoned create"
            assert [r.id for r in late() if r.alive] == []
            # the warm-up's session and the late one's: the vendor made (and bills) both
            assert router.status().entries[0].used["sessions"] == 2


class SlowProvider(ScriptedProvider):
    """Its create outlives the caller: the sandbox is made on the provider's side even
    when the client stops waiting (as a cloud API does once it took the request)."""

    def __init__(self, name: str, root: Path, delay: float) -> None:
        super().__init__(name, root)
        self.delay = delay

    async def create(self, spec: SandboxSpec, *, timeout: float) -> Sandbox:
        self.creates += 1
        return await asyncio.shield(self._server_side(spec))

    async def _server_side(self, spec: SandboxSpec) -> Sandbox:
        await asyncio.sleep(self.delay)
        sandbox = await self.local.create(spec)
        self.created.append(sandbox.id)
        return sandbox


class SlowToDie(SlowProvider):
    """Its sandboxes take ``dying`` seconds of the router's clock to kill (and bill them)."""

    def __init__(self, name: str, root: Path, delay: float, clock: Clock, dying: float) -> None:
        super().__init__(name, root, delay)
        self.clock, self.dying = clock, dying

    async def _server_side(self, spec: SandboxSpec) -> Sandbox:
        sandbox = await super()._server_side(spec)
        kill = sandbox.kill

        async def slow_kill() -> None:
            self.clock.advance(self.dying)
            await kill()

        sandbox.kill = slow_kill  # type: ignore[method-assign]
        return sandbox


def test_late_creates_are_counted_and_killed_by_the_router(
    make_router, tmp_path: Path, events, clock: Clock
) -> None:
    slow = SlowToDie("slow", tmp_path, delay=2.0, clock=clock, dying=1.5)
    router = make_router(
        providers={"slow": slow},
        create_timeout=0.3,
        retry={"attempts": 1},
        breaker={"failure_threshold": 10},
        chain=[
            {"name": "slow", "provider": "local"},
            {"name": "local", "provider": "local", "options": {"root": str(tmp_path / "l")}},
        ],
    )

    async def four() -> list[str]:
        leases = await asyncio.gather(*(router.aacquire() for _ in range(4)))
        for lease in leases:
            await lease.release()
        return [lease.entry for lease in leases]

    assert asyncio.run(four()) == ["local"] * 4
    wait_until(lambda: len(slow.created) == 4, seconds=10)
    wait_until(lambda: slow.alive() == [], seconds=5)  # killed by the router, not a janitor
    wait_until(lambda: len(fired(events, "late_create")) == 4, seconds=5)
    view = next(v for v in router.status().entries if v.name == "slow")
    assert view.used["sessions"] == 4  # the provider made (and bills) four
    assert [e["seconds"] for e in fired(events, "late_create")] == [1.5] * 4
    assert view.used["sandbox_seconds"] == pytest.approx(6.0)  # each metered until killed
    assert view.live_leases == 0
    assert [e["outcome"] for e in fired(events, "late_create")] == ["killed"] * 4
    assert fired(events, "refund") == []


class Unlisted(ScriptedProvider):
    """Its list does not answer while ``away``: a lookup cannot tell what a create made."""

    away = True

    async def list(self, labels: Mapping[str, str] | None = None) -> list[SandboxInfo]:
        if self.away:
            raise Unavailable("the list did not answer", provider=self.name, unanswered=True)
        return await super().list(labels)


def entry(router: Router, name: str) -> Any:
    return next(v for v in router.status().entries if v.name == name)


def test_a_create_dropped_after_making_is_found_by_its_lease_label(
    make_router, scripted, events
) -> None:
    flaky = scripted(script=["dropped"])
    router = make_router(providers={"flaky": flaky}, retry={"attempts": 1})
    with router.acquire() as lease:
        assert (lease.entry, lease.failovers) == ("local", ["flaky"])  # at once: no deadline
    wait_until(lambda: fired(events, "late_create"), seconds=10)
    [late] = fired(events, "late_create")
    assert (late["outcome"], late["sandbox_id"]) == ("found", flaky.created[0])
    assert flaky.alive() == []
    view = entry(router, "flaky")
    assert (view.used["sessions"], view.live_leases) == (1, 0)  # the provider made it
    assert fired(events, "refund") == []
    assert [e["reason"] for e in fired(events, "create_failed")] == ["unavailable"]


def test_an_unanswered_create_that_made_nothing_is_refunded_after_its_lookup(
    make_router, scripted, events
) -> None:
    lost = Unavailable("the connection was lost", unanswered=True)
    answered = Unavailable("503 from the vendor", status=503)
    flaky = scripted(script=[lost, answered])
    router = make_router(providers={"flaky": flaky}, create_timeout=0.3, retry={"attempts": 2})
    with router.acquire() as lease:
        assert lease.entry == "local"
    refunds = fired(events, "refund")
    assert [e["reason"] for e in refunds] == ["unavailable"]  # the answer: at once
    wait_until(lambda: fired(events, "late_create"), seconds=10)  # the lost one: looked up
    assert [e["outcome"] for e in fired(events, "late_create")] == ["failed"]
    assert [e["reason"] for e in fired(events, "refund")] == [
        "unavailable",
        "late_create_failed",
    ]
    assert entry(router, "flaky").used["sessions"] == 0


def test_a_late_create_the_vendor_cannot_list_stays_counted_for_the_janitor(
    make_router, tmp_path: Path, events
) -> None:
    flaky = Unlisted("flaky", tmp_path, ["dropped"])
    router = make_router(providers={"flaky": flaky}, create_timeout=0.3, retry={"attempts": 1})
    with router.acquire() as lease:
        assert lease.entry == "local"
    wait_until(lambda: fired(events, "late_create"), seconds=10)
    assert [e["outcome"] for e in fired(events, "late_create")] == ["unanswered"]
    assert [e["task"] for e in fired(events, "task_failed")] == ["late create lookup"]
    view = entry(router, "flaky")
    assert (view.used["sessions"], view.live_leases) == (1, 0)  # counted, its slot freed
    assert flaky.alive() == flaky.created
    flaky.away = False
    assert router.reap().killed == [("flaky", flaky.created[0])]


def test_a_lookup_cut_short_by_closing_the_router_refunds_nothing(
    make_router, scripted, events
) -> None:
    """Nothing found before the lookup's budget ran out proves nothing: stays counted."""
    flaky = scripted(script=[Unavailable("the connection was lost", unanswered=True)])
    router = make_router(providers={"flaky": flaky}, create_timeout=10, retry={"attempts": 1})
    with router.acquire() as lease:
        assert lease.entry == "local"
    router.close()  # long before the lookup's 10 s are over
    assert [e["outcome"] for e in fired(events, "late_create")] == ["unanswered"]
    assert fired(events, "refund") == []
    survivor = make_router(providers={"flaky": flaky})
    view = entry(survivor, "flaky")
    assert (view.used["sessions"], view.live_leases) == (1, 0)
