"""A Router over real Redis with the real e2b adapter first (on the emulator), then local."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from emulators.e2b import TEST_API_KEY, E2BEmulator
from emulators.harness import Emulator
from router import Router

RouterFactory = Callable[..., Router]


@pytest.fixture
def emu(e2b_emulator: Emulator) -> Iterator[E2BEmulator]:
    assert isinstance(e2b_emulator, E2BEmulator)
    yield e2b_emulator
    assert e2b_emulator.alive() == [], "a sandbox was left alive on E2B"


@pytest.fixture
def make_router(
    emu: E2BEmulator, redis_url: str, key_prefix: str, tmp_path: Path
) -> Iterator[RouterFactory]:
    routers: list[Router] = []

    def make(**e2b_entry: Any) -> Router:
        router = Router.from_config(
            {
                "state_url": redis_url,
                "key_prefix": key_prefix,
                "create_timeout": 1,
                "acquire_timeout": 20,
                "retry": {"attempts": 2, "initial": 0.05, "maximum": 0.1},
                "chain": [
                    {
                        "name": "e2b",
                        "provider": "e2b",
                        "quota": {"sessions": 100},
                        "options": {
                            "api_key": TEST_API_KEY,
                            "api_url": emu.url,
                            "sandbox_url": emu.url,
                            "request_timeout": 2,
                        },
                        **e2b_entry,
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


def used_sessions(router: Router, name: str = "e2b") -> float:
    return next(v for v in router.status().entries if v.name == name).used["sessions"]


def test_serves_from_e2b_and_kills_on_release(emu: E2BEmulator, make_router: RouterFactory) -> None:
    router = make_router()
    with router.acquire(labels={"job": "j1"}) as lease:
        assert (lease.entry, lease.failovers) == ("e2b", [])
        assert lease.sandbox.run("echo from e2b").stdout == "from e2b\n"
        (record,) = emu.alive()
        assert record.labels["job"] == "j1"
        assert record.labels["sandbox_router_entry"] == "e2b"
    assert used_sessions(router) == 1
    assert [r.ended_by for r in emu.records()] == ["kill"]


@pytest.mark.parametrize(
    ("setup", "state"),
    [
        ({"fault": {"status": 401}}, "misconfigured"),
        ({"fault": {"status": 429, "retry_after": 30}}, "rate_limited"),
        ({"quota": {"max_concurrent": 0}}, "capacity"),
        ({"quota": {"max_created": 0, "api_key": TEST_API_KEY}}, "exhausted"),
        ({"fault": {"status": 503, "times": None}}, "closed"),
        ({"fault": {"status": 500, "times": None}}, "closed"),
        ({"fault": {"drop": True, "times": None}}, "closed"),
        ({"fault": {"hang": True, "times": None}}, "closed"),
        ({"fault": {"delay": 3, "times": None}}, "closed"),
        ({"templates": ["base"]}, "closed"),
    ],
    ids=[
        "auth",
        "rate-limit",
        "concurrency-cap",
        "monthly-quota",
        "busy-503",
        "error-500",
        "dropped",
        "hung",
        "slow",
        "unknown-template",
    ],
)
def test_each_fault_fails_over_to_local_and_refunds(
    emu: E2BEmulator, make_router: RouterFactory, setup: dict[str, Any], state: str
) -> None:
    if "fault" in setup:
        emu.inject("create", **setup["fault"])
    if "quota" in setup:
        emu.set_quota(**setup["quota"])
    if "templates" in setup:
        emu.templates = set(setup["templates"])
    router = make_router(template="no-such-template") if "templates" in setup else make_router()
    with router.acquire() as lease:
        assert (lease.entry, lease.failovers) == ("local", ["e2b"])
        assert lease.sandbox.run("echo served").stdout == "served\n"
    assert used_sessions(router) == 0
    view = next(v for v in router.status().entries if v.name == "e2b")
    assert view.state == state
    if "fault" in setup:  # the SDK retries nothing; the router retries transient errors once
        assert emu.core.faults.hits["create"] == (2 if state == "closed" else 1)
    assert emu.alive() == []
