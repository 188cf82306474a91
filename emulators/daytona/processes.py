"""The daemon's processes: one-shot commands and code, and the sessions' shells.

Under ``{toolboxProxyUrl}/{sandboxId}`` (`emulators.daytona.toolbox` answers for the proxy):

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
"""

from __future__ import annotations

import shutil
from typing import Any

from aiohttp import web

from emulators.daytona.sandboxes import Box, ShellSession
from emulators.daytona.toolbox import BOX, DaemonError, json_body
from emulators.filesystem import PathRefused

__all__ = ["Processes"]

ENTRYPOINT = "sleep infinity"  # the default snapshot's command
_INTERPRETERS = {"python": ["python3", "-"], "javascript": ["node", "-"]}


class Processes:
    """The command and session handlers (the sandbox is the proxy's `BOX`)."""

    def routes(self) -> list[web.RouteDef]:
        base = "/toolbox/{sandbox}"
        session = base + "/process/session/{session}"
        return [
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
        ]

    async def execute(self, request: web.Request) -> web.Response:
        box: Box = request[BOX]
        body = await json_body(request)
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
        body = await json_body(request)
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
        session_id = (await json_body(request)).get("sessionId")
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
        body = await json_body(request)
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
        data = (await json_body(request)).get("data")
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


def _exit(code: int) -> int:
    return 128 - code if code < 0 else code
