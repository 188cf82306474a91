"""A Router over real Redis with the real runloop adapter first (on the emulator), then local."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from emulators.harness import Emulator
from emulators.runloop import TEST_API_KEY, RunloopEmulator
from router import Router

RouterFactory = Callable[..., Router]


@pytest.fixture
def emu(runloop_emulator: Emulator) -> Iterator[RunloopEmulator]:
    assert isinstance(runloop_emulator, RunloopEmulator)
    yield runloop_emulator
    assert runloop_emulator.alive() == [], "a devbox was left alive on Runloop"


@pytest.fixture
def make_router(
    emu: RunloopEmulator, redis_url: str, key_prefix: str, tmp_path: Path
) -> Iterator[RouterFactory]:
    routers: list[Router] = []

    def make(**runloop_entry: Any) -> Router:
        router = Router.from_config(
            {
                "state_url": redis_url,
                "key_prefix": key_prefix,
                "create_timeout": 1,
                "acquire_timeout": 20,
                "retry": {"attempts": 2, "initial": 0.05, "maximum": 0.1},
                "chain": [
                    {
                        "name": "runloop",
                        "provider": "runloop",
                        "quota": {"sessions": 100},
                        "options": {
                            "api_key": TEST_API_KEY,
                            "base_url": emu.url,
                            "request_timeout": 2,
                            "pool_shards": 1,
                        },
                        **runloop_entry,
                    },
                    {"name": "local", "provider": "local", "options": {"root": str(tmp_path)}},
                ],
            },
            hooks=[],
        )
        routers.append(router)
        return router

    yield make
    for router in routers:
        router.close()


def used_sessions(router: Router, name: str = "runloop") -> float:
    return next(v for v in router.status().entries if v.name == name).used["sessions"]


def test_serves_from_runloop_and_shuts_down_on_release(
    emu: RunloopEmulator, make_router: RouterFactory
) -> None:
    router = make_router()
    with router.acquire(labels={"job": "j1"}) as lease:
        assert (lease.entry, lease.failovers) == ("runloop", [])
        assert lease.sandbox.run("echo from runloop").stdout == "from runloop\n"
        (record,) = emu.alive()
        assert record.labels["job"] == "j1"
        assert record.labels["sandbox_router_entry"] == "runloop"
    assert used_sessions(router) == 1
    assert [r.ended_by for r in emu.records()] == ["kill"]


@pytest.mark.parametrize(
    ("setup", "state", "attempts"),
    [
        ({"fault": {"status": 401}}, "misconfigured", 1),
        ({"fault": {"status": 429, "retry_after": 30}}, "rate_limited", 1),
        ({"fault": {"status": 403, "message": "Usage limit exceeded"}}, "exhausted", 1),
        ({"quota": {"max_concurrent": 0}}, "capacity", 1),
        ({"quota": {"max_created": 0, "api_key": TEST_API_KEY}}, "exhausted", 1),
        ({"fault": {"status": 503, "times": None}}, "closed", 2),
        ({"fault": {"status": 500, "times": None}}, "closed", 2),
        ({"fault": {"drop": True, "times": None}}, "closed", 2),
        ({"fault": {"hang": True, "times": None}}, "closed", 2),
        ({"fault": {"delay": 3, "times": None}}, "closed", 2),
        ({"boot": {"hang": True, "times": None}}, "closed", 2),
        ({"boot": {"status": 500, "times": None}}, "closed", 2),
        ({"wait": {"status": 503, "times": None}}, "closed", 2),
        ({"blueprints": ["base"]}, "closed", 1),
    ],
    ids=[
        "auth",
        "rate-limit",
        "quota-403",
        "concurrency-cap",
        "created-quota",
        "busy-503",
        "error-500",
        "dropped",
        "hung",
        "slow",
        "boot-hangs",
        "boot-fails",
        "status-poll-503",
        "unknown-blueprint",
    ],
)
def test_each_fault_fails_over_to_local_and_refunds(
    emu: RunloopEmulator,
    make_router: RouterFactory,
    setup: dict[str, Any],
    state: str,
    attempts: int,
) -> None:
    for op in ("fault", "boot", "wait"):
        if op in setup:
            emu.inject("create" if op == "fault" else op, **setup[op])
    if "quota" in setup:
        emu.set_quota(**setup["quota"])
    if "blueprints" in setup:
        emu.blueprints = set(setup["blueprints"])
    router = make_router(template="no-such-blueprint") if "blueprints" in setup else make_router()
    with router.acquire() as lease:
        assert (lease.entry, lease.failovers) == ("local", ["runloop"])
        assert lease.sandbox.run("echo served").stdout == "served\n"
    assert used_sessions(router) == 0
    view = next(v for v in router.status().entries if v.name == "runloop")
    assert view.state == state
    op = next((op for op in ("boot", "wait") if op in setup), "create")
    if (
        op in setup or "fault" in setup
    ):  # the SDK retries nothing; the router retries transient errors
        assert emu.core.faults.hits[op] == attempts
    assert emu.alive() == []
    assert all(r.ended_by in ("kill", "failure") for r in emu.records())
