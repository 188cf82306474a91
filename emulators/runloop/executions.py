"""Runloop's command executions in a devbox: the ``execute*`` and ``executions/`` routes.

A command runs in the devbox's local sandbox as an `emulators.runloop.devboxes.Execution`,
which collects its output and log lines; these are the routes the SDK drives it through,
under ``/v1/devboxes/{id}``:

* ``POST .../execute_sync`` (deprecated) holds until the command ends and
  answers all of its output.
* ``POST .../execute`` (waits ``optimistic_timeout`` seconds, at most 25,
  for the command; a repeated ``command_id`` answers the same execution) and
  ``.../execute_async`` (with ``attach_stdin`` the command's stdin stays
  open).
* ``GET|POST .../executions/{eid}``: retrieve, ``wait_for_status`` up to 25 s
  then 408, ``kill``, ``send_std_in`` (nonempty ``text`` or the ``signal`` EOF /
  INTERRUPT), and the SSE streams ``stream_stdout_updates`` /
  ``stream_stderr_updates`` from a byte ``offset``.

Output in a view is the last ``last_n`` lines (100 by default) with
``*_truncated`` set when lines were dropped; the streams give all of it.
"""

from __future__ import annotations

import asyncio
import codecs
import functools
import json
from signal import SIGINT
from typing import TYPE_CHECKING, Any

from aiohttp import web

from emulators.runloop.api import ApiError, number
from emulators.runloop.devboxes import Devbox, Execution, new_id
from providers.errors import SandboxError

if TYPE_CHECKING:
    from emulators.runloop.api import DevboxApi

__all__ = ["Executions"]

EXEC_HOLD_MAX = 25.0
DEFAULT_LAST_N = 100
_EXEC_STATUSES = frozenset({"queued", "running", "completed"})


def _tail(data: bytes, last_n: int) -> tuple[str, bool]:
    lines = data.decode("utf-8", "replace").splitlines(keepends=True)
    if len(lines) <= last_n:
        return "".join(lines), False
    return "".join(lines[-last_n:]) if last_n else "", True


def _last_n(request: web.Request) -> int:
    raw = request.query.get("last_n")
    if raw is None:
        return DEFAULT_LAST_N
    if not raw.isdigit():
        raise ApiError(400, "last_n must be a non-negative integer")
    return int(raw)


def _execution_view(execution: Execution, last_n: int = DEFAULT_LAST_N) -> dict[str, Any]:
    view: dict[str, Any] = {
        "devbox_id": execution.devbox_id,
        "execution_id": execution.id,
        "status": execution.status,
        "exit_status": execution.exit_status,
    }
    if execution.exit_status is not None:
        view["stdout"], view["stdout_truncated"] = _tail(bytes(execution.stdout), last_n)
        view["stderr"], view["stderr_truncated"] = _tail(bytes(execution.stderr), last_n)
    return view


