"""Failover through the chain for every error class, with refunds, on real Redis."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime

import pytest

from providers.base import SandboxSpec
from providers.errors import (
    AuthError,
    CapacityExceeded,
    NoProviderAvailable,
    NotFound,
    QuotaExceeded,
    RateLimited,
    SandboxError,
    Unavailable,
)
from tests.polling import wait_until
from tests.router.conftest import NOW, Clock, fired

RESET = datetime(2026, 10, 1, tzinfo=UTC)


def entry(router, name):
    return next(v for v in router.status().entries if v.name == name)


def test_happy_path_meters_the_lease(make_router, scripted, clock: Clock) -> None:
    flaky = scripted()
    router = make_router(
        providers={"flaky": flaky},
        chain=[{"name": "flaky", "provider": "local", "quota": {"sessions": 10, "concurrent": 2}}],
    )
    with router.acquire() as lease:
        assert lease.entry == "flaky"
        result = lease.sandbox.run("echo out; echo err >&2; exit 4")
        assert (result.stdout, result.stderr, result.exit_code) == ("out\n", "err\n", 4)
        assert entry(router, "flaky").live_leases == 1
        clock.advance(12)
    view = entry(router, "flaky")
    assert view.used == {
        "sessions": 1,
        "sandbox_seconds": pytest.approx(12),
        "concurrent": 0,
        "usd": 0,
    }
    assert flaky.alive() == []
    assert lease.released


@pytest.mark.parametrize(
    ("error", "state", "until"),
    [
        (RateLimited("slow down", retry_after=40), "rate_limited", NOW + 40),
        (CapacityExceeded("too many sandboxes"), "capacity", NOW + 10),
        (QuotaExceeded("monthly quota used", reset_at=RESET), "exhausted", RESET.timestamp()),
        (AuthError("401 bad key"), "misconfigured", None),
        (NotFound("no such template"), "closed", None),
        (RuntimeError("adapter bug"), "closed", None),
    ],
)
def test_each_error_fails_over_once_and_refunds(
    make_router, scripted, events, error, state, until
) -> None:
    flaky = scripted(script=[error, None, None])
    router = make_router(providers={"flaky": flaky})
    with router.acquire() as lease:
        assert lease.entry == "local"
        assert lease.failovers == ["flaky"]
    assert flaky.creates == 1  # not retried: only transient errors are
    view = entry(router, "flaky")
    assert view.used["sessions"] == 0  # refunded
    assert view.state == state
    if until is not None:
        assert view.until is not None
        assert view.until.timestamp() == pytest.approx(until)
    assert fired(events, "refund") == [
        {
            "entry": "flaky",
            "lease_id": fired(events, "refund")[0]["lease_id"],
            "reason": fired(events, "failover")[0]["reason"],
        }
    ]
    assert fired(events, "failover")[0]["to_entry"] == "local"


def test_transient_errors_are_retried_with_backoff_then_fail_over(
    make_router, scripted, events, clock: Clock
) -> None:
    flaky = scripted(script=[Unavailable("503")] * 3)
    router = make_router(providers={"flaky": flaky})
    with router.acquire() as lease:
        assert lease.entry == "local"
    assert flaky.creates == 3
    assert clock.t > NOW  # the backoff slept (on the fake clock)
    assert entry(router, "flaky").used["sessions"] == 0
    assert len(fired(events, "refund")) == 3
    # three consecutive transient failures open the breaker (threshold 3)
    assert fired(events, "breaker") == [
        {"entry": "flaky", "from_state": "closed", "to_state": "open"}
    ]


def test_transient_then_success_stays_on_the_entry(make_router, scripted) -> None:
    flaky = scripted(script=[Unavailable("502"), None])
    router = make_router(providers={"flaky": flaky})
    with router.acquire() as lease:
        assert (lease.entry, lease.attempts, lease.failovers) == ("flaky", 2, [])
    assert entry(router, "flaky").used["sessions"] == 1


def test_sandbox_error_goes_to_the_caller_and_is_refunded(make_router, scripted) -> None:
    flaky = scripted(script=[SandboxError("bad image spec")])
    router = make_router(providers={"flaky": flaky})
    with pytest.raises(SandboxError, match="bad image spec"):
        router.acquire()
    view = entry(router, "flaky")
    assert (view.used["sessions"], view.state) == (0, "closed")


def test_hung_create_times_out_and_fails_over(make_router, scripted) -> None:
    flaky = scripted(script=["hang"])
    router = make_router(providers={"flaky": flaky}, create_timeout=0.3, retry={"attempts": 1})
    with router.acquire() as lease:
        assert lease.entry == "local"
    assert entry(router, "flaky").used["sessions"] == 1  # no answer yet: it may have made one


def test_auth_block_lasts_until_the_config_changes(make_router, scripted, tmp_path) -> None:
    router = make_router(providers={"flaky": scripted(script=[AuthError("401")])})
    router.acquire().release()
    second = scripted(script=[])
    again = make_router(providers={"flaky": second})
    with again.acquire() as lease:
        assert lease.entry == "local"
    assert second.creates == 0
    changed = scripted(script=[])
    fixed = make_router(
        providers={"flaky": changed},
        chain=[
            {"name": "flaky", "provider": "local", "template": "new-key"},
            {"name": "local", "provider": "local", "options": {"root": str(tmp_path / "l")}},
        ],
    )
    with fixed.acquire() as lease:
        assert lease.entry == "flaky"


def test_no_provider_available_lists_every_entry_and_why(make_router, scripted) -> None:
    providers = {
        "spent": scripted("spent"),
        "broken": scripted("broken", script=[Unavailable("down")] * 3),
        "keyless": scripted("keyless", unconfigured="set KEYLESS_API_KEY"),
        "files": scripted("files", capabilities=("files",)),
    }
    router = make_router(
        providers=providers,
        chain=[
            {"name": "spent", "provider": "local", "quota": {"sessions": 0}},
            {"name": "broken", "provider": "local"},
            {"name": "keyless", "provider": "local"},
            {"name": "files", "provider": "local"},
        ],
    )
    with pytest.raises(NoProviderAvailable) as info:
        router.acquire(requires=("gpu",))
    assert info.value.reasons == {
        "spent": "lacks capability gpu",
        "broken": "lacks capability gpu",
        "keyless": "not configured: set KEYLESS_API_KEY",
        "files": "lacks capability gpu",
    }
    with router.acquire() as lease:
        assert (lease.entry, lease.failovers) == ("files", ["broken"])
    with pytest.raises(NoProviderAvailable) as info:
        router.acquire(requires=("run_code",))
    reasons = info.value.reasons
    assert list(reasons) == ["spent", "broken", "keyless", "files"]
    assert reasons["spent"] == "quota exhausted: sessions 0/0 until 2026-10-01T00:00:00+00:00"
    assert reasons["broken"].startswith("breaker open for ")
    assert reasons["files"] == "lacks capability run_code"
    assert "  - keyless: not configured: set KEYLESS_API_KEY" in str(info.value)


def test_half_open_admits_one_probe_across_two_routers(make_router, scripted, clock: Clock) -> None:
    gate = threading.Event()
    flaky_a = scripted("flaky", script=[Unavailable("x")] * 3 + [gate])
    flaky_b = scripted("flaky", script=[])
    a = make_router(providers={"flaky": flaky_a})
    b = make_router(providers={"flaky": flaky_b})
    a.acquire().release()  # three transient failures: open
    assert entry(b, "flaky").state == "open"
    clock.advance(31)
    with ThreadPoolExecutor(1) as pool:
        probe = pool.submit(a.acquire)  # the probe waits inside create
        wait_until(lambda: flaky_a.creates == 4, 10)
        with b.acquire() as lease:  # a probe is in flight: b must not send another
            assert lease.entry == "local"
        assert flaky_b.creates == 0
        assert entry(b, "flaky").state == "half_open"
        gate.set()
        with probe.result(10) as lease:
            assert lease.entry == "flaky"
    assert entry(b, "flaky").state == "closed"


def test_crashed_app_lease_expires_and_frees_its_slot(make_router, scripted, clock: Clock) -> None:
    chain = [{"name": "flaky", "provider": "local", "quota": {"concurrent": 1}}]
    crashed = make_router(providers={"flaky": scripted("flaky")}, chain=chain, lease_ttl=60)
    crashed.acquire()  # never released: the app "crashes"
    other = make_router(providers={"flaky": scripted("flaky")}, chain=chain, lease_ttl=60)
    with pytest.raises(NoProviderAvailable, match="concurrent 1/1"):
        other.acquire()
    clock.advance(61)
    with other.acquire() as lease:
        assert lease.entry == "flaky"
    assert entry(other, "flaky").used["sandbox_seconds"] == pytest.approx(60)  # until expiry


def test_pooled_quota_is_shared_by_entries(make_router, scripted) -> None:
    router = make_router(
        providers={"a": scripted("a"), "b": scripted("b")},
        pools={"account": {"sessions": 2}},
        chain=[
            {"name": "a", "provider": "local", "quota_pool": "account"},
            {"name": "b", "provider": "local", "quota_pool": "account"},
        ],
    )
    router.acquire().release()
    router.acquire(requires=()).release()
    with pytest.raises(NoProviderAvailable) as info:
        router.acquire()
    assert "sessions 2/2" in info.value.reasons["a"]
    assert "sessions 2/2" in info.value.reasons["b"]


def test_balanced_prefers_the_largest_remaining_fraction(make_router, scripted) -> None:
    router = make_router(
        providers={"a": scripted("a"), "b": scripted("b")},
        strategy="balanced",
        chain=[
            {"name": "a", "provider": "local", "quota": {"sessions": 4}},
            {"name": "b", "provider": "local", "quota": {"sessions": 10}},
        ],
    )
    served = []
    for _ in range(8):
        with router.acquire() as lease:
            served.append(lease.entry)
    assert served == ["a", "b", "b", "b", "a", "b", "b", "a"]


async def test_async_api_shares_the_logic(make_router, scripted) -> None:
    flaky = scripted(script=[RateLimited("429", retry_after=5)])
    router = make_router(providers={"flaky": flaky})
    async with await router.aacquire() as lease:
        assert lease.entry == "local"
        result = await lease.sandbox.run_code("print(2 ** 10)")
        assert result.stdout == "1024\n"
        await lease.sandbox.write_file("data/x.bin", b"\x00\x01\xff")
        assert await lease.sandbox.read_file("data/x.bin") == b"\x00\x01\xff"
    status = await router.astatus()
    assert next(v for v in status.entries if v.name == "flaky").state == "rate_limited"


def test_an_entry_whose_sdk_is_missing_is_skipped_and_says_so(
    make_router, tmp_path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The SDK check runs once per router (it costs a sys.path search); its verdict
    shows in acquire, in status and in the janitor."""
    import providers

    monkeypatch.setitem(providers.SDKS, "e2b", ("no_such_e2b_sdk", "e2b"))
    monkeypatch.setenv("E2B_API_KEY", "e2b_configured")
    chain = [
        {"name": "e2b", "provider": "e2b"},
        {"name": "local", "provider": "local", "options": {"root": str(tmp_path / "l")}},
    ]
    router = make_router(chain=chain)
    with router.acquire() as lease:
        assert lease.entry == "local"
    view = router.status().entries[0]
    assert (view.name, view.state, view.configured) == ("e2b", "unconfigured", False)
    assert "pip install 'sandbox-router[e2b]'" in str(view.unconfigured_reason)
    assert "pip install" in router.reap().skipped["e2b"]


def test_a_gpu_spec_routes_only_to_entries_with_gpus(make_router, scripted) -> None:
    """A SandboxSpec(gpu=...) implies requires=("gpu",): an entry that ignores it is skipped."""
    providers = {"cpu": scripted("cpu"), "gpu": scripted("gpu", capabilities=("run_code", "gpu"))}
    router = make_router(
        providers=providers,
        chain=[{"name": "cpu", "provider": "local"}, {"name": "gpu", "provider": "local"}],
    )
    with router.acquire(SandboxSpec(gpu="T4")) as lease:
        assert lease.entry == "gpu"
    with router.acquire() as lease:
        assert lease.entry == "cpu"
    only_cpu = make_router(providers={"cpu": scripted("cpu")},
                           chain=[{"name": "cpu", "provider": "local"}])  # fmt: skip
    with pytest.raises(NoProviderAvailable, match="cpu: lacks capability gpu"):
        only_cpu.acquire(SandboxSpec(gpu="A100"))
