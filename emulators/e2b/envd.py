"""envd, the agent inside every E2B sandbox: processes, filesystem, file transfer.

With ``sandbox_url`` set, the SDK sends every sandbox request to one URL and
names the sandbox in the ``E2b-Sandbox-Id`` header and its envd token in
``X-Access-Token``. A sandbox that is gone answers what E2B's proxy answers,
a 502 whose message says it "was not found" (the SDK turns that into
``SandboxNotRunningException``); so does a paused one, unless its
lifecycle auto-resumes it: then the request resumes it.

* ``/process.Process/*`` (Connect): commands and terminals, served by
  `emulators.e2b.processes.ProcessService`.
* ``/filesystem.Filesystem/*`` (Connect): ``Stat``, ``ListDir``, ``MakeDir``,
  ``Remove``, ``Move``, and the watchers of `emulators.e2b.watch`.
* ``GET /files?path=`` downloads, ``POST /files`` uploads (multipart field
  ``file`` or an ``application/octet-stream`` body; ``X-Metadata-*`` headers
  become the file's ``user.e2b.*`` xattrs), ``GET /health``. A ``/files`` URL
  may carry a v1 ``signature`` of the envd token instead of the token.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import hmac
import json
import os
import posixpath
import shutil
import stat
import time
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from aiohttp import web

from emulators.e2b.connect import (
    Message,
    RpcError,
    Send,
    StreamHandler,
    UnaryHandler,
    serve_stream,
    serve_unary,
)
from emulators.e2b.processes import ProcessService, keepalive_of
from emulators.e2b.sandboxes import E2B_HOME, E2BSandbox
from emulators.e2b.watch import DirWatcher
from emulators.filesystem import PathRefused

if TYPE_CHECKING:
    from emulators.e2b import E2BEmulator

__all__ = ["Envd"]

_HTTP: dict[int, type[web.HTTPException]] = {
    400: web.HTTPBadRequest,
    401: web.HTTPUnauthorized,
    404: web.HTTPNotFound,
    502: web.HTTPBadGateway,
}


def _json_error(status: int, message: str) -> web.HTTPException:
    """envd's (and E2B's proxy's) plain JSON error, raised from a handler."""
    body = json.dumps({"code": status, "message": message})
    return _HTTP[status](text=body, content_type="application/json")


def _link_host(sandbox: E2BSandbox, path: str | None, *, write: bool = False) -> Path:
    """The host path of ``path`` with its last element not followed (a symlink stays one)."""
    absolute = sandbox.local.absolute(path or E2B_HOME)
    parent, name = posixpath.split(absolute)
    if not name:
        return sandbox.host(absolute, write=write)
    return sandbox.host(parent, write=write) / name


_GO_MODE_LETTERS = (
    (stat.S_ISDIR, "d"),
    (stat.S_ISLNK, "L"),
    (lambda m: stat.S_ISBLK(m) or stat.S_ISCHR(m), "D"),
    (stat.S_ISFIFO, "p"),
    (stat.S_ISSOCK, "S"),
    (lambda m: bool(m & stat.S_ISUID), "u"),
    (lambda m: bool(m & stat.S_ISGID), "g"),
    (stat.S_ISCHR, "c"),
    (lambda m: bool(m & stat.S_ISVTX), "t"),
)


def _go_filemode(mode: int) -> str:
    """``mode`` as Go's ``os.FileMode.String`` writes it (envd's ``permissions``):
    type and special letters (``-`` when none), then ``rwxrwxrwx``."""
    kind = "".join(letter for test, letter in _GO_MODE_LETTERS if test(mode)) or "-"
    return kind + "".join(c if mode & (1 << (8 - i)) else "-" for i, c in enumerate("rwxrwxrwx"))


