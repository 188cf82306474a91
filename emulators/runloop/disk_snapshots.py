"""Runloop's disk snapshots: the routes that take, list, update and delete them.

A disk snapshot (`emulators.runloop.devboxes.DiskSnapshot`) is a copy of a
devbox's directory, kept by the core; a create with ``snapshot_id``
(`emulators.runloop.api`) starts from it.

* ``POST /v1/devboxes/{id}/snapshot_disk`` (answers once the copy is done)
  and ``.../snapshot_disk_async`` (answers at once) keep the devbox's disk as
  ``snp_...``;
* ``GET /v1/devboxes/disk_snapshots`` lists them (paged as devboxes are, by
  ``devbox_id`` or ``source_blueprint_id``), ``GET
  .../disk_snapshots/{id}/status`` tells the copy's progress, ``POST
  .../disk_snapshots/{id}`` updates its name, commit message and metadata and
  ``POST .../disk_snapshots/{id}/delete`` deletes one (its status says
  ``deleted`` from then on; anything else on it is a 404).

``/v1/devboxes/disk_snapshots`` also matches ``/v1/devboxes/{devbox_id}``:
these routes are added before the devboxes' (`emulators.runloop.RunloopEmulator`).
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from aiohttp import web

from emulators.runloop.api import ApiError, optional_text, page, string_map
from emulators.runloop.devboxes import ASLEEP, DiskSnapshot, new_id

if TYPE_CHECKING:
    from emulators.runloop.api import DevboxApi

__all__ = ["DiskSnapshots"]


class DiskSnapshots:
    """The disk snapshot handlers, over `DevboxApi`."""

    def __init__(self, api: DevboxApi) -> None:
        self.api = api
        self.core = api.core

    def routes(self) -> list[web.RouteDef]:
        snapshot = "/v1/devboxes/disk_snapshots/{snapshot_id}"
        base = "/v1/devboxes/{devbox_id}"
        return [
            web.get("/v1/devboxes/disk_snapshots", self.list_snapshots),
            web.get(snapshot + "/status", self.snapshot_status),
            web.post(snapshot + "/delete", self.delete_snapshot),
            web.post(snapshot, self.update_snapshot),
            web.post(base + "/snapshot_disk", self.snapshot_disk),
            web.post(base + "/snapshot_disk_async", self.snapshot_disk_async),
        ]

    async def _snapshot(self, request: web.Request) -> DiskSnapshot:
        devbox = self.api.alive(request)
        if devbox.status not in ("running", *ASLEEP):
            raise ApiError(400, f"Devbox {devbox.id} cannot be snapshotted while {devbox.status}")
        body = await self.api.body(request)
        name, message = body.get("name"), body.get("commit_message")
        snapshot_id = new_id("snp")
        snap = DiskSnapshot(
            id=snapshot_id,
            api_key=devbox.api_key,
            source_devbox_id=devbox.id,
            path=self.core.snapshot_root / snapshot_id,
            name=name if isinstance(name, str) else None,
            metadata=string_map(body.get("metadata"), "metadata"),
            commit_message=message if isinstance(message, str) else None,
            source_blueprint_id=devbox.blueprint_id,
        )
        self.core.snapshots[snap.id] = snap
        snap.copy = asyncio.create_task(self.core.snapshot(snap, devbox))
        return snap

    async def snapshot_disk(self, request: web.Request) -> web.Response:
        snap = await self._snapshot(request)
        await snap.done.wait()
        if snap.status != "complete":
            raise ApiError(500, snap.error_message or "snapshot failed")
        return web.json_response(snap.view())

    async def snapshot_disk_async(self, request: web.Request) -> web.Response:
        return web.json_response((await self._snapshot(request)).view())

    def snapshot_of(self, request: web.Request, *, deleted: bool = False) -> DiskSnapshot:
        """The request's snapshot; a deleted one only with ``deleted`` (its status tells it)."""
        snapshot_id = request.match_info["snapshot_id"]
        snap = self.core.snapshots.get(snapshot_id)
        if (
            snap is None
            or snap.api_key != self.api.key(request)
            or (snap.status == "deleted" and not deleted)
        ):
            raise ApiError(404, f"Snapshot {snapshot_id} not found")
        return snap

    async def snapshot_status(self, request: web.Request) -> web.Response:
        return web.json_response(self.snapshot_of(request, deleted=True).status_view())

    async def update_snapshot(self, request: web.Request) -> web.Response:
        """``name``, ``commit_message`` and ``metadata`` (whole) replace what it had."""
        snap = self.snapshot_of(request)
        body = await self.api.body(request)
        if body.get("name") is not None:
            snap.name = optional_text(body["name"], "name")
        if body.get("commit_message") is not None:
            snap.commit_message = optional_text(body["commit_message"], "commit_message")
        if body.get("metadata") is not None:
            snap.metadata = string_map(body["metadata"], "metadata")
        return web.json_response(snap.view())

    async def delete_snapshot(self, request: web.Request) -> web.Response:
        snap = self.snapshot_of(request)
        await snap.done.wait()
        if snap.status == "deleted":
            raise ApiError(404, f"Snapshot {snap.id} not found")
        await self.core.delete_snapshot(snap)
        return web.json_response({})

    async def list_snapshots(self, request: web.Request) -> web.Response:
        """The key's complete snapshots, newest first, paged; by ``devbox_id`` or
        ``source_blueprint_id`` (the metadata filters are not modelled)."""
        key = self.api.key(request)
        query = request.query
        devbox_id, blueprint_id = query.get("devbox_id"), query.get("source_blueprint_id")
        matching = [
            s
            for s in reversed(self.core.snapshots.values())
            if s.api_key == key
            and s.status == "complete"
            and (devbox_id is None or s.source_devbox_id == devbox_id)
            and (blueprint_id is None or s.source_blueprint_id == blueprint_id)
        ]
        return web.json_response(page(query, matching, "snapshots"))
