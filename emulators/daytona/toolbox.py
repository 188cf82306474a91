"""The sandbox daemon's toolbox API, reached through the toolbox proxy.

The SDK sends toolbox calls to ``{toolboxProxyUrl}/{sandboxId}/...`` with
the API key; the emulator's proxy URL is ``/toolbox`` on its own port.
Errors are the daemon's ``{statusCode, message, code, source, path, method,
timestamp}`` with ``source: DAYTONA_DAEMON`` and its codes
(``FILE_NOT_FOUND``, ``PROCESS_EXECUTION_TIMEOUT``, ``SESSION_ENDED``...);
the proxy in front answers a refused key (401), an unknown sandbox (404) and
one not running (400) in the same shape with ``source: DAYTONA_PROXY``.

* ``POST /process/execute`` runs a command to the end (stdout and stderr
  merged in ``result``; past ``timeout`` seconds, when given, 408);
  ``POST /process/code-run`` runs python (or node) code the same way.
* Sessions: ``POST /process/session`` starts a shell
  (`emulators.daytona.sandboxes.ShellSession`), ``POST .../{id}/exec``
  runs a command in it (and waits unless ``runAsync``: then 202, and
  ``POST .../command/{cid}/input`` feeds its stdin),
  ``GET .../{id}``, ``.../command/{cid}``, ``.../command/{cid}/logs``
  (a websocket upgrade streams the log, stream prefixes kept, from its start
  and with ``follow=true`` until the command ends: then, or when its session
  is deleted, the socket closes 1000), ``DELETE .../{id}`` ends the shell and
  whatever it runs. ``GET /process/session/entrypoint[/logs]`` shows the
  image's command (``sleep infinity``), running and silent.
* Terminals (`emulators.daytona.terminals`): the websocket
  ``/process/pty/create-connect?id=&cols=&rows=&cwd=`` (env in the
  ``X-Daytona-Pty-Envs~<base64url JSON>`` subprotocol), ``.../{id}/connect``,
  ``GET /process/pty[/{id}]``, ``POST .../{id}/resize``, ``DELETE .../{id}``.
* The stateful interpreter (`emulators.daytona.interpreter`): the websocket
  ``/process/interpreter/execute``, in the default context or one made by
  ``POST /process/interpreter/context`` (``GET`` lists them, ``DELETE
  .../context/{id}`` ends one).
* Files: ``POST /files/bulk-upload`` (multipart ``files[i].file``, its
  destination in ``files[i].path`` or else the part's filename),
  ``POST /files/bulk-download`` (``{paths}`` in, a multipart/form-data
  response out: a ``file`` part per path, or an ``error`` part with the
  daemon's JSON error, each part naming the requested path exactly in
  ``filename*``), ``GET /files?path=&depth=``; and managing them as the
  daemon does: ``POST /files/folder``, ``DELETE /files``, ``GET
  /files/info``, ``POST /files/move``, ``POST /files/permissions``, ``GET
  /files/find`` (lines holding a text), ``GET /files/search`` (names matching
  a glob), ``POST /files/replace``; one file: ``GET /files/download`` and
  ``POST /files/upload-v2`` (multipart ``file`` or the raw body), which the
  proxy also takes with no key when pre-signed (``path``, ``expires``,
  ``signature``: `_check_signature`).
* ``GET /work-dir`` and ``/user-home-dir``: both ``/home/daytona``;
  ``GET /system/metrics``, a usage sample (`emulators.daytona.sandboxes.metrics`).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import fnmatch
import grp
import hashlib
import hmac
import json
import os
import posixpath
import pwd
import secrets
import shutil
import stat
import time
import urllib.parse
import uuid
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

from aiohttp import BodyPartReader, StreamReader, web

from emulators.daytona.api import bearer
from emulators.daytona.interpreter import DEFAULT_TIMEOUT, Interpreter
from emulators.daytona.sandboxes import DAYTONA_HOME, Box, ShellSession, iso, metrics
from emulators.daytona.terminals import EXIT_CONTROL, Terminal, open_terminal
from emulators.filesystem import PathRefused
from providers.errors import SandboxError

if TYPE_CHECKING:
    from emulators.daytona import DaytonaEmulator

__all__ = ["PROXY", "Toolbox", "daemon_error"]

PROXY = "DAYTONA_PROXY"
ENTRYPOINT = "sleep infinity"  # the default snapshot's command
BOX = web.RequestKey("box", Box)
_INTERPRETERS = {"python": ["python3", "-"], "javascript": ["node", "-"]}
_ATTR_CHARS = frozenset("!#$&+-.^_`|~")
_ENVS_PROTOCOL = "X-Daytona-Pty-Envs~"


def daemon_error(
    status: int,
    message: str,
    code: str,
    request: web.Request | None = None,
    headers: dict[str, str] | None = None,
    source: str = "DAYTONA_DAEMON",
) -> web.Response:
    """The daemon's error body (``source`` ``DAYTONA_PROXY`` when the proxy answers)."""
    body = {
        "statusCode": status,
        "message": message,
        "code": code,
        "source": source,
        "path": request.path if request is not None else "",
        "method": request.method if request is not None else "",
        "timestamp": iso(time.time()),
    }
    return web.json_response(body, status=status, headers=headers)


