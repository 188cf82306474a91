"""Modal Volumes, their file APIs, and the blob storage large uploads go through.

A volume is a host directory under the emulator's root, owned by a
workspace and named within an environment (or ephemeral: no name, until the
emulator stops; Modal drops one some minutes after its heartbeats stop). A
sandbox create's ``volume_mounts`` mount that directory for real
(`emulators.filesystem.GuestSandbox` ``mounts``; a ``sub_path`` is a
directory in it, made if missing), so what one sandbox writes there another
mounting the volume reads, and the SDK's file API reads it too. Deleting
a volume deletes its files, under the sandboxes mounting it too.

Modal's volumes are eventually consistent: a container sees others' changes
after its ``reload`` and publishes its own at ``commit`` (or in the
background). Here every mount and the file API share one directory, so
changes are seen at once; ``VolumeCommit``, ``VolumeReload`` and the
command router's ``TaskReloadVolumes`` succeed and change nothing. That is a
strictly stronger guarantee: code that commits and reloads as Modal asks
works, code that forgets to is not caught. A ``read_only`` mount is
read-only under bubblewrap; without it only the file APIs refuse writes
there (`emulators.filesystem.GuestSandbox` ``read_only``).

Both file APIs are served whatever a volume's version (a new volume is V1,
Modal's default, unless the request asks for V2; the SDK picks its RPCs by
the version): V1 puts files as mount contents (``MountPutFile``, through a
blob from 4 MiB) named by ``VolumePutFiles``; V2 puts 8 MiB blocks by
SHA-256 (``VolumePutFiles2`` answers the blocks it lacks, each with a URL
to PUT it to). Reads are ``VolumeGetFile2``: one presigned URL per block.

Blob storage (`BlobStore`) is an HTTP listener of the emulator's own, as
S3 is Modal's: ``BlobCreate`` answers one single-part upload URL whatever
the size (Modal may ask for a multipart upload), answered with the MD5
``ETag`` the SDK checks; ``BlobGet`` a download URL. Its URLs carry a
signed token (`emulators.modal.sandboxes.Tokens`) saying what they reach.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import posixpath
import shutil
import stat
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from aiohttp import web
from google.protobuf import empty_pb2  # type: ignore[import-untyped]
from grpclib import GRPCError, Status
from grpclib.server import Stream
from modal_proto import api_pb2

from emulators.filesystem import mountable
from emulators.modal.sandboxes import Tokens, new_id

if TYPE_CHECKING:
    from emulators.modal import ModalEmulator

__all__ = ["BLOCK_SIZE", "BlobStore", "ModalVolume", "VolumeRpcs", "Volumes"]

BLOCK_SIZE = 8 * 1024 * 1024  # the SDK's (modal._utils.blob_utils.BLOCK_SIZE)
_URL_TTL = 3600
_LIST_BATCH = 100
_V1 = api_pb2.VOLUME_FS_VERSION_V1
_Req = Stream[Any, Any]


@dataclass
class ModalVolume:
    """One volume: its Modal fields and the host directory holding its files."""

    id: str
    name: str  # "" for an ephemeral volume
    environment: str
    owner: str
    version: api_pb2.VolumeFsVersion.ValueType
    dir: Path
    created_at: float = field(default_factory=time.time)

    def metadata(self) -> api_pb2.VolumeMetadata:
        return api_pb2.VolumeMetadata(
            version=self.version,
            name=self.name,
            creation_info=api_pb2.CreationInfo(created_at=self.created_at, created_by="emulator"),
        )

    def host(self, path: str) -> Path:
        """The host path of a path in the volume (``/`` and ``""`` are its root)."""
        if "\x00" in path:
            raise GRPCError(Status.INVALID_ARGUMENT, "path contains a NUL byte")
        rest = posixpath.normpath("/" + path).lstrip("/")
        return self.dir / rest if rest else self.dir

    def existing(self, path: str) -> Path:
        target = self.host(path)
        if not os.path.lexists(target):
            raise GRPCError(Status.NOT_FOUND, f"No such file or directory: {path}")
        return target

    def entries(self, path: str, recursive: bool) -> Iterator[api_pb2.FileEntry]:
        """What ``listdir`` shows: a file's own entry, or a directory's children (all
        below it with ``recursive``), each by its path in the volume."""
        target = self.existing(path)
        if not target.is_dir() or target.is_symlink():
            yield self._entry(target)
            return
        children = target.rglob("*") if recursive else target.iterdir()
        for child in sorted(children):
            yield self._entry(child)

    def _entry(self, host: Path) -> api_pb2.FileEntry:
        info = host.lstat()
        if stat.S_ISLNK(info.st_mode):
            kind = api_pb2.FileEntry.SYMLINK
        elif stat.S_ISDIR(info.st_mode):
            kind = api_pb2.FileEntry.DIRECTORY
        elif stat.S_ISFIFO(info.st_mode):
            kind = api_pb2.FileEntry.FIFO
        elif stat.S_ISSOCK(info.st_mode):
            kind = api_pb2.FileEntry.SOCKET
        else:
            kind = api_pb2.FileEntry.FILE
        return api_pb2.FileEntry(
            path=str(host.relative_to(self.dir)),
            type=kind,
            mtime=int(info.st_mtime),
            size=info.st_size,
        )

    def put(self, path: str, data: bytes | Path, mode: int, *, overwrite: bool) -> None:
        """Write a file (contents or a host file to copy), its parents made."""
        target = self.host(path)
        if target == self.dir or target.is_dir():
            raise GRPCError(Status.INVALID_ARGUMENT, f"{path} is a directory")
        if not overwrite:
            self.absent(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(data, Path):
            shutil.copyfile(data, target)
        else:
            target.write_bytes(data)
        target.chmod((mode & 0o7777) or 0o644)

    def absent(self, path: str) -> None:
        """Refuse to overwrite ``path`` (ALREADY_EXISTS)."""
        if os.path.lexists(self.host(path)):
            raise GRPCError(Status.ALREADY_EXISTS, f"{path}: file already exists")

    def remove(self, path: str, recursive: bool) -> None:
        target = self.existing(path)
        if target == self.dir:
            raise GRPCError(Status.INVALID_ARGUMENT, "cannot remove the root of a volume")
        if target.is_dir() and not target.is_symlink():
            if not recursive:
                raise GRPCError(
                    Status.INVALID_ARGUMENT, f"{path} is a directory: remove it with recursive=True"
                )
            shutil.rmtree(target)
        else:
            target.unlink()

    def copy(self, sources: list[str], destination: str, recursive: bool) -> None:
        """``cp`` (``-r`` with ``recursive``): into ``destination`` when it is a directory,
        ends with ``/`` or there are several sources, else to it."""
        found = [self.existing(source) for source in sources]
        target = self.host(destination)
        into = target.is_dir() or destination.endswith("/") or len(found) > 1
        for source in found:
            to = target / source.name if into else target
            if source.is_dir():
                if not recursive:
                    raise GRPCError(
                        Status.INVALID_ARGUMENT, f"{source.name} is a directory: copy recursively"
                    )
                if to == source or to.is_relative_to(source):
                    raise GRPCError(Status.INVALID_ARGUMENT, "cannot copy a directory into itself")
                shutil.copytree(source, to, symlinks=True, dirs_exist_ok=True)
            else:
                to.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(source, to, follow_symlinks=False)


class Volumes:
    """Every workspace's volumes, by id."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.volumes: dict[str, ModalVolume] = {}

    def get_or_create(self, workspace: str, request: Any) -> ModalVolume:
        """``VolumeGetOrCreate``: by name (its ``object_creation_type`` says whether to make
        one), or a new ephemeral volume."""
        environment = request.environment_name or "main"
        kind = request.object_creation_type
        if kind == api_pb2.OBJECT_CREATION_TYPE_EPHEMERAL:
            return self._new(workspace, "", environment, request.version)
        name = request.deployment_name
        found = self.named(workspace, environment, name)
        if found is not None:
            if kind == api_pb2.OBJECT_CREATION_TYPE_CREATE_FAIL_IF_EXISTS:
                raise GRPCError(Status.ALREADY_EXISTS, f"Volume '{name}' already exists")
            return found
        creates = (
            api_pb2.OBJECT_CREATION_TYPE_CREATE_IF_MISSING,
            api_pb2.OBJECT_CREATION_TYPE_CREATE_FAIL_IF_EXISTS,
        )
        if kind not in creates:
            raise GRPCError(
                Status.NOT_FOUND, f"Volume '{name}' not found in environment '{environment}'"
            )
        return self._new(workspace, name, environment, request.version)

    def _new(
        self,
        workspace: str,
        name: str,
        environment: str,
        version: api_pb2.VolumeFsVersion.ValueType,
    ) -> ModalVolume:
        volume_id = new_id("vo")
        directory = self.root / volume_id
        directory.mkdir(parents=True)
        volume = ModalVolume(volume_id, name, environment, workspace, version or _V1, directory)
        self.volumes[volume_id] = volume
        return volume

    def named(self, workspace: str, environment: str, name: str) -> ModalVolume | None:
        return next(
            (
                v
                for v in self.volumes.values()
                if v.owner == workspace and v.environment == environment and v.name == name
            ),
            None,
        )

    def get(self, workspace: str, volume_id: str) -> ModalVolume:
        volume = self.volumes.get(volume_id)
        if volume is None or volume.owner != workspace:
            raise GRPCError(Status.NOT_FOUND, f"Volume '{volume_id}' not found")
        return volume

    def delete(self, volume: ModalVolume) -> None:
        del self.volumes[volume.id]
        shutil.rmtree(volume.dir, ignore_errors=True)

    def mounts(self, workspace: str, specs: Any) -> tuple[dict[str, Path], set[str]]:
        """A create's ``volume_mounts`` as host directories by mount path (a ``sub_path``
        made if missing), and the paths mounted ``read_only``."""
        found: dict[str, Path] = {}
        read_only: set[str] = set()
        for spec in specs:
            volume = self.get(workspace, spec.volume_id)
            path = posixpath.normpath(spec.mount_path)
            if not mountable(path) or path == "/":
                raise GRPCError(Status.INVALID_ARGUMENT, f"Cannot mount a volume at {path}")
            if path in found:
                raise GRPCError(Status.INVALID_ARGUMENT, f"Two volumes mounted at {path}")
            directory = volume.host(spec.sub_path) if spec.HasField("sub_path") else volume.dir
            directory.mkdir(parents=True, exist_ok=True)
            found[path] = directory
            if spec.read_only:
                read_only.add(path)
        return found, read_only


