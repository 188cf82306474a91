"""The code interpreter (the Jupyter server on port 49999 of code-interpreter templates).

``POST /execute`` takes ``{code, context_id, language, env_vars}`` and
streams NDJSON: ``stdout`` / ``stderr`` messages as the code prints,
``result`` for the value of the last expression (``is_main_result``) and
for what the cell displays (matplotlib figures as ``image/png``, as
IPython's inline backend shows them), ``error`` with name, value and
traceback, and ``number_of_executions``. A result's formats come from the
object's ``_repr_*_`` methods, its text from its ``repr`` with one pair of
enclosing quotes dropped (E2B's server drops them).

Python runs in kernels, one per context, as E2B's server runs a Jupyter
kernel per context: each is a long-lived interpreter started in the local
sandbox, in its context's directory (``/home/user`` by default), so state
survives between executions. A kernel reads one JSON request per line on
stdin and answers on a private copy of its stdout, each line tagged with the
request's id; the code's own fd 1 is pointed at stderr so nothing the code
does can corrupt the protocol. ``env_vars`` are set for one execution and
put back after it (to the sandbox's value, or unset), as E2B does.

A client that goes away (its timeout) interrupts the kernel (SIGINT, sent by
the kernel itself on a request line: a signal from outside would reach
bubblewrap), and its state stays, as E2B's server does since #213; a kernel
that dies is started afresh for the next execution (its count from 1), the
execution it died in answering ``ContextRestarting``.

``/contexts`` makes (``{cwd, language}``, python only), lists, removes
(``DELETE /contexts/{id}``) and restarts (``POST /contexts/{id}/restart``)
contexts; the default python context is listed among them. Bash runs as one
command per execution. Only the code interpreter templates
(``code-interpreter-*``) run it: on any other template the port is closed
and E2B's proxy answers 502.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import time
import uuid
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from aiohttp import web

from emulators.e2b.sandboxes import E2B_HOME, E2BSandbox
from providers.local import LocalProcess

if TYPE_CHECKING:
    from emulators.e2b import E2BEmulator
    from emulators.e2b.envd import Envd

__all__ = ["Context", "Contexts", "Interpreter", "Kernel"]

KERNEL = r"""
import ast, base64, io, json, linecache, os, queue, signal, sys, threading, time, traceback
import warnings

# Python leaves SIGINT ignored when it starts so (a background job's child): take it anyway.
signal.signal(signal.SIGINT, signal.default_int_handler)
proto = os.fdopen(os.dup(1), "w", buffering=1)
os.dup2(2, 1)
lock = threading.Lock()
commands = queue.Queue()
os.environ.setdefault("MPLBACKEND", "Agg")
warnings.filterwarnings("ignore", message=".*non-interactive.*cannot be shown")


def emit(**message):
    with lock:
        proto.write(json.dumps(message) + "\n")
        proto.flush()


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
        self.kind, self.cid, self.buffer = kind, cid, ""

    def write(self, text):
        self.buffer += text
        while "\n" in self.buffer or len(self.buffer) > 16384:
            cut = self.buffer.find("\n") + 1 or 16384
            self.flush(cut)
        return len(text)

    def flush(self, cut=None):
        text, self.buffer = self.buffer[:cut], self.buffer[cut:] if cut else ""
        if text:
            emit(id=self.cid, type=self.kind, text=text, timestamp=time.time_ns())

    def isatty(self):
        return False


REPRS = {"_repr_html_": "text/html", "_repr_markdown_": "text/markdown",
         "_repr_svg_": "image/svg+xml", "_repr_png_": "image/png", "_repr_jpeg_": "image/jpeg",
         "_repr_latex_": "text/latex", "_repr_json_": "application/json",
         "_repr_javascript_": "application/javascript", "_repr_pdf_": "application/pdf"}


def png(figure):
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", bbox_inches="tight")
    return base64.b64encode(buffer.getvalue()).decode()


