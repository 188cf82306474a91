"""Background processes and terminals on Daytona.

A background process is a shell session of its own running one command
(``runAsync``), so its id is ``<session>:<command>`` and any client of the
sandbox can find it again: the daemon keeps each command's log, and its
websocket replays it from the start, then follows it until the command
ends. Daytona has no kill per command, but deleting a session ends its
shell's whole process tree (SIGTERM, then SIGKILL), so with one process per
session that is the process's kill. A finished process's session stays, so
other handles can still read its log and exit code; the sandbox's end takes
it. An async command's stdin is a pipe the daemon never closes (and its
input call adds a newline), so stdin is not offered.

A terminal is one of Daytona's PTY sessions: a websocket that creates it and
carries its output and input, with Daytona's exit-control subprotocol (the
daemon says ``connected`` once the shell runs, and puts the exit code in the
close frame's reason).
"""

from __future__ import annotations

import asyncio
import base64
import codecs
import contextlib
import json
import secrets
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, Literal
from urllib.parse import quote

from providers.daytona.errors import StreamBroken, sdk_errors
from providers.errors import NotFound, ProviderError, SandboxError
from providers.processes import ProcessBase, TerminalBase

if TYPE_CHECKING:
    import aiohttp

    from providers.daytona.client import Toolbox

__all__ = [
    "KILLED",
    "SESSION_PREFIX",
    "DaytonaProcess",
    "DaytonaTerminal",
    "follow",
    "process_id",
    "toolbox_errors",
]

SESSION_PREFIX = "sandbox-router-proc-"
KILLED = 137  # ended by its session's deletion (SIGKILL at the latest)
_POLL_SECONDS = 0.2
_PTY_PREFIX = "sandbox-router-pty-"
_EXIT_CONTROL = "X-Daytona-Pty-Exit-Control"
_ENVS_PROTOCOL = "X-Daytona-Pty-Envs~"
_CONNECT_TIMEOUT = 10.0
_MARKS: dict[bytes, Literal["stdout", "stderr"]] = {
    b"\x01\x01\x01": "stdout",
    b"\x02\x02\x02": "stderr",
}


def process_id(session: str, command: str) -> str:
    return f"{session}:{command}"


@contextlib.contextmanager
def toolbox_errors(provider: str, sandbox_id: str) -> Iterator[None]:
    """`sdk_errors` in the sandbox, with the daemon's 404 (no such session, command or
    terminal: it ended or was never there) as `NotFound`."""
    try:
        with sdk_errors(provider, sandbox_id, in_sandbox=True):
            yield
    except SandboxError as err:
        if err.status != 404:
            raise
        raise NotFound(
            err.message, provider=provider, status=404, sandbox_id=sandbox_id
        ) from err.__cause__


async def follow(ws: aiohttp.ClientWebSocketResponse) -> AsyncIterator[str | bytes]:
    """The messages of a toolbox websocket until it closes; `StreamBroken` when it
    closes with an error (a clean end is code 1000, or none)."""
    import aiohttp

    async for message in ws:
        if message.type in (aiohttp.WSMsgType.TEXT, aiohttp.WSMsgType.BINARY):
            yield message.data
        elif message.type == aiohttp.WSMsgType.ERROR:
            raise StreamBroken(f"WebSocket error: {ws.exception()}")
    if ws.close_code not in (None, 1000):
        raise StreamBroken(f"WebSocket closed unexpectedly (close code {ws.close_code})")