class BlobStore:
    """Blobs and volume blocks on disk, and the HTTP listener their presigned URLs reach.

    Args:
        root: where the contents are kept.
        tokens: signs the URLs.
    """

    def __init__(self, root: Path, tokens: Tokens) -> None:
        self.root = root
        self.tokens = tokens
        self.base = ""  # set once the listener has its port
        (root / "blobs").mkdir(parents=True, exist_ok=True)
        (root / "blocks").mkdir(parents=True, exist_ok=True)

    def app(self) -> web.Application:
        app = web.Application(client_max_size=0)
        app.router.add_put("/put/{token}", self.put)
        app.router.add_get("/get/{token}", self.get)
        return app

    def blob(self, blob_id: str) -> Path:
        return self.root / "blobs" / blob_id

    def block(self, sha256: bytes) -> Path:
        return self.root / "blocks" / sha256.hex()

    def url(self, verb: str, **claims: str) -> str:
        return f"{self.base}/{verb}/{self.tokens.mint(_URL_TTL, **claims)}"

    def _claims(self, request: web.Request) -> dict[str, str]:
        claims = self.tokens.claims(request.match_info["token"])
        if claims is None:
            raise web.HTTPForbidden(text="the URL's signature is invalid or expired\n")
        return claims

    async def put(self, request: web.Request) -> web.Response:
        """An upload: a blob (answered with its MD5 ``ETag``, as S3 answers) or a volume
        block, checked against its SHA-256 (the answer is what ``VolumePutFiles2`` is
        given back)."""
        claims = self._claims(request)
        data = await request.read()
        if "blob" in claims:
            await asyncio.to_thread(self.blob(claims["blob"]).write_bytes, data)
            return web.Response(headers={"ETag": f'"{hashlib.md5(data).hexdigest()}"'})
        digest = hashlib.sha256(data).digest()
        if digest.hex() != claims.get("block"):
            return web.Response(status=400, text="the block does not match its SHA-256\n")
        await asyncio.to_thread(self.block(digest).write_bytes, data)
        return web.Response(body=digest)

    async def get(self, request: web.Request) -> web.Response:
        """A download: a blob, or a range of a volume's file."""
        claims = self._claims(request)
        if "blob" in claims:
            path, start, length = self.blob(claims["blob"]), 0, -1
        else:
            path, start, length = Path(claims["file"]), int(claims["start"]), int(claims["len"])
        try:
            data = await asyncio.to_thread(_read, path, start, length)
        except OSError:
            raise web.HTTPNotFound(text="no such object\n") from None
        return web.Response(body=data)


