"""``python -m benchmarks time_to_sandbox``: how long an app waits for a ready sandbox.

What users wait for is the provider's create. The emulators play back each
vendor's published create latency (`emulators.latency.PUBLISHED`), each in
a process of its own, and the router is timed from ``acquire`` until the
lease holds a sandbox ready for commands:

* ``cold``: no warm pool, every acquire creates.
* ``warm``: a warm pool sized for the load; the sandboxes are made by one
  replica and claimed by another, as a fleet runs; the claimer connects
  ahead to them (``warm_reach_every``, the default). ``warm_connecting``:
  the same with every claim connecting (``warm_reach_every: 0``), what
  reaching ahead saves. ``warm_paused``: the
  same with the pool parked paused (``warm: {pause: true}``) and the
  emulator playing back E2B's published resume time
  (`emulators.latency.RESUME`): what resuming adds to a claim.
  ``warm_daytona_pool``: the pool Daytona holds itself (``warm.server``),
  each create served from it.
* ``degraded``: the first entry's creates slowed to 5 s, the second healthy;
  unhedged, then with ``hedge`` on the first entry.

The two scaling ratios ride along: balanced acquire at 100,000 live leases
over 10 (`benchmarks.scaling.balanced_ratio`) and a chain of 16 entries, 15
of them out of quota, over a chain of 1 (``skip15_over_chain1_ratio``).
"""

from __future__ import annotations

import asyncio
import multiprocessing
import secrets
import time
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from benchmarks.common import percentile, summary_ms, warm_rounds
from benchmarks.scaling import balanced_ratio, chain_length
from emulators import sdk_environment
from emulators.latency import PUBLISHED, RESUME, LatencyProfile
from emulators.process import emulator_process
from router import Router
from router.logs import configure_logging

VENDOR = "e2b"  # the entry timed cold and warm: the fastest published create but Daytona's
SLOW = LatencyProfile(5.0, 5.0, "degraded: every create takes 5 s")


def _entry(name: str, provider: str, **extra: Any) -> dict[str, Any]:
    return {"name": name, "provider": provider, **extra}


async def _time_acquires(router: Router, n: int, pause: float = 0.0) -> list[float]:
    times = []
    for _ in range(n):
        start = time.perf_counter()
        lease = await router.aacquire()
        times.append(time.perf_counter() - start)
        await lease.release()
        if pause:
            await asyncio.sleep(pause)
    return times


def cold(redis_url: str, n: int) -> dict[str, Any]:
    """Every acquire creates on the vendor's emulator at its published latency."""
    with emulator_process(VENDOR, PUBLISHED[VENDOR]) as emu, sdk_environment(emu):
        config = {"state_url": redis_url, "key_prefix": f"tts-cold-{secrets.token_hex(3)}",
                  "chain": [_entry(VENDOR, VENDOR)]}  # fmt: skip

        async def run() -> list[float]:
            async with Router.from_config(config, hooks=[]) as router:
                await _time_acquires(router, warm_rounds(3, n))
                return await _time_acquires(router, n)

        return {
            "provider": VENDOR,
            "profile": PUBLISHED[VENDOR].source,
            **summary_ms(asyncio.run(run())),
        }


def _maker(config: dict[str, Any], filled: Connection, stop: Connection) -> None:
    """Replica A, in a process of its own: fill the pool, say so, refill until told to stop."""

    configure_logging("json", "warning")  # as the parent: stdout carries only the JSON

    async def run() -> None:
        async with Router.from_config(config, hooks=[]) as maker:
            await maker.afill_warm()
            filled.send(True)
            await asyncio.get_running_loop().run_in_executor(None, stop.recv)

    asyncio.run(run())


