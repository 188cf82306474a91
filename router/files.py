"""The sandbox handle's file, port and snapshot calls, in an async and a sync flavour.

`AsyncFiles` is mixed into `router.lease.AsyncSandboxHandle` and `SyncFiles`
into `router.lease.SyncSandbox`, so the lease module stays about leases.
Each call checks its arguments here, the same for every provider, before
any SDK sees them. Streams never hold a file whole: ``read_stream`` relays
the provider's chunks to the caller's loop (or thread) one at a time, and a
sync ``write_stream`` pulls the caller's chunks (an iterable or a binary
file) one at a time on a worker thread.
"""

from __future__ import annotations

import asyncio
import io
from collections.abc import AsyncIterable, AsyncIterator, Iterable, Iterator, Sequence
from contextlib import AbstractContextManager
from os import PathLike
from pathlib import Path
from typing import IO, Literal, TypeVar

from providers.base import FileInfo, PortURL, Sandbox, Snapshot, check_port
from providers.errors import InvalidArgument
from providers.files import CHUNK
from router.portal import OnEngine, Portal, blocking, iterate, relay
from router.spans import Spans, StreamSpan, TransferSpan

__all__ = ["AsyncFiles", "SyncFiles", "check_path"]

LocalPath = str | PathLike[str]
F = TypeVar("F", bound="AsyncFiles")
T = TypeVar("T")


def check_path(path: object, argument: str) -> str:
    """A sandbox path: a non-empty string without a NUL byte."""
    if not isinstance(path, str) or not path or "\x00" in path:
        raise InvalidArgument(f"{argument}: {_shown(path)} is not a path (a string, no NUL)")
    return path


def _local(path: object, argument: str, *, is_dir: bool | None = None) -> Path:
    """A local path; ``is_dir`` True/False: it must exist as a directory/file."""
    if not isinstance(path, str | PathLike) or "\x00" in str(path) or not str(path):
        raise InvalidArgument(f"{argument}: {_shown(path)} is not a local path")
    local = Path(path)
    if is_dir is True and not local.is_dir():
        raise InvalidArgument(f"{argument}: {str(local)!r} is not a directory")
    if is_dir is False and not local.is_file():
        raise InvalidArgument(f"{argument}: {str(local)!r} is not a file")
    return local


def _shown(value: object) -> str:
    return repr(value) if isinstance(value, str | PathLike) else type(value).__name__


class AsyncFiles(OnEngine):
    """File, port and snapshot calls of the async sandbox handle (see `router.lease`)."""

    _sandbox: Sandbox
    _spans: Spans

    def _transfer(self, call: str, path: str, size: int | None = None) -> TransferSpan:
        return TransferSpan(call, self._sandbox.provider, self._sandbox.id, path, size)

    def _followed(
        self,
        call: Literal["stream", "read_stream"],
        source: str | Sequence[str],
        items: AsyncIterator[T],
    ) -> tuple[AsyncIterator[T], AbstractContextManager[object]]:
        """``items`` and the span of their iteration (`router.spans.Spans.follow`)."""
        span = StreamSpan(call, self._sandbox.provider, self._sandbox.id, source)
        return self._spans.follow(span, items)

    async def remove(self, path: str) -> None:
        """Remove a file, or a directory with all it holds (capability ``files.manage``)."""
        await self._run(self._sandbox.remove(check_path(path, "remove(path)")))

    async def make_dir(self, path: str) -> bool:
        """Make a directory and its parents; False when it already existed."""
        return await self._run(self._sandbox.make_dir(check_path(path, "make_dir(path)")))

    async def exists(self, path: str) -> bool:
        return await self._run(self._sandbox.exists(check_path(path, "exists(path)")))

    async def rename(self, src: str, dst: str) -> FileInfo:
        """Move ``src`` to ``dst`` (replacing a file there); what ``dst`` is now."""
        check_path(src, "rename(src)")
        check_path(dst, "rename(dst)")
        return await self._run(self._sandbox.rename(src, dst))

    async def stat(self, path: str) -> FileInfo:
        return await self._run(self._sandbox.stat(check_path(path, "stat(path)")))

    def read_stream(self, path: str) -> AsyncIterator[bytes]:
        """A file's content in chunks as they arrive (capability ``files.stream``)."""
        self._alive()
        check_path(path, "read_stream(path)")
        return relay(
            self._engine, *self._followed("read_stream", path, self._sandbox.read_stream(path))
        )

    async def write_stream(self, path: str, chunks: AsyncIterable[bytes]) -> None:
        """Write a file from ``chunks`` as they come (an async iterable on any loop)."""
        check_path(path, "write_stream(path)")
        if not isinstance(chunks, AsyncIterable):
            raise InvalidArgument("write_stream(chunks): not an async iterable of bytes")
        if not self._engine.in_engine_thread():  # made on the caller's loop: pulled from there
            chunks = _hop(asyncio.get_running_loop(), chunks)
        with self._spans(self._transfer("write_stream", path)):
            await self._run(self._sandbox.write_stream(path, _checked(chunks)))

    async def upload_file(self, local: LocalPath, path: str) -> None:
        """Copy a local file into the sandbox, streamed."""
        source = _local(local, "upload_file(local)", is_dir=False)
        with self._spans(self._transfer("upload_file", check_path(path, "upload_file(path)"))):
            await self._run(self._sandbox.upload_file(source, path))

    async def download_file(self, path: str, local: LocalPath) -> None:
        """Copy a sandbox file to ``local``, streamed."""
        check_path(path, "download_file(path)")
        target = _local(local, "download_file(local)")
        if target.is_dir():
            raise InvalidArgument(f"download_file(local): {str(target)!r} is a directory")
        with self._spans(self._transfer("download_file", path)):
            await self._run(self._sandbox.download_file(path, target))

    async def upload_dir(self, local: LocalPath, path: str) -> None:
        """Copy a local directory's content into ``path`` (made if missing), streamed."""
        source = _local(local, "upload_dir(local)", is_dir=True)
        with self._spans(self._transfer("upload_dir", check_path(path, "upload_dir(path)"))):
            await self._run(self._sandbox.upload_dir(source, path))

    async def download_dir(self, path: str, local: LocalPath) -> None:
        """Copy a sandbox directory's content into ``local`` (made if missing), streamed."""
        check_path(path, "download_dir(path)")
        target = _local(local, "download_dir(local)")
        with self._spans(self._transfer("download_dir", path)):
            await self._run(self._sandbox.download_dir(path, target))

    async def expose(self, port: int) -> PortURL:
        """A URL the app can reach for ``port`` (capability ``port``); send its headers."""
        check_port(port, "expose(port)")
        return await self._run(self._sandbox.expose(port))

    async def snapshot(self, name: str | None = None) -> Snapshot:
        """Keep the filesystem as a template: ``SandboxSpec(template=snap.id)`` on this entry."""
        if name is not None and (not isinstance(name, str) or "\x00" in name):
            raise InvalidArgument("snapshot(name): not a string without NUL")
        return await self._run(self._sandbox.snapshot(name))


