"""A Router over real Redis with the real modal adapter first (on the emulator), then local."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from emulators.harness import Emulator
from emulators.modal import TEST_TOKEN_ID, TEST_TOKEN_SECRET, ModalEmulator
from providers.base import SandboxSpec
from router import Router

RouterFactory = Callable[..., Router]


@pytest.fixture
def emu(modal_emulator: Emulator) -> Iterator[ModalEmulator]:
    assert isinstance(modal_emulator, ModalEmulator)
    yield modal_emulator
    assert modal_emulator.alive() == [], "a sandbox was left alive on Modal"


@pytest.fixture
def make_router(
    emu: ModalEmulator, redis_url: str, key_prefix: str, tmp_path: Path
) -> Iterator[RouterFactory]:
    routers: list[Router] = []

    def make(*, local_first: bool = False, **modal_entry: Any) -> Router:
        modal = {
            "name": "modal",
            "provider": "modal",
            "quota": {"sessions": 100},
            "options": {
                "token_id": TEST_TOKEN_ID,
                "token_secret": TEST_TOKEN_SECRET,
                "server_url": emu.url,
                "request_timeout": 2,
            },
            **modal_entry,
        }
        local = {"name": "local", "provider": "local", "options": {"root": str(tmp_path)}}
        router = Router.from_config(
            {
                "state_url": redis_url,
                "key_prefix": key_prefix,
                "create_timeout": 1,
                "acquire_timeout": 20,
                "retry": {"attempts": 2, "initial": 0.05, "maximum": 0.1},
                "chain": [local, modal] if local_first else [modal, local],
            },
            hooks=[],
        )
        routers.append(router)
        return router

    yield make
    for router in routers:
        router.close()


def used_sessions(router: Router, name: str = "modal") -> float:
    return next(v for v in router.status().entries if v.name == name).used["sessions"]


def test_serves_from_modal_and_terminates_on_release(
    emu: ModalEmulator, make_router: RouterFactory
) -> None:
    router = make_router()
    with router.acquire(labels={"job": "j1"}) as lease:
        assert (lease.entry, lease.failovers) == ("modal", [])
        assert lease.sandbox.run("echo from modal").stdout == "from modal\n"
        lease.sandbox.write_file("out.bin", b"\x00\x01")
        assert lease.sandbox.read_file("out.bin") == b"\x00\x01"
        (record,) = emu.alive()
        assert record.labels["job"] == "j1"
        assert record.labels["sandbox_router_entry"] == "modal"
    assert used_sessions(router) == 1
    assert [r.ended_by for r in emu.records()] == ["kill"]


def test_gpu_requirement_picks_modal_over_entries_without_it(
    emu: ModalEmulator, make_router: RouterFactory
) -> None:
    router = make_router(local_first=True)
    with router.acquire(SandboxSpec(gpu="T4"), requires=("gpu",)) as lease:
        assert (lease.entry, lease.failovers) == ("modal", [])
        assert emu.core.modal[lease.sandbox.id].definition.resources.gpu_config.gpu_type == "T4"
    with router.acquire() as lease:
        assert lease.entry == "local"
    assert used_sessions(router) == 1


@pytest.mark.parametrize(
    ("setup", "state", "hits"),
    [
        ({"create": {"status": 401}}, "misconfigured", (1, 1)),
        ({"create": {"status": 403}}, "misconfigured", (1, 1)),
        ({"create": {"status": 429, "retry_after": 30}}, "rate_limited", (1, 1)),
        ({"quota": {"max_concurrent": 0}}, "capacity", None),
        ({"quota": {"max_created": 0, "api_key": TEST_TOKEN_ID}}, "exhausted", None),
        # The SDK itself tries UNAVAILABLE / INTERNAL / dropped streams up to 4 times (0.7 s
        # of backoff), the router twice: a loaded machine fits fewer SDK tries in the budget.
        ({"create": {"status": 503, "times": None}}, "closed", (2, 8)),
        ({"create": {"status": 500, "times": None}}, "closed", (2, 8)),
        ({"create": {"drop": True, "times": None}}, "closed", (2, 8)),
        ({"create": {"hang": True, "times": None}}, "closed", (2, 2)),
        ({"create": {"delay": 3, "times": None}}, "closed", (2, 2)),
        ({"image": {"hang": True, "times": None}}, "closed", (2, 2)),
        ({"auth": {"status": 503, "times": None}}, "closed", (2, 8)),
        ({"images": ["python:3.12-slim"]}, "closed", None),
    ],
    ids=[
        "auth",
        "permission",
        "rate-limit",
        "concurrency-cap",
        "created-quota",
        "unavailable-503",
        "internal-500",
        "dropped",
        "hung-create",
        "slow-create",
        "hung-image-build",
        "auth-token-503",
        "unknown-image",
    ],
)
def test_each_fault_fails_over_to_local_and_refunds(
    emu: ModalEmulator,
    make_router: RouterFactory,
    setup: dict[str, Any],
    state: str,
    hits: tuple[int, int] | None,
) -> None:
    for op in ("create", "image", "auth"):
        if op in setup:
            emu.inject(op, **setup[op])
    if "quota" in setup:
        emu.set_quota(**setup["quota"])
    if "images" in setup:
        emu.images.allowed = set(setup["images"])
    router = make_router(template="no/such:image") if "images" in setup else make_router()
    with router.acquire() as lease:
        assert (lease.entry, lease.failovers) == ("local", ["modal"])
        assert lease.sandbox.run("echo served").stdout == "served\n"
    assert used_sessions(router) == 0
    view = next(v for v in router.status().entries if v.name == "modal")
    assert view.state == state
    if hits is not None:
        op = next(op for op in ("create", "image", "auth") if op in setup)
        assert hits[0] <= emu.core.faults.hits[op] <= hits[1]
    assert emu.alive() == []
    assert emu.records() == [] or all(r.ended_by == "kill" for r in emu.records())