class _Demux:
    """Daytona's command log: each run of output follows a three-byte mark of its
    stream (``\\x01`` x3 stdout, ``\\x02`` x3 stderr), and a mark may be split across
    messages; each stream is decoded as UTF-8 as it comes."""

    def __init__(self, feed: Callable[[Literal["stdout", "stderr"], str], None]) -> None:
        self._feed = feed
        self._buffer = bytearray()
        self._stream: Literal["stdout", "stderr"] | None = None
        self._decoders = {
            name: codecs.getincrementaldecoder("utf-8")(errors="replace")
            for name in _MARKS.values()
        }

    def _emit(self, data: bytes, final: bool = False) -> None:
        if self._stream is not None:
            text = self._decoders[self._stream].decode(data, final)
            if text:
                self._feed(self._stream, text)

    def write(self, chunk: bytes | str) -> None:
        self._buffer += chunk.encode() if isinstance(chunk, str) else chunk
        buffer = self._buffer
        while True:
            found = [(at, name) for mark, name in _MARKS.items() if (at := buffer.find(mark)) >= 0]
            if not found:
                break
            at, name = min(found)
            self._emit(bytes(buffer[:at]))
            del buffer[: at + 3]
            self._stream = name
        kept = next((n for n in (2, 1) if any(buffer.endswith(mark[:n]) for mark in _MARKS)), 0)
        self._emit(bytes(buffer[: len(buffer) - kept]))
        del buffer[: len(buffer) - kept]

    def close(self) -> None:
        self._emit(bytes(self._buffer), final=True)
        self._buffer.clear()


class DaytonaProcess(ProcessBase):
    """A command of its own session, fed from the daemon's log websocket (from its start)."""

    def __init__(
        self,
        toolbox: Toolbox,
        provider: str,
        sandbox_id: str,
        session: str,
        command: str,
        timeout: float,
    ) -> None:
        super().__init__(process_id(session, command), provider)
        self._toolbox = toolbox
        self._sandbox_id = sandbox_id
        self._session = session
        self._command = command
        self._timeout = timeout
        self._follow = asyncio.ensure_future(self._read())

    def _errors(self) -> contextlib.AbstractContextManager[None]:
        return toolbox_errors(self.provider, self._sandbox_id)

    async def _read(self) -> None:
        try:
            with self._errors():
                await self._follow_log()
                while True:  # the daemon ends the log once the exit code is written
                    async with asyncio.timeout(self._timeout):
                        found = await self._toolbox.process.get_session_command(
                            self._session, self._command
                        )
                    if found.exit_code is not None:
                        self._finish(found.exit_code)
                        return
                    await asyncio.sleep(_POLL_SECONDS)
        except NotFound:
            self._finish(KILLED)  # its session was deleted
        except ProviderError as err:
            self._fail(err)

    async def _follow_log(self) -> None:
        """The command's log from its start, split into stdout and stderr, until it ends."""
        path = f"/process/session/{quote(self._session)}/command/{quote(self._command)}/logs"
        demux = _Demux(self._feed)
        async with await self._toolbox.websocket(path, follow="true") as ws:
            try:
                async for data in follow(ws):
                    demux.write(data)
            finally:
                demux.close()

    async def kill(self) -> bool:
        if self.finished:
            return False
        process = self._toolbox.process
        try:
            with self._errors():
                async with asyncio.timeout(self._timeout):
                    found = await process.get_session_command(self._session, self._command)
                    if found.exit_code is not None:
                        return False
                    await process.delete_session(self._session)
        except NotFound:
            return False
        self._finish(KILLED)
        return True


