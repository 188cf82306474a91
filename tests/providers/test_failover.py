"""A Router over real Redis with each real adapter first (on its emulator), then local.

One table of faults per vendor: each must fail over to local, refund the
reservation (a create left unanswered once the lookup by its lease label
found nothing), leave the entry in the expected health state, hit the emulator
the expected number of times (the router retries transient errors once, and
no SDK retries under it) and leave no sandbox alive.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from emulators import available
from emulators.daytona import TEST_API_KEY as DAYTONA_KEY
from emulators.e2b import TEST_API_KEY as E2B_KEY
from emulators.harness import Emulator
from emulators.modal import TEST_TOKEN_ID, TEST_TOKEN_SECRET
from emulators.runloop import TEST_API_KEY as RUNLOOP_KEY
from providers import provider_class
from providers.base import SandboxSpec
from providers.errors import RateLimited
from router import Router
from tests.polling import wait_until

RouterFactory = Callable[..., Router]
LIMIT = "Total CPU limit exceeded. Maximum allowed: 10."
TRANSIENT = {"times": None}


@dataclass(frozen=True)
class Fault:
    """One row: what goes wrong, the entry's state after it, and the emulator's hits."""

    id: str
    state: str
    inject: dict[str, dict[str, Any]] | None = None  # op -> FaultSpec fields
    quota: dict[str, Any] | None = None
    catalog: list[str] | None = None  # the only templates the vendor knows
    hits: tuple[int, int] | None = (1, 1)  # on the injected op, min and max


@dataclass(frozen=True)
class Vendor:
    name: str
    options: Callable[[Any], dict[str, Any]]
    catalog: Callable[[Any, list[str]], None]
    unknown_template: str
    faults: list[Fault]


def transient(op: str, hits: tuple[int, int] = (2, 2), **fault: Any) -> dict[str, Any]:
    return {"inject": {op: {**fault, **TRANSIENT}}, "hits": hits}


def common(key: str, *, cap: str = "capacity") -> list[Fault]:
    """The rows every vendor shares (quota, rate limit, transient create failures)."""
    return [
        Fault("auth", "misconfigured", inject={"create": {"status": 401}}),
        Fault("rate-limit", "rate_limited", inject={"create": {"status": 429, "retry_after": 30}}),
        Fault("concurrency-cap", cap, quota={"max_concurrent": 0}, hits=None),
        Fault("created-quota", "exhausted", quota={"max_created": 0, "api_key": key}, hits=None),
        Fault("hung", "closed", **transient("create", hang=True)),
        Fault("slow", "closed", **transient("create", delay=3)),
    ]


def sdk_http_errors() -> list[Fault]:
    return [
        Fault("busy-503", "closed", **transient("create", status=503)),
        Fault("error-500", "closed", **transient("create", status=500)),
        Fault("dropped", "closed", **transient("create", drop=True)),
    ]


def set_attr(attr: str) -> Callable[[Any, list[str]], None]:
    return lambda emu, names: setattr(emu, attr, set(names))


# The router owns retries: the adapter stops the SDK's own (up to 4 tries of UNAVAILABLE,
# INTERNAL and dropped streams), so the router's 2 attempts are 2 requests.
MODAL_TRIES = (2, 2)

VENDORS = {
    "e2b": Vendor(
        "e2b",
        lambda emu: {"api_key": E2B_KEY, "api_url": emu.url, "sandbox_url": emu.url},
        set_attr("templates"),
        "no-such-template",
        [
            *common(E2B_KEY),
            *sdk_http_errors(),
            Fault("unknown-template", "closed", catalog=["base"]),
        ],
    ),
    "runloop": Vendor(
        "runloop",
        lambda emu: {"api_key": RUNLOOP_KEY, "base_url": emu.url, "pool_shards": 1},
        set_attr("blueprints"),
        "no-such-blueprint",
        [
            *common(RUNLOOP_KEY),
            *sdk_http_errors(),
            Fault(
                "quota-403",
                "exhausted",
                inject={"create": {"status": 403, "message": "Usage limit exceeded"}},
            ),
            Fault("boot-hangs", "closed", **transient("boot", hang=True)),
            Fault("boot-fails", "closed", **transient("boot", status=500)),
            Fault("status-poll-503", "closed", **transient("wait", status=503)),
            Fault("unknown-blueprint", "closed", catalog=["base"]),
        ],
    ),
    "daytona": Vendor(
        "daytona",
        lambda emu: {"api_key": DAYTONA_KEY, "api_url": emu.api_url},
        set_attr("snapshots"),
        "no-such-snapshot",
        [
            *common(DAYTONA_KEY),  # the CPU limit caps live sandboxes: a release frees it
            *sdk_http_errors(),
            Fault("cpu-403", "capacity", inject={"create": {"status": 403}}),
            Fault(
                "cpu-limit-400", "capacity", inject={"create": {"status": 400, "message": LIMIT}}
            ),
            Fault("boot-hangs", "closed", **transient("boot", hang=True)),
            Fault("boot-fails", "closed", **transient("boot", status=500)),
            Fault("unknown-snapshot", "closed", catalog=["base"]),
        ],
    ),
    "modal": Vendor(
        "modal",
        lambda emu: {
            "token_id": TEST_TOKEN_ID,
            "token_secret": TEST_TOKEN_SECRET,
            "server_url": emu.url,
        },
        lambda emu, names: setattr(emu.images, "allowed", set(names)),
        "no/such:image",
        [
            *common(TEST_TOKEN_ID),
            Fault("permission", "misconfigured", inject={"create": {"status": 403}}),
            Fault("unavailable-503", "closed", **transient("create", MODAL_TRIES, status=503)),
            Fault("internal-500", "closed", **transient("create", MODAL_TRIES, status=500)),
            Fault("dropped", "closed", **transient("create", MODAL_TRIES, drop=True)),
            Fault("hung-image-build", "closed", **transient("image", hang=True)),
            Fault("auth-token-503", "closed", **transient("auth", MODAL_TRIES, status=503)),
            Fault("unknown-image", "closed", catalog=["python:3.12-slim"]),
        ],
    ),
}
NAMES = available(list(VENDORS))


@pytest.fixture(params=NAMES)
def vendor(request: pytest.FixtureRequest) -> Vendor:
    return VENDORS[request.param]


@pytest.fixture
def emu(vendor: Vendor, request: pytest.FixtureRequest) -> Iterator[Emulator]:
    emulator: Emulator = request.getfixturevalue(f"{vendor.name}_emulator")
    yield emulator
    assert emulator.alive() == [], f"a sandbox was left alive on {vendor.name}"


@pytest.fixture
def make_router(
    vendor: Vendor,
    emu: Emulator,
    redis_url: str,
    key_prefix: str,
    tmp_path: Path,
    new_router: RouterFactory,
) -> RouterFactory:
    def make(*, local_first: bool = False, **entry: Any) -> Router:
        first = {
            "name": vendor.name,
            "provider": vendor.name,
            "quota": {"sessions": 100},
            "options": {**vendor.options(emu), "request_timeout": 2},
            **entry,
        }
        local = {"name": "local", "provider": "local", "options": {"root": str(tmp_path)}}
        return new_router(
            {
                "state_url": redis_url,
                "key_prefix": key_prefix,
                "create_timeout": 1,
                "acquire_timeout": 20,
                "retry": {"attempts": 2, "initial": 0.05, "maximum": 0.1},
                "chain": [local, first] if local_first else [first, local],
            },
            hooks=[],
        )

    return make


def entry_view(router: Router, name: str) -> Any:
    return next(v for v in router.status().entries if v.name == name)


def test_serves_from_the_vendor_and_kills_on_release(
    vendor: Vendor, emu: Emulator, make_router: RouterFactory
) -> None:
    router = make_router()
    with router.acquire(labels={"job": "j1"}) as lease:
        assert (lease.entry, lease.failovers) == (vendor.name, [])
        assert lease.sandbox.run("echo served").stdout == "served\n"
        lease.sandbox.write_file("out.bin", b"\x00\x01")
        assert lease.sandbox.read_file("out.bin") == b"\x00\x01"
        (record,) = emu.alive()
        assert record.labels["job"] == "j1"
        assert record.labels["sandbox_router_entry"] == vendor.name
    assert entry_view(router, vendor.name).used["sessions"] == 1
    assert [r.ended_by for r in emu.records()] == ["kill"]


def faults() -> list[Any]:
    return [
        pytest.param(name, fault, id=f"{name}-{fault.id}")
        for name in NAMES
        for fault in VENDORS[name].faults
    ]


@pytest.mark.parametrize(("vendor", "fault"), faults(), indirect=["vendor"])
def test_each_fault_fails_over_to_local_and_refunds(
    vendor: Vendor, fault: Fault, emu: Any, make_router: RouterFactory
) -> None:
    name = vendor.name
    for op, spec in (fault.inject or {}).items():
        emu.inject(op, **spec)
    if fault.quota:
        emu.set_quota(**fault.quota)
    if fault.catalog:
        vendor.catalog(emu, fault.catalog)
    router = make_router(template=vendor.unknown_template) if fault.catalog else make_router()
    with router.acquire() as lease:
        assert (lease.entry, lease.failovers) == ("local", [name])
        assert lease.sandbox.run("echo served").stdout == "served\n"
    # A create the router stopped waiting for, or left unanswered, is refunded once
    # upkeep knows it made nothing (its lookup by lease label lasts the create's budget).
    wait_until(lambda: entry_view(router, name).used["sessions"] == 0, seconds=15)
    view = entry_view(router, name)
    assert view.used["sessions"] == 0
    assert view.state == fault.state
    if fault.inject and fault.hits:
        (op,) = fault.inject
        assert fault.hits[0] <= emu.core.faults.hits[op] <= fault.hits[1]
    assert emu.alive() == []
    assert all(r.ended_by in ("kill", "failure") for r in emu.records())


@pytest.mark.skipif("modal" not in NAMES, reason="needs the modal emulator and adapter")
@pytest.mark.parametrize("vendor", ["modal"], indirect=True)
def test_gpu_requirement_picks_modal_over_entries_without_it(
    emu: Any, make_router: RouterFactory
) -> None:
    router = make_router(local_first=True)
    with router.acquire(SandboxSpec(gpu="T4"), requires=("gpu",)) as lease:
        assert (lease.entry, lease.failovers) == ("modal", [])
        definition = emu.core.modal[lease.sandbox.id].definition
        assert definition.resources.gpu_config.gpu_type == "T4"
    with router.acquire() as lease:
        assert lease.entry == "local"
    assert entry_view(router, "modal").used["sessions"] == 1


@pytest.mark.parametrize("op", ["create", "list"])
async def test_a_429_keeps_its_retry_after(vendor: Vendor, emu: Any, op: str) -> None:
    """The router blocks a rate-limited entry for as long as the vendor's Retry-After says."""
    cls = provider_class(vendor.name)
    provider = cls(vendor.name, cls.Options(**vendor.options(emu)))
    emu.inject(op, status=429, retry_after=30)
    try:
        with pytest.raises(RateLimited) as limited:
            await (provider.create(SandboxSpec(), timeout=2) if op == "create" else provider.list())
    finally:
        await provider.aclose()
    assert (limited.value.retry_after, limited.value.status) == (30, 429)
