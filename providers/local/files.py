"""`LocalFiles`: a ``local`` sandbox's file calls, on its directory from the host.

They need no command, so they work on a paused sandbox too, each on a
worker thread. A command running meanwhile may swap a directory for a
symlink at any moment, so each call walks its path by descriptor
(`providers.local.paths`) and never follows a link out; a whole directory
is moved (`upload_dir`, `download_dir`) by ``tar`` inside the sandbox,
except while it is paused.
"""

from __future__ import annotations

import asyncio
import errno
import functools
import os
import posixpath
import shutil
import stat
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from typing import BinaryIO, TypeVar

from providers.base import FileInfo
from providers.files import CHUNK, Chunks, pack_dir, unpack_dir
from providers.local.directory import LocalDirectory
from providers.local.isolation import HOME
from providers.local.paths import Escape, Located

__all__ = ["LocalFiles"]

T = TypeVar("T")


class LocalFiles(LocalDirectory):
    """The file calls of `providers.local.sandbox.LocalSandbox`."""

    async def _at(
        self, path: str, op: Callable[[Located], T], *, follow: bool, make_parents: bool = False
    ) -> T:
        """Run ``op`` on a worker thread on what ``path`` locates (see `providers.local.paths`)."""
        self._check_alive()
        inner = self._inner(path)

        def call() -> T:
            with self._tree.locate(inner, follow=follow, make_parents=make_parents) as found:
                return op(found)

        return await asyncio.to_thread(self._fs, call, path)

    def _fs(self, op: Callable[[], T], path: str) -> T:
        try:
            return op()
        except Escape:
            raise self._escape(path) from None
        except FileNotFoundError as exc:
            raise self._error(f"no such file or directory: {path!r}") from exc
        except OSError as exc:
            raise self._error(f"{path!r}: {exc.strerror}") from exc

    async def write_file(self, path: str, data: bytes | str) -> None:
        payload = data.encode() if isinstance(data, str) else data

        def write(found: Located) -> None:
            with os.fdopen(found.open(os.O_WRONLY | os.O_CREAT | os.O_TRUNC), "wb") as out:
                out.write(payload)

        await self._at(path, write, follow=True, make_parents=True)

    async def read_file(self, path: str) -> bytes:
        def read(found: Located) -> bytes:
            with _open_regular(found) as handle:
                return handle.read()

        return await self._at(path, read, follow=True)

    async def list_files(self, path: str = ".") -> list[FileInfo]:
        def listing(found: Located) -> list[FileInfo]:
            fd = found.open(os.O_RDONLY | os.O_DIRECTORY)
            try:
                with os.scandir(fd) as entries:
                    return [
                        FileInfo(
                            name=entry.name,
                            path=_home_path((*found.parts, entry.name)),
                            is_dir=entry.is_dir(follow_symlinks=False),
                            size=(
                                entry.stat(follow_symlinks=False).st_size
                                if entry.is_file(follow_symlinks=False)
                                else 0
                            ),
                        )
                        for entry in sorted(entries, key=lambda e: e.name)
                    ]
            finally:
                os.close(fd)

        return await self._at(path, listing, follow=True)

    def _info(self, found: Located) -> FileInfo:
        st = found.lstat()
        return FileInfo(
            name=found.name or posixpath.basename(HOME),
            path=_home_path(found.parts),
            is_dir=stat.S_ISDIR(st.st_mode),
            size=st.st_size,
            mode=stat.S_IMODE(st.st_mode),
            modified=st.st_mtime,
        )

    async def remove(self, path: str) -> None:
        def remove(found: Located) -> None:
            if not found.name:
                raise self._error(f"remove {path!r}: the sandbox's home cannot be removed")
            if stat.S_ISDIR(found.lstat().st_mode):
                shutil.rmtree(found.name, dir_fd=found.parent)
            else:
                os.unlink(found.name, dir_fd=found.parent)

        await self._at(path, remove, follow=False)

    async def make_dir(self, path: str) -> bool:
        def make(found: Located) -> bool:
            if not found.name:
                return False
            try:
                os.mkdir(found.name, dir_fd=found.parent)
            except FileExistsError:
                if stat.S_ISDIR(found.lstat().st_mode):
                    return False
                raise
            return True

        return await self._at(path, make, follow=True, make_parents=True)

    async def exists(self, path: str) -> bool:
        self._check_alive()
        inner = self._inner(path)

        def there() -> bool:
            try:
                with self._tree.locate(inner, follow=False) as found:
                    found.lstat()
            except (FileNotFoundError, NotADirectoryError):
                return False
            return True

        return await asyncio.to_thread(self._fs, there, path)

    async def rename(self, src: str, dst: str) -> FileInfo:
        self._check_alive()
        source, target = self._inner(src), self._inner(dst)

        def move() -> FileInfo:
            with (
                self._tree.locate(source, follow=False) as old,
                self._tree.locate(target, follow=False) as new,
            ):
                if not (old.name and new.name):
                    raise self._error(f"rename {src!r} {dst!r}: the sandbox's home cannot be moved")
                old.lstat()
                os.replace(old.name, new.name, src_dir_fd=old.parent, dst_dir_fd=new.parent)
                return self._info(new)

        return await asyncio.to_thread(self._fs, move, src)

    async def stat(self, path: str) -> FileInfo:
        return await self._at(path, self._info, follow=False)

    async def read_stream(self, path: str) -> AsyncIterator[bytes]:
        """The file in `CHUNK` pieces, each read on a worker thread."""
        handle = await self._at(path, _open_regular, follow=True)
        try:
            read = functools.partial(handle.read, CHUNK)
            while chunk := await asyncio.to_thread(self._fs, read, path):
                yield chunk
        finally:
            handle.close()

    async def write_stream(self, path: str, chunks: Chunks) -> None:
        """Write ``chunks`` into the file as they come, each write on a worker thread."""

        def open_target(found: Located) -> BinaryIO:
            return os.fdopen(found.open(os.O_WRONLY | os.O_CREAT | os.O_TRUNC), "wb")

        handle = await self._at(path, open_target, follow=True, make_parents=True)
        try:
            async for chunk in chunks:
                await asyncio.to_thread(self._fs, functools.partial(handle.write, chunk), path)
        finally:
            handle.close()

    async def upload_dir(self, local: Path, path: str) -> None:
        """Unpack a tar stream of ``local`` into the sandbox: on the host straight into
        a paused sandbox's directory, else by ``tar`` in the sandbox (`_walks_host`)."""
        if not self._walks_host():
            await super().upload_dir(local, path)
            return
        target = self.resolve(path)
        await self._moved("upload_dir", path, unpack_dir(pack_dir(local), target))

    async def download_dir(self, path: str, local: Path) -> None:
        """Pack the sandbox's directory as a tar stream and unpack it into ``local``: on
        the host for a paused sandbox, else by ``tar`` in the sandbox (`_walks_host`)."""
        if not self._walks_host():
            await super().download_dir(path, local)
            return
        source = self.resolve(path)
        if not await asyncio.to_thread(source.is_dir):
            raise self._error(f"download_dir {path!r}: no such directory")
        await self._moved("download_dir", path, unpack_dir(pack_dir(source), local))

    def _walks_host(self) -> bool:
        """Whether a tree may be walked by path on the host: only while the sandbox is
        paused, when no command can swap a directory on the way for a symlink (tar
        walks by name; `Tree` guards single paths only)."""
        self._check_alive()
        return self.paused


def _open_regular(found: Located) -> BinaryIO:
    """Open a regular file for reading; non-blocking first, so a FIFO a command made
    is refused rather than waited on."""
    fd = found.open(os.O_RDONLY | os.O_NONBLOCK)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise IsADirectoryError(errno.EISDIR, "not a regular file")
    os.set_blocking(fd, True)
    return os.fdopen(fd, "rb")


def _home_path(parts: Sequence[str]) -> str:
    return posixpath.join(HOME, *parts)
