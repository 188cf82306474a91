"""Driving ``sandbox-router mcp`` as its clients do: the SDK's own client, the server a process.

`McpClient` is the SDK's `mcp.Client` on an event loop of its own thread, so
sync tests can hold a session open across calls (and drop it mid-call);
over stdio it starts the server itself, as an MCP host does. `HttpServer` is
``sandbox-router mcp --http`` as a subprocess on a free port.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import httpx
import mcp_types as types
import yaml
from mcp import Client, StdioServerParameters

from emulators.harness import Emulator

ROOT = Path(__file__).resolve().parents[2]


def server_env(state: Path, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """What the server process needs beyond an MCP host's default environment: this
    checkout's code and a state directory of the test's own."""
    return {"PYTHONPATH": str(ROOT), "XDG_STATE_HOME": str(state), **(extra or {})}


def write_config(path: Path, chain: list[dict[str, Any]], **settings: Any) -> Path:
    path.write_text(
        yaml.safe_dump(
            {"state_url": f"sqlite:///{path.parent}/state.db", "chain": chain, **settings}
        )
    )
    return path


def stdio(config: Path, env: Mapping[str, str]) -> StdioServerParameters:
    return StdioServerParameters(
        command=sys.executable,
        args=["-m", "router.cli", "mcp", "--config", str(config)],
        env=dict(env),
    )


class McpClient:
    """One MCP session, through the SDK's client, on a loop of its own thread."""

    def __init__(
        self,
        server: StdioServerParameters | str,
        *,
        token: str | None = None,
        mode: str = "legacy",
        terminate_on_close: bool = True,
    ) -> None:
        self._server = server
        self._token = token
        self._mode = mode
        self._terminate = terminate_on_close
        self._ready = threading.Event()
        self._failed: BaseException | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._client: Client | None = None
        self._thread = threading.Thread(target=asyncio.run, args=(self._main(),), daemon=True)

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        try:
            async with contextlib.AsyncExitStack() as stack:
                transport: Any = self._server
                if isinstance(self._server, str):
                    import httpx2
                    from mcp.client.streamable_http import streamable_http_client

                    headers = {"Authorization": f"Bearer {self._token}"} if self._token else {}
                    http = await stack.enter_async_context(
                        httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(30, read=300))
                    )
                    transport = streamable_http_client(
                        self._server, http_client=http, terminate_on_close=self._terminate
                    )
                self._client = await stack.enter_async_context(Client(transport, mode=self._mode))
                self._ready.set()
                await self._stop.wait()
        except BaseException as exc:  # the test reads it
            self._failed = exc
        finally:
            self._ready.set()

    def __enter__(self) -> McpClient:
        self._thread.start()
        self._ready.wait(60)
        if self._failed is not None:
            raise self._failed
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """End the session as the client does (stdio: the server's input closes)."""
        if self._loop is not None and self._stop is not None and self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(30)

    @property
    def protocol_version(self) -> str:
        assert self._client is not None
        return self._client.protocol_version

    def submit(
        self, name: str, arguments: dict[str, Any] | None = None, progress: list[Any] | None = None
    ) -> concurrent.futures.Future[types.CallToolResult]:
        """Call a tool without waiting; ``progress`` collects (time, progress, message)."""
        assert self._client is not None
        assert self._loop is not None
        client = self._client

        async def record(value: float, _total: float | None, message: str | None) -> None:
            if progress is not None:
                progress.append((time.monotonic(), value, message))

        callback = record if progress is not None else None
        work = client.call_tool(name, arguments or {}, progress_callback=callback)
        return asyncio.run_coroutine_threadsafe(work, self._loop)

    def call(
        self, name: str, arguments: dict[str, Any] | None = None, progress: list[Any] | None = None
    ) -> types.CallToolResult:
        return self.submit(name, arguments, progress).result(90)

    def ok(self, name: str, arguments: dict[str, Any] | None = None, **kw: Any) -> dict[str, Any]:
        """A tool's structured result; the call must succeed."""
        result = self.call(name, arguments, **kw)
        assert not result.is_error, result.content
        assert result.structured_content is not None
        return result.structured_content

    def error(self, name: str, arguments: dict[str, Any] | None = None) -> str:
        """A tool error's message; the call must fail as a tool error."""
        result = self.call(name, arguments)
        assert result.is_error, result.structured_content
        [content] = result.content
        assert isinstance(content, types.TextContent)
        return content.text

    def tools(self) -> list[types.Tool]:
        assert self._client is not None
        assert self._loop is not None
        listed = asyncio.run_coroutine_threadsafe(self._client.list_tools(), self._loop)
        return listed.result(30).tools


class HttpServer:
    """``sandbox-router mcp --http`` in a subprocess; its stderr kept for the test."""

    def __init__(self, config: Path, env: Mapping[str, str], *args: str) -> None:
        self.lines: list[str] = []
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "router.cli", "mcp", "--http", "--port", "0",
             "--config", str(config), *args],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, **env},
        )  # fmt: skip
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.lines.append(line)
            if "serving MCP on " in line:
                self.url = line.split("serving MCP on ", 1)[1].split()[0]
                break
        else:
            raise AssertionError("the server did not start:\n" + "".join(self.lines))
        self._drain = threading.Thread(target=self._read, daemon=True)
        self._drain.start()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.lines.append(line)

    @property
    def stderr(self) -> str:
        return "".join(self.lines)

    def stop(self, sig: int = signal.SIGTERM) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        code = self.proc.wait(60)
        self._drain.join(10)
        return code


def fetch(url: str, headers: Mapping[str, str], emulator: Emulator | None = None) -> httpx.Response:
    """GET an exposed port's URL as a client outside the sandbox would, with its headers; a
    vendor's wildcard host name goes to the emulator's edge (`Emulator.resolve`)."""
    target_url = httpx.URL(url)
    sent = dict(headers)
    target = emulator.resolve(target_url.host) if emulator is not None else None
    if target is not None:
        sent["Host"] = target_url.netloc.decode()
        target_url = target_url.copy_with(scheme="http", host=target[0], port=target[1])
    return httpx.get(target_url, headers=sent, timeout=10)
