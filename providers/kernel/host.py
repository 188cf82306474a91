"""The router's code kernel, host side: one kernel process per code context.

Where the vendor has no kernel, `Interpreter` brings one: on a context's
first ``run_code`` it starts `providers.kernel.program` in the sandbox as a
background process (`Sandbox.start`), sends it the program on stdin, and
from then on one JSON line per cell; the answers are frames on the
process's stdout, each line prefixed with a token made for that kernel, so
nothing else on the channel can pass for one. A context is a process of
its own, so its variables, imports and working directory are its own.

A kernel that ends (killed from outside, ``os._exit`` in a cell, a cell
past its timeout that ignored the interrupt) is started anew by the next
call, whose result says so (``restarted``); the cell it ended during says
its state is not kept (``stateful`` False). A cell the kernel never began
(it ended first) is sent once more to the new kernel. A kernel that answers
nothing past the cell's timeout plus `SLACK_SECONDS` is killed.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import secrets
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from typing import TYPE_CHECKING, Any, Literal

from providers.capabilities import Capability
from providers.code import CodeContext, CodeError, RichResult
from providers.errors import InvalidArgument, ProviderError, SandboxError, Unsupported
from providers.kernel import program

if TYPE_CHECKING:
    from providers.base import CodeResult, Sandbox
    from providers.processes import Process

__all__ = ["BOOTSTRAP", "SLACK_SECONDS", "Interpreter", "Kernel", "refuse_context"]

SLACK_SECONDS = 5.0  # past a cell's timeout and the kernel's own escalation
_DIAGNOSTICS = 4096  # the last characters of the kernel's own stderr kept for errors

BOOTSTRAP = """import os,sys,json
b=b''
while b'\\n' not in b:
 c=os.read(0,65536)
 if not c:raise SystemExit(0)
 b+=c
s,_,r=b.partition(b'\\n')
g={'__name__':'sandbox_router_kernel'}
exec(compile(json.loads(s),'<sandbox-router-kernel>','exec'),g)
g['main'](sys.argv[1],r)
"""
"""What ``python -c`` runs: read the program (one JSON line of stdin), run its ``main``."""


@cache
def source() -> str:
    """The text of `providers.kernel.program`, as the sandbox runs it."""
    return resources.files("providers.kernel").joinpath("program.py").read_text("utf-8")


Ending = Literal["done", "unsent", "lost", "deadline"]


@dataclass
class _Cell:
    """What one cell's frames brought so far."""

    id: int
    stdout: list[str] = field(default_factory=list)
    stderr: list[str] = field(default_factory=list)
    results: list[RichResult] = field(default_factory=list)
    error: CodeError | None = None
    started: bool = False
    timed_out: bool = False
    ending: asyncio.Future[Ending] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )

    def end(self, how: Ending) -> None:
        if not self.ending.done():
            self.ending.set_result(how)


