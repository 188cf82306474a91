"""``python -m benchmarks frameworks``: one tool call through a framework's backend on the
router against the framework's own vendor backend, on the same emulator.

deepagents: ``execute("true")`` through `RouterSandbox` against langchain-e2b's
``E2BSandbox`` (and langchain-daytona's ``DaytonaSandbox`` on Daytona's emulator,
where installed). smolagents: the cell ``x + 1`` through `RouterExecutor` against
smolagents' ``E2BExecutor``, both on E2B's code interpreter template (E2B's own
kernel). Each backend holds one sandbox for the whole run, as an agent's session
does; the calls are interleaved round by round, the order rotating, and timed in
wall and in this process's CPU time (all its threads: the router's engine
thread too). Target: the router's p50 within 1.1x of the vendor backend's. A
framework or vendor backend that is not installed is reported as skipped.

Each emulator runs in a process of its own (`emulators.process`), so its work
is not in the CPU figures.
"""

from __future__ import annotations

import importlib.util
import secrets
import time
from collections.abc import Callable
from typing import Any

from benchmarks.common import percentile, summary_ms, warm_rounds
from emulators import sdk_environment
from emulators.process import Remote, emulator_process
from providers.base import SandboxSpec
from router import Router

Call = Callable[[], object]


def rounds(paths: dict[str, Call], iterations: int, warmup: int = 3) -> dict[str, Any]:
    """Each path once per round, the order rotating; wall and CPU per call, and the
    router's p50 over the vendor's."""
    for _ in range(warm_rounds(warmup, iterations)):
        for path in paths.values():
            path()
    wall: dict[str, list[float]] = {name: [] for name in paths}
    cpu: dict[str, list[float]] = {name: [] for name in paths}
    names = list(paths)
    for i in range(iterations):
        for name in names[i % len(names) :] + names[: i % len(names)]:
            start, start_cpu = time.perf_counter(), time.process_time()
            paths[name]()
            wall[name].append(time.perf_counter() - start)
            cpu[name].append(time.process_time() - start_cpu)
    result: dict[str, Any] = {
        name: {"wall": summary_ms(wall[name]), "cpu": summary_ms(cpu[name])} for name in names
    }
    router, vendor = names[0], names[1]
    result["ratio_p50"] = round(percentile(wall[router], 50) / percentile(wall[vendor], 50), 3)
    result["cpu_ratio_p50"] = round(percentile(cpu[router], 50) / percentile(cpu[vendor], 50), 3)
    return result


def _router(redis_url: str, name: str, template: str | None = None) -> Router:
    entry: dict[str, Any] = {"name": name, "provider": name}
    if template is not None:
        entry["template"] = template
    config = {"state_url": redis_url, "key_prefix": f"fw-{secrets.token_hex(3)}", "chain": [entry]}
    return Router.from_config(config, hooks=[])


def _e2b(emu: Remote, template: str | None = None) -> dict[str, Any]:
    """The E2B SDK's connection arguments for the emulator."""
    made = {"api_key": emu.env["E2B_API_KEY"], "api_url": emu.url, "sandbox_url": emu.url}
    return {**made, "template": template} if template else made


def deepagents_e2b(redis_url: str, emu: Remote, iterations: int) -> dict[str, Any]:
    import e2b
    from langchain_e2b import E2BSandbox

    from router.integrations.deepagents import RouterSandbox

    sandbox = e2b.Sandbox.create(**_e2b(emu))
    vendor = E2BSandbox(sandbox=sandbox)
    router = _router(redis_url, "e2b")
    try:
        with RouterSandbox(router) as ours:
            return rounds(
                {
                    "router": lambda: ours.execute("true"),
                    "langchain_e2b": lambda: vendor.execute("true"),
                },
                iterations,
            )
    finally:
        sandbox.kill()
        router.close()


def deepagents_daytona(redis_url: str, emu: Remote, iterations: int) -> dict[str, Any]:
    from daytona import Daytona, DaytonaConfig
    from langchain_daytona import DaytonaSandbox

    from router.integrations.deepagents import RouterSandbox

    env = emu.env
    client = Daytona(
        DaytonaConfig(api_key=env["DAYTONA_API_KEY"], api_url=env["DAYTONA_API_URL"], target="us")
    )
    sandbox = client.create()
    vendor = DaytonaSandbox(sandbox=sandbox)
    router = _router(redis_url, "daytona")
    try:
        with RouterSandbox(router) as ours:
            return rounds(
                {
                    "router": lambda: ours.execute("true"),
                    "langchain_daytona": lambda: vendor.execute("true"),
                },
                iterations,
            )
    finally:
        client.delete(sandbox)
        router.close()


def smolagents_e2b(redis_url: str, emu: Remote, iterations: int) -> dict[str, Any]:
    from smolagents.monitoring import AgentLogger, LogLevel
    from smolagents.remote_executors import E2BExecutor

    from router.integrations.smolagents import RouterExecutor

    quiet = AgentLogger(LogLevel.OFF)
    template = "code-interpreter-v1"
    vendor = E2BExecutor([], quiet, **_e2b(emu, template))
    router = _router(redis_url, "e2b", template)
    ours = RouterExecutor(router, logger=quiet, spec=SandboxSpec(template=template))
    try:
        for executor in (ours, vendor):
            executor.run_code_raise_errors("x = 1")
        return rounds(
            {
                "router": lambda: ours.run_code_raise_errors("x + 1"),
                "e2b_executor": lambda: vendor.run_code_raise_errors("x + 1"),
            },
            iterations,
        )
    finally:
        ours.cleanup()
        vendor.cleanup()
        router.close()


def frameworks(redis_url: str, quick: bool, iterations: int | None = None) -> dict[str, Any]:
    iterations = iterations or (20 if quick else 200)
    result: dict[str, Any] = {}
    have = {name: importlib.util.find_spec(name) is not None for name in
            ("deepagents", "smolagents", "langchain_e2b", "langchain_daytona")}  # fmt: skip
    with emulator_process("e2b") as emu, sdk_environment(emu):
        if have["deepagents"] and have["langchain_e2b"]:
            result["deepagents_e2b"] = deepagents_e2b(redis_url, emu, iterations)
        else:
            result["deepagents_e2b"] = {"skipped": "needs deepagents and langchain-e2b"}
        if have["smolagents"]:
            result["smolagents_e2b"] = smolagents_e2b(redis_url, emu, iterations)
        else:
            result["smolagents_e2b"] = {"skipped": "needs smolagents"}
    if have["deepagents"] and have["langchain_daytona"]:
        with emulator_process("daytona") as emu, sdk_environment(emu):
            result["deepagents_daytona"] = deepagents_daytona(redis_url, emu, iterations)
    else:
        result["deepagents_daytona"] = {"skipped": "needs deepagents and langchain-daytona"}
    return result
