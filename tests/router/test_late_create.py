"""A create that outlives the acquire deadline: the caller fails over, and the
sandbox the provider finishes later is killed (by the adapter, else the janitor)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from emulators import available, emulator_class
from providers.base import LABEL_ROUTER
from router import Router

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