async def _hop(
    caller: asyncio.AbstractEventLoop, chunks: AsyncIterable[bytes]
) -> AsyncIterator[bytes]:
    """The chunks made on the ``caller``'s loop, pulled from the engine loop one at a time."""
    items = aiter(chunks)

    async def step() -> tuple[bool, bytes]:
        try:
            return True, await anext(items)
        except StopAsyncIteration:
            return False, b""

    while True:
        more, chunk = await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(step(), caller))
        if not more:
            return
        yield chunk


async def _checked(chunks: AsyncIterable[bytes]) -> AsyncIterator[bytes]:
    async for chunk in chunks:
        if not isinstance(chunk, bytes | bytearray | memoryview):
            raise InvalidArgument(f"write_stream(chunks): a {type(chunk).__name__}, not bytes")
        yield bytes(chunk)


async def _pulled(source: Iterable[bytes] | IO[bytes]) -> AsyncIterator[bytes]:
    """A sync caller's chunks, each pulled on a worker thread (a file is read in CHUNKs)."""
    items: Iterator[bytes]
    if hasattr(source, "read"):
        read = source.read
        items = iter(lambda: read(CHUNK), b"")
    else:
        items = iter(source)
    done = object()
    while (chunk := await asyncio.to_thread(next, items, done)) is not done:
        yield chunk  # type: ignore[misc]


class SyncFiles(Portal[F]):
    """The sync twins of `AsyncFiles`; `router.lease.SyncSandbox` is one."""

    remove = blocking(AsyncFiles.remove)
    make_dir = blocking(AsyncFiles.make_dir)
    exists = blocking(AsyncFiles.exists)
    rename = blocking(AsyncFiles.rename)
    stat = blocking(AsyncFiles.stat)
    upload_file = blocking(AsyncFiles.upload_file)
    download_file = blocking(AsyncFiles.download_file)
    upload_dir = blocking(AsyncFiles.upload_dir)
    download_dir = blocking(AsyncFiles.download_dir)
    expose = blocking(AsyncFiles.expose)
    snapshot = blocking(AsyncFiles.snapshot)

    def read_stream(self, path: str) -> Iterator[bytes]:
        """A file's content in chunks as they arrive; leaving the loop early closes it."""
        self._alive()
        check_path(path, "read_stream(path)")
        chunks = self._async._sandbox.read_stream(path)
        return iterate(self._engine, *self._async._followed("read_stream", path, chunks))

    def write_stream(self, path: str, chunks: Iterable[bytes] | IO[bytes]) -> None:
        """Write a file from an iterable of bytes or a binary file, never read whole."""
        source: object = chunks
        if isinstance(source, bytes | bytearray | str | io.TextIOBase) or not (
            hasattr(source, "read") or isinstance(source, Iterable)
        ):
            raise InvalidArgument("write_stream(chunks): not an iterable of bytes or a binary file")
        self._call(self._async.write_stream(path, _pulled(chunks)))