def _entry(sandbox: E2BSandbox, host: Path) -> Message:
    """envd's EntryInfo: a symlink is described by its target (type, mode) and flagged,
    with the target resolved to an absolute sandbox path (the link's own when dangling)."""
    info = host.lstat()
    path = sandbox.local.vendor(host)
    entry: Message = {"name": host.name, "path": path}
    mode_of = info
    file_type = "FILE_TYPE_FILE"
    if stat.S_ISLNK(info.st_mode):
        target = sandbox.host(path)
        try:
            mode_of = target.stat()
        except OSError:
            file_type = "FILE_TYPE_UNSPECIFIED"
        entry["isSymlink"] = True
        entry["symlinkTarget"] = (
            sandbox.local.vendor(target) if file_type != "FILE_TYPE_UNSPECIFIED" else path
        )
    if stat.S_ISDIR(mode_of.st_mode):
        file_type = "FILE_TYPE_DIRECTORY"
    entry.update(
        type=file_type,
        size=str(info.st_size),
        mode=stat.S_IMODE(mode_of.st_mode),
        permissions=_go_filemode(info.st_mode),
        owner="user",
        group="user",
        modifiedTime=datetime.fromtimestamp(info.st_mtime, UTC).isoformat().replace("+00:00", "Z"),
    )
    if metadata := _read_metadata(host):
        entry["metadata"] = metadata
    return entry


CHUNK = 1 << 20
_OPERATIONS = {"GET": "read", "POST": "write"}
XATTR_PREFIX = "user.e2b."
METADATA_HEADER = "x-metadata-"
_MAX_KEY = 246
_MAX_METADATA = 4096


def _signature(request: web.Request, token: str) -> str:
    """The v1 signature a client holding ``token`` makes for this file request: sha256 of
    ``path:operation:username:token[:expiration]``, unpadded base64."""
    query = request.query
    parts = [
        query.get("path", ""),
        _OPERATIONS.get(request.method, ""),
        query.get("username", ""),
        token,
    ]
    if "signature_expiration" in query:
        parts.append(query["signature_expiration"])
    digest = hashlib.sha256(":".join(parts).encode()).digest()
    return "v1_" + base64.b64encode(digest).rstrip(b"=").decode()


def _metadata_of(request: web.Request) -> dict[str, str]:
    """An upload's ``X-Metadata-<key>`` headers (key lowercased, first value kept), checked
    as envd checks them: printable US-ASCII, keys of at most 246 bytes, 4096 in all."""
    metadata: dict[str, str] = {}
    for raw_name, raw_value in request.raw_headers:
        name = raw_name.decode("latin-1").lower()
        if not name.startswith(METADATA_HEADER):
            continue
        key, value = name[len(METADATA_HEADER) :], raw_value.decode("latin-1")
        if not key or not all(0x20 <= ord(c) <= 0x7E for c in key + value):
            raise _json_error(400, f"invalid metadata {key!r}: only printable US-ASCII")
        if len(key) > _MAX_KEY:
            raise _json_error(400, f"metadata key {key!r} is longer than {_MAX_KEY} bytes")
        metadata.setdefault(key, value)
    total = sum(len(XATTR_PREFIX) + len(k) + len(v) for k, v in metadata.items())
    if total > _MAX_METADATA:
        raise _json_error(400, f"metadata takes {total} bytes, more than {_MAX_METADATA}")
    return metadata


def _read_metadata(host: Path) -> dict[str, str]:
    """The ``user.e2b.*`` xattrs of a file, prefix stripped (none when unreadable)."""
    try:
        names = os.listxattr(host)
        return {
            name[len(XATTR_PREFIX) :]: os.getxattr(host, name).decode("utf-8", "replace")
            for name in names
            if name.startswith(XATTR_PREFIX)
        }
    except OSError:
        return {}


async def _part_chunks(part: Any) -> AsyncIterator[bytes]:
    """A multipart file part's content as it arrives."""
    while chunk := await part.read_chunk(CHUNK):
        yield bytes(chunk)


