"""The same large-file transfer through each vendor's SDK directly, for `benchmarks.transfer`.

Each path makes a sandbox and moves ``big`` up and back with the call the
SDK offers for large files (its streaming call where it has one), as an
app without the router would. Directories have no SDK call on most
vendors, so only the router's directory figures are taken. The SDKs read
their emulator's address from the environment the child process was given.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Awaitable, Callable, Coroutine
from pathlib import Path
from typing import Any

CHUNK = 1 << 20
Timings = dict[str, float]


async def _timed(step: Callable[[], Awaitable[None]]) -> float:
    start = time.perf_counter()
    await step()
    return round(time.perf_counter() - start, 3)


def _writer(local: Path) -> Callable[[bytes], Awaitable[object]]:
    local.parent.mkdir(parents=True, exist_ok=True)
    out = local.open("wb")

    async def write(chunk: bytes) -> object:
        if chunk:
            return await asyncio.to_thread(out.write, chunk)
        out.close()
        return None

    return write


async def e2b(big: Path, tree: Path, out: Path) -> Timings:
    from e2b_code_interpreter import AsyncSandbox

    url = os.environ["E2B_API_URL"]
    sandbox = await AsyncSandbox.create(
        api_key=os.environ["E2B_API_KEY"], api_url=url, sandbox_url=url
    )

    async def up() -> None:
        with big.open("rb") as source:
            await sandbox.files.write("big.bin", source)

    async def down() -> None:
        write = _writer(out / "big.bin")
        async for chunk in await sandbox.files.read("big.bin", format="stream"):
            await write(chunk)
        await write(b"")

    try:
        return {"upload_file_s": await _timed(up), "download_file_s": await _timed(down)}
    finally:
        await sandbox.kill()


async def daytona(big: Path, tree: Path, out: Path) -> Timings:
    from daytona import AsyncDaytona, DaytonaConfig

    config = DaytonaConfig(
        api_key=os.environ["DAYTONA_API_KEY"], api_url=os.environ["DAYTONA_API_URL"], target="us"
    )
    async with AsyncDaytona(config) as client:
        sandbox = await client.create()

        async def up() -> None:
            await sandbox.fs.upload_file_stream(str(big), "big.bin")

        async def down() -> None:
            write = _writer(out / "big.bin")
            async for chunk in await sandbox.fs.download_file_stream("big.bin"):
                await write(chunk)
            await write(b"")

        try:
            return {"upload_file_s": await _timed(up), "download_file_s": await _timed(down)}
        finally:
            await client.delete(sandbox)


async def runloop(big: Path, tree: Path, out: Path) -> Timings:
    from runloop_api_client import AsyncRunloop

    client = AsyncRunloop(
        bearer_token=os.environ["RUNLOOP_API_KEY"], base_url=os.environ["RUNLOOP_BASE_URL"]
    )
    view = await client.devboxes.create()
    if view.status != "running":
        await client.devboxes.await_running(view.id)

    async def up() -> None:
        with big.open("rb") as source:  # the SDK reads a file part whole (its multipart encoder)
            await client.devboxes.upload_file(view.id, path="big.bin", file=source)

    async def down() -> None:
        write = _writer(out / "big.bin")
        stream = client.devboxes.with_streaming_response.download_file
        async with stream(view.id, path="big.bin") as response:
            async for chunk in response.iter_bytes(CHUNK):
                await write(chunk)
        await write(b"")

    try:
        return {"upload_file_s": await _timed(up), "download_file_s": await _timed(down)}
    finally:
        await client.devboxes.shutdown(view.id)
        await client.close()


async def modal(big: Path, tree: Path, out: Path) -> Timings:
    import modal as sdk

    client = await sdk.Client.from_credentials.aio(
        os.environ["MODAL_TOKEN_ID"], os.environ["MODAL_TOKEN_SECRET"]
    )
    app = await sdk.App.lookup.aio("bench-transfer", create_if_missing=True, client=client)
    sandbox = await sdk.Sandbox.create.aio(app=app, client=client)

    async def up() -> None:
        await sandbox.filesystem.copy_from_local.aio(big, "/root/big.bin")

    async def down() -> None:
        await sandbox.filesystem.copy_to_local.aio("/root/big.bin", out / "big.bin")

    try:
        return {"upload_file_s": await _timed(up), "download_file_s": await _timed(down)}
    finally:
        await sandbox.terminate.aio()
        await client.close.aio()


DIRECT: dict[str, Callable[[Path, Path, Path], Coroutine[Any, Any, Timings]]] = {
    "e2b": e2b,
    "daytona": daytona,
    "runloop": runloop,
    "modal": modal,
}
