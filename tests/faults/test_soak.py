"""A bounded soak: mixed traffic with random provider faults through real SDKs.

Runs ``SOAK_SECONDS`` (default 40) of concurrent acquire / run / release and
sticky-session traffic through a chain of every provider emulator then
``local``, while a chaos task injects random faults into the emulators.
At the end: memory stayed flat, no lease is left, the janitor finds nothing
the router still owes, and the router's session counts reconcile exactly
with each emulator's own record of sandboxes created.

The emulators serve from child processes (`emulators.process`), as the
vendors do, so the RSS measured is the router's and the SDKs', not the
emulators' record of every sandbox they made. The baseline is taken once
the warm-up has met every fault: before, the SDKs' error paths, imported on
their first use under chaos, grew RSS by ~30 MiB in steps after it.
"""

from __future__ import annotations

import asyncio
import os
import random
import resource
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest

import emulators
from emulators import EMULATORS
from emulators.process import Remote, emulator_process
from providers.base import LABEL_ROUTER
from providers.errors import NoProviderAvailable
from router import Router

pytestmark = pytest.mark.slow
SECONDS = float(os.environ.get("SOAK_SECONDS", "40"))
FAULTS: list[dict[str, Any]] = [
    {"status": 503, "times": 3},
    {"status": 502, "times": 1},
    {"status": 429, "retry_after": 1, "times": 2},
    {"delay": 0.3, "times": 2},
]


def available() -> list[str]:
    """Every provider with an emulator (or those named in SOAK_PROVIDERS)."""
    wanted = [n for n in os.environ.get("SOAK_PROVIDERS", ",".join(EMULATORS)).split(",") if n]
    return emulators.available(wanted)


def rss_mb() -> float:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


async def day(router: Router, emus: dict[str, Remote]) -> tuple[dict[str, int], list[str], float]:
    """Warm up, then SECONDS of traffic from 4 workers beside a chaos task; returns the
    requests served per entry, any errors, and the RSS after the warm-up."""
    served: dict[str, int] = {}
    errors: list[str] = []
    names = sorted(emus)

    async def traffic(worker: int, stop_at: float) -> None:
        rng = random.Random(worker)
        while time.monotonic() < stop_at:
            session = f"s{worker}-{rng.randrange(3)}" if rng.random() < 0.3 else None
            try:
                lease = await router.aacquire(session=session)
            except NoProviderAvailable as exc:
                errors.append(str(exc))
                continue
            try:
                result = await lease.sandbox.run(f"echo w{worker}", timeout=20)
                if result.stdout != f"w{worker}\n":
                    errors.append(f"{lease.entry}: unexpected output {result.stdout!r}")
            finally:
                await lease.release()
            served[lease.entry] = served.get(lease.entry, 0) + 1

    async def chaos(stop_at: float) -> None:
        rng = random.Random(7)
        while time.monotonic() < stop_at:
            await asyncio.sleep(rng.uniform(0.5, 2.0))
            emu, fault = emus[rng.choice(names)], rng.choice(FAULTS)
            await asyncio.to_thread(emu.inject, "create", **fault)

    # The warm-up meets every fault on every emulator once: the SDKs import their
    # error paths (exception classes, retry helpers, typed models) on first use,
    # ~30 MiB of code that is not a leak and must be in before the baseline.
    for emu in emus.values():
        for fault in FAULTS:
            await asyncio.to_thread(emu.inject, "create", **{**fault, "times": 1})
    warm_until = time.monotonic() + 6
    await asyncio.gather(*(traffic(w, warm_until) for w in range(4)))
    baseline = rss_mb()
    stop_at = time.monotonic() + SECONDS
    await asyncio.gather(chaos(stop_at), *(traffic(w, stop_at) for w in range(4)))
    return served, errors, baseline


@pytest.mark.skipif(not available(), reason="no provider emulator is installed")
def test_soak(redis_url: str, key_prefix: str, tmp_path: Path) -> None:
    names = available()
    with ExitStack() as stack:
        emus = {n: stack.enter_context(emulator_process(n, isolation="auto")) for n in names}
        env = {k: v for emu in emus.values() for k, v in emu.sdk_env().items()}
        monkeypatch = stack.enter_context(pytest.MonkeyPatch.context())
        for key, value in env.items():
            monkeypatch.setenv(key, value)
        config = {
            "state_url": redis_url,
            "key_prefix": key_prefix,
            "create_timeout": 10,
            "acquire_timeout": 30,
            "retry": {"attempts": 2, "initial": 0.05, "maximum": 0.2},
            "breaker": {"failure_threshold": 3, "cooldown_base": 1, "cooldown_max": 2},
            "chain": [
                *({"name": n, "provider": n, "quota": {"sessions": 100_000}} for n in names),
                {"name": "local", "provider": "local", "options": {"root": str(tmp_path)}},
            ],
        }
        router = stack.enter_context(Router.from_config(config, hooks=[]))
        served, errors, baseline = asyncio.run(day(router, emus))
        grown = rss_mb() - baseline
        for emu in emus.values():
            emu.clear_faults()
        sessions_used = {v.name: v.used["sessions"] for v in router.status().entries}
        for w in range(4):
            for s in range(3):
                router.close_session(f"s{w}-{s}")
        report = router.reap()
        status = router.status()

        assert errors == []
        assert sum(served.values()) > 50
        assert grown < 40, f"RSS grew {grown:.1f} MiB over the soak"
        assert all(v.live_leases == 0 for v in status.entries)
        assert report.killed == []  # nothing was orphaned: the janitor had nothing to do
        for name, emu in emus.items():
            ours = [r for r in emu.records() if r["labels"].get(LABEL_ROUTER) == key_prefix]
            assert sessions_used[name] == len(ours), name  # the ledger matches the provider
            alive = [r["id"] for r in ours if r["killed_at"] is None]
            assert alive == [], f"{name} left sandboxes alive"
