"""A tool call through the OpenAI Agents SDK's sandbox backend: ``session.exec("true")`` (what
its shell tool calls, through ``sh -lc``) on `RouterSandboxClient` against the SDK's own vendor
client (`E2BSandboxClient`, `DaytonaSandboxClient`) on the same emulator, in wall and CPU time.

Both sessions are created and started once and kept, as a run keeps its session between tool
calls; the calls are paired round by round (`paired`). The router path runs on the caller's
loop (``async with Router``), as an async agent app would run it. Each emulator runs in a
process of its own (see `benchmarks.vendors`).
"""

from __future__ import annotations

import asyncio
import secrets
from typing import Any

from benchmarks.common import paired
from emulators import sdk_environment
from emulators.process import Remote, emulator_process
from router import Router

VENDORS = ("e2b", "daytona")


def agents_overhead(redis_url: str, iterations: int) -> dict[str, Any]:
    try:
        import agents  # noqa: F401
    except ImportError:
        return {"skipped": 'openai-agents is not installed (pip install "sandbox-router[all]")'}
    results: dict[str, Any] = {"call": 'session.exec("true"), a session kept open'}
    for name in VENDORS:
        with emulator_process(name) as emu, sdk_environment(emu):
            results[name] = asyncio.run(_measure(name, emu, redis_url, iterations))
    return results


async def _measure(name: str, emu: Remote, redis_url: str, iterations: int) -> dict[str, Any]:
    from agents.sandbox import Manifest

    from router.integrations.openai_agents import RouterSandboxClient

    config = {"state_url": redis_url, "key_prefix": f"a-{secrets.token_hex(3)}",
              "chain": [{"name": name, "provider": name}]}  # fmt: skip
    vendor, options, home = _vendor_client(name, emu)
    async with Router.from_config(config, hooks=[]) as router:
        routed = await RouterSandboxClient(router).create()
        direct = await vendor.create(manifest=Manifest(root=f"{home}/workspace"), options=options)
        async with routed, direct:

            async def via_router() -> None:
                assert (await routed.exec("true")).exit_code == 0

            async def directly() -> None:
                assert (await direct.exec("true")).exit_code == 0

            measured = await paired(via_router, directly, iterations)
        await vendor.delete(direct)
        if hasattr(vendor, "close"):
            await vendor.close()
    return measured


def _vendor_client(name: str, emu: Remote) -> tuple[Any, Any, str]:
    """The SDK's own client for ``name``, its options, and the sandbox's home directory."""
    if name == "e2b":
        from agents.extensions.sandbox.e2b import E2BSandboxClient, E2BSandboxClientOptions

        # The SDK asks for no sandbox timeout, so E2B's API default (15 s) would end the
        # sandbox mid-run (paused: on_timeout="pause") on a slow machine.
        options = E2BSandboxClientOptions(sandbox_type="e2b", timeout=3600)
        return E2BSandboxClient(), options, "/home/user"
    from agents.extensions.sandbox.daytona import DaytonaSandboxClient, DaytonaSandboxClientOptions

    client = DaytonaSandboxClient(
        api_key=emu.env["DAYTONA_API_KEY"], api_url=emu.env["DAYTONA_API_URL"]
    )
    return client, DaytonaSandboxClientOptions(), "/home/daytona"
