"""`DaytonaFiles`: files in a Daytona sandbox, through its toolbox's bulk routes.

As the SDK sends them: an upload is a multipart body streamed as its chunks
come (chunked encoding), a download a multipart answer read a chunk at a
time, so neither is ever whole in memory. ``files.manage`` goes through the
shell (`ShellFiles`), one exec each, so it needs no toolbox route beyond
the ones every other call uses.
"""

from __future__ import annotations

import asyncio
import json
import posixpath
import secrets
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

from providers.base import FileInfo
from providers.daytona.errors import StreamBroken
from providers.daytona.handle import DaytonaHandle, json_object
from providers.files import CHUNK, Chunks, ShellFiles

if TYPE_CHECKING:
    import aiohttp

__all__ = ["DaytonaFiles"]


class DaytonaFiles(ShellFiles, DaytonaHandle):
    """The file calls of a Daytona sandbox."""

    def _timeout(self) -> aiohttp.ClientTimeout:
        """A transfer's: no wall-clock cap (a large file takes what it takes), but
        ``transfer_timeout`` without a byte from Daytona."""
        import aiohttp

        return aiohttp.ClientTimeout(
            total=None, sock_connect=30.0, sock_read=self._transfer_timeout
        )

    async def _upload(self, path: str, chunks: Chunks) -> None:
        """``chunks`` to ``path``: the bulk upload's multipart body, sent as they come."""
        boundary = "sandbox-router-" + secrets.token_hex(12)
        name = posixpath.basename(path).translate(_UNQUOTED) or "upload"
        head = (
            f"--{boundary}\r\n"
            'Content-Disposition: form-data; name="files[0].path"\r\n\r\n'
            f"{path}\r\n"
            f"--{boundary}\r\n"
            f'Content-Disposition: form-data; name="files[0].file"; filename="{name}"\r\n'
            "Content-Type: application/octet-stream\r\n\r\n"
        ).encode()

        async def body() -> AsyncIterator[bytes]:
            yield head
            async for chunk in chunks:
                if chunk:
                    yield bytes(chunk)
            yield f"\r\n--{boundary}--\r\n".encode()

        toolbox = await self._tools()
        headers = {
            **toolbox.default_headers,
            "Content-Type": f"multipart/form-data; boundary={boundary}",
        }
        async with toolbox.session.post(
            toolbox.url("/files/bulk-upload"), data=body(), headers=headers, timeout=self._timeout()
        ) as response:
            await _raise_for_status(response)

    async def _download(self, path: str) -> AsyncIterator[bytes]:
        """``path``'s bytes as they come: the bulk download's ``file`` part, or its
        ``error`` part (the daemon's error body) raised as the error answer it is."""
        import aiohttp
        from daytona_toolbox_api_client_async.exceptions import ApiException

        toolbox = await self._tools()
        headers = {**toolbox.default_headers, "Content-Type": "application/json"}
        async with toolbox.session.post(
            toolbox.url("/files/bulk-download"),
            data=json.dumps({"paths": [path]}),
            headers=headers,
            timeout=self._timeout(),
        ) as response:
            await _raise_for_status(response)
            reader = aiohttp.MultipartReader(response.headers, response.content)
            while (part := await reader.next()) is not None:
                if not isinstance(part, aiohttp.BodyPartReader):
                    continue
                if part.name == "error":
                    error = await part.read()
                    status = json_object(error).get("statusCode")
                    raise ApiException(
                        status=status if isinstance(status, int) else 500,
                        reason="file download failed",
                        body=error.decode(errors="replace"),
                    )
                if part.name == "file":
                    while chunk := await part.read_chunk(CHUNK):
                        yield chunk
                    return
        raise StreamBroken(f"Daytona's download of {path} carried no file")

    async def write_file(self, path: str, data: bytes | str) -> None:
        payload = data.encode() if isinstance(data, str) else bytes(data)

        async def chunks() -> AsyncIterator[bytes]:
            yield payload

        async with self._toolbox():
            async with asyncio.timeout(self._transfer_timeout):
                await self._upload(path, chunks())

    async def read_file(self, path: str) -> bytes:
        async with self._toolbox():
            async with asyncio.timeout(self._transfer_timeout):
                return b"".join([chunk async for chunk in self._download(path)])

    async def read_stream(self, path: str) -> AsyncIterator[bytes]:
        async with self._toolbox():
            async for chunk in self._download(path):
                yield chunk

    async def write_stream(self, path: str, chunks: Chunks) -> None:
        """The toolbox's bulk upload, its body sent as the chunks come (chunked encoding)."""
        async with self._toolbox():
            parent = posixpath.dirname(path)
            if parent:
                await self.make_dir(parent)
            await self._upload(path, chunks)

    async def list_files(self, path: str = ".") -> list[FileInfo]:
        async with self._toolbox():
            async with asyncio.timeout(self._request_timeout):
                entries = await (await self._tools()).files.list_files(path=path)
                where = path if posixpath.isabs(path) else await self._absolute(path)
        return sorted(
            (
                FileInfo(
                    name=e.name,
                    path=posixpath.join(where, e.name),
                    is_dir=e.is_dir,
                    size=0 if e.is_dir else e.size,
                )
                for e in entries
            ),
            key=lambda f: f.name,
        )

    async def _absolute(self, path: str) -> str:
        """``path`` from the sandbox's working directory (asked once per handle)."""
        if self._work_dir is None:
            found = await (await self._tools()).info.get_work_dir()
            self._work_dir = found.dir or "/"
        return posixpath.normpath(posixpath.join(self._work_dir, path))


_UNQUOTED = str.maketrans({'"': "_", "\\": "_", "\r": "_", "\n": "_"})


async def _raise_for_status(response: aiohttp.ClientResponse) -> None:
    """An error answer to a transfer, raised as the generated client raises one."""
    if response.status < 400:
        return
    from daytona_toolbox_api_client_async.exceptions import ApiException

    error = ApiException(
        status=response.status, reason=response.reason, body=await response.text(errors="replace")
    )
    error.headers = response.headers
    raise error