class Kernel:
    """One kernel process of a sandbox, one cell at a time."""

    def __init__(self, sandbox: Sandbox, python: str, cwd: str | None) -> None:
        self._sandbox = sandbox
        self._python = python
        self._cwd = cwd
        self._token = "\x1esandbox-router:" + secrets.token_hex(8) + ":"
        self._process: Process | None = None
        self._reader: asyncio.Task[None] | None = None
        self._lock = asyncio.Lock()
        self._ids = itertools.count(1)
        self._cells: dict[int, _Cell] = {}
        self._diagnostics = ""
        self.ran = False  # a cell began here: it holds state a restart would lose
        self.ended = False

    async def _start(self) -> Process:
        if self._process is not None:
            return self._process
        argv = [self._python, "-u", "-c", BOOTSTRAP, self._token]
        env = {"PYTHONUNBUFFERED": "1", "PYTHONIOENCODING": "utf-8"}
        process = await self._sandbox.start(argv, env=env, cwd=self._cwd)
        process.discard_output()
        self._process = process
        self._reader = asyncio.ensure_future(self._read(process))
        try:
            await process.write_stdin(json.dumps(source()) + "\n")
        except ProviderError:
            if not await self._ending():
                await self.close()
                raise
            # It ended before it read its program (a python that cannot run): the caller
            # finds it ended and says why, from what it printed.
        except BaseException:
            await self.close()
            raise
        return process

    async def _read(self, process: Process) -> None:
        buffer = ""
        try:
            async for chunk in process.output():
                if chunk.stream == "stderr":
                    self._diagnostics = (self._diagnostics + chunk.data)[-_DIAGNOSTICS:]
                    continue
                buffer += chunk.data
                if "\n" not in chunk.data:
                    continue  # a frame (a figure's) may come in many chunks
                *lines, buffer = buffer.split("\n")
                for line in lines:
                    if line.startswith(self._token):
                        self._frame(json.loads(line[len(self._token) :]))
        except (ProviderError, ValueError) as exc:
            self._diagnostics += f"\n(the kernel's output could not be read: {exc})"
            with contextlib.suppress(ProviderError):
                await process.kill()  # no kernel left running that nothing reads
        finally:
            self.ended = True
            for cell in self._cells.values():
                cell.end("lost" if cell.started else "unsent")

    def _frame(self, frame: dict[str, Any]) -> None:
        cell = self._cells.get(frame.get("id", -1))
        if cell is None:
            return  # what a cell given up on still sends
        kind = frame.pop("type", None)
        if kind == "start":
            cell.started = self.ran = True
        elif kind == "stdout":
            cell.stdout.append(str(frame.get("text", "")))
        elif kind == "stderr":
            cell.stderr.append(str(frame.get("text", "")))
        elif kind == "result":
            main = bool(frame.pop("is_main_result", False))
            frame.pop("id", None)
            cell.results.append(RichResult.of_formats(frame, is_main_result=main))
        elif kind == "error":
            cell.error = CodeError(
                str(frame.get("name", "")),
                str(frame.get("value", "")),
                str(frame.get("traceback", "")),
            )
        elif kind == "done":
            cell.timed_out = bool(frame.get("timed_out"))
            cell.end("lost" if frame.get("lost") else "done")

    async def run(
        self, code: str, env: Mapping[str, str] | None, timeout: float | None
    ) -> tuple[_Cell, Ending]:
        """Run one cell; how it ended: ``done``, or ``unsent`` (the kernel ended before it
        began), ``lost`` (the kernel ended during it) or ``deadline`` (killed here)."""
        async with self._lock:
            process = await self._start()
            cell = _Cell(next(self._ids))
            self._cells[cell.id] = cell
            try:
                if self.ended:
                    return cell, "unsent"
                request = {
                    "op": "run",
                    "id": cell.id,
                    "code": code,
                    "env": dict(env or {}),
                    "timeout": timeout,
                }
                try:
                    await process.write_stdin(json.dumps(request) + "\n")
                except ProviderError:
                    if not await self._ending():
                        raise
                    return cell, "unsent"  # it ended meanwhile: the next kernel takes the cell
                deadline = None if timeout is None else timeout + program.ESCALATE_SECONDS
                try:
                    how = await asyncio.wait_for(
                        asyncio.shield(cell.ending),
                        None if deadline is None else deadline + SLACK_SECONDS,
                    )
                except TimeoutError:
                    await self.close()
                    return cell, "deadline"
                except asyncio.CancelledError:
                    with contextlib.suppress(Exception):
                        await asyncio.wait_for(self._interrupt(process, cell.id), SLACK_SECONDS)
                    raise
                return cell, how
            finally:
                del self._cells[cell.id]

    async def _ending(self) -> bool:
        """Whether the kernel has ended, once its output says so (a write it refused may
        come before the end of its output)."""
        if self._reader is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(self._reader), SLACK_SECONDS)
        return self.ended

    @property
    def process(self) -> Process | None:
        """The kernel's process, once started."""
        return self._process

    async def _interrupt(self, process: Process, cell_id: int) -> None:
        await process.write_stdin(json.dumps({"op": "interrupt", "id": cell_id}) + "\n")

    async def exit_code(self) -> int | None:
        """The ended kernel's exit code, when its process says."""
        if self._process is None or not self._process.finished:
            return None
        with contextlib.suppress(Exception):
            return (await self._process.wait(1.0)).exit_code
        return None

    @property
    def diagnostics(self) -> str:
        """The end of what the kernel itself wrote to stderr (its own failures)."""
        return self._diagnostics.strip()

    async def close(self) -> None:
        """Kill the kernel process (its state goes with it)."""
        self.ended = True
        if self._process is not None and not self._process.finished:
            with contextlib.suppress(ProviderError):
                await self._process.kill()
        if self._reader is not None and not self._reader.done():
            with contextlib.suppress(TimeoutError, asyncio.CancelledError):
                await asyncio.wait_for(asyncio.shield(self._reader), SLACK_SECONDS)


