"""The code interpreter (the Jupyter server on port 49999 of code-interpreter templates).

``POST /execute`` takes ``{code, context_id, language, env_vars}`` and
streams NDJSON: ``stdout`` / ``stderr`` messages as the code prints,
``result`` for the value of the last expression (``is_main_result``),
``error`` with name, value and traceback, and ``number_of_executions``.

Python runs in a kernel: one long-lived interpreter per sandbox, started in
the local sandbox, so state survives between executions as in Jupyter. The
kernel reads one JSON request per line on stdin and answers on a private
copy of its stdout; the code's own fd 1 is pointed at stderr so nothing the
code does can corrupt the protocol. A client that goes away (its timeout)
kills the kernel; the next execution starts a fresh one. Bash runs as one
command per execution. Only the default context exists. Only the code
interpreter templates (``code-interpreter-*``) run it: on any other template
the port is closed and E2B's proxy answers 502.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING

from aiohttp import web

from emulators.e2b.sandboxes import E2BSandbox
from providers.local import LocalProcess

if TYPE_CHECKING:
    from emulators.e2b import E2BEmulator
    from emulators.e2b.envd import Envd

__all__ = ["Interpreter", "Kernel"]

_DONE = b'{"type": "__done__"}'

KERNEL = r"""
import ast, json, os, sys, time, traceback

proto = os.fdopen(os.dup(1), "w", buffering=1)
os.dup2(2, 1)


def emit(**message):
    proto.write(json.dumps(message) + "\n")
    proto.flush()


class Stream:
    def __init__(self, kind):
        self.kind, self.buffer = kind, ""

    def write(self, text):
        self.buffer += text
        while "\n" in self.buffer or len(self.buffer) > 16384:
            cut = self.buffer.find("\n") + 1 or 16384
            self.flush(cut)
        return len(text)

    def flush(self, cut=None):
        text, self.buffer = self.buffer[:cut], self.buffer[cut:] if cut else ""
        if text:
            emit(type=self.kind, text=text, timestamp=time.time_ns())

    def isatty(self):
        return False


namespace = {"__name__": "__main__"}
count = 0
for line in sys.stdin:
    request = json.loads(line)
    count += 1
    saved_env = dict(os.environ)
    os.environ.update(request.get("env") or {})
    sys.stdout, sys.stderr = Stream("stdout"), Stream("stderr")
    try:
        tree = ast.parse(request["code"], "<cell>", "exec")
        last = tree.body.pop() if tree.body and isinstance(tree.body[-1], ast.Expr) else None
        exec(compile(tree, "<cell>", "exec"), namespace)
        if last is not None:
            value = eval(compile(ast.Expression(last.value), "<cell>", "eval"), namespace)
            if value is not None:
                sys.stdout.flush()
                emit(type="result", text=repr(value), is_main_result=True)
    except BaseException as exc:
        sys.stdout.flush()
        sys.stderr.flush()
        emit(type="error", name=type(exc).__name__, value=str(exc),
             traceback=traceback.format_exc())
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        sys.stdout, sys.stderr = sys.__stdout__, sys.__stderr__
        os.environ.clear()
        os.environ.update(saved_env)
    emit(type="number_of_executions", execution_count=count)
    emit(type="__done__")
"""


def _message(**fields: object) -> bytes:
    return json.dumps(fields).encode()


class Kernel:
    """A Python interpreter kept running in a sandbox; one execution at a time."""

    def __init__(self, process: LocalProcess, rewrite: Callable[[str], str]) -> None:
        self.process = process
        self.rewrite = rewrite
        self.lock = asyncio.Lock()
        self.dead = False

    @classmethod
    async def start(cls, sandbox: E2BSandbox, python: str) -> Kernel:
        return cls(await sandbox.local.spawn([python, "-u", "-c", KERNEL]), sandbox.local.rewrite)

    async def execute(self, code: str, env: dict[str, str]) -> AsyncIterator[bytes]:
        """The NDJSON lines of one execution."""
        stdin, stdout = self.process.proc.stdin, self.process.proc.stdout
        assert stdin is not None
        assert stdout is not None
        async with self.lock:
            try:
                request = {"code": self.rewrite(code), "env": env}
                stdin.write(json.dumps(request).encode() + b"\n")
                await stdin.drain()
                while (line := await stdout.readline()).strip() != _DONE:
                    if not line:
                        raise ConnectionResetError
                    yield line.rstrip(b"\n")
            except (ConnectionResetError, BrokenPipeError):
                self.kill()
                yield _message(
                    type="error",
                    name="DeadKernelError",
                    value="the kernel died during the execution",
                    traceback="",
                )

    def kill(self) -> None:
        self.dead = True
        self.process.kill()


class Interpreter:
    """``/execute`` for every sandbox, through envd's sandbox lookup."""

    def __init__(self, emulator: E2BEmulator, envd: Envd) -> None:
        self.envd = envd
        self.python = emulator.core.local.opts.python

    def routes(self) -> list[web.RouteDef]:
        return [web.post("/execute", self.execute)]

    async def execute(self, request: web.Request) -> web.StreamResponse:
        sandbox = await self.envd.sandbox(request)
        if not sandbox.has_interpreter:  # E2B's proxy: nothing listens on the port
            body = {
                "sandboxId": sandbox.id,
                "message": "The sandbox is running but port is not open",
                "port": 49999,
                "code": 502,
            }
            return web.json_response(body, status=502)
        try:
            body = await request.json()
            code = body["code"]
        except (ValueError, KeyError, TypeError):
            return web.Response(status=400, text="expected a JSON body with code")
        if body.get("context_id"):
            return web.Response(status=404, text=f"context {body['context_id']} not found")
        language = body.get("language") or "python"
        if language not in ("python", "bash"):
            return web.Response(status=400, text=f"language {language!r} is not supported")
        env = body.get("env_vars") or {}
        response = web.StreamResponse(headers={"Content-Type": "application/x-ndjson"})
        await response.prepare(request)
        lines = (
            self._python(sandbox, code, env) if language == "python" else _bash(sandbox, code, env)
        )
        try:
            async for line in lines:
                await response.write(line + b"\n")
        except (asyncio.CancelledError, ConnectionResetError):
            if sandbox.kernel is not None and language == "python":
                sandbox.kernel.kill()
                sandbox.kernel = None
            raise
        await response.write_eof()
        return response

    async def _python(
        self, sandbox: E2BSandbox, code: str, env: dict[str, str]
    ) -> AsyncIterator[bytes]:
        if sandbox.kernel is None or sandbox.kernel.dead:
            sandbox.kernel = await Kernel.start(sandbox, self.python)
        async for line in sandbox.kernel.execute(code, env):
            yield line


async def _bash(sandbox: E2BSandbox, code: str, env: dict[str, str]) -> AsyncIterator[bytes]:
    process = await sandbox.local.spawn(["/bin/bash", "-c", code], env=env)
    try:
        out, err, exit_code, _ = await process.communicate(None, None)
    finally:
        process.kill()
    now = time.time_ns()
    if out:
        yield _message(type="stdout", text=out.decode("utf-8", "replace"), timestamp=now)
    if err:
        yield _message(type="stderr", text=err.decode("utf-8", "replace"), timestamp=now)
    if exit_code != 0:
        yield _message(
            type="error", name="ExitCode", value=f"exit status {exit_code}", traceback=""
        )
