"""Background processes and terminals: the handles a sandbox hands out.

Every vendor delivers a running command's output differently (E2B and
Runloop call back, Daytona follows a log websocket, Modal yields from a
stream), so an adapter only feeds what arrives into a `ProcessBase`: the
queue behind `Process.output`, the collected stdout/stderr behind
`Process.wait`, and the exit that ends both are written once, here. The same
holds for terminals (`TerminalBase`). Streaming `run` (callbacks, stdin) and
`Sandbox.stream` are built on `Sandbox.start`, so an adapter that can start a
process streams for free.

What a provider cannot do is a capability it does not declare (see
`providers.capabilities`), and calling it raises `Unsupported`, naming the provider and the
capability: never a silent no-op.
"""

from __future__ import annotations

import abc
import asyncio
import inspect
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Literal, TypeVar

from providers.capabilities import Capability
from providers.errors import Unsupported

__all__ = [
    "OnOutput",
    "OnTerminalData",
    "OutputChunk",
    "Process",
    "ProcessBase",
    "ProcessInfo",
    "ProcessResult",
    "Terminal",
    "TerminalBase",
    "deliver",
]


OnOutput = Callable[[str], Awaitable[None] | None]
"""A stdout/stderr callback: plain or async; it gets each chunk as it arrives."""

OnTerminalData = Callable[[bytes], Awaitable[None] | None]
"""A terminal's output callback: plain or async; it gets the bytes as they arrive."""

D = TypeVar("D", str, bytes)


@dataclass(frozen=True, slots=True)
class OutputChunk:
    """One piece of a running command's output, in arrival order."""

    stream: Literal["stdout", "stderr"]
    data: str


@dataclass(frozen=True, slots=True)
class ProcessInfo:
    """A process as `Sandbox.processes` lists it."""

    id: str
    command: str
    running: bool = True
    exit_code: int | None = None


@dataclass(frozen=True, slots=True)
class ProcessResult:
    """How a background process ended (``timed_out``: `wait`'s deadline passed first)."""

    stdout: str
    stderr: str
    exit_code: int
    duration: float
    timed_out: bool = False


async def deliver(callback: Callable[[D], Awaitable[None] | None] | None, data: D) -> None:
    """Hand ``data`` to a plain or async callback."""
    if callback is None:
        return
    outcome = callback(data)
    if inspect.isawaitable(outcome):
        await outcome


class Process(abc.ABC):
    """A command running in the background of a sandbox."""

    id: str
    provider: str

    @abc.abstractmethod
    def output(self) -> AsyncIterator[OutputChunk]:
        """The output as it arrives, until the process ends (one reader)."""

    @abc.abstractmethod
    async def wait(self, timeout: float | None = None) -> ProcessResult:
        """Its end; on ``timeout`` the process is killed and ``timed_out`` is set."""

    @abc.abstractmethod
    async def kill(self) -> bool:
        """Kill it (and what it started); False when it had already ended."""

    @property
    @abc.abstractmethod
    def finished(self) -> bool:
        """True once it has ended and its output is all delivered to this handle."""

    def discard_output(self) -> None:  # noqa: B027 - optional hook
        """Keep no output for `wait` from now on; `output` still streams it all.

        A long-lived process read through `output` only (the router's code
        kernel) would otherwise hold everything it ever printed.
        """

    async def write_stdin(self, data: str | bytes) -> None:
        raise Unsupported(self.provider, Capability.STDIN)

    async def close_stdin(self) -> None:
        raise Unsupported(self.provider, Capability.STDIN)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.provider}:{self.id}>"


class ProcessBase(Process):
    """A process whose adapter feeds it: `_feed` each chunk, `_finish` with the exit code."""

    def __init__(self, process_id: str, provider: str) -> None:
        self.id = process_id
        self.provider = provider
        self._started = time.monotonic()
        self._queue: asyncio.Queue[OutputChunk | None] = asyncio.Queue()
        self._stdout: list[str] = []
        self._stderr: list[str] = []
        self._keep = True
        self._exit: asyncio.Future[int] = asyncio.get_running_loop().create_future()

    def discard_output(self) -> None:
        self._keep = False
        self._stdout.clear()
        self._stderr.clear()

    def _feed(self, stream: Literal["stdout", "stderr"], data: str) -> None:
        if not data or self._exit.done():
            return
        if self._keep:
            (self._stdout if stream == "stdout" else self._stderr).append(data)
        self._queue.put_nowait(OutputChunk(stream, data))

    def _finish(self, exit_code: int) -> None:
        if not self._exit.done():
            self._exit.set_result(exit_code)
            self._queue.put_nowait(None)

    def _fail(self, error: BaseException) -> None:
        if not self._exit.done():
            self._exit.set_exception(error)
            # Readers of output() and wait() get it; a handle nobody reads is not an error.
            self._exit.add_done_callback(lambda done: done.exception())
            self._queue.put_nowait(None)

    @property
    def finished(self) -> bool:
        return self._exit.done()

    async def output(self) -> AsyncIterator[OutputChunk]:
        while (chunk := await self._queue.get()) is not None:
            yield chunk
        self._exit.result()  # an error that ended the stream is the reader's too

    async def wait(self, timeout: float | None = None) -> ProcessResult:
        timed_out = False
        try:
            code = await asyncio.wait_for(asyncio.shield(self._exit), timeout)
        except TimeoutError:
            timed_out = True
            await self.kill()
            code = await asyncio.wait_for(asyncio.shield(self._exit), 10.0)
        return ProcessResult(
            "".join(self._stdout),
            "".join(self._stderr),
            code,
            time.monotonic() - self._started,
            timed_out,
        )


class Terminal(abc.ABC):
    """An interactive terminal (a PTY) in a sandbox: bytes in, bytes out."""

    id: str
    provider: str

    @abc.abstractmethod
    def output(self) -> AsyncIterator[bytes]:
        """What the terminal prints, as it arrives, until it exits (one reader)."""

    @abc.abstractmethod
    async def write(self, data: str | bytes) -> None:
        """Type into the terminal."""

    async def resize(self, rows: int, cols: int) -> None:
        raise Unsupported(self.provider, Capability.PTY_RESIZE)

    @abc.abstractmethod
    async def wait(self, timeout: float | None = None) -> int:
        """The exit code of the terminal's shell (TimeoutError after ``timeout``)."""

    @abc.abstractmethod
    async def kill(self) -> bool:
        """End the terminal; False when it had already exited."""

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.provider}:{self.id}>"


class TerminalBase(Terminal):
    """A terminal whose adapter feeds it: `_feed` each piece, `_finish` with the exit code."""

    def __init__(self, terminal_id: str, provider: str) -> None:
        self.id = terminal_id
        self.provider = provider
        self._queue: asyncio.Queue[bytes | None] = asyncio.Queue()
        self._exit: asyncio.Future[int] = asyncio.get_running_loop().create_future()

    def _feed(self, data: bytes) -> None:
        if data and not self._exit.done():
            self._queue.put_nowait(data)

    def _finish(self, exit_code: int) -> None:
        if not self._exit.done():
            self._exit.set_result(exit_code)
            self._queue.put_nowait(None)

    async def output(self) -> AsyncIterator[bytes]:
        while (data := await self._queue.get()) is not None:
            yield data

    async def wait(self, timeout: float | None = None) -> int:
        return await asyncio.wait_for(asyncio.shield(self._exit), timeout)