def is_figure(value):
    return type(value).__module__ == "matplotlib.figure" and type(value).__name__ == "Figure"


def bundle(value):
    data = {"text/plain": repr(value)}
    for method, mime in REPRS.items():
        shown = getattr(type(value), method, None)
        if not callable(shown):
            continue
        try:
            shown = getattr(value, method)()
        except Exception:
            continue
        if isinstance(shown, tuple):
            shown = shown[0]
        if isinstance(shown, bytes):
            shown = base64.b64encode(shown).decode()
        if shown is not None:
            data[mime] = shown
    if is_figure(value):
        data["image/png"] = png(value)
    return data


class Figures:
    def __init__(self):
        self.cid, self.shown = None, set()

    def flush(self, *args, **kwargs):
        pyplot = sys.modules.get("matplotlib.pyplot")
        if pyplot is None:
            return
        for number in pyplot.get_fignums():
            figure = pyplot.figure(number)
            if id(figure) not in self.shown:
                data = {"text/plain": repr(figure), "image/png": png(figure)}
                emit(id=self.cid, type="display_data", data=data)
        pyplot.close("all")


figures = Figures()
namespace = {"__name__": "__main__"}
count = 0
threading.Thread(target=read, daemon=True).start()
while True:
    try:
        request = commands.get()
    except KeyboardInterrupt:
        continue
    if request is None:
        break
    cid = request["id"]
    count += 1
    emit(id=cid, type="number_of_executions", execution_count=count)
    env = request.get("env") or {}
    saved = {name: os.environ.get(name) for name in env}
    os.environ.update(env)
    figures.cid, figures.shown = cid, set()
    if "matplotlib.pyplot" in sys.modules:
        sys.modules["matplotlib.pyplot"].show = figures.flush
    sys.stdout, sys.stderr = Stream("stdout", cid), Stream("stderr", cid)
    try:
        cell = "<cell-%d>" % count
        linecache.cache[cell] = (len(request["code"]), None, request["code"].splitlines(True), cell)
        tree = ast.parse(request["code"], cell, "exec")
        last = tree.body.pop() if tree.body and isinstance(tree.body[-1], ast.Expr) else None
        exec(compile(tree, cell, "exec"), namespace)
        if last is not None:
            value = eval(compile(ast.Expression(last.value), cell, "eval"), namespace)
            if value is not None:
                sys.stdout.flush()
                if is_figure(value):
                    figures.shown.add(id(value))
                emit(id=cid, type="execute_result", data=bundle(value))
        figures.flush()
    except BaseException as exc:
        sys.stdout.flush()
        sys.stderr.flush()
        tb = exc.__traceback__.tb_next  # from the cell's frame on, as IPython shows it
        lines = traceback.format_exception(type(exc), exc, tb)
        emit(id=cid, type="error", name=type(exc).__name__, value=str(exc),
             traceback="".join(lines))
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        sys.stdout, sys.stderr = sys.__stdout__, sys.__stderr__
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
    emit(id=cid, type="__done__")
"""

_FORMATS = {
    "text/plain": "text",
    "text/html": "html",
    "text/markdown": "markdown",
    "image/svg+xml": "svg",
    "image/png": "png",
    "image/jpeg": "jpeg",
    "application/pdf": "pdf",
    "text/latex": "latex",
    "application/json": "json",
    "application/javascript": "javascript",
}


def _message(**fields: object) -> bytes:
    return json.dumps(fields).encode()


def _result(data: dict[str, Any], *, main: bool) -> bytes:
    """A ``result`` message as E2B's server makes it from a Jupyter display bundle."""
    message: dict[str, Any] = {"type": "result", "is_main_result": main}
    for mime, shown in data.items():
        name = _FORMATS.get(mime)
        if name is None:
            message.setdefault("extra", {})[mime] = shown
        elif name == "text" and len(shown) >= 2 and shown[0] == shown[-1] and shown[0] in "'\"":
            message[name] = shown[1:-1]
        else:
            message[name] = shown
    return json.dumps(message).encode()


