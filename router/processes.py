"""Handles on a lease's background processes and terminals, async and sync.

The provider's `Process` and `Terminal` live on the router's engine loop;
these handles carry each call there (`AsyncProcess`, `AsyncTerminal`) and
derive the sync twins from them (`SyncProcess`, `SyncTerminal`, see
`router.portal`). Every call first checks that the lease is still held.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator
from typing import TYPE_CHECKING, TypeVar

from providers.base import Sandbox, check_positive
from providers.errors import ArgumentTypeError, InvalidArgument
from providers.processes import OutputChunk, Process, ProcessResult, Terminal
from router.portal import OnEngine, Portal, blocking, iterate, relay
from router.spans import CommandSpan, Spans

if TYPE_CHECKING:
    from router.engine import Engine

__all__ = ["AsyncProcess", "AsyncTerminal", "SyncProcess", "SyncTerminal"]

T = TypeVar("T")


class AsyncProcess(OnEngine):
    """A background command of a lease's sandbox (`AsyncSandboxHandle.start`)."""

    def __init__(
        self,
        process: Process,
        engine: Engine,
        alive: Callable[[], None],
        spans: Spans,
        sandbox: Sandbox,
    ) -> None:
        super().__init__(engine, alive)
        self._process = process
        self._spans = spans
        self._sandbox = sandbox  # its sandbox: the entry and id its wait's span names

    @property
    def id(self) -> str:
        """The provider's id: `AsyncSandboxHandle.attach` finds it again from any replica."""
        return self._process.id

    @property
    def finished(self) -> bool:
        return self._process.finished

    def output(self) -> AsyncIterator[OutputChunk]:
        """Its output as it arrives, until it ends (one reader per handle)."""
        self._alive()
        return relay(self._engine, self._process.output())

    async def wait(self, timeout: float | None = None) -> ProcessResult:
        """Its end; past ``timeout`` it is killed and the result says ``timed_out``."""
        check_positive(timeout, "wait", "timeout", optional=True)
        sandbox = self._sandbox
        span = CommandSpan("wait", sandbox.provider, sandbox.id, "", process_id=self._process.id)
        with self._spans(span):
            result = await self._run(self._process.wait(timeout))
            span.exit_code, span.timed_out = result.exit_code, result.timed_out
        return result

    async def kill(self) -> bool:
        """Kill it and what it started; False when it had already ended."""
        return await self._run(self._process.kill())

    async def write_stdin(self, data: str | bytes) -> None:
        await self._run(self._process.write_stdin(check_data(data, "write_stdin(data)")))

    async def close_stdin(self) -> None:
        await self._run(self._process.close_stdin())

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self._process!r}>"


class SyncProcess(Portal[AsyncProcess]):
    """`AsyncProcess` for sync code: the same methods, waited for."""

    def __init__(self, process: AsyncProcess, engine: Engine, alive: Callable[[], None]) -> None:
        super().__init__(engine, alive)
        self._async = process

    @property
    def id(self) -> str:
        return self._async.id

    @property
    def finished(self) -> bool:
        return self._async.finished

    def output(self) -> Iterator[OutputChunk]:
        self._alive()
        return iterate(self._engine, self._async._process.output())

    wait = blocking(AsyncProcess.wait)
    kill = blocking(AsyncProcess.kill)
    write_stdin = blocking(AsyncProcess.write_stdin)
    close_stdin = blocking(AsyncProcess.close_stdin)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self._async._process!r}>"


class AsyncTerminal(OnEngine):
    """An interactive terminal in a lease's sandbox (`AsyncSandboxHandle.open_terminal`)."""

    def __init__(self, terminal: Terminal, engine: Engine, alive: Callable[[], None]) -> None:
        super().__init__(engine, alive)
        self._terminal = terminal

    @property
    def id(self) -> str:
        return self._terminal.id

    def output(self) -> AsyncIterator[bytes]:
        """What the terminal prints, as it arrives (one reader per handle)."""
        self._alive()
        return relay(self._engine, self._terminal.output())

    async def write(self, data: str | bytes) -> None:
        """Type into it."""
        await self._run(self._terminal.write(check_data(data, "write(data)")))

    async def resize(self, rows: int, cols: int) -> None:
        check_size(rows, cols, "resize")
        await self._run(self._terminal.resize(rows, cols))

    async def wait(self, timeout: float | None = None) -> int:
        """The exit code of its shell."""
        check_positive(timeout, "wait", "timeout", optional=True)
        return await self._run(self._terminal.wait(timeout))

    async def kill(self) -> bool:
        return await self._run(self._terminal.kill())

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self._terminal!r}>"


class SyncTerminal(Portal[AsyncTerminal]):
    """`AsyncTerminal` for sync code: the same methods, waited for."""

    def __init__(self, terminal: AsyncTerminal, engine: Engine, alive: Callable[[], None]) -> None:
        super().__init__(engine, alive)
        self._async = terminal

    @property
    def id(self) -> str:
        return self._async.id

    def output(self) -> Iterator[bytes]:
        self._alive()
        return iterate(self._engine, self._async._terminal.output())

    write = blocking(AsyncTerminal.write)
    resize = blocking(AsyncTerminal.resize)
    wait = blocking(AsyncTerminal.wait)
    kill = blocking(AsyncTerminal.kill)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self._async._terminal!r}>"


def check_size(rows: object, cols: object, call: str) -> None:
    """A terminal size a PTY can take: whole numbers from 1 to 65535 (its ioctl's field)."""
    for name, value in (("rows", rows), ("cols", cols)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise ArgumentTypeError(f"{call}({name}={value!r}): a whole number of characters")
        if not 1 <= value <= 65535:
            raise InvalidArgument(f"{call}({name}={value!r}): from 1 to 65535 characters")


def check_data(data: object, argument: str) -> str | bytes:
    """Input for a process or terminal: text or bytes."""
    if isinstance(data, bytearray | memoryview):
        return bytes(data)
    if not isinstance(data, str | bytes):
        raise ArgumentTypeError(f"{argument}: str or bytes, not {type(data).__name__}")
    return data