class Executions:
    """The execution handlers, over `DevboxApi`."""

    def __init__(self, api: DevboxApi) -> None:
        self.api = api
        self.core = api.core

    def routes(self) -> list[web.RouteDef]:
        base = "/v1/devboxes/{devbox_id}"
        execution = base + "/executions/{execution_id}"
        return [
            web.post(base + "/execute", self.execute),
            web.post(base + "/execute_async", self.execute_async),
            web.post(base + "/execute_sync", self.execute_sync),
            web.get(execution, self.execution),
            web.post(execution + "/wait_for_status", self.wait_for_execution),
            web.post(execution + "/kill", self.kill_execution),
            web.post(execution + "/send_std_in", self.send_std_in),
            web.get(execution + "/stream_stdout_updates", self.stream_stdout),
            web.get(execution + "/stream_stderr_updates", self.stream_stderr),
        ]

    def execution_of(self, request: web.Request) -> tuple[Devbox, Execution]:
        devbox = self.api.devbox(request)
        execution_id = request.match_info["execution_id"]
        execution = devbox.executions.get(execution_id)
        if execution is None:
            raise ApiError(404, f"Execution {execution_id} not found on devbox {devbox.id}")
        return devbox, execution

    async def _start(self, devbox: Devbox, body: dict[str, Any]) -> Execution:
        command = body.get("command")
        if not isinstance(command, str) or not command:
            raise ApiError(400, "command is required")
        command_id = body.get("command_id")
        if isinstance(command_id, str) and command_id in devbox.by_command_id:
            return devbox.executions[devbox.by_command_id[command_id]]
        attach_stdin = body.get("attach_stdin")
        if attach_stdin is not None and not isinstance(attach_stdin, bool):
            raise ApiError(400, "attach_stdin must be a boolean")
        try:
            process = await devbox.local.spawn(command, cwd=devbox.workdir)
        except SandboxError as exc:
            raise ApiError(400, exc.message) from None
        if process.proc.stdin is not None and not attach_stdin:
            process.proc.stdin.close()
        execution = Execution(
            id=new_id("exn"),
            devbox_id=devbox.id,
            command_id=command_id if isinstance(command_id, str) else None,
            process=process,
            stdin_attached=bool(attach_stdin),
            command=command,
        )
        devbox.executions[execution.id] = execution
        if execution.command_id:
            devbox.by_command_id[execution.command_id] = execution.id
        execution.task = asyncio.create_task(execution.collect(lambda: self.core.touch(devbox)))
        return execution

    async def execute(self, request: web.Request) -> web.Response:
        devbox = self.api.running(request)
        last_n = _last_n(request)
        body = await self.api.body(request)
        hold = number(
            body.get("optimistic_timeout"), "optimistic_timeout", EXEC_HOLD_MAX, EXEC_HOLD_MAX
        )
        if body.get("attach_stdin"):
            raise ApiError(400, "attach_stdin is only valid for execute_async")
        execution = await self._start(devbox, body)
        await execution.changes.wait_for(lambda: execution.exit_status is not None, hold)
        return web.json_response(_execution_view(execution, last_n))

    async def execute_async(self, request: web.Request) -> web.Response:
        devbox = self.api.running(request)
        body = await self.api.body(request)
        return web.json_response(_execution_view(await self._start(devbox, body)))

    async def execute_sync(self, request: web.Request) -> web.Response:
        """Deprecated on Runloop, still served: held to the command's end, all of its output."""
        devbox = self.api.running(request)
        body = await self.api.body(request)
        if body.get("attach_stdin"):
            raise ApiError(400, "attach_stdin is not supported by execute_sync")
        execution = await self._start(devbox, body)
        if execution.task is not None:
            await asyncio.shield(execution.task)
        return web.json_response(
            {
                "devbox_id": devbox.id,
                "exit_status": execution.exit_status,
                "stdout": execution.stdout.decode("utf-8", "replace"),
                "stderr": execution.stderr.decode("utf-8", "replace"),
            }
        )

    async def execution(self, request: web.Request) -> web.Response:
        _, execution = self.execution_of(request)
        return web.json_response(_execution_view(execution, _last_n(request)))

    async def wait_for_execution(self, request: web.Request) -> web.Response:
        _, execution = self.execution_of(request)
        last_n = _last_n(request)
        body = await self.api.body(request)
        wanted = self.api.statuses(body, _EXEC_STATUSES)
        hold = number(body.get("timeout_seconds"), "timeout_seconds", EXEC_HOLD_MAX, EXEC_HOLD_MAX)
        if not await execution.changes.wait_for(lambda: execution.status in wanted, hold):
            raise ApiError(408, f"Execution {execution.id} did not reach {sorted(wanted)}")
        return web.json_response(_execution_view(execution, last_n))

    async def kill_execution(self, request: web.Request) -> web.Response:
        devbox, execution = self.execution_of(request)
        await self.api.body(request)
        await execution.kill()
        self.core.touch(devbox)
        return web.json_response(_execution_view(execution))

    async def send_std_in(self, request: web.Request) -> web.Response:
        """Nonempty ``text`` or a ``signal`` (EOF closes stdin, INTERRUPT is a Ctrl-C)."""
        devbox, execution = self.execution_of(request)
        body = await self.api.body(request)
        text, signal = body.get("text"), body.get("signal")
        if (text is None) == (signal is None):
            raise ApiError(400, "supply exactly one of text and signal")
        if text is not None and (not isinstance(text, str) or not text):
            raise ApiError(400, "text must be a nonempty string")
        if signal is not None and signal not in ("EOF", "INTERRUPT"):
            raise ApiError(400, "signal must be one of ['EOF', 'INTERRUPT']")
        if not execution.stdin_attached:
            raise ApiError(400, f"Execution {execution.id} was not started with attach_stdin")
        if execution.exit_status is not None:
            raise ApiError(400, f"Execution {execution.id} is not running")
        if signal == "INTERRUPT":
            execution.process.kill(SIGINT)
            sent = True
        else:
            sent = await execution.send_stdin(text.encode() if text is not None else None)
        self.core.touch(devbox)
        return web.json_response(
            {"devbox_id": devbox.id, "execution_id": execution.id, "success": sent}
        )

    async def stream_stdout(self, request: web.Request) -> web.StreamResponse:
        return await self._stream(request, "stdout")

    async def stream_stderr(self, request: web.Request) -> web.StreamResponse:
        return await self._stream(request, "stderr")

    async def _stream(self, request: web.Request, which: str) -> web.StreamResponse:
        """Server-sent events, one ``{"output", "offset"}`` chunk per piece of output.

        A chunk's ``offset`` is the byte offset after it: the SDK's reconnecting
        stream asks for the last chunk's offset again, so it resumes without a repeat.
        """
        _, execution = self.execution_of(request)
        raw_offset = request.query.get("offset", "0")
        if not raw_offset.isdigit():
            raise ApiError(400, "offset must be a non-negative integer")
        offset = int(raw_offset)
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        decoder = codecs.getincrementaldecoder("utf-8")("replace")
        while True:
            buf: bytearray = getattr(execution, which)
            done = execution.exit_status is not None
            if len(buf) > offset:
                chunk = bytes(buf[offset:])
                offset += len(chunk)
                event = {"output": decoder.decode(chunk, final=done), "offset": offset}
                await response.write(f"data: {json.dumps(event)}\n\n".encode())
            elif done:
                break
            else:
                await execution.changes.wait_for(
                    functools.partial(execution.progressed, which, offset), EXEC_HOLD_MAX
                )
        await response.write_eof()
        return response
