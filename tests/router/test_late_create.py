"""A create that outlives the acquire deadline: the caller fails over, and the
sandbox the provider finishes later is killed (by the adapter, else the janitor)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest

from emulators import available, emulator_class
from providers.base import LABEL_ROUTER, Sandbox, SandboxSpec
from router import Router
from router.testing import ScriptedProvider
from tests.polling import wait_until
from tests.router.conftest import Clock, fired

PROVIDERS = available(["daytona", "runloop", "e2b"])  # the HTTP emulators


@pytest.mark.slow
@pytest.mark.parametrize("name", PROVIDERS)
def test_slow_create_is_abandoned_then_reaped(
    name: str, redis_url: str, key_prefix: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with emulator_class(name)() as emu:
        for key, value in emu.sdk_env().items():
            monkeypatch.setenv(key, value)
        config = {
            "state_url": redis_url,
            "key_prefix": key_prefix,
            "create_timeout": 0.5,
            "retry": {"attempts": 1},
            "chain": [
                {"name": name, "provider": name},
                {"name": "local", "provider": "local", "options": {"root": str(tmp_path)}},
            ],
        }
        # Warm up (SDK imports: a second or more) so the faulty create below reaches
        # the emulator within its 0.5 s even on a loaded machine.
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
            assert router.status().entries[0].used["sessions"] == 1  # the late one refunded
            deadline = time.monotonic() + 15
            while time.monotonic() < deadline:
                ours = late()
                if ours and all(not r.alive for r in ours):
                    break  # the adapter killed the late sandbox itself
                if ours and any(r.alive for r in ours):
                    router.reap()  # else the janitor does
                time.sleep(0.3)
            ours = late()
            assert ours, "the provider never finished the abandoned create"
            assert [r.id for r in ours if r.alive] == []


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