class DaytonaTerminal(TerminalBase):
    """A Daytona PTY session, its websocket read by a task of its own."""

    def __init__(
        self, terminal_id: str, provider: str, sandbox_id: str, toolbox: Toolbox, timeout: float
    ) -> None:
        super().__init__(terminal_id, provider)
        self._sandbox_id = sandbox_id
        self._toolbox = toolbox
        self._timeout = timeout
        self._ws: aiohttp.ClientWebSocketResponse | None = None
        self._connected = asyncio.Event()
        self._error: str | None = None
        self._reader: asyncio.Future[None] | None = None

    @classmethod
    async def open(
        cls,
        toolbox: Toolbox,
        provider: str,
        sandbox_id: str,
        *,
        rows: int,
        cols: int,
        env: Mapping[str, str] | None,
        cwd: str | None,
        timeout: float,
    ) -> DaytonaTerminal:
        """A new PTY session running the sandbox's login shell; ``timeout`` bounds each
        of its requests.

        Its env travels as a subprotocol token (base64url JSON), as the SDK sends it:
        kept out of the URL and the logs of whatever is in between.
        """
        terminal = cls(_PTY_PREFIX + secrets.token_hex(6), provider, sandbox_id, toolbox, timeout)
        query = {"id": terminal.id, "cols": str(cols), "rows": str(rows)}
        if cwd:
            query["cwd"] = cwd
        protocols = [_EXIT_CONTROL]
        if env:
            encoded = base64.urlsafe_b64encode(json.dumps(dict(env)).encode()).rstrip(b"=")
            protocols.append(_ENVS_PROTOCOL + encoded.decode())
        with terminal._errors():
            ws = await toolbox.websocket(
                "/process/pty/create-connect", protocols=protocols, **query
            )
            terminal._ws = ws
            terminal._reader = asyncio.ensure_future(terminal._read(ws))
            try:
                async with asyncio.timeout(_CONNECT_TIMEOUT):
                    await terminal._connected.wait()
                if terminal._error is not None:
                    raise StreamBroken(terminal._error)
            except BaseException:
                terminal._reader.cancel()
                await ws.close()
                raise
        return terminal

    async def _read(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        """Feed the output until the websocket closes; then finish with the exit code its
        close (or an ``exited`` control message) gave, else -1."""
        import aiohttp

        exit_code: int | None = None
        try:
            while True:
                message = await ws.receive()
                if message.type == aiohttp.WSMsgType.TEXT:
                    control = _control(message.data)
                    if control is None:
                        self._feed(message.data.encode())
                    elif control.get("status") == "exited":
                        code = control.get("exitCode")
                        exit_code = code if isinstance(code, int) else exit_code
                    elif control.get("status") == "error":
                        self._error = str(control.get("error") or "PTY connection failed")
                    if control is not None:
                        self._connected.set()
                elif message.type == aiohttp.WSMsgType.BINARY:
                    self._feed(message.data)
                elif message.type == aiohttp.WSMsgType.CLOSE:
                    exit_code = _closed(message.data, message.extra, exit_code)
                    break
                else:
                    if ws.close_code == 1000 and exit_code is None:
                        exit_code = 0
                    break
        finally:
            if not self._connected.is_set():
                self._error = self._error or "the PTY's websocket closed before it connected"
                self._connected.set()
            self._finish(exit_code if exit_code is not None else -1)
            await ws.close()

    def _errors(self) -> contextlib.AbstractContextManager[None]:
        return toolbox_errors(self.provider, self._sandbox_id)

    async def write(self, data: str | bytes) -> None:
        assert self._ws is not None
        with self._errors():
            if self._ws.closed or self._exit.done():
                raise StreamBroken("PTY is not connected")
            await self._ws.send_bytes(data.encode() if isinstance(data, str) else data)

    async def resize(self, rows: int, cols: int) -> None:
        from daytona_toolbox_api_client_async.models.pty_resize_request import PtyResizeRequest

        with self._errors():
            async with asyncio.timeout(self._timeout):
                await self._toolbox.process.resize_pty_session(
                    self.id, PtyResizeRequest(rows=rows, cols=cols)
                )

    async def kill(self) -> bool:
        if self._exit.done():
            return False
        try:
            with self._errors():
                async with asyncio.timeout(self._timeout):
                    await self._toolbox.process.delete_pty_session(self.id)
        except NotFound:
            return False
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(self._exit), 10)
        return True


def _control(text: str) -> dict[str, Any] | None:
    """The exit-control message a text frame is (``{"type": "control", ...}``), if it is one."""
    if not text.startswith("{"):
        return None
    with contextlib.suppress(ValueError):
        parsed = json.loads(text)
        if isinstance(parsed, dict) and parsed.get("type") == "control":
            return parsed
    return None


def _closed(code: Any, reason: Any, exit_code: int | None) -> int | None:
    """The exit code a PTY's close frame gives: its reason's ``exitCode`` (JSON), else 0
    for a normal close (1000), else what was known before."""
    with contextlib.suppress(TypeError, ValueError):
        found = json.loads(reason).get("exitCode")
        if isinstance(found, int):
            return found
    if exit_code is None and code == 1000:
        return 0
    return exit_code