def warm(
    redis_url: str, n: int, size: int = 8, *, pause: bool = False, reach: bool = True
) -> dict[str, Any]:
    """Acquires served from a warm pool that another replica fills, as a fleet runs.

    Replica A, a process of its own, refills every 0.1 s (the lock lets one
    replica refill at a time); replica B never refills (``warm_refill_every:
    0``), so every sandbox B gets was made by A. B connects ahead to them
    every second unless ``reach`` is off (then each claim connects through
    the vendor's connect). B acquires at a pace the pool was sized for (one
    every 0.3 s against 8 ready).
    """
    resume = RESUME[VENDOR] if pause else None
    with (
        emulator_process(VENDOR, PUBLISHED[VENDOR], resume=resume) as emu,
        sdk_environment(emu),
    ):
        chain = [_entry(VENDOR, VENDOR, warm={"size": size, "max_idle": 240, "pause": pause})]
        prefix = f"tts-warm-{secrets.token_hex(3)}"

        def config(refill: float) -> dict[str, Any]:
            return {"state_url": redis_url, "key_prefix": prefix, "chain": chain,
                    "warm_refill_every": refill,
                    "warm_reach_every": 1.0 if reach else 0}  # fmt: skip

        async def run() -> tuple[list[float], int]:
            async with Router.from_config(config(0), hooks=[]) as claimer:
                await _time_acquires(claimer, warm_rounds(3, n), pause=0.3)
                times = await _time_acquires(claimer, n, pause=0.3)
                status = await claimer.astatus()
            hits = next(e for e in status.entries if e.name == VENDOR).used.get("sessions", 0)
            return times, int(hits)

        ctx = multiprocessing.get_context("spawn")
        (filled, filling), (stopping, stop) = ctx.Pipe(), ctx.Pipe()
        maker = ctx.Process(target=_maker, args=(config(0.1), filling, stop), daemon=True)
        maker.start()
        try:
            if not filled.poll(60):
                raise RuntimeError("the warm pool's maker replica did not fill it in 60 s")
            times, sessions = asyncio.run(run())
        finally:
            stopping.send(True)
            maker.join(30)
    got = {"provider": VENDOR, "size": size, "sessions_spent": sessions, **summary_ms(times)}
    return {**got, "resume_profile": resume.source} if resume is not None else got


def vendor_warm(redis_url: str, n: int, size: int = 8) -> dict[str, Any]:
    """Acquires served by Daytona's own warm pool (``warm.server``), which the router
    only sizes: each acquire's create is served from the pool at once, and Daytona
    refills it in the background (at its published create latency)."""
    vendor = "daytona"
    with emulator_process(vendor, PUBLISHED[vendor]) as emu, sdk_environment(emu):
        config = {"state_url": redis_url, "key_prefix": f"tts-vwarm-{secrets.token_hex(3)}",
                  "chain": [_entry(vendor, vendor, warm={"size": size})],
                  "warm_refill_every": 0}  # fmt: skip

        async def run() -> list[float]:
            async with Router.from_config(config, hooks=[]) as router:
                deadline = time.monotonic() + 60
                while (await router.afill_warm()).get(vendor, 0) < size:
                    if time.monotonic() > deadline:
                        raise RuntimeError(f"Daytona's pool never held {size}")
                    await asyncio.sleep(0.2)
                await _time_acquires(router, warm_rounds(3, n), pause=0.3)
                return await _time_acquires(router, n, pause=0.3)

        times = asyncio.run(run())
    return {"provider": vendor, "size": size, "server": True, **summary_ms(times)}


