"""stdin and stdout for the stdio transport, read and written by the event loop itself.

The SDK's `mcp.server.stdio.stdio_server` reads and writes through anyio's
file wrapper: a worker thread for each line read, written and flushed,
three thread hand-offs per tool call, about 1.5 ms of its latency on this
machine (``python -m benchmarks mcp``). It takes the two streams as
arguments, so `wire` hands it the process's pipes polled by the loop
instead (a regular file or ``/dev/null``, which no loop can poll, is read
and written as it is: it never blocks). As the SDK does, the process's own
descriptors are taken off the wire while it serves: fd 0 reads
``/dev/null`` and fd 1 writes to stderr, so neither a child process nor a
stray print can take or corrupt a message; both are put back on exit.

End of input is held back until every request read has its answer: the
SDK cancels what is still in flight when its input ends, so a client that
sends its requests and closes stdin (a pipe from a script, a file of
requests) would otherwise lose the answers that were not ready yet.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import selectors
import stat
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, BinaryIO, TypeVar

__all__ = ["Exchange", "Lines", "Writer", "wire"]

T = TypeVar("T")

LINE_LIMIT = 2**31  # the SDK reads a message of any size; the tools refuse oversized arguments


class Exchange:
    """The requests read and not answered yet (by JSON-RPC id)."""

    def __init__(self) -> None:
        self._open: set[Any] = set()
        self._idle = asyncio.Event()
        self._idle.set()

    def read(self, line: bytes) -> None:
        message = _message(line)
        if message is None or "method" not in message:
            return
        if "id" in message:
            self._open.add(_key(message["id"]))
            self._idle.clear()
        elif message["method"] == "notifications/cancelled":  # it gets no answer
            params = message.get("params")
            if isinstance(params, dict):
                self._settle(params.get("requestId"))

    def written(self, text: str) -> None:
        for line in text.splitlines():
            message = _message(line.encode())
            if message is not None and "method" not in message and "id" in message:
                self._settle(message["id"])

    def _settle(self, request_id: Any) -> None:
        self._open.discard(_key(request_id))
        if not self._open:
            self._idle.set()

    async def drained(self) -> None:
        await self._idle.wait()


class Lines:
    """The messages on stdin: one line each, as text; at its end, once all are answered."""

    def __init__(self, readline: Callable[[], Awaitable[bytes]], exchange: Exchange) -> None:
        self._readline = readline
        self._exchange = exchange

    def __aiter__(self) -> Lines:
        return self

    async def __anext__(self) -> str:
        line = await self._readline()
        if not line:
            await self._exchange.drained()
            raise StopAsyncIteration
        self._exchange.read(line)
        return line.decode("utf-8", "replace")


class Writer:
    """stdout, as the SDK writes it (``write`` then ``flush``)."""

    def __init__(
        self,
        write: Callable[[bytes], object],
        flush: Callable[[], Awaitable[None]],
        exchange: Exchange,
    ) -> None:
        self._write = write
        self._flush = flush
        self._exchange = exchange

    async def write(self, text: str) -> None:
        self._write(text.encode())
        self._exchange.written(text)

    async def flush(self) -> None:
        await self._flush()


@contextlib.asynccontextmanager
async def wire() -> AsyncIterator[tuple[Lines, Writer]]:
    """stdin and stdout for the SDK, fds 0 and 1 off the wire until the block ends."""
    loop = asyncio.get_running_loop()
    exchange = Exchange()
    source, sink = os.fdopen(os.dup(0), "rb", 0), os.fdopen(os.dup(1), "wb", 0)
    transports: list[asyncio.BaseTransport] = []
    saved_in, saved_out = os.dup(0), os.dup(1)
    try:
        lines = Lines(await _reading(loop, source, transports), exchange)
        write, flush = await _writing(loop, sink, transports)
        nothing = os.open(os.devnull, os.O_RDONLY)
        os.dup2(nothing, 0)
        os.close(nothing)
        os.dup2(2, 1)
        yield lines, Writer(write, flush, exchange)
    finally:
        for transport in transports:
            transport.close()
        for stream in (source, sink):
            with contextlib.suppress(OSError):
                stream.close()
        for saved, fd in ((saved_in, 0), (saved_out, 1)):
            os.dup2(saved, fd)
            os.close(saved)


async def _reading(
    loop: asyncio.AbstractEventLoop, source: BinaryIO, transports: list[asyncio.BaseTransport]
) -> Callable[[], Awaitable[bytes]]:
    if not _pollable(source, selectors.EVENT_READ):
        return lambda: _done(source.readline())
    reader = asyncio.StreamReader(limit=LINE_LIMIT)
    transport, _ = await loop.connect_read_pipe(
        lambda: asyncio.StreamReaderProtocol(reader), source
    )
    transports.append(transport)
    return reader.readline


async def _writing(
    loop: asyncio.AbstractEventLoop, sink: BinaryIO, transports: list[asyncio.BaseTransport]
) -> tuple[Callable[[bytes], object], Callable[[], Awaitable[None]]]:
    if not _pollable(sink, selectors.EVENT_WRITE):
        return sink.write, lambda: _done(None)
    transport, protocol = await loop.connect_write_pipe(asyncio.streams.FlowControlMixin, sink)
    transports.append(transport)
    writer = asyncio.StreamWriter(transport, protocol, None, loop)
    return writer.write, writer.drain


def _pollable(stream: BinaryIO, events: int) -> bool:
    """Whether the loop can wait on ``stream``: not a regular file, nor a device the
    selector refuses (epoll refuses ``/dev/null``, a supervisor's usual stdin); asyncio
    would take either and fail later, in a callback, leaving the read unanswered."""
    fd = stream.fileno()
    if stat.S_ISREG(os.fstat(fd).st_mode):
        return False
    with selectors.DefaultSelector() as probe:
        try:
            probe.register(fd, events)
        except OSError:
            return False
    return True


async def _done(value: T) -> T:
    return value


def _message(line: bytes) -> dict[str, Any] | None:
    try:
        message = json.loads(line)
    except ValueError:
        return None
    return message if isinstance(message, dict) else None


def _key(request_id: Any) -> Any:
    return request_id if isinstance(request_id, (int, str)) else repr(request_id)