def _read(path: Path, start: int, length: int) -> bytes:
    with path.open("rb") as f:
        f.seek(start)
        return f.read(length)


class VolumeRpcs:
    """The volume and blob RPCs of the control plane (`emulators.modal.control.ControlPlane`
    mixes them in; it authenticates with ``_enter``)."""

    emu: ModalEmulator
    _enter: Callable[..., Awaitable[tuple[str, Any]]]

    def _volume(self, workspace: str, volume_id: str) -> ModalVolume:
        return self.emu.volumes.get(workspace, volume_id)

    # -- volumes as objects ------------------------------------------------------
    async def VolumeGetOrCreate(self, stream: _Req) -> None:
        workspace, request = await self._enter(stream, "volume")
        volume = self.emu.volumes.get_or_create(workspace, request)
        await stream.send_message(
            api_pb2.VolumeGetOrCreateResponse(
                volume_id=volume.id, version=volume.version, metadata=volume.metadata()
            )
        )

    async def VolumeGetById(self, stream: _Req) -> None:
        workspace, request = await self._enter(stream, "volume")
        volume = self._volume(workspace, request.volume_id)
        await stream.send_message(
            api_pb2.VolumeGetByIdResponse(volume_id=volume.id, metadata=volume.metadata())
        )

    async def VolumeHeartbeat(self, stream: _Req) -> None:
        workspace, request = await self._enter(stream, "volume")
        self._volume(workspace, request.volume_id)
        await stream.send_message(empty_pb2.Empty())

    async def VolumeList(self, stream: _Req) -> None:
        """Named volumes of the environment, newest first, a page at a time."""
        workspace, request = await self._enter(stream, "volume")
        environment = request.environment_name or "main"
        before = request.pagination.created_before or time.time() + 1
        found = sorted(
            (
                v
                for v in self.emu.volumes.volumes.values()
                if v.owner == workspace
                and v.name
                and v.environment == environment
                and v.created_at < before
            ),
            key=lambda v: v.created_at,
            reverse=True,
        )
        page = found[: request.pagination.max_objects or 100]
        items = [
            api_pb2.VolumeListItem(
                label=v.name, volume_id=v.id, created_at=v.created_at, metadata=v.metadata()
            )
            for v in page
        ]
        await stream.send_message(
            api_pb2.VolumeListResponse(items=items, environment_name=environment)
        )

    async def VolumeDelete(self, stream: _Req) -> None:
        workspace, request = await self._enter(stream, "volume")
        self.emu.volumes.delete(self._volume(workspace, request.volume_id))
        await stream.send_message(empty_pb2.Empty())

    async def VolumeRename(self, stream: _Req) -> None:
        workspace, request = await self._enter(stream, "volume")
        volume = self._volume(workspace, request.volume_id)
        if self.emu.volumes.named(workspace, volume.environment, request.name) is not None:
            raise GRPCError(Status.ALREADY_EXISTS, f"Volume '{request.name}' already exists")
        volume.name = request.name
        await stream.send_message(empty_pb2.Empty())

    async def VolumeCommit(self, stream: _Req) -> None:
        workspace, request = await self._enter(stream, "volume")
        self._volume(workspace, request.volume_id)
        await stream.send_message(api_pb2.VolumeCommitResponse(skip_reload=True))

    async def VolumeReload(self, stream: _Req) -> None:
        workspace, request = await self._enter(stream, "volume")
        self._volume(workspace, request.volume_id)
        await stream.send_message(empty_pb2.Empty())

    # -- files ---------------------------------------------------------------------
    async def VolumeListFiles(self, stream: _Req) -> None:
        await self._list_files(stream, api_pb2.VolumeListFilesResponse)

    async def VolumeListFiles2(self, stream: _Req) -> None:
        await self._list_files(stream, api_pb2.VolumeListFiles2Response)

    async def _list_files(self, stream: _Req, response: Any) -> None:
        workspace, request = await self._enter(stream, "volume")
        volume = self._volume(workspace, request.volume_id)
        limit = request.max_entries if request.HasField("max_entries") else None
        batch: list[api_pb2.FileEntry] = []
        for count, entry in enumerate(volume.entries(request.path, request.recursive)):
            if limit is not None and count >= limit:
                break
            batch.append(entry)
            if len(batch) == _LIST_BATCH:
                await stream.send_message(response(entries=batch))
                batch = []
        if batch:
            await stream.send_message(response(entries=batch))

    async def VolumeGetFile2(self, stream: _Req) -> None:
        """One presigned URL per block of the range asked for (blocks are aligned to
        `BLOCK_SIZE` in the file; the first may be shorter)."""
        workspace, request = await self._enter(stream, "volume")
        volume = self._volume(workspace, request.volume_id)
        target = volume.existing(request.path)
        if target.is_dir():
            raise GRPCError(Status.INVALID_ARGUMENT, f"{request.path} is a directory")
        size = target.stat().st_size
        start = min(request.start, size)
        length = size - start if not request.len else min(request.len, size - start)
        urls = []
        at = start
        while at < start + length:
            end = min(start + length, (at // BLOCK_SIZE + 1) * BLOCK_SIZE)
            store = self.emu.blobs
            urls.append(store.url("get", file=str(target), start=str(at), len=str(end - at)))
            at = end
        await stream.send_message(
            api_pb2.VolumeGetFile2Response(get_urls=urls, size=size, start=start, len=length)
        )

    async def VolumePutFiles(self, stream: _Req) -> None:
        """V1: files whose contents were put with ``MountPutFile``."""
        workspace, request = await self._enter(stream, "volume")
        volume = self._volume(workspace, request.volume_id)
        overwrite = not request.disallow_overwrite_existing_files
        contents = [(f, self.emu.mounts.content(f.sha256_hex)) for f in request.files]
        for file, data in contents:
            volume.put(file.filename, data, file.mode, overwrite=overwrite)
        await stream.send_message(empty_pb2.Empty())

    async def VolumePutFiles2(self, stream: _Req) -> None:
        """V2: files as blocks; the blocks not stored yet are answered, each with a URL to
        PUT it to, and no file is written until all are there."""
        workspace, request = await self._enter(stream, "volume")
        volume = self._volume(workspace, request.volume_id)
        overwrite = not request.disallow_overwrite_existing_files
        store = self.emu.blobs
        missing = []
        for file_index, file in enumerate(request.files):
            if not overwrite:
                volume.absent(file.path)
            for block_index, block in enumerate(file.blocks):
                if not store.block(block.contents_sha256).exists():
                    url = store.url("put", block=block.contents_sha256.hex())
                    missing.append(
                        api_pb2.VolumePutFiles2Response.MissingBlock(
                            file_index=file_index, block_index=block_index, put_url=url
                        )
                    )
        if not missing:
            for file in request.files:
                data = await asyncio.to_thread(_assemble, store, file)
                mode = file.mode if file.HasField("mode") else 0o644
                volume.put(file.path, data, mode, overwrite=overwrite)
        await stream.send_message(api_pb2.VolumePutFiles2Response(missing_blocks=missing))

    async def VolumeRemoveFile(self, stream: _Req) -> None:
        await self._remove(stream)

    async def VolumeRemoveFile2(self, stream: _Req) -> None:
        await self._remove(stream)

    async def _remove(self, stream: _Req) -> None:
        workspace, request = await self._enter(stream, "volume")
        self._volume(workspace, request.volume_id).remove(request.path, request.recursive)
        await stream.send_message(empty_pb2.Empty())

    async def VolumeCopyFiles(self, stream: _Req) -> None:
        await self._copy(stream)

    async def VolumeCopyFiles2(self, stream: _Req) -> None:
        await self._copy(stream)

    async def _copy(self, stream: _Req) -> None:
        workspace, request = await self._enter(stream, "volume")
        volume = self._volume(workspace, request.volume_id)
        volume.copy(list(request.src_paths), request.dst_path, request.recursive)
        await stream.send_message(empty_pb2.Empty())

    # -- blobs ---------------------------------------------------------------------
    async def BlobCreate(self, stream: _Req) -> None:
        await self._enter(stream, "volume")
        blob_id = new_id("bl")
        url = self.emu.blobs.url("put", blob=blob_id)
        await stream.send_message(
            api_pb2.BlobCreateResponse(
                blob_id=blob_id,
                upload_url=url,
                blob_ids=[blob_id],
                upload_urls=api_pb2.UploadUrlList(items=[url]),
            )
        )

    async def BlobGet(self, stream: _Req) -> None:
        _, request = await self._enter(stream, "volume")
        if not self.emu.blobs.blob(request.blob_id).exists():
            raise GRPCError(Status.NOT_FOUND, f"Blob '{request.blob_id}' not found")
        url = self.emu.blobs.url("get", blob=request.blob_id)
        await stream.send_message(api_pb2.BlobGetResponse(download_url=url))


def _assemble(store: BlobStore, file: Any) -> bytes:
    """A V2 file's contents: its blocks, each padded with the zeros the SDK stripped."""
    parts = []
    for index, block in enumerate(file.blocks):
        length = min(BLOCK_SIZE, file.size - index * BLOCK_SIZE)
        parts.append(store.block(block.contents_sha256).read_bytes().ljust(length, b"\0"))
    return b"".join(parts).ljust(file.size, b"\0")
