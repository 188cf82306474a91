"""Router vs the vendor SDK called directly, on each provider's emulator.

The direct path is the few SDK calls an app would make without the router
(create, run a command, kill); the router path is acquire + run + release
through the sync API with that provider as the only chain entry.
"""

from __future__ import annotations

import asyncio
import os
import secrets
from collections.abc import Awaitable, Callable
from contextlib import ExitStack
from typing import Any

from benchmarks.common import summary_ms, timed
from emulators import available, emulator_class
from emulators.harness import Emulator
from router import Router


async def _e2b(emu: Emulator) -> None:
    from e2b_code_interpreter import AsyncSandbox

    env = emu.sdk_env()
    sandbox = await AsyncSandbox.create(
        api_key=env["E2B_API_KEY"], api_url=emu.url, sandbox_url=emu.url, retries=0
    )
    await sandbox.commands.run("true")
    await sandbox.kill()


_clients: dict[str, Any] = {}


async def _runloop(emu: Emulator) -> None:
    from runloop_api_client import AsyncRunloop

    client = _clients.get(emu.url)
    if client is None:  # one client per account, as an app (and the adapter) keeps it
        env = emu.sdk_env()
        client = AsyncRunloop(bearer_token=env["RUNLOOP_API_KEY"], base_url=emu.url, max_retries=0)
        _clients[emu.url] = client
    view = await client.devboxes.create()
    if view.status != "running":
        await client.devboxes.await_running(view.id)
    execution = await client.devboxes.execute(view.id, command="true", optimistic_timeout=30)
    if execution.status != "completed":
        await client.devboxes.wait_for_command(
            execution.execution_id, devbox_id=view.id, statuses=["completed"]
        )
    await client.devboxes.shutdown(view.id)


DIRECT: dict[str, Callable[[Emulator], Awaitable[None]]] = {"e2b": _e2b, "runloop": _runloop}


def overhead(redis_url: str, iterations: int) -> dict[str, Any]:
    results: dict[str, Any] = {}
    for name in available([n for n in DIRECT]):
        with ExitStack() as stack:
            emu = stack.enter_context(emulator_class(name)())
            saved = {k: os.environ.get(k) for k in emu.sdk_env()}
            os.environ.update(emu.sdk_env())
            stack.callback(_restore, saved)
            config = {"state_url": redis_url, "key_prefix": f"v-{secrets.token_hex(3)}",
                      "chain": [{"name": name, "provider": name}]}  # fmt: skip
            router = stack.enter_context(Router.from_config(config, hooks=[]))
            loop = asyncio.new_event_loop()
            stack.callback(loop.close)

            def via_router(r: Router = router) -> None:
                with r.acquire() as lease:
                    lease.sandbox.run("true")

            def directly(
                e: Emulator = emu, n: str = name, lp: asyncio.AbstractEventLoop = loop
            ) -> None:
                lp.run_until_complete(DIRECT[n](e))

            for _ in range(5):
                via_router()
                directly()
            routed, raw = [], []
            for _ in range(iterations):
                routed.append(timed(via_router))
                raw.append(timed(directly))
            diffs = [r - d for r, d in zip(routed, raw, strict=True)]
            results[name] = {
                "router": summary_ms(routed),
                "direct": summary_ms(raw),
                "overhead": summary_ms(diffs),
                "ratio_p50": round(summary_ms(routed)["p50_ms"] / summary_ms(raw)["p50_ms"], 4),
            }
    return results


def _restore(saved: dict[str, str | None]) -> None:
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
