"""The daemon's terminals: PTY sessions on a real pseudo-terminal in the sandbox.

Daytona runs ``bash -i -l`` on a PTY and relays it over websockets; a
`Terminal` does the same inside the emulated sandbox. The PTY is made in the
sandbox (so under bubblewrap it is the sandbox's own): the sandbox runs a
small Python bridge (`BRIDGE`) that opens it with ``pty.fork``, starts the
shell on it and relays bytes between the PTY and the bridge's stdin/stdout.
The emulator speaks to the bridge in frames (one kind byte, a 4-byte length,
the payload): ``d`` is input for the terminal, ``r`` a new size
(``"rows cols"``), which the bridge sets on the PTY (the kernel tells the
shell with SIGWINCH), ``k`` the kill: the bridge SIGKILLs the shell's
process group, so a killed terminal ends with 137, as on Daytona. A frame,
not a signal: it waits in the pipe for a bridge still starting, where a
signal could reach bubblewrap before its sandbox is made and be lost.

Every attached websocket client gets the output from its attach on (binary
frames) and, on exit, the control message ``{"type": "control", "status":
"exited", "exitCode": N}`` (with the exit-control subprotocol) and a close
frame whose reason is ``{"exitCode": N}`` (1000 for 0, else 1011).

The routes (`Terminals`, under ``{toolboxProxyUrl}/{sandboxId}``; the
proxy is `emulators.daytona.toolbox`): the websocket
``/process/pty/create-connect?id=&cols=&rows=&cwd=`` (env in the
``X-Daytona-Pty-Envs~<base64url JSON>`` subprotocol), ``.../{id}/connect``,
``GET /process/pty[/{id}]``, ``POST .../{id}/resize``, ``DELETE .../{id}``.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import json
import time
from collections.abc import Mapping
from typing import Any

from aiohttp import web

from emulators.daytona.sandboxes import DAYTONA_HOME, Box, iso
from emulators.daytona.toolbox import BOX, DaemonError, json_body
from emulators.filesystem import GuestSandbox
from providers.errors import SandboxError
from providers.local import LocalProcess

__all__ = ["BRIDGE", "EXIT_CONTROL", "Terminal", "Terminals", "open_terminal"]

EXIT_CONTROL = "X-Daytona-Pty-Exit-Control"
_ENVS_PROTOCOL = "X-Daytona-Pty-Envs~"
_KILLED = 137

# No absolute paths in here: without bubblewrap the sandbox rewrites them in argv.
BRIDGE = r"""
import fcntl, os, pty, select, signal, struct, sys, termios

def size(fd, rows, cols):
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))

rows, cols = int(sys.argv[1]), int(sys.argv[2])
pid, master = pty.fork()
if pid == 0:
    size(0, rows, cols)
    os.execvp(sys.argv[3], sys.argv[3:])
pending, reading = b"", True
while True:
    try:
        ready = select.select([master, 0] if reading else [master], [], [])[0]
    except InterruptedError:
        continue
    if master in ready:
        try:
            data = os.read(master, 65536)
        except OSError:
            data = b""
        if not data:
            break
        while data:
            data = data[os.write(1, data):]
    if 0 in ready:
        data = os.read(0, 65536)
        reading = bool(data)
        pending += data
        while len(pending) >= 5 and len(pending) >= 5 + int.from_bytes(pending[1:5], "big"):
            end = 5 + int.from_bytes(pending[1:5], "big")
            kind, body, pending = pending[:1], pending[5:end], pending[end:]
            if kind == b"d":
                while body:
                    body = body[os.write(master, body):]
            elif kind == b"r":
                size(master, *map(int, body.split()))
            elif kind == b"k":
                os.killpg(pid, signal.SIGKILL)
