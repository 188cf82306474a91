"""Create latency profiles: the emulators' creates take what the vendor's do, when asked."""

from __future__ import annotations

import random
import statistics
import time

import httpx
import pytest

from emulators import emulator_class
from emulators.e2b import E2BEmulator
from emulators.latency import PUBLISHED, RESUME, LatencyProfile
from providers.base import SandboxSpec
from tests.contract.conftest import build


def test_a_profile_draws_around_its_median_and_95th_percentile() -> None:
    profile = LatencyProfile(0.1, 0.3)
    rng = random.Random(7)
    draws = sorted(profile.sample(rng) for _ in range(4000))
    assert statistics.median(draws) == pytest.approx(0.1, rel=0.1)
    assert draws[int(0.95 * len(draws))] == pytest.approx(0.3, rel=0.15)


def test_a_profile_refuses_a_95th_percentile_below_its_median() -> None:
    with pytest.raises(ValueError, match="p50 <= p95"):
        LatencyProfile(0.3, 0.1)


def test_every_vendor_has_a_published_profile_with_its_source() -> None:
    assert set(PUBLISHED) == {"e2b", "daytona", "modal", "runloop"}
    assert all(profile.source for profile in PUBLISHED.values())


def test_a_profile_given_at_construction_holds_for_a_vendor_core() -> None:
    with E2BEmulator(isolation="none", latency=PUBLISHED["e2b"]) as emu:
        assert emu.core.latency == PUBLISHED["e2b"]


async def test_creates_take_the_profile_set_on_the_control_port() -> None:
    with E2BEmulator(isolation="none") as emu:
        async with httpx.AsyncClient() as client:
            answer = await client.put(
                f"{emu.control_url}/latency", json={"p50_ms": 300, "p95_ms": 300}
            )
            assert answer.status_code == 200
            started = time.monotonic()
            sandbox = await emu.core.create(None, SandboxSpec(), home="/home/user")
            assert time.monotonic() - started >= 0.3
            await emu.core.kill(sandbox.id)
            assert (await client.delete(f"{emu.control_url}/latency")).status_code == 200
            assert emu.core.latency is None
            bad = await client.put(f"{emu.control_url}/latency", json={"p50_ms": 5})
            assert (bad.status_code, "latency" in bad.text) == (400, True)


def test_every_vendor_that_pauses_has_a_resume_profile_with_its_source() -> None:
    assert set(RESUME) == {"e2b", "daytona", "runloop"}  # Modal has no pause
    assert all(profile.source for profile in RESUME.values())


@pytest.mark.parametrize("vendor", sorted(RESUME))
async def test_a_resume_takes_the_resume_profile(vendor: str, tmp_path) -> None:
    """E2B's connect, Daytona's start and Runloop's resume of a paused sandbox wait."""
    wait = LatencyProfile(0.3, 0.3)
    with emulator_class(vendor)(isolation="none", resume_latency=wait) as emu:
        backend = build(vendor, emu, tmp_path)
        sandbox = await backend.create()
        try:
            await sandbox.pause()
            started = time.monotonic()
            woken = await backend.provider.resume(sandbox.id, timeout=10)
            assert time.monotonic() - started >= 0.3
            assert (await woken.run("echo awake")).stdout == "awake\n"
        finally:
            await backend.provider.kill(sandbox.id)
            await backend.provider.aclose()


async def test_the_resume_profile_is_set_and_cleared_on_the_control_port() -> None:
    with E2BEmulator(isolation="none") as emu:
        async with httpx.AsyncClient() as client:
            url = f"{emu.control_url}/latency/resume"
            assert (await client.put(url, json={"p50_ms": 800, "p95_ms": 900})).status_code == 200
            assert emu.core.resume_latency == LatencyProfile(0.8, 0.9)
            assert emu.core.latency is None  # the create profile is another
            assert (await client.delete(url)).status_code == 200
            assert emu.core.resume_latency is None
