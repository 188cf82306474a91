"""A Daytona sandbox's settings: lifecycle intervals, public, labels, network, size, signing key.

Over `emulators.daytona.api.SandboxApi`, under ``/api/sandbox/{idOrName}``:
``POST .../autostop|autoarchive|autodelete|ttl/{minutes}`` (the lifecycle
intervals `emulators.daytona.sandboxes.DaytonaCore` keeps),
``.../public/{bool}`` (whether a preview link wants the token), ``PUT
.../labels``, ``POST .../network-settings`` (recorded only), ``POST
.../resize`` (CPU, memory, disk) and ``GET .../signing-key`` (``POST
.../rotate``: a new one), which pre-signed file URLs are signed with. A
create's own settings are read by `Lifecycle` and `network_settings`.
"""

from __future__ import annotations

import secrets
import time
from typing import TYPE_CHECKING

from aiohttp import web

from emulators.daytona.api import (
    MAX_AUTO_ARCHIVE,
    ApiError,
    int_field,
    network_settings,
    string_map,
)

if TYPE_CHECKING:
    from emulators.daytona.api import SandboxApi

__all__ = ["SandboxSettings"]


class SandboxSettings:
    """The settings handlers, over `SandboxApi`."""

    def __init__(self, api: SandboxApi) -> None:
        self.api = api
        self.core = api.core

    def routes(self) -> list[web.RouteDef]:
        one = "/api/sandbox/{sandbox}"
        return [
            web.post(one + "/autodelete/{interval}", self.set_auto_delete),
            web.post(one + "/autostop/{interval}", self.set_auto_stop),
            web.post(one + "/autoarchive/{interval}", self.set_auto_archive),
            web.post(one + "/ttl/{interval}", self.set_ttl),
            web.post(one + "/public/{public}", self.set_public),
            web.put(one + "/labels", self.replace_labels),
            web.post(one + "/resize", self.resize),
            web.post(one + "/network-settings", self.update_network),
            web.get(one + "/signing-key", self.signing_key),
            web.post(one + "/signing-key/rotate", self.rotate_signing_key),
        ]

    async def set_auto_delete(self, request: web.Request) -> web.Response:
        """Minutes a stopped sandbox is kept before deletion (0: at once, -1: never)."""
        box = self.api.box_of(request)
        box.auto_delete = self._interval(request, -1)
        return web.json_response(self.api.dto(box))

    def _interval(self, request: web.Request, minimum: int) -> int:
        raw = request.match_info["interval"]
        try:
            interval = int(raw)
        except ValueError:
            raise ApiError(400, f"interval must be an integer, got {raw!r}") from None
        if interval < minimum:
            raise ApiError(400, f"interval must be at least {minimum}")
        return interval

    async def set_auto_stop(self, request: web.Request) -> web.Response:
        """Minutes without activity before a stop (0: never)."""
        box = self.api.box_of(request)
        box.auto_stop = self._interval(request, 0)
        return web.json_response(self.api.dto(box))

    async def set_auto_archive(self, request: web.Request) -> web.Response:
        """Minutes a stopped sandbox waits before its archive (0: the longest, 30 days)."""
        box = self.api.box_of(request)
        box.auto_archive = self._interval(request, 0) or MAX_AUTO_ARCHIVE
        return web.json_response(self.api.dto(box))

    async def set_ttl(self, request: web.Request) -> web.Response:
        """Minutes from now until the sandbox is destroyed, whatever its state (0: never)."""
        box = self.api.box_of(request)
        box.ttl, box.ttl_from = self._interval(request, 0), time.time()
        return web.json_response(self.api.dto(box))

    async def set_public(self, request: web.Request) -> web.Response:
        """Whether a port's preview link needs the sandbox's token."""
        box = self.api.box_of(request)
        raw = request.match_info["public"]
        if raw not in ("true", "false"):
            raise ApiError(400, f"isPublic must be true or false, got {raw!r}")
        box.public = raw == "true"
        return web.json_response(self.api.dto(box))

    async def replace_labels(self, request: web.Request) -> web.Response:
        box = self.api.box_of(request)
        box.labels = string_map((await self.api.json_body(request)).get("labels"), "labels")
        box.updated = time.time()
        return web.json_response({"labels": box.labels})

    async def signing_key(self, request: web.Request) -> web.Response:
        """The key the SDK signs pre-signed file URLs with (checked by the toolbox proxy)."""
        return web.json_response(self.api.box_of(request).signing_key)

    async def rotate_signing_key(self, request: web.Request) -> web.Response:
        """A new signing key: the URLs signed with the old one stop working."""
        box = self.api.box_of(request)
        box.signing_key = secrets.token_urlsafe(32)
        return web.json_response(box.signing_key)

    async def update_network(self, request: web.Request) -> web.Response:
        """The settings the body names changed, the others kept."""
        box = self.api.box_of(request)
        body = await self.api.json_body(request)
        current = {
            "networkBlockAll": box.network_block_all,
            "networkAllowList": box.network_allow_list,
            "domainAllowList": box.domain_allow_list,
        }
        given = {k: v for k, v in body.items() if k in current and v is not None}
        if not given:
            raise ApiError(400, "At least one network setting must be given")
        for name, value in network_settings({**current, **given}).items():
            setattr(box, name, value)
        box.updated = time.time()
        return web.json_response(self.api.dto(box))

    async def resize(self, request: web.Request) -> web.Response:
        """New CPU, memory (GB) or disk (GB): a started sandbox only grows CPU and memory, a
        stopped one changes them and grows its disk; it passes through ``resizing``."""
        box = self.api.box_of(request)
        body = await self.api.json_body(request)
        wanted = {k: body[k] for k in ("cpu", "memory", "disk") if body.get(k) is not None}
        if not wanted:
            raise ApiError(400, "At least one of cpu, memory or disk must be given")
        sizes = {k: int_field(body, k, 0, minimum=1) for k in wanted}
        if box.state not in ("started", "stopped"):
            raise ApiError(
                400, f"Sandbox must be started or stopped to resize (state: {box.state})"
            )
        if box.state == "started":
            if "disk" in sizes:
                raise ApiError(400, "Disk resize requires a stopped sandbox")
            if sizes.get("cpu", box.cpu) < box.cpu or sizes.get("memory", box.memory) < box.memory:
                raise ApiError(400, "Hot resize only supports increases of cpu and memory")
        if sizes.get("disk", box.disk) < box.disk:
            raise ApiError(400, "Sandbox disk size can only be increased")
        previous = box.state
        self.core.set_state(box, "resizing")
        box.cpu = sizes.get("cpu", box.cpu)
        box.memory = sizes.get("memory", box.memory)
        box.disk = sizes.get("disk", box.disk)
        self.core.set_state(box, previous)
        return web.json_response(self.api.dto(box))
