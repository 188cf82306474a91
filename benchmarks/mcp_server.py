"""What the MCP server adds to a tool call: `run_command` of ``true`` through ``sandbox-router
mcp`` over stdio and over Streamable HTTP, with the SDK's own client, against the same command
run on a lease's sandbox directly (`AsyncSandboxHandle.run`), on the `local` provider.

Each transport is paired with the direct call round by round (`paired`): ``overhead`` is what
the server, the protocol and the client add per call. ``floor`` is a tool that touches no
sandbox (`list_sandboxes`) against doing nothing: the round trip alone. The server runs in a
child process, as a client's would, so ``cpu_overhead`` counts only this process (the client's
side).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from benchmarks.common import paired
from router import Router

ROOT = Path(__file__).resolve().parents[1]


def mcp_overhead(root: Path, iterations: int) -> dict[str, Any]:
    """The stdio and the HTTP path, each paired with the direct call."""
    try:
        import mcp  # noqa: F401
    except ImportError:
        return {"skipped": 'the mcp SDK is not installed (pip install "sandbox-router[mcp]")'}
    root.mkdir(parents=True, exist_ok=True)
    config = root / "chain.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "state_url": f"sqlite:///{root}/state.db",
                "chain": [
                    {"name": "local", "provider": "local",
                     "options": {"root": str(root / "sb"), "isolation": "none"}}
                ],
            }
        )
    )  # fmt: skip
    env = {"PYTHONPATH": str(ROOT), "XDG_STATE_HOME": str(root / "state")}
    with _http_server(config, env) as url:
        return asyncio.run(_measure(config, env, url, iterations))


async def _measure(config: Path, env: dict[str, str], url: str, iterations: int) -> dict[str, Any]:
    from mcp import Client, StdioServerParameters

    server = StdioServerParameters(
        command=sys.executable, args=["-m", "router.cli", "mcp", "--config", str(config)], env=env
    )
    async with (
        Router.from_config(config, hooks=[]) as router,
        await router.aacquire() as lease,
        Client(server) as over_stdio,
        Client(url) as over_http,
    ):
        sandbox = lease.sandbox

        async def directly() -> None:
            await sandbox.run("true")

        def tool_call(client: Client) -> Any:
            async def call() -> None:
                result = await client.call_tool("run_command", {"command": "true"})
                assert not result.is_error, result.content

            return call

        def listing(client: Client) -> Any:
            async def call() -> None:
                await client.call_tool("list_sandboxes", {})

            return call

        async def nothing() -> None:
            pass

        return {
            "call": "run_command of `true` on a local sandbox",
            "stdio": await paired(tool_call(over_stdio), directly, iterations),
            "http": await paired(tool_call(over_http), directly, iterations),
            "floor": {  # a tool that touches no sandbox: the protocol's own round trip
                "stdio": await paired(listing(over_stdio), nothing, iterations),
                "http": await paired(listing(over_http), nothing, iterations),
            },
            "protocol": {"stdio": over_stdio.protocol_version, "http": over_http.protocol_version},
        }


@contextlib.contextmanager
def _http_server(config: Path, env: dict[str, str]) -> Iterator[str]:
    """``sandbox-router mcp --http`` on a free port; its URL."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "router.cli", "mcp", "--http", "--port", "0",
         "--config", str(config)],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        env={**os.environ, **env},
    )  # fmt: skip
    try:
        assert proc.stderr is not None
        line = proc.stderr.readline()
        if "serving MCP on " not in line:
            raise RuntimeError(f"the MCP server did not start: {line}")
        yield line.split("serving MCP on ", 1)[1].split()[0]
    finally:
        proc.terminate()
        proc.wait(30)
