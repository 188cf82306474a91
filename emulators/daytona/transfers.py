"""The daemon's file transfers: uploads and downloads, one file or many, streamed.

Under ``{toolboxProxyUrl}/{sandboxId}`` (`emulators.daytona.toolbox` answers for the proxy):
``POST /files/bulk-upload`` (multipart ``files[i].file``, its destination in
``files[i].path`` or else the part's filename), ``POST /files/bulk-download``
(``{paths}`` in, a multipart/form-data response out: a ``file`` part per
path, or an ``error`` part with the daemon's JSON error, each part naming
the requested path exactly in ``filename*``); one file: ``GET
/files/download`` and ``POST /files/upload-v2`` (multipart ``file`` or the
raw body), which the proxy also takes with no key when pre-signed. A file
arriving is staged beside the sandbox as it streams in, then moved into
place; one leaving is read a chunk at a time. Listing and managing files is
`emulators.daytona.files`.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import shutil
import urllib.parse
from pathlib import Path
from typing import BinaryIO

from aiohttp import BodyPartReader, StreamReader, web

from emulators.daytona.files import host_path, os_call, required, writable
from emulators.daytona.sandboxes import Box
from emulators.daytona.toolbox import BOX, DaemonError, daemon_error, json_body
from emulators.filesystem import PathRefused

__all__ = ["Transfers"]

CHUNK = 1 << 20
_ATTR_CHARS = frozenset("!#$&+-.^_`|~")


def _content_disposition(form_name: str | None, path: str) -> bytes:
    """A part's Content-Disposition as the daemon writes it, naming ``path`` exactly (with no
    ``form_name``: a download's ``attachment``).

    ``filename`` is a Latin-1 approximation (quotes and backslashes escaped,
    control characters and anything beyond Latin-1 made ``_``); ``filename*``
    carries the path byte for byte (RFC 5987), and is what the SDK matches.
    """
    escaped = path.replace("\\", "\\\\").replace('"', '\\"')
    latin1 = "".join(
        "" if c in "\r\n\x00" else "_" if ord(c) > 0xFF or ord(c) < 0x20 or c == "\x7f" else c
        for c in escaped
    )
    encoded = "".join(
        chr(b) if chr(b).isascii() and (chr(b).isalnum() or chr(b) in _ATTR_CHARS) else f"%{b:02X}"
        for b in path.encode()
    )
    kind = "attachment" if form_name is None else f'form-data; name="{form_name}"'
    return (
        f'{kind}; filename="{latin1}"; '.encode("latin-1") + f"filename*=utf-8''{encoded}".encode()
    )


class Transfers:
    """The upload and download handlers (the sandbox is the proxy's `BOX`)."""

    def routes(self) -> list[web.RouteDef]:
        base = "/toolbox/{sandbox}/files"
        return [
            web.post(base + "/bulk-upload", self.upload),
            web.post(base + "/bulk-download", self.download),
            web.get(base + "/download", self.download_one),
            web.post(base + "/upload-v2", self.upload_one),
        ]

    async def upload(self, request: web.Request) -> web.Response:
        """Each file part is streamed to a staging file as it arrives, then moved to
        its path (which may come before or after it in the form)."""
        box: Box = request[BOX]
        paths: dict[str, str] = {}
        named: dict[str, str] = {}
        staged: dict[str, tuple[Path, int]] = {}
        staging = _staging(box)
        try:
            reader = await request.multipart()
            while (part := await reader.next()) is not None:
                name = (part.name or "") if isinstance(part, BodyPartReader) else ""
                if not isinstance(part, BodyPartReader) or not name.startswith("files["):
                    continue
                index, _, kind = name[len("files[") :].partition("].")
                if kind == "path":
                    paths[index] = (await part.read()).decode()
                elif kind == "file":
                    staged[index] = await _stage(part, staging)
                    if part.filename:
                        named[index] = urllib.parse.unquote(part.filename)
            errors, written = [], []
            for index, (file, size) in staged.items():
                dest = paths.get(index) or named.get(index)
                if dest is None:
                    errors.append(f"files[{index}]: no destination path")
                    continue
                try:
                    await asyncio.to_thread(_place, file, box.local.host(dest, write=True))
                except PathRefused as exc:
                    errors.append(str(exc))
                    continue
                except OSError as exc:
                    errors.append(f"{dest}: {exc}")
                    continue
                written.append({"path": dest, "bytes": size})
        finally:
            await asyncio.to_thread(_unstage, staging)
        if errors:
            return web.json_response({"errors": errors, "files": written}, status=400)
        return web.json_response({"files": written})

    async def download(self, request: web.Request) -> web.StreamResponse:
        """The files as multipart parts, each read from disk a chunk at a time."""
        box: Box = request[BOX]
        paths = (await json_body(request)).get("paths")
        if not isinstance(paths, list) or not all(isinstance(p, str) for p in paths):
            raise DaemonError(400, "paths must be a list of strings", "INVALID_REQUEST_BODY")
        boundary = secrets.token_hex(16)
        response = web.StreamResponse(
            headers={"Content-Type": f"multipart/form-data; boundary={boundary}"}
        )
        await response.prepare(request)
        for path in paths:
            opened = await self._open_part(box, path, request)
            name, content_type, size = opened[:3]

            def head(name: str, content_type: str, size: int, path: str = path) -> bytes:
                return (
                    f"--{boundary}\r\nContent-Type: {content_type}\r\n".encode()
                    + b"Content-Disposition: "
                    + _content_disposition(name, path)
                    + f"\r\nContent-Length: {size}\r\n\r\n".encode()
                )

            await response.write(head(name, content_type, size))
            body = opened[3]
            if isinstance(body, bytes):
                await response.write(body)
            else:
                try:
                    while chunk := await asyncio.to_thread(body.read, CHUNK):
                        await response.write(chunk)
                finally:
                    body.close()
            await response.write(b"\r\n")
        await response.write(f"--{boundary}--\r\n".encode())
        await response.write_eof()
        return response

    async def download_one(self, request: web.Request) -> web.StreamResponse:
        """One file, its body the response's (``GET /files/download?path=``)."""
        box: Box = request[BOX]
        (path,) = required(request, "path")
        target = host_path(box, path)
        handle = await os_call(path, lambda: target.open("rb"))
        try:
            size = os.fstat(handle.fileno()).st_size
            response = web.StreamResponse(
                headers={
                    "Content-Type": "application/octet-stream",
                    "Content-Disposition": _content_disposition(None, target.name).decode(
                        "latin-1"
                    ),
                    "Content-Length": str(size),
                }
            )
            await response.prepare(request)
            while chunk := await asyncio.to_thread(handle.read, CHUNK):
                await response.write(chunk)
            await response.write_eof()
            return response
        finally:
            handle.close()

    async def upload_one(self, request: web.Request) -> web.Response:
        """One file to ``path`` (its directories made): the ``file`` part of a multipart body,
        or the raw body."""
        box: Box = request[BOX]
        (path,) = required(request, "path")
        target = writable(box, path)
        staging = _staging(box)
        try:
            if request.content_type.startswith("multipart/form-data"):
                reader = await request.multipart()
                staged = None
                while (part := await reader.next()) is not None:
                    if isinstance(part, BodyPartReader) and part.name == "file":
                        staged = await _stage(part, staging)
                        break
                if staged is None:
                    raise DaemonError(400, "http: no such file", "BAD_REQUEST")
            else:
                staged = await _stage(request.content, staging)
            await os_call(path, lambda: _place(staged[0], target))
        finally:
            await asyncio.to_thread(_unstage, staging)
        return web.json_response({"name": target.name, "path": path, "type": "file"})

    async def _open_part(
        self, box: Box, path: str, request: web.Request
    ) -> tuple[str, str, int, bytes | BinaryIO]:
        """The part for ``path``: the file opened (and its size), or the daemon's error."""
        try:
            host = box.local.host(path)
            handle = await asyncio.to_thread(host.open, "rb")
        except PathRefused as exc:
            error = daemon_error(400, str(exc), "INVALID_FILE_PATH", request)
        except FileNotFoundError:
            error = daemon_error(404, f"file not found: {path}", "FILE_NOT_FOUND", request)
        except IsADirectoryError:
            error = daemon_error(400, f"path is a directory: {path}", "BAD_REQUEST", request)
        except PermissionError:
            error = daemon_error(403, f"permission denied: {path}", "FILE_ACCESS_DENIED", request)
        else:
            size = os.fstat(handle.fileno()).st_size
            return "file", "application/octet-stream", size, handle
        assert isinstance(error.body, bytes)
        return "error", "application/json", len(error.body), error.body


async def _stage(part: BodyPartReader | StreamReader, staging: Path) -> tuple[Path, int]:
    """A file part (or a raw body) written to a staging file as it arrives: its path, size."""
    await asyncio.to_thread(staging.mkdir, parents=True, exist_ok=True)
    file = staging / secrets.token_hex(8)
    size = 0
    read = part.read_chunk if isinstance(part, BodyPartReader) else part.read
    with await asyncio.to_thread(file.open, "wb") as out:
        while chunk := await read(CHUNK):
            await asyncio.to_thread(out.write, chunk)
            size += len(chunk)
    return file, size


def _staging(box: Box) -> Path:
    """A directory of this request's own for the files it receives (beside the sandbox's,
    so a move from it is a rename): uploads running at once never share one."""
    return box.local.dir.parent / f".{box.local.id}.uploads" / secrets.token_hex(8)


def _unstage(staging: Path) -> None:
    """Remove a request's staging directory, and the sandbox's once no upload uses it."""
    shutil.rmtree(staging, ignore_errors=True)
    with contextlib.suppress(OSError):
        staging.parent.rmdir()


def _place(staged: Path, target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.move(staged, target)
