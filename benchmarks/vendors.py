"""Router vs the vendor SDK called directly, on each provider's emulator.

The direct path is the SDK calls an app would make without the router to
get the same result (create, run ``true`` and get its exit code, stdout and
stderr, kill), with one client kept open as an app keeps it; the router
path is acquire + ``run(["true"])`` + release with that provider as the
only chain entry, through both APIs (see `benchmarks.overhead`). The
command is argv, as the direct calls give it (a string runs through
``bash -c`` where the SDK takes argv). Daytona gives stdout and stderr
apart only from a command run in a session, so its direct path creates
one, as the adapter does; its ``exec`` path (one call, the streams merged)
is timed beside it. Modal's direct path detaches from the sandbox after
terminating it, which frees the SDK's connection to it (without that, an
app keeps one per sandbox until it idles out). The async run also times
the adapter on its own (create, run, kill through the `Provider`), which
splits the difference into the router's share (state, bookkeeping) and
the adapter's.

Each emulator runs in a process of its own, as the vendor's service would:
in the benchmark's process it would take turns with the measured code for
the GIL, which taxes whichever path does more Python meanwhile.
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Awaitable, Callable
from typing import Any

from benchmarks.common import paired
from emulators import available, sdk_environment
from emulators.process import Remote, emulator_process
from providers.base import SandboxSpec
from router import Router


class Direct:
    """One vendor's SDK, used directly: ``cycle`` = create, run ``true``, kill."""

    def __init__(self, emu: Remote) -> None:
        self.emu = emu
        self.env = emu.env

    async def cycle(self) -> None:
        raise NotImplementedError

    def variants(self) -> dict[str, Callable[[], Awaitable[None]]]:
        """Other direct paths to time in the same rounds, by name."""
        return {}

    async def aclose(self) -> None:
        """Close the SDK client on the loop that opened it."""


class E2B(Direct):
    async def cycle(self) -> None:
        from e2b_code_interpreter import AsyncSandbox

        url = self.emu.url
        sandbox = await AsyncSandbox.create(
            api_key=self.env["E2B_API_KEY"], api_url=url, sandbox_url=url, retries=0
        )
        await sandbox.commands.run("true")
        await sandbox.kill()


class Runloop(Direct):
    client: Any = None

    async def cycle(self) -> None:
        from runloop_api_client import AsyncRunloop

        if self.client is None:
            token = self.env["RUNLOOP_API_KEY"]
            self.client = AsyncRunloop(bearer_token=token, base_url=self.emu.url, max_retries=0)
        devboxes = self.client.devboxes
        view = await devboxes.create()
        if view.status != "running":
            await devboxes.await_running(view.id)
        execution = await devboxes.execute(view.id, command="true", optimistic_timeout=30)
        if execution.status != "completed":
            await devboxes.wait_for_command(
                execution.execution_id, devbox_id=view.id, statuses=["completed"]
            )
        await devboxes.shutdown(view.id)

    async def aclose(self) -> None:
        if self.client is not None:
            await self.client.close()


class Daytona(Direct):
    client: Any = None

    def _client(self) -> Any:
        from daytona import AsyncDaytona, DaytonaConfig

        if self.client is None:
            env = self.env
            config = DaytonaConfig(
                api_key=env["DAYTONA_API_KEY"], api_url=env["DAYTONA_API_URL"], target="us"
            )
            self.client = AsyncDaytona(config)
        return self.client

    async def cycle(self) -> None:
        from daytona import SessionExecuteRequest

        client = self._client()
        sandbox = await client.create()
        await sandbox.process.create_session("bench")
        await sandbox.process.execute_session_command(
            "bench", SessionExecuteRequest(command="true")
        )
        await client.delete(sandbox)

    async def exec_cycle(self) -> None:
        client = self._client()
        sandbox = await client.create()
        await sandbox.process.exec("true")
        await client.delete(sandbox)

    def variants(self) -> dict[str, Callable[[], Awaitable[None]]]:
        return {"exec": self.exec_cycle}

    async def aclose(self) -> None:
        if self.client is not None:
            await self.client.close()


class Modal(Direct):
    client: Any = None
    app: Any = None

    async def cycle(self) -> None:
        import modal

        if self.client is None:
            self.client = await modal.Client.from_credentials.aio(
                self.env["MODAL_TOKEN_ID"], self.env["MODAL_TOKEN_SECRET"]
            )
            self.app = await modal.App.lookup.aio(
                "bench-direct", create_if_missing=True, client=self.client
            )
        sandbox = await modal.Sandbox.create.aio(app=self.app, client=self.client)
        process = await sandbox.exec.aio("true")
        await asyncio.gather(
            process.stdout.read.aio(), process.stderr.read.aio(), process.wait.aio()
        )
        await sandbox.terminate.aio()
        await sandbox.detach.aio()  # type: ignore[no-untyped-call]  # frees its connection, as the SDK asks

    async def aclose(self) -> None:
        if self.client is not None:
            await self.client.close.aio()


DIRECT: dict[str, type[Direct]] = {
    "e2b": E2B,
    "runloop": Runloop,
    "daytona": Daytona,
    "modal": Modal,
}


def overhead(redis_url: str, iterations: int) -> dict[str, Any]:
    results: dict[str, Any] = {}
    for name in available(list(DIRECT)):
        with emulator_process(name) as emu, sdk_environment(emu):
            config = {"state_url": redis_url, "key_prefix": f"v-{secrets.token_hex(3)}",
                      "chain": [{"name": name, "provider": name}]}  # fmt: skip
            results[name] = {
                "sync": asyncio.run(_sync_api(config, DIRECT[name](emu), iterations)),
                "async": asyncio.run(_async_api(config, DIRECT[name](emu), iterations)),
            }
    return results


async def _sync_api(config: dict[str, Any], direct: Direct, iterations: int) -> dict[str, Any]:
    with Router.from_config(config, hooks=[]) as router:

        async def via_router() -> None:
            with router.acquire() as lease:
                lease.sandbox.run(["true"])

        try:
            return await paired(
                via_router, direct.cycle, iterations, warmup=5, also=direct.variants()
            )
        finally:
            await direct.aclose()


async def _async_api(config: dict[str, Any], direct: Direct, iterations: int) -> dict[str, Any]:
    async with Router.from_config(config, hooks=[]) as router:
        adapter = router.provider(config["chain"][0]["name"])

        async def via_router() -> None:
            async with await router.aacquire() as lease:
                await lease.sandbox.run(["true"])

        async def via_adapter() -> None:
            sandbox = await adapter.create(SandboxSpec(), timeout=60)
            await sandbox.run(["true"])
            await sandbox.kill()

        also = {"adapter": via_adapter, **direct.variants()}
        try:
            return await paired(via_router, direct.cycle, iterations, warmup=5, also=also)
        finally:
            await direct.aclose()
