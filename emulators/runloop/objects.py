"""Runloop's object storage: stored objects, their routes and their presigned URLs.

An object (`StoredObject`) is bytes with a name, a ``content_type`` and
metadata, kept in a file under the emulator's root. Its life is Runloop's:
a create answers it ``UPLOADING`` with an ``upload_url``, the client PUTs
the bytes there (as the SDK's ``upload_content`` does, with its own HTTP
client and no API key: the URL is the credential), ``complete`` makes it
``READ_ONLY`` and from then on it can be downloaded, mounted in a devbox
(`emulators.runloop.api`) or built from as a blueprint's ``build_context``
(`emulators.runloop.build_context`). A ``ttl_ms`` makes it ``DELETED`` that
long after its create (checked whenever it is looked up, its bytes dropped
then); a delete does so at once. A deleted object stays retrievable, its
``state`` saying so, as on Runloop; anything else on it is a 404.

Routes, under ``/v1/objects``: ``POST`` creates (a create repeated with the
same ``x-request-id`` answers the first one's object); ``GET`` lists the
key's objects not deleted (``state=DELETED`` lists the deleted ones),
newest first, paged as devboxes are, by ``content_type``, ``state``,
``name`` (a part of it) and ``search`` (a part of the id or the name);
``GET .../list_public`` lists the public ones (the emulator has none);
``GET .../{id}``, ``POST .../{id}/complete``, ``POST .../{id}/delete`` and
``GET .../{id}/download`` (a ``download_url`` valid ``duration_seconds``,
an hour by default).

The presigned URLs are served by the emulator itself, as a storage bucket
would: ``PUT`` and ``GET /storage/{id}?expires=...&signature=...`` (an
HMAC of the method, the object and the expiry under a key of the
emulator's). An upload URL lasts an hour (less when the object's lifetime
ends first) and only while the object is ``UPLOADING``: a PUT replaces what
an earlier one stored. Both stream: an upload is written to disk as it
comes, a download sent from the file, so an object is never held whole.
Storage errors are S3's XML body (``<Error><Code>...``), not the API's.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import os
import secrets
import shutil
import tarfile
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any
from xml.sax.saxutils import escape

from aiohttp import web

from emulators.runloop.api import ApiError, page, string_map
from emulators.runloop.devboxes import new_id, now_ms

if TYPE_CHECKING:
    from emulators.runloop.api import DevboxApi

__all__ = ["ARCHIVES", "Objects", "StoredObject", "unpack"]

CONTENT_TYPES = frozenset({"unspecified", "text", "binary", "gzip", "tar", "tgz"})
ARCHIVES = frozenset({"tar", "tgz"})
_STATES = frozenset({"UPLOADING", "READ_ONLY", "DELETED", "ERROR"})
_URL_SECONDS = 3600
_MAX_URL_SECONDS = 7 * 24 * 3600  # S3's longest presigned URL
_CHUNK = 1 << 20
_MEDIA_TYPES = {
    "text": "text/plain; charset=utf-8",
    "gzip": "application/gzip",
    "tgz": "application/gzip",
    "tar": "application/x-tar",
}


@dataclass
class StoredObject:
    """One object: what the API shows of it and the file holding its bytes."""

    id: str
    api_key: str
    name: str
    content_type: str
    metadata: dict[str, str]
    path: Path
    delete_after_ms: int | None = None
    state: str = "UPLOADING"
    size_bytes: int | None = None
    uploaded: bool = False  # a PUT stored bytes (maybe none) since the create
    created_ms: int = field(default_factory=now_ms)

    def view(self) -> dict[str, Any]:
        """``ObjectView`` (``upload_url`` only on a create)."""
        return {
            "id": self.id,
            "name": self.name,
            "content_type": self.content_type,
            "create_time_ms": self.created_ms,
            "state": self.state,
            "delete_after_time_ms": self.delete_after_ms,
            "metadata": self.metadata,
            "size_bytes": self.size_bytes,
        }

    @property
    def archive(self) -> bool:
        """A tar (``tar``, ``tgz``): a mount unpacks it into a directory."""
        return self.content_type in ARCHIVES

    def expire(self) -> None:
        """Delete it if its lifetime has passed."""
        if self.delete_after_ms is not None and self.delete_after_ms <= now_ms():
            self.delete()

    def delete(self) -> None:
        self.state = "DELETED"
        self.path.unlink(missing_ok=True)

    def place(self, target: Path) -> None:
        """Write it at ``target`` (a host path), as a devbox mount does: an archive (``tar``,
        ``tgz``) unpacked into the directory ``target``, anything else as the file.

        Raises:
            OSError: it cannot be written there.
            tarfile.TarError: the archive is corrupt or would write outside ``target``.
        """
        target.parent.mkdir(parents=True, exist_ok=True)
        if self.archive:
            unpack(self.path, target)
        else:
            shutil.copyfile(self.path, target)


def unpack(archive: Path, target: Path) -> None:
    """Extract a tar (plain or compressed) into ``target``, refusing members that would land
    outside it, as Docker and Runloop do.

    Raises:
        OSError, tarfile.TarError: see `StoredObject.place`.
    """
    target.mkdir(parents=True, exist_ok=True)
    with tarfile.open(archive, "r:*") as tar:
        tar.extractall(target, filter="data")


def _storage_error(status: int, code: str, message: str) -> web.Response:
    body = (
        '<?xml version="1.0" encoding="UTF-8"?>\n'
        f"<Error><Code>{code}</Code><Message>{escape(message)}</Message></Error>"
    )
    return web.Response(status=status, text=body, content_type="application/xml")


class Objects:
    """The object handlers, over `DevboxApi`, and the storage URLs they hand out."""

    def __init__(self, api: DevboxApi) -> None:
        self.api = api
        self.core = api.core
        self.url = api.emulator.url
        self._key = secrets.token_bytes(32)

    def routes(self) -> list[web.RouteDef]:
        one = "/v1/objects/{object_id}"
        return [
            web.post("/v1/objects", self.create),
            web.get("/v1/objects", self.list),
            web.get("/v1/objects/list_public", self.list_public),
            web.get(one, self.retrieve),
            web.post(one + "/complete", self.complete),
            web.post(one + "/delete", self.delete),
            web.get(one + "/download", self.download),
            web.put("/storage/{object_id}", self.upload_bytes),
            web.get("/storage/{object_id}", self.download_bytes),
        ]

    # -- presigned URLs ------------------------------------------------------------
    def _signature(self, method: str, object_id: str, expires: int) -> str:
        message = f"{method}\n{object_id}\n{expires}".encode()
        return hmac.new(self._key, message, hashlib.sha256).hexdigest()

    def _signed_url(self, method: str, obj: StoredObject, seconds: int) -> str:
        expires = int(time.time()) + seconds
        if obj.delete_after_ms is not None:
            expires = min(expires, obj.delete_after_ms // 1000)
        signature = self._signature(method, obj.id, expires)
        return f"{self.url}/storage/{obj.id}?expires={expires}&signature={signature}"

    def _signed(self, request: web.Request, method: str) -> StoredObject | web.Response:
        """The object a storage request's URL signs for, or the storage's refusal."""
        object_id = request.match_info["object_id"]
        try:
            expires = int(request.query.get("expires", ""))
        except ValueError:
            return _storage_error(403, "AccessDenied", "Query-string authentication required")
        wanted = self._signature(method, object_id, expires)
        if not hmac.compare_digest(wanted, request.query.get("signature", "")):
            return _storage_error(403, "SignatureDoesNotMatch", "The signature does not match")
        if expires < time.time():
            return _storage_error(403, "AccessDenied", "Request has expired")
        obj = self.core.objects.get(object_id)
        if obj is not None:
            obj.expire()
        if obj is None or obj.state == "DELETED":
            return _storage_error(404, "NoSuchKey", "The specified key does not exist.")
        return obj

    async def upload_bytes(self, request: web.Request) -> web.Response:
        """The bytes of a PUT to an upload URL, streamed to a file that replaces the object's."""
        obj = self._signed(request, "PUT")
        if isinstance(obj, web.Response):
            return obj
        if obj.state != "UPLOADING":
            return _storage_error(403, "AccessDenied", f"Object {obj.id} is {obj.state}")
        await asyncio.to_thread(obj.path.parent.mkdir, parents=True, exist_ok=True)
        fd, name = tempfile.mkstemp(dir=obj.path.parent, suffix=".part")
        digest = hashlib.md5(usedforsecurity=False)
        try:
            with os.fdopen(fd, "wb") as handle:
                while chunk := await request.content.read(_CHUNK):
                    digest.update(chunk)
                    await asyncio.to_thread(handle.write, chunk)
            if obj.state != "UPLOADING":  # completed or deleted while the bytes came
                return _storage_error(403, "AccessDenied", f"Object {obj.id} is {obj.state}")
            await asyncio.to_thread(os.replace, name, obj.path)
        finally:
            await asyncio.to_thread(Path(name).unlink, True)
        obj.uploaded = True
        return web.Response(headers={"ETag": f'"{digest.hexdigest()}"'})

    async def download_bytes(self, request: web.Request) -> web.StreamResponse:
        obj = self._signed(request, "GET")
        if isinstance(obj, web.Response):
            return obj
        media = _MEDIA_TYPES.get(obj.content_type, "application/octet-stream")
        return web.FileResponse(obj.path, chunk_size=_CHUNK, headers={"Content-Type": media})

    # -- routes --------------------------------------------------------------------
    def object_of(self, request: web.Request, *, deleted: bool = False) -> StoredObject:
        """The request's object; a deleted one only with ``deleted`` (its state tells it)."""
        object_id = request.match_info["object_id"]
        obj = self.core.object_for(self.api.key(request), object_id)
        if obj is None or (obj.state == "DELETED" and not deleted):
            raise ApiError(404, f"Object {object_id} not found")
        return obj

    async def create(self, request: web.Request) -> web.Response:
        key = self.api.key(request)
        request_id = request.headers.get("x-request-id")
        made = self.core.objects_by_request.get((key, request_id or ""))
        if request_id and made is not None and self.core.objects[made].state == "UPLOADING":
            obj = self.core.objects[made]
            return web.json_response(
                obj.view() | {"upload_url": self._signed_url("PUT", obj, _URL_SECONDS)}
            )
        body = await self.api.body(request)
        name, content_type, ttl = body.get("name"), body.get("content_type"), body.get("ttl_ms")
        if not isinstance(name, str) or not name:
            raise ApiError(400, "name is required")
        if content_type not in CONTENT_TYPES:
            raise ApiError(400, f"content_type must be one of {sorted(CONTENT_TYPES)}")
        if ttl is not None and (isinstance(ttl, bool) or not isinstance(ttl, int) or ttl < 0):
            raise ApiError(400, "ttl_ms must be a non-negative integer")
        object_id = new_id("obj")
        obj = StoredObject(
            id=object_id,
            api_key=key,
            name=name,
            content_type=content_type,
            metadata=string_map(body.get("metadata"), "metadata"),
            path=self.core.object_root / object_id,
        )
        if ttl:  # 0, as unset, gives no lifetime
            obj.delete_after_ms = obj.created_ms + ttl
        self.core.objects[obj.id] = obj
        if request_id:
            self.core.objects_by_request[key, request_id] = obj.id
        upload = self._signed_url("PUT", obj, _URL_SECONDS)
        return web.json_response(obj.view() | {"upload_url": upload})

    async def retrieve(self, request: web.Request) -> web.Response:
        return web.json_response(self.object_of(request, deleted=True).view())

    async def complete(self, request: web.Request) -> web.Response:
        """``UPLOADING`` -> ``READ_ONLY``, once a PUT stored its bytes; again, the same view."""
        obj = self.object_of(request)
        if obj.state == "UPLOADING":
            if not obj.uploaded:
                raise ApiError(
                    400, f"Object {obj.id} has no content: PUT it to its upload_url first"
                )
            stat = await asyncio.to_thread(obj.path.stat)
            obj.state, obj.size_bytes = "READ_ONLY", stat.st_size
        return web.json_response(obj.view())

    async def delete(self, request: web.Request) -> web.Response:
        obj = self.object_of(request)
        await asyncio.to_thread(obj.delete)
        return web.json_response(obj.view())

    async def download(self, request: web.Request) -> web.Response:
        obj = self.object_of(request)
        if obj.state != "READ_ONLY":
            raise ApiError(400, f"Object {obj.id} is {obj.state}: complete its upload first")
        raw = request.query.get("duration_seconds") or "0"
        try:
            seconds = int(raw) or _URL_SECONDS
        except ValueError:
            raise ApiError(400, "duration_seconds must be an integer") from None
        if not 0 < seconds <= _MAX_URL_SECONDS:
            raise ApiError(400, f"duration_seconds must be between 1 and {_MAX_URL_SECONDS}")
        return web.json_response({"download_url": self._signed_url("GET", obj, seconds)})

    async def list(self, request: web.Request) -> web.Response:
        """The key's objects, newest first, paged; by content type, state, name and search."""
        key = self.api.key(request)
        query = request.query
        content_type, state = query.get("content_type"), query.get("state")
        if content_type is not None and content_type not in CONTENT_TYPES:
            raise ApiError(400, f"content_type must be one of {sorted(CONTENT_TYPES)}")
        if state is not None and state not in _STATES:
            raise ApiError(400, f"state must be one of {sorted(_STATES)}")
        name, search = query.get("name"), query.get("search")
        for obj in self.core.objects.values():
            obj.expire()
        matching = [
            obj
            for obj in reversed(self.core.objects.values())
            if obj.api_key == key
            and (obj.state == state if state is not None else obj.state != "DELETED")
            and (content_type is None or obj.content_type == content_type)
            and (name is None or name in obj.name)
            and (search is None or search in obj.id or search in obj.name)
        ]
        return web.json_response(page(query, matching, "objects"))

    async def list_public(self, request: web.Request) -> web.Response:
        self.api.key(request)
        return web.json_response(page(request.query, [], "objects"))