class Interpreter:
    """``run_code`` for Python on a sandbox, through the router's kernels.

    Args:
        sandbox: the sandbox the kernels run in (its `Sandbox.start`).
        python: the interpreter to start there (``python3``).
    """

    def __init__(self, sandbox: Sandbox, python: str) -> None:
        self._sandbox = sandbox
        self._python = python
        self._kernels: dict[str | None, Kernel] = {}
        self._contexts: dict[str, CodeContext] = {}

    def context(self, cwd: str | None) -> CodeContext:
        """A new context; its kernel starts with its first cell."""
        made = CodeContext(secrets.token_hex(8), "python", cwd)
        self._contexts[made.id] = made
        return made

    async def remove(self, context: CodeContext) -> None:
        """End a context and its kernel; SandboxError when this handle has no such context."""
        self._known(context)
        del self._contexts[context.id]
        kernel = self._kernels.pop(context.id, None)
        if kernel is not None:
            await kernel.close()

    def _known(self, context: CodeContext) -> None:
        if self._contexts.get(context.id) != context:
            raise SandboxError(
                f"no code context {context.id!r} here: removed, or made by another handle "
                "(a router kernel lives with the handle that started it)",
                provider=self._sandbox.provider,
                sandbox_id=self._sandbox.id,
            )

    async def run(
        self,
        code: str,
        *,
        context: CodeContext | None,
        timeout: float | None,
        env: Mapping[str, str] | None,
    ) -> CodeResult:
        from providers.base import CodeResult

        if context is not None:
            self._known(context)
        key = None if context is None else context.id
        started = time.monotonic()
        restarted = False
        for _ in range(2):  # a cell the kernel never began is sent once more
            kernel, lost = self._kernel(key, context)
            restarted = restarted or lost
            cell, how = await kernel.run(code, env, timeout)
            if how != "unsent":
                break
            if not kernel.ran and not cell.started:
                await self._refuse_start(kernel)
        error, stateful = cell.error, True
        if how == "unsent":
            error, stateful = (
                CodeError("DeadKernelError", "the kernel ended before the cell began"),
                False,
            )
        elif how == "lost" and cell.timed_out:
            error, stateful = (
                CodeError(
                    "TimeoutError",
                    f"execution timed out after {timeout}s and the cell did not stop: its kernel "
                    "was ended, and its state with it",
                    error.traceback if error else "",
                ),
                False,
            )
        elif how == "lost":
            code_ = await kernel.exit_code()
            ended = f" (exit code {code_})" if code_ is not None else ""
            error, stateful = (
                CodeError(
                    "DeadKernelError",
                    f"the kernel ended during the cell{ended}: its state is lost",
                    kernel.diagnostics,
                ),
                False,
            )
        elif how == "deadline":
            error, stateful = (
                CodeError(
                    "TimeoutError",
                    f"execution timed out after {timeout}s and the kernel did not answer: it was "
                    "killed, and its state with it",
                ),
                False,
            )
        elif cell.timed_out:
            error = CodeError(
                "TimeoutError",
                f"execution timed out after {timeout}s",
                error.traceback if error else "",
            )
        timed_out = cell.timed_out or how == "deadline"
        return CodeResult(
            "".join(cell.stdout),
            "".join(cell.stderr),
            -1 if timed_out else (1 if error else 0),
            time.monotonic() - started,
            timed_out,
            tuple(cell.results),
            error,
            stateful,
            restarted,
        )

    def _kernel(self, key: str | None, context: CodeContext | None) -> tuple[Kernel, bool]:
        """The context's kernel, a new one if it has none running; and whether one that had
        run cells ended (their state is lost)."""
        kernel = self._kernels.get(key)
        if kernel is not None and not kernel.ended:
            return kernel, False
        cwd = None if context is None else context.cwd
        self._kernels[key] = Kernel(self._sandbox, self._python, cwd)
        return self._kernels[key], kernel is not None and kernel.ran

    async def _refuse_start(self, kernel: Kernel) -> None:
        """A kernel that ended before its first cell could not start: say why."""
        why = kernel.diagnostics or f"exit code {await kernel.exit_code()}"
        raise SandboxError(
            f"run_code: the code kernel did not start with {self._python!r}: {why}",
            provider=self._sandbox.provider,
            sandbox_id=self._sandbox.id,
        )

    def process(self, context: CodeContext | None) -> Process | None:
        """The process of a context's running kernel (to watch it, or end it from outside)."""
        kernel = self._kernels.get(None if context is None else context.id)
        return None if kernel is None or kernel.ended else kernel.process


def refuse_context(sandbox: Sandbox, context: CodeContext | None, language: str) -> None:
    """Code that runs once, without a kernel, has no context to run in: refuse one."""
    if context is None:
        return
    if context.language != language:
        raise InvalidArgument(
            f"run_code(context=...): context {context.id!r} runs {context.language}, "
            f"not {language!r}"
        )
    raise Unsupported(sandbox.provider, Capability.STATEFUL_CODE)