class Kernel:
    """A Python interpreter kept running in a sandbox; one execution at a time."""

    def __init__(self, process: LocalProcess, rewrite: Callable[[str], str]) -> None:
        self.process = process
        self.rewrite = rewrite
        self.lock = asyncio.Lock()
        self.dead = False
        self._ids = itertools.count(1)

    @classmethod
    async def start(cls, sandbox: E2BSandbox, python: str, cwd: str) -> Kernel:
        process = await sandbox.local.spawn([python, "-u", "-c", KERNEL], cwd=cwd)
        return cls(process, sandbox.local.rewrite)

    async def execute(self, code: str, env: dict[str, str]) -> AsyncGenerator[bytes, None]:
        """The NDJSON lines of one execution; a client that leaves interrupts it."""
        stdin, stdout = self.process.proc.stdin, self.process.proc.stdout
        assert stdin is not None
        assert stdout is not None
        async with self.lock:
            cid = next(self._ids)
            finished = False
            try:
                request = {"id": cid, "code": self.rewrite(code), "env": env}
                stdin.write(json.dumps(request).encode() + b"\n")
                await stdin.drain()
                while True:
                    line = await stdout.readline()
                    if not line:
                        raise ConnectionResetError
                    try:
                        message = json.loads(line)
                    except ValueError:
                        continue
                    if message.pop("id", None) != cid:
                        continue  # what an interrupted execution still sent
                    kind = message["type"]
                    if kind == "__done__":
                        finished = True
                        return
                    if kind in ("execute_result", "display_data"):
                        yield _result(message["data"], main=kind == "execute_result")
                    else:
                        yield json.dumps(message).encode()
            except (ConnectionResetError, BrokenPipeError):
                self.kill()
                finished = True
                yield _message(
                    type="error",
                    name="ContextRestarting",
                    value="Context was restarted",
                    traceback="",
                )
            finally:
                if not finished:
                    self.interrupt()

    def interrupt(self) -> None:
        """SIGINT the running execution (the kernel signals itself: see the module doc)."""
        stdin = self.process.proc.stdin
        if not self.dead and stdin is not None and not stdin.is_closing():
            stdin.write(b'{"interrupt": true}\n')

    def kill(self) -> None:
        self.dead = True
        self.process.kill()


@dataclass
class Context:
    """A code context: its kernel, started by its first execution."""

    id: str
    cwd: str
    language: str = "python"
    kernel: Kernel | None = None

    def view(self) -> dict[str, str]:
        return {"id": self.id, "language": self.language, "cwd": self.cwd}

    async def running(self, sandbox: E2BSandbox, python: str) -> Kernel:
        """Its kernel, a fresh one when it has none or it died (Jupyter restarts it)."""
        if (
            self.kernel is None
            or self.kernel.dead
            or self.kernel.process.proc.returncode is not None
        ):
            self.kernel = await Kernel.start(sandbox, python, self.cwd)
        return self.kernel

    def close(self) -> None:
        if self.kernel is not None:
            self.kernel.kill()
            self.kernel = None


@dataclass
class Contexts:
    """A sandbox's contexts; the default python one made when first needed."""

    default: Context = field(default_factory=lambda: Context(str(uuid.uuid4()), E2B_HOME))
    made: dict[str, Context] = field(default_factory=dict)

    def all(self) -> list[Context]:
        return [self.default, *self.made.values()]

    def get(self, context_id: str) -> Context | None:
        return self.default if context_id == self.default.id else self.made.get(context_id)

    def close(self) -> None:
        for context in self.all():
            context.close()


