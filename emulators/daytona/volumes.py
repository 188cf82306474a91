"""Daytona's volumes: directories shared by sandboxes that outlive them.

Routes, under ``/api/volumes`` (`VolumesApi` in the SDK's generated client),
answered as Daytona's API does (its ``VolumeService``):

* ``POST`` (``{name}``) creates one, answered in ``pending_create``; it is
  ``ready`` by the next request. Daytona makes an S3 bucket in the
  background; the emulator's volume is a host directory under the
  emulator's root, made before the answer, and Daytona's published examples
  mount a volume straight after ``volume.get(name, create=True)``. A name
  another volume (not deleted) has is a 400; an empty one takes the id.
* ``GET`` lists the organization's volumes, most recently mounted first
  (never mounted last), then newest; deleted ones only with
  ``includeDeleted=true``.
* ``GET /{volumeId}``, ``GET /by-name/{name}``: another organization's
  volume is a 404, as an unknown one.
* ``DELETE /{volumeId}``: only a ``ready`` (or ``error``) volume (else 400)
  that no sandbox mounts (a sandbox not being destroyed: 409). It goes
  ``pending_delete`` -> ``deleting`` -> ``deleted``, its files with it, and
  is renamed ``<name>-deleted``, so its name is free again.

Each creation, state change and use is announced on the notification
gateway (``volume.created``, ``volume.state.updated`` with ``{volume,
oldState, newState}``, ``volume.lastUsedAt.updated``).

A sandbox create's ``volumes`` (``[{volumeId, mountPath, subpath?}]``, each
``volumeId`` a volume's id or name) are resolved and checked by `Volumes.mounts`
with Daytona's messages (an unknown volume 404, one not ready, a relative or
system mount path, a subpath starting with ``/`` or holding ``..``: 400), and
the sandbox (`emulators.filesystem.GuestSandbox` ``mounts``) has each volume's
directory (or its ``subpath`` in it, made if missing) at its mount path: what
one sandbox writes there another mounting the same volume reads, and a
snapshot of the sandbox holds none of it. A sandbox with volumes is never a
warm pool's. Besides Daytona's rules the emulator
refuses a mount path in or over the host's system directories the sandbox
borrows (``/usr``...), and two mounts at one path.
"""

from __future__ import annotations

import asyncio
import posixpath
import re
import shutil
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from aiohttp import web

from emulators.daytona.api import ApiError
from emulators.daytona.sandboxes import GONE, iso, org_of
from emulators.filesystem import mountable

if TYPE_CHECKING:
    from emulators.daytona.api import SandboxApi

__all__ = ["Volume", "Volumes"]

_SYSTEM = ("/proc", "/sys", "/dev", "/boot", "/etc", "/bin", "/sbin", "/lib", "/lib64")
_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", re.I)


@dataclass
class Volume:
    """One volume: its Daytona fields and the host directory holding its files."""

    id: str
    name: str
    organization_id: str
    dir: Path
    state: str = "pending_create"
    error: str | None = None
    created: float = field(default_factory=time.time)
    updated: float = field(default_factory=time.time)
    last_used: float | None = None

    def dto(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "name": self.name,
            "organizationId": self.organization_id,
            "state": self.state,
            "createdAt": iso(self.created),
            "updatedAt": iso(self.updated),
            "lastUsedAt": iso(self.last_used) if self.last_used is not None else None,
            "errorReason": self.error,
        }