def degraded(redis_url: str, n_unhedged: int, n_hedged: int, after: float) -> dict[str, Any]:
    """The first entry's creates slowed to 5 s, the second (Daytona) healthy: without and
    with ``hedge: {after}`` on the first. The second entry's own cold p99 is taken in the
    same run, for the target (hedge delay + that p99 x 1.2)."""
    second = "daytona"
    with (
        emulator_process(VENDOR, SLOW) as slow,
        emulator_process(second, PUBLISHED[second]) as healthy,
        sdk_environment(slow, healthy),
    ):

        def config(hedge: dict[str, Any] | None, chain: list[str]) -> dict[str, Any]:
            entries = [_entry(name, name) for name in chain]
            if hedge is not None:
                entries[0]["hedge"] = hedge
            return {"state_url": redis_url, "key_prefix": f"tts-deg-{secrets.token_hex(3)}",
                    "chain": entries}  # fmt: skip

        async def timed(cfg: dict[str, Any], n: int) -> list[float]:
            async with Router.from_config(cfg, hooks=[]) as router:
                # clients open, the emulators' first boots
                await _time_acquires(router, warm_rounds(2, n))
                return await _time_acquires(router, n)

        second_cold = asyncio.run(timed(config(None, [second]), n_hedged))
        unhedged = asyncio.run(timed(config(None, [VENDOR, second]), n_unhedged))
        hedged = asyncio.run(timed(config({"after": after}, [VENDOR, second]), n_hedged))
    bound = after + percentile(second_cold, 99) * 1.2
    return {
        "first": f"{VENDOR}, every create 5 s",
        "second": second,
        "hedge_after_s": after,
        "second_cold": summary_ms(second_cold),
        "unhedged": summary_ms(unhedged),
        "hedged": summary_ms(hedged),
        "target_hedged_p99_ms": round(bound * 1000, 1),
    }


def skip15(redis_url: str, root: Path, n: int) -> dict[str, Any]:
    """A chain of 16 with 15 entries out of quota, against a chain of 1 (p50 over p50)."""
    curve = chain_length(redis_url, root, [1, 16], n)
    return {
        "chain1": curve[0],
        "chain16_skip15": curve[1],
        "ratio": round(curve[1]["p50_ms"] / curve[0]["p50_ms"], 3),
    }


def time_to_sandbox(redis_url: str, root: Path, quick: bool) -> dict[str, Any]:
    n = 20 if quick else 100
    result: dict[str, Any] = {}
    cold_run = cold(redis_url, n)
    result["cold"] = cold_run
    result["cold_p50_ms"] = cold_run["p50_ms"]
    warm_run = warm(redis_url, n)
    result["warm"] = warm_run
    result["warm_p50_ms"] = warm_run["p50_ms"]
    result["warm_p99_ms"] = warm_run["p99_ms"]
    result["warm_over_cold_p50"] = round(cold_run["p50_ms"] / warm_run["p50_ms"], 1)
    connecting = warm(redis_url, n, reach=False)
    result["warm_connecting"] = connecting
    result["reach_saves_p50_ms"] = round(connecting["p50_ms"] - warm_run["p50_ms"], 1)
    paused = warm(redis_url, 10 if quick else 40, pause=True)
    result["warm_paused"] = paused
    result["resume_adds_p50_ms"] = round(paused["p50_ms"] - warm_run["p50_ms"], 1)
    result["warm_daytona_pool"] = vendor_warm(redis_url, n)
    slow = degraded(redis_url, 3 if quick else 10, 10 if quick else 200, 0.5)  # p99 not a max
    result["degraded"] = slow
    result["degraded_unhedged_p99_ms"] = slow["unhedged"]["p99_ms"]
    result["degraded_hedged_p99_ms"] = slow["hedged"]["p99_ms"]
    skip = skip15(redis_url, root / "skip", 30 if quick else 300)
    result["skip15"] = skip
    result["skip15_over_chain1_ratio"] = skip["ratio"]
    balanced = balanced_ratio(
        redis_url, root / "bal", 10_000 if quick else 100_000, 10, 30 if quick else 300
    )
    result["balanced"] = balanced
    result["balanced_100k_over_10_ratio"] = balanced["ratio"]
    result["targets"] = {
        "warm_p50_ms": "<= 5 and <= cold_p50_ms / 20",
        "degraded_hedged_p99_ms": "<= hedge delay + second entry's cold p99 x 1.2",
        "balanced_100k_over_10_ratio": "<= 1.2",
        "skip15_over_chain1_ratio": "<= 1.2",
    }
    return result


__all__ = ["cold", "degraded", "skip15", "time_to_sandbox", "vendor_warm", "warm"]