class Envd:
    """envd's services for every sandbox of the emulator."""

    def __init__(self, emulator: E2BEmulator) -> None:
        self.core = emulator.core
        self.processes = ProcessService(emulator.core.local.opts.python)

    def routes(self) -> list[web.RouteDef]:
        return [
            web.get("/health", self.health),
            web.get("/files", self.download),
            web.post("/files", self.upload),
            web.post(r"/{service:(process\.Process|filesystem\.Filesystem)}/{method}", self.rpc),
        ]

    async def sandbox(self, request: web.Request, *, envd: bool = True) -> E2BSandbox:
        """The sandbox a request is for, with its access token (or file signature) checked;
        not ``envd``'s (a port's server, the code interpreter's: E2B's proxy then checks
        only the traffic token of a sandbox that restricts public traffic)."""
        signature = request.query.get("signature") if request.path == "/files" else None
        sandbox_id = request.headers.get("E2b-Sandbox-Id")
        if not sandbox_id and signature is not None:
            sandbox_id = self._signed_by(request, signature)
        if not sandbox_id:
            raise _json_error(400, "missing E2b-Sandbox-Id header")
        sandbox = self.core.alive_sandbox(sandbox_id)
        if sandbox is None:
            raise _json_error(502, f"The sandbox {sandbox_id} was not found")
        if not await self.core.woken(sandbox_id):
            raise _json_error(502, f"The sandbox {sandbox_id} was not found: it is paused")
        if not envd:
            traffic = request.headers.get("E2B-Traffic-Access-Token")
            if sandbox.traffic_token is not None and traffic != sandbox.traffic_token:
                raise _json_error(403, "missing or invalid traffic access token")
            return sandbox
        token = request.headers.get("X-Access-Token")
        if token is None and signature is not None:
            self._check_signature(request, signature, sandbox.token)
        elif token != sandbox.token:
            raise _json_error(401, "unauthorized access, please provide a valid access token")
        return sandbox

    def _signed_by(self, request: web.Request, signature: str) -> str:
        """The sandbox whose envd token made ``signature``: a signed URL on the shared
        ``sandbox_url`` names no sandbox (on E2B its host does)."""
        for sandbox_id, sandbox in self.core.e2b.items():
            if self.core.alive_sandbox(sandbox_id) is not None and hmac.compare_digest(
                signature, _signature(request, sandbox.token)
            ):
                return sandbox_id
        raise _json_error(401, "invalid signature")

    @staticmethod
    def _check_signature(request: web.Request, signature: str, token: str) -> None:
        """envd's order: a signature that does not match, then one past its expiry."""
        if not hmac.compare_digest(signature, _signature(request, token)):
            raise _json_error(401, "invalid signature")
        expiration = request.query.get("signature_expiration")
        if expiration is not None and not expiration.lstrip("-").isdigit():
            raise _json_error(401, "invalid signature_expiration")
        if expiration is not None and int(expiration) < time.time():
            raise _json_error(401, "signature is already expired")

    # -- HTTP API ----------------------------------------------------------
    async def health(self, request: web.Request) -> web.Response:
        await self.sandbox(request)
        return web.Response(status=204)

    async def download(self, request: web.Request) -> web.StreamResponse:
        sandbox = await self.sandbox(request)
        path = request.query.get("path", "")
        host = self._host(sandbox, path)
        if not host.exists():
            raise _json_error(404, f"path '{path}' does not exist")
        if host.is_dir():
            raise _json_error(400, f"path '{path}' is a directory")
        return web.FileResponse(host, headers={"Content-Type": "application/octet-stream"})

    async def upload(self, request: web.Request) -> web.Response:
        sandbox = await self.sandbox(request)
        path = request.query.get("path")
        metadata = _metadata_of(request)
        written: list[Message] = []
        if request.content_type == "multipart/form-data":
            reader = await request.multipart()
            while (part := await reader.next()) is not None:
                if getattr(part, "name", None) != "file":
                    continue
                target = path or getattr(part, "filename", None)
                if not target:
                    raise _json_error(400, "a file part names no path")
                absolute = sandbox.local.vendor(self._host(sandbox, target, write=True))
                if any(entry["path"] == absolute for entry in written):
                    raise _json_error(
                        400,
                        f"you cannot upload multiple files to the same path '{absolute}' in one"
                        " upload request, only the first specified file was uploaded",
                    )
                written.append(await self._write(sandbox, target, _part_chunks(part), metadata))
        else:
            if not path:
                raise _json_error(400, "missing path")
            written.append(
                await self._write(sandbox, path, request.content.iter_chunked(CHUNK), metadata)
            )
        return web.json_response(written)

    def _host(self, sandbox: E2BSandbox, path: str, *, write: bool = False) -> Path:
        try:
            return sandbox.host(path, write=write)
        except PathRefused as exc:
            raise _json_error(400, str(exc)) from None

    async def _write(
        self,
        sandbox: E2BSandbox,
        path: str,
        chunks: AsyncIterator[bytes],
        metadata: dict[str, str],
    ) -> Message:
        """Write the body as it arrives into a file beside the target, then move it there
        with the upload's metadata (and no other) as its xattrs."""
        host = self._host(sandbox, path, write=True)
        if host.is_dir():
            raise _json_error(400, f"path '{path}' is a directory")
        await asyncio.to_thread(host.parent.mkdir, parents=True, exist_ok=True)
        existed = host.exists()
        partial = host.with_name(f".{host.name}.upload-{os.urandom(4).hex()}")
        out = await asyncio.to_thread(partial.open, "wb")
        try:
            async for chunk in chunks:
                await asyncio.to_thread(out.write, chunk)
            out.close()
            for key, value in metadata.items():
                os.setxattr(partial, XATTR_PREFIX + key, value.encode())
            kinds = ["CHMOD", "WRITE"] if existed else ["CREATE", "CHMOD", "WRITE"]
            await asyncio.to_thread(
                sandbox.watchers.change, lambda: partial.replace(host), host, kinds
            )
        finally:
            out.close()
            partial.unlink(missing_ok=True)
        entry: Message = {"name": host.name, "type": "file", "path": sandbox.local.vendor(host)}
        if metadata:
            entry["metadata"] = metadata
        return entry

    # -- Connect RPC -------------------------------------------------------
    async def rpc(self, request: web.Request) -> web.StreamResponse:
        sandbox = await self.sandbox(request)
        name = f"{request.match_info['service']}/{request.match_info['method']}"
        streams: dict[str, StreamHandler] = {
            **self.processes.streams(sandbox, request),
            "filesystem.Filesystem/WatchDir": lambda m, send: self.watch_dir(
                sandbox, m, send, keepalive_of(request)
            ),
        }
        unaries: dict[str, UnaryHandler] = {
            **self.processes.unaries(sandbox),
            "filesystem.Filesystem/Stat": lambda m: self.fs(sandbox, m, self._stat),
            "filesystem.Filesystem/ListDir": lambda m: self.fs(sandbox, m, self._list_dir),
            "filesystem.Filesystem/MakeDir": lambda m: self.fs(sandbox, m, self._make_dir),
            "filesystem.Filesystem/Remove": lambda m: self.fs(sandbox, m, self._remove),
            "filesystem.Filesystem/Move": lambda m: self.fs(sandbox, m, self._move),
            "filesystem.Filesystem/CreateWatcher": lambda m: self.create_watcher(sandbox, m),
            "filesystem.Filesystem/GetWatcherEvents": sandbox.watchers.events,
            "filesystem.Filesystem/RemoveWatcher": lambda m: self._sync(sandbox.watchers.remove, m),
        }
        if name in streams:
            return await serve_stream(request, streams[name])
        if name in unaries:
            return await serve_unary(request, unaries[name])
        return web.json_response(
            {"code": "unimplemented", "message": f"{name} is not emulated"}, status=501
        )

    @staticmethod
    async def _sync(op: Callable[[Message], Message], message: Message) -> Message:
        return op(message)

    async def _watcher(self, sandbox: E2BSandbox, message: Message) -> DirWatcher:
        path = message.get("path") or E2B_HOME

        def opened(_: E2BSandbox, __: Message) -> Message:
            root = sandbox.host(path)
            return {
                "watcher": sandbox.watchers.open(
                    root, path, message, lambda host: _entry(sandbox, host)
                )
            }

        watcher: DirWatcher = (await self.fs(sandbox, message, opened))["watcher"]
        return watcher

    async def watch_dir(
        self, sandbox: E2BSandbox, message: Message, send: Send, keepalive: float | None
    ) -> None:
        watcher = await self._watcher(sandbox, message)
        await sandbox.watchers.stream(
            watcher, send, keepalive, lambda: self.core.alive_sandbox(sandbox.id) is not None
        )

    async def create_watcher(self, sandbox: E2BSandbox, message: Message) -> Message:
        return sandbox.watchers.create(await self._watcher(sandbox, message))

    async def fs(self, sandbox: E2BSandbox, message: Message, op: Any) -> Message:
        """Run one filesystem operation off the loop, mapping OS errors to RPC codes with
        envd's messages, which name the (absolute) path."""
        try:
            result: Message = await asyncio.to_thread(op, sandbox, message)
        except PathRefused as exc:
            raise RpcError("invalid_argument", str(exc)) from None
        except OSError as exc:
            where = message.get("path") or message.get("source") or E2B_HOME
            with contextlib.suppress(PathRefused):
                where = sandbox.local.absolute(str(where))
            if isinstance(exc, FileNotFoundError):
                message_ = f"file not found: {where}: no such file or directory"
                raise RpcError("not_found", message_) from None
            if isinstance(exc, FileExistsError):
                raise RpcError("already_exists", f"file already exists: {where}") from None
            if isinstance(exc, NotADirectoryError):
                raise RpcError("invalid_argument", f"path is not a directory: {where}") from None
            raise RpcError("internal", f"{exc.strerror}: {where}") from None
        return result

    def _stat(self, sandbox: E2BSandbox, message: Message) -> Message:
        return {"entry": _entry(sandbox, _link_host(sandbox, message.get("path")))}

    def _list_dir(self, sandbox: E2BSandbox, message: Message) -> Message:
        root = sandbox.host(message.get("path"))
        if not root.is_dir():
            raise NotADirectoryError(root)
        depth = max(int(message.get("depth") or 1), 1)
        entries: list[Message] = []

        def walk(directory: Path, level: int) -> None:
            for child in sorted(directory.iterdir()):
                entries.append(_entry(sandbox, child))
                if level < depth and child.is_dir() and not child.is_symlink():
                    walk(child, level + 1)

        walk(root, 1)
        return {"entries": entries}

    def _make_dir(self, sandbox: E2BSandbox, message: Message) -> Message:
        host = sandbox.host(message.get("path"), write=True)
        host.mkdir(parents=True)
        return {"entry": _entry(sandbox, host)}

    def _remove(self, sandbox: E2BSandbox, message: Message) -> Message:
        host = _link_host(sandbox, message.get("path"), write=True)
        if host.is_dir() and not host.is_symlink():
            shutil.rmtree(host)
        else:
            host.unlink(missing_ok=True)  # envd's os.RemoveAll: gone already is removed
        return {}

    def _move(self, sandbox: E2BSandbox, message: Message) -> Message:
        source = _link_host(sandbox, message.get("source"), write=True)
        destination = _link_host(sandbox, message.get("destination"), write=True)
        destination.parent.mkdir(parents=True, exist_ok=True)
        source.rename(destination)
        return {"entry": _entry(sandbox, destination)}
