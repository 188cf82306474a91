"""The files of a Runloop devbox: the routes that write, read, upload and download them.

Under ``/v1/devboxes/{id}``: ``POST .../write_file_contents``,
``read_file_contents`` (plain text), ``upload_file`` (multipart ``path`` +
``file``; without a file part, an empty file), ``download_file`` (bytes).
Uploads stream to disk part by part and downloads go out in chunks: a file
is never held whole. Paths are the devbox's (`emulators.runloop.devboxes`).
"""

from __future__ import annotations

import asyncio
import os
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from aiohttp import BodyPartReader, web

from emulators.runloop.api import ApiError

if TYPE_CHECKING:
    from emulators.runloop.api import DevboxApi

__all__ = ["Files"]

_CHUNK = 1 << 20


class Files:
    """The file handlers, over `DevboxApi`."""

    def __init__(self, api: DevboxApi) -> None:
        self.api = api
        self.core = api.core

    def routes(self) -> list[web.RouteDef]:
        base = "/v1/devboxes/{devbox_id}"
        return [
            web.post(base + "/write_file_contents", self.write_file_contents),
            web.post(base + "/read_file_contents", self.read_file_contents),
            web.post(base + "/upload_file", self.upload_file),
            web.post(base + "/download_file", self.download_file),
        ]

    async def write_file_contents(self, request: web.Request) -> web.Response:
        devbox = self.api.running(request)
        body = await self.api.body(request)
        target = self.api.path(devbox, body.get("file_path"), "file_path", write=True)
        contents = body.get("contents")
        if not isinstance(contents, str):
            raise ApiError(400, "contents must be a string")
        await self._write(target, contents.encode())
        return web.json_response(
            {"devbox_id": devbox.id, "exit_status": 0, "stdout": "", "stderr": ""}
        )

    async def read_file_contents(self, request: web.Request) -> web.Response:
        devbox = self.api.running(request)
        body = await self.api.body(request)
        target = self.api.path(devbox, body.get("file_path"), "file_path")
        data = await self._read(target, body["file_path"])
        return web.Response(text=data.decode("utf-8", "replace"), content_type="text/plain")

    async def upload_file(self, request: web.Request) -> web.Response:
        """Multipart ``path`` and ``file``, the file streamed to disk part by part."""
        devbox = self.api.running(request)
        if not request.content_type.startswith("multipart/"):
            raise ApiError(400, "upload_file takes multipart/form-data with path and file")
        reader = await request.multipart()
        spool = self.core.local.root / ".uploads"
        await asyncio.to_thread(spool.mkdir, exist_ok=True)
        fd, name = tempfile.mkstemp(dir=spool)
        os.close(fd)
        staged = Path(name)
        try:
            path: str | None = None
            while (part := await reader.next()) is not None:
                if not isinstance(part, BodyPartReader):
                    raise ApiError(400, "nested multipart is not accepted")
                if part.name == "path":
                    path = await part.text()
                elif part.name == "file":
                    await self._spool(part, staged)
            target = self.api.path(devbox, path, "path", write=True)
            await self._place(staged, target)
        finally:
            await asyncio.to_thread(staged.unlink, True)
        return web.json_response({})

    @staticmethod
    async def _spool(part: BodyPartReader, staged: Path) -> None:
        handle = await asyncio.to_thread(staged.open, "wb")
        try:
            while chunk := await part.read_chunk(_CHUNK):
                await asyncio.to_thread(handle.write, chunk)
        finally:
            await asyncio.to_thread(handle.close)

    @staticmethod
    async def _place(staged: Path, target: Path) -> None:
        def place() -> None:
            target.parent.mkdir(parents=True, exist_ok=True)
            os.replace(staged, target)

        try:
            await asyncio.to_thread(place)
        except OSError as exc:
            raise ApiError(400, f"cannot write {target.name}: {exc.strerror}") from None

    async def download_file(self, request: web.Request) -> web.StreamResponse:
        """The file's bytes, sent a chunk at a time."""
        devbox = self.api.running(request)
        body = await self.api.body(request)
        target = self.api.path(devbox, body.get("path"), "path")
        try:
            handle = await asyncio.to_thread(target.open, "rb")
        except FileNotFoundError:
            raise ApiError(400, f"No such file or directory: {body['path']}") from None
        except OSError as exc:
            raise ApiError(400, f"cannot read {body['path']}: {exc.strerror}") from None
        try:
            size = os.fstat(handle.fileno()).st_size
            response = web.StreamResponse(headers={"Content-Type": "application/octet-stream"})
            response.content_length = size
            await response.prepare(request)
            while chunk := await asyncio.to_thread(handle.read, _CHUNK):
                await response.write(chunk)
            await response.write_eof()
        finally:
            handle.close()
        return response

    @staticmethod
    async def _write(target: Any, data: bytes) -> None:
        def write() -> None:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)

        try:
            await asyncio.to_thread(write)
        except OSError as exc:
            raise ApiError(400, f"cannot write {target.name}: {exc.strerror}") from None

    @staticmethod
    async def _read(target: Any, path: str) -> bytes:
        try:
            data: bytes = await asyncio.to_thread(target.read_bytes)
        except FileNotFoundError:
            raise ApiError(400, f"No such file or directory: {path}") from None
        except OSError as exc:
            raise ApiError(400, f"cannot read {path}: {exc.strerror}") from None
        return data