class DaemonError(Exception):
    def __init__(self, status: int, message: str, code: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code


def _content_disposition(form_name: str | None, path: str) -> bytes:
    """A part's Content-Disposition as the daemon writes it, naming ``path`` exactly (with no
    ``form_name``: a download's ``attachment``).

    ``filename`` is a Latin-1 approximation (quotes and backslashes escaped,
    control characters and anything beyond Latin-1 made ``_``); ``filename*``
    carries the path byte for byte (RFC 5987), and is what the SDK matches.
    """
    escaped = path.replace("\\", "\\\\").replace('"', '\\"')
    latin1 = "".join(
        "" if c in "\r\n\x00" else "_" if ord(c) > 0xFF or ord(c) < 0x20 or c == "\x7f" else c
        for c in escaped
    )
    encoded = "".join(
        chr(b) if chr(b).isascii() and (chr(b).isalnum() or chr(b) in _ATTR_CHARS) else f"%{b:02X}"
        for b in path.encode()
    )
    kind = "attachment" if form_name is None else f'form-data; name="{form_name}"'
    return (
        f'{kind}; filename="{latin1}"; '.encode("latin-1") + f"filename*=utf-8''{encoded}".encode()
    )


def _file_info(st: os.stat_result, shown: str) -> dict[str, Any]:
    """A file's ``FileInfo`` as the daemon gives it: from ``stat`` (a symlink shows what it
    points to), owner and group as numeric ids, ``name`` the last part of ``shown``."""
    modified = time.gmtime(st.st_mtime)
    return {
        "name": posixpath.basename(shown.rstrip("/")) or "/",
        "path": shown,
        "isDir": stat.S_ISDIR(st.st_mode),
        "size": st.st_size,
        "mode": stat.filemode(st.st_mode),
        "permissions": oct(st.st_mode & 0o777)[2:].zfill(4),
        "owner": str(st.st_uid),
        "group": str(st.st_gid),
        "modTime": time.strftime("%Y-%m-%d %H:%M:%S +0000 UTC", modified),
        "modifiedAt": iso(st.st_mtime),
    }


class Toolbox:
    """The toolbox handlers, over the emulator's core."""

    def __init__(self, emulator: DaytonaEmulator) -> None:
        self.emulator = emulator
        self.core = emulator.core

    def routes(self) -> list[web.RouteDef]:
        base = "/toolbox/{sandbox}"
        session = base + "/process/session/{session}"
        pty = base + "/process/pty"
        return [
            web.get(pty, self.list_terminals),
            web.get(pty + "/create-connect", self.create_terminal),
            web.get(pty + "/{pty}", self.get_terminal),
            web.delete(pty + "/{pty}", self.kill_terminal),
            web.post(pty + "/{pty}/resize", self.resize_terminal),
            web.get(pty + "/{pty}/connect", self.connect_terminal),
            web.get(base + "/process/interpreter/execute", self.interpret),
            web.post(base + "/process/interpreter/context", self.create_context),
            web.get(base + "/process/interpreter/context", self.list_contexts),
            web.delete(base + "/process/interpreter/context/{context}", self.delete_context),
            web.post(base + "/process/execute", self.execute),
            web.post(base + "/process/code-run", self.code_run),
            web.get(base + "/process/session/entrypoint", self.entrypoint),
            web.get(base + "/process/session/entrypoint/logs", self.entrypoint_logs),
            web.post(base + "/process/session", self.create_session),
            web.get(base + "/process/session", self.list_sessions),
            web.get(session, self.get_session),
            web.delete(session, self.delete_session),
            web.post(session + "/exec", self.session_exec),
            web.get(session + "/command/{command}", self.get_command),
            web.get(session + "/command/{command}/logs", self.command_logs),
            web.post(session + "/command/{command}/input", self.command_input),
            web.post(base + "/files/bulk-upload", self.upload),
            web.post(base + "/files/bulk-download", self.download),
            web.get(base + "/files", self.list_files),
            web.get(base + "/files/download", self.download_one),
            web.post(base + "/files/upload-v2", self.upload_one),
            web.delete(base + "/files", self.delete_file),
            web.post(base + "/files/folder", self.create_folder),
            web.get(base + "/files/info", self.file_info),
            web.post(base + "/files/move", self.move_file),
            web.post(base + "/files/permissions", self.set_permissions),
            web.get(base + "/files/find", self.find_in_files),
            web.get(base + "/files/search", self.search_files),
            web.post(base + "/files/replace", self.replace_in_files),
            web.get(base + "/work-dir", self.home_dir),
            web.get(base + "/system/metrics", self.system_metrics),
            web.get(base + "/user-home-dir", self.home_dir),
        ]

    @web.middleware
    async def errors(
        self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        """Authenticate through the proxy, count activity, answer errors in the daemon's shape."""
        if not request.path.startswith("/toolbox/"):
            return await handler(request)
        key = bearer(request)
        signed = _signed_operation(request)
        if signed is not None and not self.core.key_ok(key):
            box = self.core.boxes.get(_sandbox_id(request))
            refused = _check_signature(request, signed, box)
            if refused is not None:
                return daemon_error(401, refused, "UNAUTHORIZED", request, source=PROXY)
        elif not self.core.key_ok(key):
            return daemon_error(401, "Unauthorized", "UNAUTHORIZED", request, source=PROXY)
        else:
            assert key is not None
            box = self.core.find(_sandbox_id(request), key)
        if box is None or box.state == "destroyed":
            return daemon_error(404, "sandbox not found", "NOT_FOUND", request, source=PROXY)
        if box.state != "started":
            message = f"sandbox is not running (state: {box.state})"
            return daemon_error(400, message, "BAD_REQUEST", request, source=PROXY)
        request[BOX] = box
        self.core.touch(box)
        try:
            return await handler(request)
        except DaemonError as exc:
            return daemon_error(exc.status, exc.message, exc.code, request)
        except web.HTTPNotFound:
            tail = "/" + "/".join(request.path.split("/")[3:])
            message = f"route not found: {request.method} {tail}"
            return daemon_error(404, message, "NOT_FOUND", request)

    @staticmethod
    async def _json(request: web.Request) -> dict[str, Any]:
        try:
            body = await request.json()
        except (ValueError, UnicodeDecodeError):
            raise DaemonError(400, "invalid request body", "INVALID_REQUEST_BODY") from None
        if not isinstance(body, dict):
            raise DaemonError(400, "invalid request body", "INVALID_REQUEST_BODY")
        return body

    @staticmethod
    def _path(box: Box, path: str) -> Path:
        try:
            return box.local.host(path)
        except PathRefused as exc:
            raise DaemonError(400, str(exc), "INVALID_FILE_PATH") from None

    async def home_dir(self, request: web.Request) -> web.Response:
        """The user's home, which is also the working directory."""
        return web.json_response({"dir": DAYTONA_HOME})

    async def system_metrics(self, request: web.Request) -> web.Response:
        return web.json_response(await asyncio.to_thread(metrics, request[BOX]))

    # -- one-shot commands ------------------------------------------------
    async def execute(self, request: web.Request) -> web.Response:
        box: Box = request[BOX]
        body = await self._json(request)
        command = body.get("command")
        if not isinstance(command, str) or not command.strip():
            raise DaemonError(400, "command cannot be empty or whitespace-only", "BAD_REQUEST")
        cwd = body.get("cwd")
        timeout = body.get("timeout") or None
        script = self._shell(box, f"{{ {command}\n}} 2>&1", cwd)
        result = await box.local.run(
            ["/bin/bash", "-c", script],
            timeout=timeout,
            env=body.get("envs") or None,
            stdin=b"",
        )
        if result.timed_out:
            raise DaemonError(
                408,
                f"command execution timeout after {timeout} seconds",
                "PROCESS_EXECUTION_TIMEOUT",
            )
        return web.json_response({"exitCode": _exit(result.exit_code), "result": result.stdout})

    async def code_run(self, request: web.Request) -> web.Response:
        box: Box = request[BOX]
        body = await self._json(request)
        code, language = body.get("code"), body.get("language")
        if not isinstance(code, str) or not isinstance(language, str):
            raise DaemonError(400, "code and language are required", "INVALID_REQUEST_BODY")
        argv = body.get("argv") or []
        interpreter = _INTERPRETERS.get(language)
        if interpreter is None or shutil.which(interpreter[0]) is None:
            raise DaemonError(400, f"unsupported language: {language}", "BAD_REQUEST")
        timeout = body.get("timeout") or None
        script = self._shell(box, 'exec "$@" 2>&1', None)
        result = await box.local.run(
            ["/bin/bash", "-c", script, "code-run", *interpreter, *map(str, argv)],
            timeout=timeout,
            env=body.get("envs") or None,
            stdin=box.local.rewrite(code).encode(),
        )
        if result.timed_out:
            raise DaemonError(
                408,
                f"command execution timeout after {timeout} seconds",
                "PROCESS_EXECUTION_TIMEOUT",
            )
        return web.json_response(
            {
                "exitCode": _exit(result.exit_code),
                "result": result.stdout,
                "artifacts": {"charts": []},
            }
        )

    def _shell(self, box: Box, command: str, cwd: Any) -> str:
        if cwd is not None and not isinstance(cwd, str):
            raise DaemonError(400, "cwd must be a string", "INVALID_REQUEST_BODY")
        try:
            return box.shell(command, cwd)
        except PathRefused as exc:
            raise DaemonError(400, str(exc), "INVALID_FILE_PATH") from None

    # -- sessions ---------------------------------------------------------
    def _session(self, request: web.Request) -> ShellSession:
        box: Box = request[BOX]
        session = box.sessions.get(request.match_info["session"])
        if session is None:
            raise DaemonError(404, "session not found", "NOT_FOUND")
        return session

    async def entrypoint(self, request: web.Request) -> web.Response:
        """The ``entrypoint`` session: the image's command, which runs as long as the sandbox."""
        box: Box = request[BOX]
        command = {"id": f"entrypoint-{box.id}", "command": ENTRYPOINT, "exitCode": None}
        return web.json_response({"sessionId": "entrypoint", "commands": [command]})

    async def entrypoint_logs(self, request: web.Request) -> web.StreamResponse:
        """The entrypoint's log, empty: ``sleep infinity`` writes nothing (a followed log stays
        open until the client leaves)."""
        if request.headers.get("Upgrade", "").lower() != "websocket":
            return web.json_response({"output": "", "stdout": "", "stderr": ""})
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        if request.query.get("follow") == "true":
            async for _ in ws:
                pass
        await ws.close()
        return ws

    async def create_session(self, request: web.Request) -> web.Response:
        box: Box = request[BOX]
        session_id = (await self._json(request)).get("sessionId")
        if not isinstance(session_id, str) or not session_id:
            raise DaemonError(400, "sessionId is required", "INVALID_REQUEST_BODY")
        if session_id in box.sessions:
            raise DaemonError(409, f"session {session_id} already exists", "CONFLICT")
        process = await box.local.spawn(["/bin/bash", "--noprofile", "--norc", "-s"])
        session = ShellSession(session_id, process, box.local)
        box.sessions[session_id] = session
        return web.Response(status=201)

    async def list_sessions(self, request: web.Request) -> web.Response:
        box: Box = request[BOX]
        return web.json_response([s.view() for s in box.sessions.values()])

    async def get_session(self, request: web.Request) -> web.Response:
        return web.json_response(self._session(request).view())

    async def delete_session(self, request: web.Request) -> web.Response:
        box: Box = request[BOX]
        session = self._session(request)
        del box.sessions[session.id]
        await session.close()
        return web.Response(status=204)

    async def session_exec(self, request: web.Request) -> web.Response:
        session = self._session(request)
        body = await self._json(request)
        command = body.get("command")
        if not isinstance(command, str) or not command:
            raise DaemonError(400, "command is required", "INVALID_REQUEST_BODY")
        if session.ended:
            raise DaemonError(410, f"session {session.id} has ended", "SESSION_ENDED")
        run_async = bool(body.get("runAsync") or body.get("async"))
        try:
            cmd = session.submit(
                command, interactive=run_async, echo=not body.get("suppressInputEcho")
            )
        except (OSError, PathRefused) as exc:
            raise DaemonError(
                500, f"failed to create input pipe: {exc}", "INTERNAL_ERROR"
            ) from None
        if run_async:
            return web.json_response({"cmdId": cmd.id}, status=202)
        await cmd.done.wait()
        return web.json_response({"cmdId": cmd.id, "exitCode": cmd.exit_code, **cmd.logs()})

    def _command(self, request: web.Request) -> Any:
        cmd = self._session(request).commands.get(request.match_info["command"])
        if cmd is None:
            raise DaemonError(404, "command not found", "NOT_FOUND")
        return cmd

    async def get_command(self, request: web.Request) -> web.Response:
        return web.json_response(self._command(request).view())

    async def command_input(self, request: web.Request) -> web.Response:
        """Input for a running command (what it reads on stdin); 410 once it ended."""
        if request.match_info["session"] == "entrypoint":
            raise DaemonError(400, "can't send input to entrypoint session", "BAD_REQUEST")
        session = self._session(request)
        data = (await self._json(request)).get("data")
        if not isinstance(data, str):
            raise DaemonError(400, "data is required", "INVALID_REQUEST_BODY")
        if session.ended:
            raise DaemonError(410, "session process has exited", "SESSION_ENDED")
        cmd = self._command(request)
        if cmd.exit_code is not None or cmd.done.is_set():
            message = f"command has already completed with exit code {cmd.exit_code}"
            raise DaemonError(410, message, "GONE")
        try:
            await cmd.send(data)
        except OSError as exc:
            raise DaemonError(
                500, f"failed to write to input pipe: {exc}", "INTERNAL_ERROR"
            ) from None
        return web.Response(status=204)

    async def command_logs(self, request: web.Request) -> web.StreamResponse:
        cmd = self._command(request)
        if request.headers.get("Upgrade", "").lower() != "websocket":
            return web.json_response(cmd.logs())
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        if request.query.get("follow") == "true":
            async for chunk in cmd.follow():
                await ws.send_bytes(chunk)
        else:
            await ws.send_bytes(bytes(cmd.output))
        await ws.close()
        return ws

    # -- terminals --------------------------------------------------------
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
        body = await self._json(request)
        terminal.resize(self._size(body.get("rows"), "rows"), self._size(body.get("cols"), "cols"))
        return web.json_response(self._info(terminal))

    async def kill_terminal(self, request: web.Request) -> web.Response:
        box: Box = request[BOX]
        terminal = self._terminal(request)
        await terminal.kill()
        box.terminals.pop(terminal.id, None)
        return web.json_response({"message": f"PTY session {terminal.id} terminated"})

    # -- the stateful interpreter -----------------------------------------
    async def interpret(self, request: web.Request) -> web.StreamResponse:
        box: Box = request[BOX]
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        try:
            body = json.loads(await ws.receive_str())
        except (TypeError, ValueError):
            await ws.close(code=1003, message=b"invalid request")
            return ws
        code, context = body.get("code"), body.get("contextId")
        if not isinstance(code, str) or not code:
            await ws.close(code=1008, message=b"code is required")
            return ws
        if context in (None, "default"):
            if box.interpreter is None:
                box.interpreter = Interpreter(box.local, DAYTONA_HOME)
            interpreter = box.interpreter
        elif isinstance(context, str) and context in box.contexts:
            interpreter = box.contexts[context]
        else:
            await ws.close(code=1008, message=f"context not found: {context}".encode())
            return ws
        timeout = body.get("timeout")

        async def send(chunk: dict[str, Any]) -> None:
            await ws.send_str(json.dumps(chunk))

        close = await interpreter.execute(
            code,
            body.get("envs") or {},
            DEFAULT_TIMEOUT if timeout is None else float(timeout),
            send,
        )
        await ws.close(code=close)
        return ws

    async def create_context(self, request: web.Request) -> web.Response:
        box: Box = request[BOX]
        body = await self._json(request)
        language, cwd = body.get("language") or "python", body.get("cwd") or DAYTONA_HOME
        if language != "python":
            message = f"unsupported language: {language} (only 'python' is supported currently)"
            raise DaemonError(400, message, "BAD_REQUEST")
        if not isinstance(cwd, str):
            raise DaemonError(400, "cwd must be a string", "INVALID_REQUEST_BODY")
        try:
            cwd = box.local.absolute(cwd)
        except PathRefused as exc:
            raise DaemonError(400, str(exc), "INVALID_FILE_PATH") from None
        interpreter = Interpreter(box.local, cwd, str(uuid.uuid4()))
        box.contexts[interpreter.id] = interpreter
        return web.json_response(interpreter.info())

    async def list_contexts(self, request: web.Request) -> web.Response:
        box: Box = request[BOX]
        return web.json_response({"contexts": [c.info() for c in box.contexts.values()]})

    async def delete_context(self, request: web.Request) -> web.Response:
        box: Box = request[BOX]
        context_id = request.match_info["context"]
        if context_id == "default":
            raise DaemonError(400, "cannot delete default context", "BAD_REQUEST")
        interpreter = box.contexts.pop(context_id, None)
        if interpreter is None:
            raise DaemonError(404, f"context {context_id} not found", "NOT_FOUND")
        await interpreter.close()
        return web.json_response({"message": "Context deleted successfully"})

    # -- files ------------------------------------------------------------
    async def upload(self, request: web.Request) -> web.Response:
        """Each file part is streamed to a staging file as it arrives, then moved to
        its path (which may come before or after it in the form)."""
        box: Box = request[BOX]
        paths: dict[str, str] = {}
        named: dict[str, str] = {}
        staged: dict[str, tuple[Path, int]] = {}
        staging = _staging(box)
        try:
            reader = await request.multipart()
            while (part := await reader.next()) is not None:
                name = (part.name or "") if isinstance(part, BodyPartReader) else ""
                if not isinstance(part, BodyPartReader) or not name.startswith("files["):
                    continue
                index, _, kind = name[len("files[") :].partition("].")
                if kind == "path":
                    paths[index] = (await part.read()).decode()
                elif kind == "file":
                    staged[index] = await _stage(part, staging)
                    if part.filename:
                        named[index] = urllib.parse.unquote(part.filename)
            errors, written = [], []
            for index, (file, size) in staged.items():
                dest = paths.get(index) or named.get(index)
                if dest is None:
                    errors.append(f"files[{index}]: no destination path")
                    continue
                try:
                    await asyncio.to_thread(_place, file, box.local.host(dest, write=True))
                except PathRefused as exc:
                    errors.append(str(exc))
                    continue
                except OSError as exc:
                    errors.append(f"{dest}: {exc}")
                    continue
                written.append({"path": dest, "bytes": size})
        finally:
            await asyncio.to_thread(_unstage, staging)
        if errors:
            return web.json_response({"errors": errors, "files": written}, status=400)
        return web.json_response({"files": written})

    async def download(self, request: web.Request) -> web.StreamResponse:
        """The files as multipart parts, each read from disk a chunk at a time."""
        box: Box = request[BOX]
        paths = (await self._json(request)).get("paths")
        if not isinstance(paths, list) or not all(isinstance(p, str) for p in paths):
            raise DaemonError(400, "paths must be a list of strings", "INVALID_REQUEST_BODY")
        boundary = secrets.token_hex(16)
        response = web.StreamResponse(
            headers={"Content-Type": f"multipart/form-data; boundary={boundary}"}
        )
        await response.prepare(request)
        for path in paths:
            opened = await self._open_part(box, path, request)
            name, content_type, size = opened[:3]

            def head(name: str, content_type: str, size: int, path: str = path) -> bytes:
                return (
                    f"--{boundary}\r\nContent-Type: {content_type}\r\n".encode()
                    + b"Content-Disposition: "
                    + _content_disposition(name, path)
                    + f"\r\nContent-Length: {size}\r\n\r\n".encode()
                )

            await response.write(head(name, content_type, size))
            body = opened[3]
            if isinstance(body, bytes):
                await response.write(body)
            else:
                try:
                    while chunk := await asyncio.to_thread(body.read, CHUNK):
                        await response.write(chunk)
                finally:
                    body.close()
            await response.write(b"\r\n")
        await response.write(f"--{boundary}--\r\n".encode())
        await response.write_eof()
        return response

    async def download_one(self, request: web.Request) -> web.StreamResponse:
        """One file, its body the response's (``GET /files/download?path=``)."""
        box: Box = request[BOX]
        (path,) = self._query(request, "path")
        target = self._path(box, path)
        handle = await _os(path, lambda: target.open("rb"))
        try:
            size = os.fstat(handle.fileno()).st_size
            response = web.StreamResponse(
                headers={
                    "Content-Type": "application/octet-stream",
                    "Content-Disposition": _content_disposition(None, target.name).decode(
                        "latin-1"
                    ),
                    "Content-Length": str(size),
                }
            )
            await response.prepare(request)
            while chunk := await asyncio.to_thread(handle.read, CHUNK):
                await response.write(chunk)
            await response.write_eof()
            return response
        finally:
            handle.close()

    async def upload_one(self, request: web.Request) -> web.Response:
        """One file to ``path`` (its directories made): the ``file`` part of a multipart body,
        or the raw body."""
        box: Box = request[BOX]
        (path,) = self._query(request, "path")
        target = self._writable(box, path)
        staging = _staging(box)
        try:
            if request.content_type.startswith("multipart/form-data"):
                reader = await request.multipart()
                staged = None
                while (part := await reader.next()) is not None:
                    if isinstance(part, BodyPartReader) and part.name == "file":
                        staged = await _stage(part, staging)
                        break
                if staged is None:
                    raise DaemonError(400, "http: no such file", "BAD_REQUEST")
            else:
                staged = await _stage(request.content, staging)
            await _os(path, lambda: _place(staged[0], target))
        finally:
            await asyncio.to_thread(_unstage, staging)
        return web.json_response({"name": target.name, "path": path, "type": "file"})

    async def _open_part(
        self, box: Box, path: str, request: web.Request
    ) -> tuple[str, str, int, bytes | BinaryIO]:
        """The part for ``path``: the file opened (and its size), or the daemon's error."""
        try:
            host = box.local.host(path)
            handle = await asyncio.to_thread(host.open, "rb")
        except PathRefused as exc:
            error = daemon_error(400, str(exc), "INVALID_FILE_PATH", request)
        except FileNotFoundError:
            error = daemon_error(404, f"file not found: {path}", "FILE_NOT_FOUND", request)
        except IsADirectoryError:
            error = daemon_error(400, f"path is a directory: {path}", "BAD_REQUEST", request)
        except PermissionError:
            error = daemon_error(403, f"permission denied: {path}", "FILE_ACCESS_DENIED", request)
        else:
            size = os.fstat(handle.fileno()).st_size
            return "file", "application/octet-stream", size, handle
        assert isinstance(error.body, bytes)
        return "error", "application/json", len(error.body), error.body

    async def list_files(self, request: web.Request) -> web.Response:
        box: Box = request[BOX]
        path = request.query.get("path")
        if path is None:
            raise DaemonError(400, "path is required", "BAD_REQUEST")
        raw_depth = request.query.get("depth", "1")
        if not raw_depth.isdigit() or int(raw_depth) < 1:
            raise DaemonError(400, "depth must be at least 1", "BAD_REQUEST")
        target = self._path(box, path)
        if not target.exists():
            raise DaemonError(404, f"directory not found: {path}", "FILE_NOT_FOUND")
        if not target.is_dir():
            raise DaemonError(400, f"not a directory: {path}", "BAD_REQUEST")
        shown = path.rstrip("/") or "/"
        entries = await asyncio.to_thread(_walk, box, target, shown, int(raw_depth))
        return web.json_response(entries)

    # -- managing files ---------------------------------------------------
    @staticmethod
    def _query(request: web.Request, *names: str) -> list[str]:
        values = [request.query.get(name, "") for name in names]
        if not all(values):
            raise DaemonError(400, f"{' and '.join(names)} are required", "BAD_REQUEST")
        return values

    async def create_folder(self, request: web.Request) -> web.Response:
        """``mkdir -p`` with the octal ``mode`` (``0755`` when unset)."""
        box: Box = request[BOX]
        (path,) = self._query(request, "path")
        mode = _mode(request.query.get("mode") or "755")
        target = self._writable(box, path)
        await _os(path, lambda: target.mkdir(mode=mode, parents=True, exist_ok=True))
        return web.Response(status=201)

    async def delete_file(self, request: web.Request) -> web.Response:
        """A file, or a directory with ``recursive=true``."""
        box: Box = request[BOX]
        (path,) = self._query(request, "path")
        entry = self._entry(box, path)
        st = await _os(path, self._writable(box, path).stat)
        if stat.S_ISDIR(st.st_mode) and request.query.get("recursive") != "true":
            raise DaemonError(400, "cannot delete directory without recursive flag", "BAD_REQUEST")
        if entry.is_dir() and not entry.is_symlink():
            await _os(path, lambda: shutil.rmtree(entry))
        else:
            await _os(path, entry.unlink)
        return web.Response(status=204)

    async def file_info(self, request: web.Request) -> web.Response:
        box: Box = request[BOX]
        (path,) = self._query(request, "path")
        target = self._path(box, path)
        st = await _os(path, target.stat)
        return web.json_response(_file_info(st, box.local.absolute(path)))

    async def move_file(self, request: web.Request) -> web.Response:
        """A rename; the destination's directory must exist and the destination must not."""
        box: Box = request[BOX]
        source, destination = self._query(request, "source", "destination")
        src = self._entry(box, source)
        dst = self._entry(box, destination)
        await _os(source, src.lstat)
        await _os(destination, dst.parent.stat)
        if dst.exists() or dst.is_symlink():
            raise DaemonError(409, "destination already exists", "CONFLICT")
        await _os(source, lambda: shutil.move(src, dst))
        return web.Response(status=200)

    async def set_permissions(self, request: web.Request) -> web.Response:
        """``chmod`` to the octal ``mode``, ``chown`` to ``owner`` / ``group`` (names or ids;
        ``daytona``, the sandbox's user, is the emulator's own)."""
        box: Box = request[BOX]
        (path,) = self._query(request, "path")
        target = self._path(box, path)
        await _os(path, target.stat)
        mode = request.query.get("mode")
        if mode:
            await _os(path, lambda: target.chmod(_mode(mode)))
        owner, group = request.query.get("owner", ""), request.query.get("group", "")
        if owner or group:
            uid = _id_of(owner, pwd.getpwnam, "user") if owner else -1
            gid = _id_of(group, grp.getgrnam, "group") if group else -1
            try:
                await asyncio.to_thread(os.chown, target, uid, gid)
            except OSError as exc:
                message = f"failed to change owner: {exc.strerror}"
                raise DaemonError(400, message, "BAD_REQUEST") from None
        return web.Response(status=200)

    async def find_in_files(self, request: web.Request) -> web.Response:
        """Lines holding ``pattern`` (plain text) in the text files under ``path``."""
        box: Box = request[BOX]
        path, pattern = self._query(request, "path", "pattern")
        root = self._path(box, path)
        matches = await asyncio.to_thread(_find, root, path, pattern)
        return web.json_response(matches)

    async def search_files(self, request: web.Request) -> web.Response:
        """Paths under ``path`` (itself included) whose name matches the glob ``pattern``."""
        box: Box = request[BOX]
        path, pattern = self._query(request, "path", "pattern")
        root = self._path(box, path)
        files = await asyncio.to_thread(
            lambda: [
                shown
                for host, shown in _tree(root, path)
                if fnmatch.fnmatchcase(host.name, pattern)
            ]
        )
        return web.json_response({"files": files})

    async def replace_in_files(self, request: web.Request) -> web.Response:
        """Every occurrence of ``pattern`` replaced in each file; a result per file."""
        box: Box = request[BOX]
        body = await self._json(request)
        files, pattern = body.get("files"), body.get("pattern")
        new_value = body.get("newValue") or ""
        if (
            not isinstance(files, list)
            or not all(isinstance(f, str) for f in files)
            or not isinstance(pattern, str)
            or not isinstance(new_value, str)
        ):
            raise DaemonError(400, "invalid request body", "INVALID_REQUEST_BODY")
        results = []
        for file in files:
            try:
                target = box.local.host(file, write=True)
                content = await asyncio.to_thread(target.read_bytes)
                replaced = content.replace(pattern.encode(), new_value.encode())
                await asyncio.to_thread(target.write_bytes, replaced)
            except PathRefused as exc:
                results.append({"file": file, "success": False, "error": str(exc)})
            except OSError as exc:
                results.append({"file": file, "success": False, "error": _os_message(file, exc)})
            else:
                results.append({"file": file, "success": True})
        return web.json_response(results)

    def _entry(self, box: Box, path: str) -> Path:
        """The host path of the entry ``path`` names itself: its directory's symlinks
        followed, not a symlink it ends in (a delete or a move acts on the link)."""
        absolute = box.local.absolute(path)
        if absolute == "/":
            raise DaemonError(400, "/: cannot delete or move the root", "BAD_REQUEST")
        return self._writable(box, posixpath.dirname(absolute)) / posixpath.basename(absolute)

    def _writable(self, box: Box, path: str) -> Path:
        try:
            return box.local.host(path, write=True)
        except PathRefused as exc:
            raise DaemonError(400, str(exc), "INVALID_FILE_PATH") from None


_SIGNED = {("GET", "/files/download"): "GET", ("HEAD", "/files/download"): "GET"}
_SIGNED[("POST", "/files/upload-v2")] = "POST"


def _sandbox_id(request: web.Request) -> str:
    """The sandbox a toolbox request names (``/toolbox/{id}/...``), whether a route matched."""
    return request.match_info.get("sandbox") or request.path.split("/")[2]


def _signed_operation(request: web.Request) -> str | None:
    """The method a pre-signed file URL was signed for, if ``request`` is one."""
    if "signature" not in request.query:
        return None
    tail = "/" + "/".join(request.path.split("/")[3:])
    return _SIGNED.get((request.method, tail))


def _check_signature(request: web.Request, method: str, box: Box | None) -> str | None:
    """Why the proxy refuses a pre-signed file URL (None: it accepts it).

    The signature is ``v1_`` and the unpadded base64url HMAC-SHA256, under the
    sandbox's signing key, of ``v1:files:{method}:{path}:{expires}``; ``expires``
    0 never expires.
    """
    raw_expires, path = request.query.get("expires", ""), request.query.get("path", "")
    if not raw_expires.isdigit():
        return "invalid expires query parameter"
    expires = int(raw_expires)
    if expires and time.time() > expires:
        return "signature is expired"
    signature = request.query["signature"]
    if not signature.startswith("v1_"):
        return "unsupported signature scheme"
    if box is None:
        return "failed to resolve signing key"
    canonical = f"v1:files:{method}:{path}:{expires}".encode()
    digest = hmac.new(box.signing_key.encode(), canonical, hashlib.sha256).digest()
    wanted = "v1_" + base64.urlsafe_b64encode(digest).rstrip(b"=").decode()
    return None if hmac.compare_digest(wanted, signature) else "invalid signature"


def _mode(raw: str) -> int:
    try:
        return int(raw, 8)
    except ValueError:
        raise DaemonError(400, "invalid mode format", "BAD_REQUEST") from None


def _id_of(name: str, lookup: Callable[[str], Any], kind: str) -> int:
    if name.isdigit():
        return int(name)
    if name == "daytona":
        return os.getuid() if kind == "user" else os.getgid()
    try:
        return int(lookup(name)[2])
    except KeyError:
        raise DaemonError(400, f"{kind} not found", "BAD_REQUEST") from None


def _os_message(path: str, exc: OSError) -> str:
    return f"{path}: {exc.strerror or exc}".lower()


async def _os(path: str, call: Callable[[], Any]) -> Any:
    """``call`` off the loop, its OS error answered as the daemon does (404, 403, else 400)."""
    try:
        return await asyncio.to_thread(call)
    except FileNotFoundError as exc:
        raise DaemonError(404, _os_message(path, exc), "FILE_NOT_FOUND") from None
    except PermissionError as exc:
        raise DaemonError(403, _os_message(path, exc), "FILE_ACCESS_DENIED") from None
    except OSError as exc:
        raise DaemonError(400, _os_message(path, exc), "BAD_REQUEST") from None


def _tree(root: Path, shown: str) -> Iterator[tuple[Path, str]]:
    """``root`` and what lies under it, depth first in name order; symlinks not followed;
    nothing when ``root`` is missing (the daemon's walk skips it and answers no matches)."""
    if not root.exists() and not root.is_symlink():
        return
    yield root, shown
    if root.is_dir() and not root.is_symlink():
        try:
            children = sorted(root.iterdir(), key=lambda p: p.name)
        except OSError:
            return
        for child in children:
            yield from _tree(child, posixpath.join(shown, child.name))


def _find(root: Path, shown: str, pattern: str) -> list[dict[str, Any]]:
    """The daemon's content search, a line at a time: regular files that are not binary
    (no NUL in their first 512 bytes)."""
    matches: list[dict[str, Any]] = []
    wanted = pattern.encode()
    for host, path in _tree(root, shown):
        if not host.is_file() or host.is_symlink():
            continue
        try:
            with host.open("rb") as file:
                if b"\x00" in file.read(512):
                    continue
                file.seek(0)
                for number, line in enumerate(file, 1):
                    if wanted in line:
                        text = line.rstrip(b"\n").removesuffix(b"\r").decode(errors="replace")
                        matches.append({"file": path, "line": number, "content": text})
        except OSError:
            continue
    return matches


CHUNK = 1 << 20


async def _stage(part: BodyPartReader | StreamReader, staging: Path) -> tuple[Path, int]:
    """A file part (or a raw body) written to a staging file as it arrives: its path, size."""
    await asyncio.to_thread(staging.mkdir, parents=True, exist_ok=True)
    file = staging / secrets.token_hex(8)
    size = 0
    read = part.read_chunk if isinstance(part, BodyPartReader) else part.read
    with await asyncio.to_thread(file.open, "wb") as out:
        while chunk := await read(CHUNK):
            await asyncio.to_thread(out.write, chunk)
            size += len(chunk)
    return file, size


def _staging(box: Box) -> Path:
    """A directory of this request's own for the files it receives (beside the sandbox's,
    so a move from it is a rename): uploads running at once never share one."""
    return box.local.dir.parent / f".{box.local.id}.uploads" / secrets.token_hex(8)


def _unstage(staging: Path) -> None:
    """Remove a request's staging directory, and the sandbox's once no upload uses it."""
    shutil.rmtree(staging, ignore_errors=True)
    with contextlib.suppress(OSError):
        staging.parent.rmdir()


def _place(staged: Path, target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.move(staged, target)


def _walk(box: Box, directory: Path, shown: str, depth: int) -> list[dict[str, Any]]:
    """The entries under ``directory``, ``depth`` levels deep; a symlink shows what it points
    to (followed inside the sandbox), a dangling one is left out, as by the daemon."""
    entries = []
    for child in sorted(directory.iterdir(), key=lambda p: p.name):
        child_shown = f"{shown}/{child.name}" if shown != "/" else f"/{child.name}"
        try:
            real = box.local.host(child_shown) if child.is_symlink() else child
            st = real.stat()
        except (OSError, PathRefused):
            continue
        entries.append(_file_info(st, child_shown))
        if depth > 1 and child.is_dir() and not child.is_symlink():
            entries.extend(_walk(box, child, child_shown, depth - 1))
    return entries


def _exit(code: int) -> int:
    return 128 - code if code < 0 else code