class Interpreter:
    """``/execute`` and ``/contexts`` for every sandbox, through envd's sandbox lookup."""

    def __init__(self, emulator: E2BEmulator, envd: Envd) -> None:
        self.envd = envd
        self.python = emulator.core.local.opts.python

    def routes(self) -> list[web.RouteDef]:
        return [
            web.post("/execute", self.execute),
            web.post("/contexts", self.create_context),
            web.get("/contexts", self.list_contexts),
            web.delete("/contexts/{context}", self.remove_context),
            web.post("/contexts/{context}/restart", self.restart_context),
        ]

    async def _sandbox(self, request: web.Request) -> E2BSandbox | web.Response:
        sandbox = await self.envd.sandbox(request, envd=False)
        if not sandbox.has_interpreter:  # E2B's proxy: nothing listens on the port
            body = {
                "sandboxId": sandbox.id,
                "message": "The sandbox is running but port is not open",
                "port": 49999,
                "code": 502,
            }
            return web.json_response(body, status=502)
        return sandbox

    async def execute(self, request: web.Request) -> web.StreamResponse:
        sandbox = await self._sandbox(request)
        if isinstance(sandbox, web.Response):
            return sandbox
        try:
            body = await request.json()
            code = body["code"]
        except (ValueError, KeyError, TypeError):
            return web.Response(status=400, text="expected a JSON body with code")
        context_id, language = body.get("context_id"), body.get("language")
        if context_id and language:
            return web.Response(
                status=400, text="Only one of context_id or language can be provided"
            )
        context = sandbox.contexts.get(context_id) if context_id else sandbox.contexts.default
        if context is None:
            return web.Response(status=404, text=f"Context {context_id} not found")
        language = language or context.language
        if language not in ("python", "bash"):
            return web.Response(status=400, text=f"language {language!r} is not supported")
        env = body.get("env_vars") or {}
        response = web.StreamResponse(headers={"Content-Type": "application/x-ndjson"})
        await response.prepare(request)
        if language == "python":
            kernel = await context.running(sandbox, self.python)
            lines = kernel.execute(code, env)
        else:
            lines = _bash(sandbox, code, env)
        try:
            async for line in lines:
                await response.write(line + b"\n")
        finally:
            await lines.aclose()  # a client gone: the kernel is interrupted, its state kept
        await response.write(b'{"type": "end_of_execution"}\n')
        await response.write_eof()
        return response

    async def create_context(self, request: web.Request) -> web.Response:
        sandbox = await self._sandbox(request)
        if isinstance(sandbox, web.Response):
            return sandbox
        try:
            body = await request.json()
        except ValueError:
            body = {}
        language = (body.get("language") or "python").lower()
        if language != "python":
            return web.Response(status=500, text=f"Failed to create context: no {language} kernel")
        context = Context(str(uuid.uuid4()), body.get("cwd") or E2B_HOME)
        try:
            sandbox.local.host(context.cwd)
        except Exception:
            return web.Response(status=500, text="Failed to set working directory")
        sandbox.contexts.made[context.id] = context
        return web.json_response(context.view())

    async def list_contexts(self, request: web.Request) -> web.Response:
        sandbox = await self._sandbox(request)
        if isinstance(sandbox, web.Response):
            return sandbox
        return web.json_response([c.view() for c in sandbox.contexts.all()])

    async def remove_context(self, request: web.Request) -> web.Response:
        sandbox = await self._sandbox(request)
        if isinstance(sandbox, web.Response):
            return sandbox
        context_id = request.match_info["context"]
        context = sandbox.contexts.made.pop(context_id, None)
        if context is None:
            return web.Response(status=404, text=f"Context {context_id} not found")
        context.close()
        return web.json_response(None)

    async def restart_context(self, request: web.Request) -> web.Response:
        sandbox = await self._sandbox(request)
        if isinstance(sandbox, web.Response):
            return sandbox
        context_id = request.match_info["context"]
        context = sandbox.contexts.get(context_id)
        if context is None:
            return web.Response(status=404, text=f"Context {context_id} not found")
        context.close()
        return web.json_response(None)


async def _bash(sandbox: E2BSandbox, code: str, env: dict[str, str]) -> AsyncGenerator[bytes, None]:
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
