"""Daytona's snapshot routes: snapshots of sandboxes, of images, and the general ones.

The snapshots themselves are `emulators.daytona.snapshots` (`Captured`, kept
by the emulator in ``captured``); these are the routes that make, show and
remove them, over `emulators.daytona.api.SandboxApi`:

* ``POST /api/sandbox/{idOrName}/snapshot`` (``{name}``) snapshots a started
  or stopped sandbox: it answers the sandbox ``snapshotting`` and copies it
  in the background; ``GET|DELETE /api/snapshots/{idOrName}`` read and delete
  such a snapshot, and a create naming it starts from its files
  (`SandboxApi.source`).
* ``GET /api/snapshots`` pages them with the deployment's general snapshots
  (the default one among them); ``POST /api/snapshots`` makes one of an
  image (emulated: nothing is pulled), ``.../activate`` and ``.../deactivate``
  switch one, and ``.../build-logs[-url]`` show a build's log.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import TYPE_CHECKING, Any

from aiohttp import web

from emulators.daytona.api import (
    DEFAULT_RESOURCES,
    DEFAULT_SNAPSHOT,
    MAX_PAGE,
    ApiError,
    int_field,
    write_steps,
)
from emulators.daytona.sandboxes import Box, org_of
from emulators.daytona.snapshots import Captured, find, general
from providers.errors import ProviderError

if TYPE_CHECKING:
    from emulators.daytona.api import SandboxApi

__all__ = ["SnapshotApi"]


class SnapshotApi:
    """The snapshot handlers, over `SandboxApi`."""

    def __init__(self, api: SandboxApi) -> None:
        self.api = api
        self.core = api.core
        self._pulls: dict[str, asyncio.Task[None]] = {}  # image snapshots still pulling

    def routes(self) -> list[web.RouteDef]:
        one = "/api/sandbox/{sandbox}"
        return [
            web.post(one + "/snapshot", self.snapshot),
            web.get("/api/snapshots", self.list_snapshots),
            web.post("/api/snapshots", self.create_snapshot),
            web.post("/api/snapshots/{snapshot}/activate", self.activate_snapshot),
            web.post("/api/snapshots/{snapshot}/deactivate", self.deactivate_snapshot),
            web.get("/api/snapshots/{snapshot}/build-logs-url", self.snapshot_build_logs_url),
            web.get("/api/snapshots/{snapshot}/build-logs", self.snapshot_build_logs),
            web.get("/api/snapshots/{snapshot}", self.get_snapshot),
            web.delete("/api/snapshots/{snapshot}", self.delete_snapshot),
        ]

    async def snapshot(self, request: web.Request) -> web.Response:
        """Start a snapshot of the sandbox: the answer shows it ``snapshotting``; the copy
        runs in the background (`_capture`)."""
        box = self.api.box_of(request)
        body = await self.api.json_body(request)
        name = body.get("name")
        if not isinstance(name, str) or not name.strip():
            raise ApiError(400, "name must be a non-empty string")
        if body.get("includeMemory"):
            raise ApiError(400, "includeMemory is only supported for Windows sandboxes")
        if box.state not in ("started", "stopped"):
            raise ApiError(400, "Sandbox must be in started or stopped state to create a snapshot")
        previous = box.state
        self.core.set_state(box, "snapshotting")
        self.api.background(self._capture(box, name, previous))
        return web.json_response(self.api.dto(box))

    async def _capture(self, box: Box, name: str, previous: str) -> None:
        """Copy the sandbox's files into a snapshot, then give the sandbox its state back.

        As on Daytona, a copy that fails (the sandbox deleted meanwhile) or a
        name already taken leaves no snapshot and is reported nowhere: the
        sandbox only leaves ``snapshotting``.
        """
        await asyncio.sleep(self.api.emulator.boot_seconds)
        try:
            kept = await box.local.snapshot(name)
        except ProviderError:
            kept = None
        if kept is not None:
            if find(self.api.emulator.captured.values(), name, box.organization_id) is None:
                made = Captured(
                    id=str(uuid.uuid4()),
                    name=name,
                    organization_id=box.organization_id,
                    local_id=kept.id,
                    source_sandbox_id=box.id,
                    target=box.target,
                    cpu=box.cpu,
                    gpu=box.gpu,
                    memory=box.memory,
                    disk=box.disk,
                )
                self.api.emulator.captured[made.id] = made
            else:
                await self.core.local.delete_snapshot(kept.id)
        if box.state == "snapshotting":
            self.core.set_state(box, previous)

    async def create_snapshot(self, request: web.Request) -> web.Response:
        """A snapshot of an image (``imageName``) or a build (``buildInfo``): it answers
        ``pending`` and becomes ``active`` in the background (`_pull`)."""
        key = self.api.key(request)
        body = await self.api.json_body(request)
        name, image = body.get("name"), body.get("imageName")
        if not isinstance(name, str) or not name.strip():
            raise ApiError(400, "name must be a non-empty string")
        if find(self.api.emulator.captured.values(), name, org_of(key)) is not None:
            raise ApiError(409, f"Snapshot with name {name} already exists")
        build_info = body.get("buildInfo")
        if (image is None) == (build_info is None):
            raise ApiError(400, "Exactly one of imageName and buildInfo must be given")
        if image is not None:
            if not isinstance(image, str) or not image.strip():
                raise ApiError(400, "imageName must be a non-empty string")
            tag = image.rsplit("/", 1)[-1].partition("@")[0].partition(":")[2]
            if "@" not in image and tag in ("", "latest"):
                raise ApiError(
                    400, "Images must include a tag, and the tag 'latest' is not allowed"
                )
        else:
            _, build_info, _ = self.api.source({"buildInfo": build_info}, key)
        entrypoint = body.get("entrypoint")
        if entrypoint is not None and (
            not isinstance(entrypoint, list) or not all(isinstance(a, str) for a in entrypoint)
        ):
            raise ApiError(400, "entrypoint must be a list of strings")
        snap = Captured(
            id=str(uuid.uuid4()),
            name=name,
            organization_id=org_of(key),
            local_id=None,
            source_sandbox_id=None,
            target=str(body.get("regionId") or "us"),
            cpu=int_field(body, "cpu", DEFAULT_RESOURCES["cpu"], minimum=0),
            gpu=int_field(body, "gpu", DEFAULT_RESOURCES["gpu"], minimum=0),
            memory=int_field(body, "memory", DEFAULT_RESOURCES["memory"], minimum=0),
            disk=int_field(body, "disk", DEFAULT_RESOURCES["disk"], minimum=0),
            state="pending",
            image_name=image,
            build_info=build_info,
            entrypoint=entrypoint,
        )
        self.api.emulator.captured[snap.id] = snap
        self._pulls[snap.id] = self.api.background(self._pull(snap))
        return web.json_response(snap.dto())

    async def _pull(self, snap: Captured) -> None:
        """``pulling`` (``building`` for a build), then ``active``, ``boot_seconds`` apart."""
        for state in ("building" if snap.build_info else "pulling", "active"):
            await asyncio.sleep(self.api.emulator.boot_seconds)
            if snap.state == "removing":
                break
            snap.state, snap.updated = state, time.time()
        self._pulls.pop(snap.id, None)

    async def activate_snapshot(self, request: web.Request) -> web.Response:
        """An ``inactive`` snapshot made ``active`` again."""
        snap = self._captured(request)
        if snap.state not in ("inactive", "active"):
            raise ApiError(400, f"Snapshot {snap.name} is {snap.state}")
        snap.state, snap.updated = "active", time.time()
        return web.json_response(snap.dto())

    async def deactivate_snapshot(self, request: web.Request) -> web.Response:
        """An ``active`` snapshot made ``inactive``: creates refuse it until activated."""
        snap = self._captured(request)
        if snap.state not in ("inactive", "active"):
            raise ApiError(400, f"Snapshot {snap.name} is {snap.state}")
        snap.state, snap.updated = "inactive", time.time()
        return web.Response(status=204)

    async def snapshot_build_logs_url(self, request: web.Request) -> web.Response:
        snap = self._captured(request)
        return web.json_response(
            {"url": f"{self.api.emulator.api_url}/snapshots/{snap.id}/build-logs"}
        )

    async def snapshot_build_logs(self, request: web.Request) -> web.StreamResponse:
        """The build's log, as a sandbox's (`_write_build_log`), once it is over when followed."""
        snap = self._captured(request)
        if snap.build_info is None:
            raise ApiError(400, f"Snapshot {snap.name} has no build")
        response = web.StreamResponse(headers={"Content-Type": "text/plain; charset=utf-8"})
        await response.prepare(request)
        await write_steps(response, snap.build_info["dockerfileContent"])
        if request.query.get("follow") == "true":
            pulling = self._pulls.get(snap.id)
            if pulling is not None:
                await asyncio.wait({pulling})
            ended = f"Build failed: {snap.error}" if snap.state == "build_failed" else "Built"
            await response.write(f"{ended} {snap.build_info['snapshotRef']}\n".encode())
        await response.write_eof()
        return response

    def _captured(self, request: web.Request) -> Captured:
        wanted = request.match_info["snapshot"]
        found = find(self.api.emulator.captured.values(), wanted, org_of(self.api.key(request)))
        if found is None:
            raise ApiError(404, f"Snapshot {wanted} not found")
        return found

    def _general(self) -> list[dict[str, Any]]:
        names = {DEFAULT_SNAPSHOT, *(self.api.emulator.snapshots or ())}
        return [general(name) for name in sorted(names)]

    async def get_snapshot(self, request: web.Request) -> web.Response:
        wanted = request.match_info["snapshot"]
        found = find(self.api.emulator.captured.values(), wanted, org_of(self.api.key(request)))
        if found is not None:
            return web.json_response(found.dto())
        for dto in self._general():
            if wanted in (dto["id"], dto["name"]):
                return web.json_response(dto)
        raise ApiError(404, f"Snapshot {wanted} not found")

    async def list_snapshots(self, request: web.Request) -> web.Response:
        """The organization's snapshots and the general ones, ``name`` (a part of it) and
        ``sourceSandboxId`` filtering, ``sort`` (``createdAt``, ``name``...) and ``order``
        ordering, ``page`` / ``limit`` paging."""
        query = request.query
        page, limit = _positive(query, "page", 1), _positive(query, "limit", 100)
        if limit > MAX_PAGE:
            raise ApiError(400, f"limit must not be greater than {MAX_PAGE}")
        org = org_of(self.api.key(request))
        items = [s.dto() for s in self.api.emulator.captured.values() if s.organization_id == org]
        items += self._general()
        name, source = query.get("name", "").lower(), query.get("sourceSandboxId")
        items = [
            dto
            for dto in items
            if name in dto["name"].lower() and (source is None or dto["sourceSandboxId"] == source)
        ]
        sort = query.get("sort", "createdAt")
        if sort not in ("name", "state", "lastUsedAt", "createdAt"):
            raise ApiError(400, "sort must be one of name, state, lastUsedAt, createdAt")
        order = query.get("order", "desc")
        if order not in ("asc", "desc"):
            raise ApiError(400, "order must be asc or desc")
        items.sort(key=lambda dto: (dto[sort] or "", dto["id"]), reverse=order == "desc")
        pages = max(1, -(-len(items) // limit))
        return web.json_response(
            {
                "items": items[(page - 1) * limit : page * limit],
                "total": len(items),
                "page": page,
                "totalPages": pages,
            }
        )

    async def delete_snapshot(self, request: web.Request) -> web.Response:
        """Mark the snapshot ``removing``; it is gone ``boot_seconds`` later (a delete of
        one already removing changes nothing, as on Daytona)."""
        snap = self._captured(request)
        if snap.state != "removing":
            snap.state, snap.updated = "removing", time.time()
            self.api.background(self._remove(snap))
        return web.Response(status=200)

    async def _remove(self, snap: Captured) -> None:
        await asyncio.sleep(self.api.emulator.boot_seconds)
        self.api.emulator.captured.pop(snap.id, None)
        if snap.local_id is not None:
            await self.core.local.delete_snapshot(snap.local_id)


def _positive(query: Any, name: str, default: int) -> int:
    raw = query.get(name)
    if raw is None:
        return default
    if not raw.isdigit() or int(raw) < 1:
        raise ApiError(400, f"{name} must be a positive integer")
    return int(raw)
