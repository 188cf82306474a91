"""A Router over real Redis with the real daytona adapter first (on the emulator), then local."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from emulators.daytona import TEST_API_KEY, DaytonaEmulator
from emulators.harness import Emulator
from router import Router

RouterFactory = Callable[..., Router]
LIMIT = "Total CPU limit exceeded. Maximum allowed: 10."


@pytest.fixture
def emu(daytona_emulator: Emulator) -> Iterator[DaytonaEmulator]:
    assert isinstance(daytona_emulator, DaytonaEmulator)
    yield daytona_emulator
    assert daytona_emulator.alive() == [], "a sandbox was left alive on Daytona"


@pytest.fixture
def make_router(
    emu: DaytonaEmulator, redis_url: str, key_prefix: str, tmp_path: Path
) -> Iterator[RouterFactory]:
    routers: list[Router] = []

    def make(**daytona_entry: Any) -> Router:
        router = Router.from_config(
            {
                "state_url": redis_url,
                "key_prefix": key_prefix,
                "create_timeout": 1,
                "acquire_timeout": 20,
                "retry": {"attempts": 2, "initial": 0.05, "maximum": 0.1},
                "chain": [
                    {
                        "name": "daytona",
                        "provider": "daytona",
                        "quota": {"sessions": 100},
                        "options": {
                            "api_key": TEST_API_KEY,
                            "api_url": emu.api_url,
                            "request_timeout": 2,
                        },
                        **daytona_entry,
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


def used_sessions(router: Router, name: str = "daytona") -> float:
    return next(v for v in router.status().entries if v.name == name).used["sessions"]


def test_serves_from_daytona_and_deletes_on_release(
    emu: DaytonaEmulator, make_router: RouterFactory
) -> None:
    router = make_router()
    with router.acquire(labels={"job": "j1"}) as lease:
        assert (lease.entry, lease.failovers) == ("daytona", [])
        assert lease.sandbox.run("echo from daytona").stdout == "from daytona\n"
        (record,) = emu.alive()
        assert record.labels["job"] == "j1"
        assert record.labels["sandbox_router_entry"] == "daytona"
    assert used_sessions(router) == 1
    assert [r.ended_by for r in emu.records()] == ["kill"]


@pytest.mark.parametrize(
    ("setup", "state", "attempts"),
    [
        ({"fault": {"status": 401}}, "misconfigured", 1),
        ({"fault": {"status": 429, "retry_after": 30}}, "rate_limited", 1),
        ({"fault": {"status": 403}}, "exhausted", 1),
        ({"fault": {"status": 400, "message": LIMIT}}, "exhausted", 1),
        ({"quota": {"max_concurrent": 0}}, "exhausted", 1),
        ({"quota": {"max_created": 0, "api_key": TEST_API_KEY}}, "exhausted", 1),
        ({"fault": {"status": 503, "times": None}}, "closed", 2),
        ({"fault": {"status": 500, "times": None}}, "closed", 2),
        ({"fault": {"drop": True, "times": None}}, "closed", 2),
        ({"fault": {"hang": True, "times": None}}, "closed", 2),
        ({"fault": {"delay": 3, "times": None}}, "closed", 2),
        ({"boot": {"hang": True, "times": None}}, "closed", 2),
        ({"boot": {"status": 500, "times": None}}, "closed", 2),
        ({"snapshots": ["base"]}, "closed", 1),
    ],
    ids=[
        "auth",
        "rate-limit",
        "quota-403",
        "quota-400",
        "concurrency-cap",
        "created-quota",
        "busy-503",
        "error-500",
        "dropped",
        "hung",
        "slow",
        "boot-hangs",
        "boot-fails",
        "unknown-snapshot",
    ],
)
def test_each_fault_fails_over_to_local_and_refunds(
    emu: DaytonaEmulator,
    make_router: RouterFactory,
    setup: dict[str, Any],
    state: str,
    attempts: int,
) -> None:
    for op in ("fault", "boot"):
        if op in setup:
            emu.inject("create" if op == "fault" else op, **setup[op])
    if "quota" in setup:
        emu.set_quota(**setup["quota"])
    if "snapshots" in setup:
        emu.snapshots = set(setup["snapshots"])
    router = make_router(template="no-such-snapshot") if "snapshots" in setup else make_router()
    with router.acquire() as lease:
        assert (lease.entry, lease.failovers) == ("local", ["daytona"])
        assert lease.sandbox.run("echo served").stdout == "served\n"
    assert used_sessions(router) == 0
    view = next(v for v in router.status().entries if v.name == "daytona")
    assert view.state == state
    op = "boot" if "boot" in setup else "create"
    if op in setup or "fault" in setup:  # the SDK retries no status; the router retries transient
        assert emu.core.faults.hits[op] == attempts
    assert emu.alive() == []
    assert all(r.ended_by == "kill" for r in emu.records())