class Volumes:
    """The volume handlers, over the sandbox API, and the mounts of a sandbox create."""

    def __init__(self, api: SandboxApi) -> None:
        self.api = api
        self.root = api.core.local.root / ".volumes"  # a dot name: never a sandbox's
        self.volumes: dict[str, Volume] = {}

    def routes(self) -> list[web.RouteDef]:
        base = "/api/volumes"
        return [
            web.get(base, self.list_volumes),
            web.post(base, self.create),
            web.get(base + "/by-name/{name}", self.get_by_name),
            web.get(base + "/{volume}", self.get),
            web.delete(base + "/{volume}", self.delete),
        ]

    def _live(self, organization_id: str) -> list[Volume]:
        return [
            v
            for v in self.volumes.values()
            if v.organization_id == organization_id and v.state != "deleted"
        ]

    def _by_id(self, request: web.Request) -> Volume:
        volume_id = request.match_info["volume"]
        volume = self.volumes.get(volume_id.lower())
        if volume is None or volume.organization_id != org_of(self.api.key(request)):
            raise ApiError(404, f"Volume with ID {volume_id} not found")
        return volume

    async def create(self, request: web.Request) -> web.Response:
        org = org_of(self.api.key(request))
        name = (await self.api.json_body(request)).get("name")
        if not isinstance(name, str):
            raise ApiError(400, "name must be a string")
        volume_id = str(uuid.uuid4())
        name = name or volume_id
        if any(v.name == name for v in self._live(org)):
            raise ApiError(400, f"Volume with name {name} already exists")
        volume = Volume(volume_id, name, org, self.root / volume_id)
        volume.dir.mkdir(parents=True)
        self.volumes[volume_id] = volume
        view = volume.dto()
        self.api.emulator.notify("volume.created", org, view)
        asyncio.get_running_loop().call_soon(self._set_state, volume, "ready")
        return web.json_response(view)

    def _set_state(self, volume: Volume, state: str) -> None:
        """Change a volume's state, announced as Daytona's gateway does."""
        old, volume.state, volume.updated = volume.state, state, time.time()
        data = {"volume": volume.dto(), "oldState": old, "newState": state}
        self.api.emulator.notify("volume.state.updated", volume.organization_id, data)

    async def list_volumes(self, request: web.Request) -> web.Response:
        org = org_of(self.api.key(request))
        deleted = request.query.get("includeDeleted") == "true"
        found = [
            v
            for v in self.volumes.values()
            if v.organization_id == org and (deleted or v.state != "deleted")
        ]
        found.sort(key=lambda v: -v.created)
        found.sort(key=lambda v: (v.last_used is None, -(v.last_used or 0)))
        return web.json_response([v.dto() for v in found])

    async def get(self, request: web.Request) -> web.Response:
        return web.json_response(self._by_id(request).dto())

    async def get_by_name(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        org = org_of(self.api.key(request))
        volume = next((v for v in self._live(org) if v.name == name), None)
        if volume is None:
            raise ApiError(404, f"Volume with name {name} not found")
        return web.json_response(volume.dto())

    async def delete(self, request: web.Request) -> web.Response:
        volume = self._by_id(request)
        if volume.state not in ("ready", "error"):
            raise ApiError(400, "Volume must be in 'ready' or 'error' state in order to be deleted")
        user = next(
            (
                box
                for box in self.api.core.boxes.values()
                if box.organization_id == volume.organization_id
                and box.desired_state != "destroyed"
                and box.state not in GONE
                and any(m["volumeId"] == volume.id for m in box.volumes)
            ),
            None,
        )
        if user is not None:
            raise ApiError(
                409,
                "Volume cannot be deleted because it is in use by one or more sandboxes "
                f"(e.g. {user.name})",
            )
        self._set_state(volume, "pending_delete")
        self.api.background(self._remove(volume))
        return web.Response()

    async def _remove(self, volume: Volume) -> None:
        self._set_state(volume, "deleting")
        await asyncio.to_thread(shutil.rmtree, volume.dir, ignore_errors=True)
        renamed = f"{volume.name}-deleted"
        for old in [v for v in self.volumes.values() if v.state == "deleted"]:
            if old.organization_id == volume.organization_id and old.name == renamed:
                del self.volumes[old.id]
        volume.name = renamed
        self._set_state(volume, "deleted")

    # -- a sandbox create's mounts -------------------------------------------
    def mounts(self, raw: Any, api_key: str) -> tuple[list[dict[str, str]], dict[str, Path]]:
        """A create's ``volumes``, resolved: as the sandbox shows them (each ``volumeId``
        the volume's id), and the host directory to mount at each path.

        Raises:
            ApiError: what Daytona answers a create with these volumes.
        """
        if raw is None:
            return [], {}
        if not isinstance(raw, list) or not all(isinstance(m, dict) for m in raw):
            raise ApiError(400, "volumes must be an array of objects")
        org = org_of(api_key)
        views: list[dict[str, str]] = []
        for mount in raw:
            ref, path, subpath = mount.get("volumeId"), mount.get("mountPath"), mount.get("subpath")
            if not isinstance(ref, str) or not ref:
                raise ApiError(400, "volumeId should not be empty")
            if not isinstance(path, str):
                raise ApiError(400, "mountPath must be a string")
            if subpath is not None and not isinstance(subpath, str):
                raise ApiError(400, "subpath must be a string")
            view = {"volumeId": self._resolve(ref, org).id, "mountPath": path}
            if subpath is not None:
                view["subpath"] = subpath
            views.append(view)
        _check_paths([v["mountPath"] for v in views])
        _check_subpaths([v.get("subpath") for v in views])
        found: dict[str, Path] = {}
        for view in views:
            volume = self.volumes[view["volumeId"]]
            found[posixpath.normpath(view["mountPath"])] = volume.dir.joinpath(
                *(view.get("subpath") or "").split("/")
            )
        if len(found) < len(views):
            raise ApiError(400, "Invalid mount paths (two volumes mounted at one path)")
        for directory in found.values():
            directory.mkdir(parents=True, exist_ok=True)
        return views, found

    def mounted(self, views: list[dict[str, str]], when: float) -> None:
        """Record a sandbox made at ``when`` with these mounts as the volumes' last use."""
        for view in views:
            volume = self.volumes[view["volumeId"]]
            volume.last_used = when
            self.api.emulator.notify(
                "volume.lastUsedAt.updated", volume.organization_id, volume.dto()
            )

    def _resolve(self, ref: str, organization_id: str) -> Volume:
        """The volume a mount names, by id or by name (both naming different ones: 400)."""
        live = self._live(organization_id)
        by_id = None
        if _UUID.fullmatch(ref):
            by_id = next((v for v in live if v.id == ref.lower()), None)
        by_name = next((v for v in live if v.name == ref), None)
        if by_id is not None and by_name is not None and by_id is not by_name:
            raise ApiError(
                400,
                f"Volume reference '{ref}' matches one volume's ID and another volume's "
                "name; rename the volume to remove the ambiguity",
            )
        volume = by_id or by_name
        if volume is None:
            raise ApiError(404, f"Volume '{ref}' not found")
        if volume.state != "ready":
            raise ApiError(
                400,
                f"Volume '{volume.name}' is not in a ready state. Current state: {volume.state}",
            )
        return volume


def _check_paths(paths: list[str]) -> None:
    """Daytona's mount path rules (``validateMountPaths``), and the emulator's own."""
    errors = []
    for path in paths:
        if not path.startswith("/"):
            errors.append(f"Invalid mount path {path} (must be absolute)")
        elif path in ("/", "//"):
            errors.append(f"Invalid mount path {path} (cannot mount to the root directory)")
        elif "/../" in path or "/./" in path or path.endswith(("/..", "/.")):
            errors.append(f"Invalid mount path {path} (cannot contain relative path components)")
        elif "//" in path[1:]:
            errors.append(f"Invalid mount path {path} (cannot contain consecutive slashes)")
        elif any(path == d or path.startswith(d + "/") for d in _SYSTEM) or not mountable(path):
            errors.append(f"Invalid mount path {path} (cannot mount to system directory)")
    if errors:
        raise ApiError(400, ", ".join(errors))


def _check_subpaths(subpaths: list[str | None]) -> None:
    """Daytona's subpath rules (``validateSubpaths``): S3 key prefixes."""
    errors = []
    for subpath in subpaths:
        if not subpath:
            continue
        if subpath.startswith("/"):
            errors.append(f'Invalid subpath "{subpath}" (S3 key prefixes cannot start with /)')
        elif ".." in subpath:
            errors.append(f'Invalid subpath "{subpath}" (cannot contain .. for security)')
        elif "//" in subpath:
            errors.append(f'Invalid subpath "{subpath}" (cannot contain consecutive slashes)')
    if errors:
        raise ApiError(400, ", ".join(errors))
