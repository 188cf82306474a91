"""The daemon's stateful Python interpreter (``code_interpreter.run_code``).

Daytona keeps one Python worker per interpreter context; each execution
sends it the code, and the worker runs it in the context's namespace, so
variables, imports and functions stay for the next one. As Daytona's
worker does, an execution's ``envs`` are put back after it, ``SystemExit``
ends it without an error, and an error's traceback keeps only the code's
own frames (``<string>``), shown as ``<stdin>``. The emulator does
the same inside the sandbox: `WORKER` reads one JSON command per line and
answers JSON lines tagged with the command's id: ``stdout``/``stderr``
(``text``), ``error`` (``name``, ``value``, ``traceback``) and a final
``control`` (``completed``, or ``interrupted`` when the line
``{"interrupt": true}`` made it SIGINT itself: a signal from outside would
reach bubblewrap, not the worker).

The routes are `Interpreters`, under ``{toolboxProxyUrl}/{sandboxId}`` (the
proxy is `emulators.daytona.toolbox`). The websocket
``/process/interpreter/execute`` takes ``{code, contextId,
envs, timeout}`` and streams those chunks as text frames, then closes 1000.
Past ``timeout`` seconds (0: none) the worker is interrupted and has 2 s to stop,
else it is killed (its state lost; the next call starts a fresh one); either
way the close code is 4008.

Besides the default context, ``POST /process/interpreter/context`` makes
one (``{cwd}``, python only) with a worker of its own, ``GET`` lists them
(the default left out) and ``DELETE .../context/{id}`` ends one; an
execution naming an unknown context is closed 1008, ``context not found``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from aiohttp import web

from emulators.daytona.sandboxes import DAYTONA_HOME, Box
from emulators.daytona.toolbox import BOX, DaemonError, json_body
from emulators.filesystem import GuestSandbox, PathRefused
from providers.local import LocalProcess

__all__ = ["DEFAULT_TIMEOUT", "TIMEOUT_CLOSE", "WORKER", "Interpreter", "Interpreters"]

TIMEOUT_CLOSE = 4008
_GRACE_SECONDS = 2.0
DEFAULT_TIMEOUT = 600  # seconds, when a call names none

WORKER = r"""
import json, os, queue, signal, sys, threading, traceback

# Python leaves SIGINT ignored when it starts so (a background job's child): take it anyway.
signal.signal(signal.SIGINT, signal.default_int_handler)
out = os.fdopen(os.dup(1), "w", buffering=1)
namespace = {"__name__": "__main__", "__doc__": None, "__package__": None,
             "__builtins__": __builtins__}
commands = queue.Queue()

def read():
    for line in sys.stdin:
        message = json.loads(line)
        if message.get("interrupt"):
            os.kill(os.getpid(), signal.SIGINT)
        else:
            commands.put(message)
    commands.put(None)

class Stream:
    def __init__(self, kind, cid):
        self.kind, self.cid = kind, cid
    def write(self, text):
        if text:
            out.write(json.dumps({"id": self.cid, "type": self.kind, "text": text}) + "\n")
        return len(text)
    def flush(self):
        pass

def cleaned(exc):
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename == "<string>"]
    lines = ["Traceback (most recent call last):\n"] if frames else []
    for frame in frames:
        lines.append('  File "<stdin>", line %d\n' % frame.lineno)
        if frame.line:
            lines.append("    %s\n" % frame.line)
    return "".join(lines) + "%s: %s\n" % (type(exc).__name__, exc)

threading.Thread(target=read, daemon=True).start()
while True:
    try:
        command = commands.get()
    except KeyboardInterrupt:
        continue
    if command is None:
        break
    cid = command["id"]
    envs = command.get("envs") or {}
    saved = {name: os.environ.get(name) for name in envs}
    os.environ.update(envs)
    sys.stdout, sys.stderr = Stream("stdout", cid), Stream("stderr", cid)
    status = "completed"
    try:
        exec(compile(command["code"], "<string>", "exec"), namespace)
    except KeyboardInterrupt:
        status = "interrupted"
    except SystemExit:
        pass
    except BaseException as exc:
        chunk = {"id": cid, "type": "error", "name": type(exc).__name__, "value": str(exc),
                 "traceback": cleaned(exc)}
        out.write(json.dumps(chunk) + "\n")
    sys.stdout, sys.stderr = sys.__stdout__, sys.__stderr__
    for name, value in saved.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
    out.write(json.dumps({"id": cid, "type": "control", "text": status}) + "\n")
"""


class Interpreter:
    """One interpreter context of a sandbox: a worker, one execution at a time."""

    def __init__(self, sandbox: GuestSandbox, cwd: str, context_id: str = "default") -> None:
        self.sandbox = sandbox
        self.cwd = cwd
        self.id = context_id
        self.created = time.time()
        self._worker: LocalProcess | None = None
        self._lock = asyncio.Lock()

    async def _started(self) -> LocalProcess:
        if self._worker is None or self._worker.proc.returncode is not None:
            self._worker = await self.sandbox.spawn(["python3", "-u", "-c", WORKER], cwd=self.cwd)
        return self._worker

    async def execute(self, code: str, envs: Mapping[str, str], timeout: float, send: Any) -> int:
        """Run ``code``, handing each chunk (a dict) to ``send``; the close code to answer."""
        async with self._lock:
            worker = await self._started()
            assert worker.proc.stdin is not None
            cid = str(uuid.uuid4())
            command = {"id": cid, "code": self.sandbox.rewrite(code), "envs": dict(envs)}
            worker.proc.stdin.write(json.dumps(command).encode() + b"\n")
            reading = asyncio.ensure_future(self._relay(worker, cid, send))
            try:
                status = await asyncio.wait_for(asyncio.shield(reading), timeout or None)
            except TimeoutError:
                worker.proc.stdin.write(b'{"interrupt": true}\n')
                try:
                    await asyncio.wait_for(asyncio.shield(reading), _GRACE_SECONDS)
                except TimeoutError:
                    worker.kill()
                return TIMEOUT_CLOSE
            finally:
                if not reading.done():
                    reading.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await reading
            return TIMEOUT_CLOSE if status == "interrupted" else 1000

    @staticmethod
    async def _relay(worker: LocalProcess, cid: str, send: Any) -> str:
        stdout = worker.proc.stdout
        assert stdout is not None
        while line := await stdout.readline():
            try:
                chunk = json.loads(line)
            except ValueError:
                continue
            if chunk.pop("id", None) != cid:
                continue  # what an abandoned execution still printed
            if chunk["type"] == "control":
                return str(chunk["text"])
            await send(chunk)
        return "interrupted"

    def info(self) -> dict[str, Any]:
        """The context as the daemon shows it (``InterpreterContext``)."""
        created = datetime.fromtimestamp(self.created, UTC).isoformat().replace("+00:00", "Z")
        return {
            "id": self.id,
            "cwd": self.cwd,
            "createdAt": created,
            "active": True,
            "language": "python",
        }

    async def close(self) -> None:
        if self._worker is not None and self._worker.proc.returncode is None:
            self._worker.kill()
            await self._worker.proc.wait()


class Interpreters:
    """The interpreter handlers (the sandbox is the proxy's `BOX`)."""

    def routes(self) -> list[web.RouteDef]:
        base = "/toolbox/{sandbox}/process/interpreter"
        return [
            web.get(base + "/execute", self.interpret),
            web.post(base + "/context", self.create_context),
            web.get(base + "/context", self.list_contexts),
            web.delete(base + "/context/{context}", self.delete_context),
        ]

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
        body = await json_body(request)
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
