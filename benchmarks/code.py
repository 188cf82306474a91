"""``python -m benchmarks code``: a cell through the code kernel against a fresh interpreter.

On each provider a sandbox runs the cell ``x + 1`` (``x`` set once) through
``run_code`` (the router's kernel, `providers.kernel`: one request on its
stdin, one answer on its stdout) and, in the same rounds, the same code as
the stateless path ran it before the kernel: a command that pipes it into a
new ``python3`` (`providers.shell.piped`), so every call starts an
interpreter. Target: the kernel's p50 at least 5x below the fresh one's.

E2B is measured on a plain template (``base``), where the router's kernel
runs, and its code interpreter template (its own Jupyter kernel) is timed
beside as ``native``; Daytona's ``kernel`` is its own interpreter (with the
router's results helper), the one ``run_code`` uses there. Each emulator
runs in a process of its own, without bubblewrap (as the other vendor
benchmarks); ``local`` uses bubblewrap where the host has it, as an entry
does by default.
"""

from __future__ import annotations

import asyncio
import tempfile
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from benchmarks.common import percentile, summary_ms, warm_rounds
from emulators import available, sdk_environment
from emulators.process import emulator_process
from providers import provider_class
from providers.base import Provider, Sandbox, SandboxSpec
from providers.local import LocalOptions, LocalProvider
from providers.shell import piped

CELL = "x + 1"
FRESH = piped("x = 1\nprint(x + 1)", "python3 -")


async def _timed(path: Callable[[Sandbox], Awaitable[None]], sandbox: Sandbox) -> float:
    loop = asyncio.get_running_loop()
    start = loop.time()
    await path(sandbox)
    return loop.time() - start


async def _cell(sandbox: Sandbox) -> None:
    ran = await sandbox.run_code(CELL)
    assert ran.text == "2", ran


async def _fresh(sandbox: Sandbox) -> None:
    ran = await sandbox.run(FRESH)
    assert ran.stdout == "2\n", ran


async def _rounds(
    sandbox: Sandbox, paths: dict[str, Callable[[Sandbox], Awaitable[None]]], iterations: int
) -> dict[str, list[float]]:
    """Each path once per round, in turns (the order rotating), after a warm-up."""
    await sandbox.run_code("x = 1")
    names = list(paths)
    for name in names * warm_rounds(3, iterations):
        await paths[name](sandbox)
    timings: dict[str, list[float]] = {name: [] for name in names}
    for i in range(iterations):
        for name in names[i % len(names) :] + names[: i % len(names)]:
            timings[name].append(await _timed(paths[name], sandbox))
    return timings


async def _measure(
    provider: Provider, iterations: int, template: str | None = None
) -> dict[str, Any]:
    paths: dict[str, Callable[[Sandbox], Awaitable[None]]] = {"kernel": _cell, "fresh": _fresh}
    sandbox = await provider.create(SandboxSpec(template=template), timeout=60)
    try:
        timings = await _rounds(sandbox, paths, iterations)
    finally:
        await sandbox.kill()
        await provider.aclose()
    kernel, fresh = timings["kernel"], timings["fresh"]
    return {
        "kernel": summary_ms(kernel),
        "fresh": summary_ms(fresh),
        "speedup_p50": round(percentile(fresh, 50) / percentile(kernel, 50), 1),
    }


async def _native(provider: Provider, iterations: int, template: str | None) -> dict[str, Any]:
    """The vendor's own interpreter, ``x + 1`` timed alone."""
    sandbox = await provider.create(SandboxSpec(template=template), timeout=60)
    try:
        timings = await _rounds(sandbox, {"native": _cell}, iterations)
    finally:
        await sandbox.kill()
        await provider.aclose()
    return summary_ms(timings["native"])


def code(quick: bool, iterations: int | None = None) -> dict[str, Any]:
    iterations = iterations or (20 if quick else 200)
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="bench-code-") as root:
        local = LocalProvider("local", LocalOptions(root=Path(root)))
        results["local"] = asyncio.run(_measure(local, iterations))
    for name in available(["modal", "runloop", "e2b", "daytona"]):
        with emulator_process(name) as emu, sdk_environment(emu):
            adapter = provider_class(name)
            results[name] = asyncio.run(
                _measure(adapter(name), iterations, "base" if name == "e2b" else None)
            )
            if name == "e2b":
                native = asyncio.run(_native(adapter(name), iterations, "code-interpreter-v1"))
                results[name]["native"] = native
    return results