status = os.waitpid(pid, 0)[1]
code = os.waitstatus_to_exitcode(status)
sys.exit(code if code >= 0 else 128 - code)
"""


class Terminal:
    """One PTY session: its shell, its attached clients and how it ended."""

    def __init__(
        self,
        session_id: str,
        process: LocalProcess,
        *,
        rows: int,
        cols: int,
        cwd: str,
        envs: Mapping[str, str],
    ) -> None:
        self.id = session_id
        self.process = process
        self.rows, self.cols, self.cwd, self.envs = rows, cols, cwd, dict(envs)
        self.created = time.time()
        self.exit_code: int | None = None
        self.clients: set[web.WebSocketResponse] = set()
        self._killed = False
        self._pump = asyncio.get_running_loop().create_task(self._relay())

    def info(self, created_at: str) -> dict[str, Any]:
        return {
            "id": self.id,
            "active": self.exit_code is None,
            "cols": self.cols,
            "rows": self.rows,
            "cwd": self.cwd,
            "envs": self.envs,
            "createdAt": created_at,
            "lazyStart": False,
        }

    async def _relay(self) -> None:
        stdout = self.process.proc.stdout
        assert stdout is not None
        while data := await stdout.read(65536):
            for client in list(self.clients):
                with contextlib.suppress(ConnectionError, RuntimeError):
                    await client.send_bytes(data)
        code = await self.process.proc.wait()
        self.exit_code = _KILLED if self._killed else (128 - code if code < 0 else code)
        for client in list(self.clients):
            await self._close(client)

    async def _close(self, client: web.WebSocketResponse) -> None:
        assert self.exit_code is not None
        self.clients.discard(client)
        with contextlib.suppress(ConnectionError, RuntimeError):
            if client.ws_protocol == EXIT_CONTROL:
                control = {"type": "control", "status": "exited", "exitCode": self.exit_code}
                await client.send_str(json.dumps(control))
            reason = json.dumps({"exitCode": self.exit_code}).encode()
            await client.close(code=1000 if self.exit_code == 0 else 1011, message=reason)

    async def attach(self, client: web.WebSocketResponse) -> None:
        """Relay ``client`` until it leaves or the shell exits."""
        if self.exit_code is not None:
            await self._close(client)
            return
        self.clients.add(client)
        await client.send_str(json.dumps({"type": "control", "status": "connected"}))
        async for message in client:
            data = message.data if isinstance(message.data, bytes) else str(message.data).encode()
            self._send(b"d", data)
        self.clients.discard(client)

    def _send(self, kind: bytes, payload: bytes) -> None:
        stdin = self.process.proc.stdin
        if stdin is not None and self.exit_code is None and not stdin.is_closing():
            stdin.write(kind + len(payload).to_bytes(4, "big") + payload)

    def resize(self, rows: int, cols: int) -> None:
        self.rows, self.cols = rows, cols
        self._send(b"r", f"{rows} {cols}".encode())

    async def kill(self) -> None:
        """End the shell (its process group SIGKILLed) and close the clients with 137."""
        if self.exit_code is None:
            self._killed = True
            self._send(b"k", b"")
            try:
                await asyncio.wait_for(asyncio.shield(self._pump), 2.0)
            except TimeoutError:
                # The pipe is still open, so a member of the group holds it and the
                # group's number is still taken, even when its leader was reaped.
                self.process.end_group()
        with contextlib.suppress(asyncio.CancelledError):
            await self._pump


async def open_terminal(
    sandbox: GuestSandbox,
    session_id: str,
    *,
    rows: int,
    cols: int,
    cwd: str,
    envs: Mapping[str, str],
) -> Terminal:
    """Start ``bash -i -l`` on a new PTY of ``rows`` x ``cols`` in ``sandbox``, from ``cwd``."""
    argv = ["python3", "-c", BRIDGE, str(rows), str(cols), "bash", "-i", "-l"]
    env = {"TERM": "xterm-256color", **envs}
    process = await sandbox.spawn(argv, env=env, cwd=cwd)
    return Terminal(session_id, process, rows=rows, cols=cols, cwd=cwd, envs=envs)


class Terminals:
    """The daemon's PTY handlers (the sandbox is the proxy's `BOX`)."""

    def routes(self) -> list[web.RouteDef]:
        pty = "/toolbox/{sandbox}/process/pty"
        return [
            web.get(pty, self.list_terminals),
            web.get(pty + "/create-connect", self.create_terminal),
            web.get(pty + "/{pty}", self.get_terminal),
            web.delete(pty + "/{pty}", self.kill_terminal),
            web.post(pty + "/{pty}/resize", self.resize_terminal),
            web.get(pty + "/{pty}/connect", self.connect_terminal),
        ]

    def _terminal(self, request: web.Request) -> Terminal:
        box: Box = request[BOX]
        terminal = box.terminals.get(request.match_info["pty"])
        if terminal is None or terminal.exit_code is not None:
            raise DaemonError(404, "PTY session not found", "NOT_FOUND")
        return terminal

    @staticmethod
    def _size(raw: Any, name: str) -> int:
        try:
            value = int(raw)
        except (TypeError, ValueError):
            raise DaemonError(400, f"{name} must be a number", "BAD_REQUEST") from None
        if not 1 <= value <= 1000:
            raise DaemonError(400, f"{name} must be between 1 and 1000", "BAD_REQUEST")
        return value

    @staticmethod
    def _envs(request: web.Request) -> dict[str, str]:
        for raw in request.headers.get("Sec-WebSocket-Protocol", "").split(","):
            token = raw.strip()
            if token.startswith(_ENVS_PROTOCOL):
                encoded = token[len(_ENVS_PROTOCOL) :]
                try:
                    envs = json.loads(base64.urlsafe_b64decode(encoded + "=" * (-len(encoded) % 4)))
                except (ValueError, binascii.Error):
                    raise DaemonError(400, "malformed PTY envs", "BAD_REQUEST") from None
                if not isinstance(envs, dict):
                    raise DaemonError(400, "malformed PTY envs", "BAD_REQUEST")
                return {str(k): str(v) for k, v in envs.items()}
        return {}

    def _info(self, terminal: Terminal) -> dict[str, Any]:
        return terminal.info(iso(terminal.created))

    async def create_terminal(self, request: web.Request) -> web.StreamResponse:
        box: Box = request[BOX]
        query = request.query
        session_id = query.get("id", "")
        if not session_id:
            raise DaemonError(400, "id is required", "BAD_REQUEST")
        live = box.terminals.get(session_id)
        if live is not None and live.exit_code is None:
            raise DaemonError(409, f"PTY session {session_id} already exists", "CONFLICT")
        rows = self._size(query.get("rows", "24"), "rows")
        cols = self._size(query.get("cols", "80"), "cols")
        cwd = box.local.absolute(query.get("cwd") or DAYTONA_HOME)
        envs = self._envs(request)
        try:
            terminal = await open_terminal(
                box.local, session_id, rows=rows, cols=cols, cwd=cwd, envs=envs
            )
        except SandboxError as exc:
            raise DaemonError(400, exc.message, "BAD_REQUEST") from None
        box.terminals[session_id] = terminal
        return await self._attach(request, terminal)

    async def connect_terminal(self, request: web.Request) -> web.StreamResponse:
        return await self._attach(request, self._terminal(request))

    @staticmethod
    async def _attach(request: web.Request, terminal: Terminal) -> web.StreamResponse:
        ws = web.WebSocketResponse(protocols=(EXIT_CONTROL,))
        await ws.prepare(request)
        await terminal.attach(ws)
        return ws

    async def list_terminals(self, request: web.Request) -> web.Response:
        box: Box = request[BOX]
        live = [t for t in box.terminals.values() if t.exit_code is None]
        return web.json_response({"sessions": [self._info(t) for t in live]})

    async def get_terminal(self, request: web.Request) -> web.Response:
        return web.json_response(self._info(self._terminal(request)))

    async def resize_terminal(self, request: web.Request) -> web.Response:
        terminal = self._terminal(request)
        body = await json_body(request)
        terminal.resize(self._size(body.get("rows"), "rows"), self._size(body.get("cols"), "cols"))
        return web.json_response(self._info(terminal))

    async def kill_terminal(self, request: web.Request) -> web.Response:
        box: Box = request[BOX]
        terminal = self._terminal(request)
        await terminal.kill()
        box.terminals.pop(terminal.id, None)
        return web.json_response({"message": f"PTY session {terminal.id} terminated"})
