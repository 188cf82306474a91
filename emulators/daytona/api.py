"""Daytona's control-plane REST API for sandboxes: the handlers the SDK talks to.

Routes (JSON in camelCase, key in ``Authorization: Bearer``, errors as the
API's ``{statusCode, timestamp, path, error, message}``), under ``/api``:

* ``POST /api/sandbox`` creates a sandbox from a snapshot (``snapshot``) or
  an image (``buildInfo``); it answers at once in ``creating`` (or
  ``pending_build``) and the sandbox boots in the background, announcing
  each state over Socket.IO. With ``boot_seconds=0`` and no boot fault it
  answers ``started``.
* ``GET /api/sandbox`` lists the organization's sandboxes, newest first,
  filtered by ``labels`` (JSON), ``states``, ``id`` / ``name`` prefixes,
  paged by ``limit`` / ``cursor`` (``nextCursor`` is null on the last page).
* ``GET|DELETE /api/sandbox/{idOrName}``; ``POST .../start``, ``.../stop``,
  ``.../archive`` (a stopped sandbox), ``.../resize``;
  ``POST /api/sandbox/{id}/last-activity`` (resets the auto-stop timer);
  ``GET /api/sandbox/{id}/toolbox-proxy-url``; ``.../build-logs-url`` and
  ``.../build-logs`` (an image create's emulated build: no image is built,
  the sandbox is the default one); the settings
  ``POST .../autostop|autoarchive|autodelete|ttl/{minutes}``, ``.../public/{bool}``
  and ``PUT .../labels``, ``POST .../network-settings`` (recorded only);
  ``GET .../signing-key`` (``.../rotate``: a new one), which pre-signed file
  URLs are signed with; ``GET .../telemetry/metrics`` (one sample, now).
* ``POST /api/sandbox/{idOrName}/snapshot`` (``{name}``) snapshots a started
  or stopped sandbox: it answers the sandbox ``snapshotting`` and copies it in
  the background (`emulators.daytona.snapshots`); ``GET|DELETE
  /api/snapshots/{idOrName}`` read and delete such a snapshot, and a create
  naming it starts from its files. ``GET /api/snapshots`` pages them with the
  deployment's general snapshots (the default one among them);
  ``POST /api/snapshots`` makes one of an image (emulated: nothing is
  pulled), ``.../activate`` and ``.../deactivate`` switch one, and
  ``.../build-logs[-url]`` show a build's log.
* A create matching a warm pool is served by one of its ready sandboxes
  (`emulators.daytona.warm_pools`, which also holds ``/api/warm-pools``).
* Preview links: ``GET .../ports/{port}/preview-url`` gives
  ``/preview/{id}/{port}`` on the emulator's port and the token a private
  sandbox's link wants (or an API key of its organization);
  ``GET .../ports/{port}/signed-preview-url`` a ``/signed-preview/{token}``
  URL that needs nothing until it expires (``POST .../{token}/expire``).
* ``GET /api/config``, public: the deployment's configuration, whose
  ``defaultSnapshot`` is what a create naming no snapshot starts from.

A sandbox belongs to the organization of the key that created it: other
keys get 404 ("Sandbox not found"). Account limits come from the harness:
both the concurrency cap and a spent quota of created sandboxes answer 403
with Daytona's limit message.
"""

from __future__ import annotations

import asyncio
import base64
import ipaddress
import json
import secrets
import time
import uuid
from collections.abc import Awaitable, Callable, Coroutine
from typing import TYPE_CHECKING, Any, NamedTuple

from aiohttp import web

from emulators.daytona.sandboxes import DAYTONA_HOME, GONE, Box, iso, metrics, org_of
from emulators.daytona.snapshots import Captured, find, general
from emulators.harness import QuotaViolation, apply_delay_or_hang
from emulators.ingress import forward
from providers.base import SandboxSpec
from providers.errors import ProviderError

if TYPE_CHECKING:
    from emulators.daytona import DaytonaEmulator
    from emulators.daytona.warm_pools import WarmPools

__all__ = [
    "CONCURRENCY_MESSAGE",
    "CREATED_MESSAGE",
    "ApiError",
    "Lifecycle",
    "SandboxApi",
    "api_error",
    "network_settings",
]

CONCURRENCY_MESSAGE = "Total CPU limit exceeded. Maximum allowed: {limit}."
CREATED_MESSAGE = "Total sandbox limit exceeded. Maximum allowed: {limit}."
DEFAULT_RESOURCES = {"cpu": 1, "gpu": 0, "memory": 1, "disk": 3}
DEFAULT_SNAPSHOT = "daytonaio/sandbox:0.5.0"
DEFAULT_AUTO_STOP = 15
DEFAULT_AUTO_ARCHIVE = 7 * 24 * 60
MAX_PAGE = 200
MAX_ALLOWED_NETWORKS = 10
MAX_AUTO_ARCHIVE = 30 * 24 * 60
_METRICS = {
    "daytona.sandbox.cpu.utilization": "cpuUsedPct",
    "daytona.sandbox.cpu.limit": "cpuCount",
    "daytona.sandbox.memory.usage": "memUsed",
    "daytona.sandbox.memory.limit": "memTotal",
    "daytona.sandbox.memory.cache": "memCache",
    "daytona.sandbox.filesystem.usage": "diskUsed",
    "daytona.sandbox.filesystem.total": "diskTotal",
}
_REASONS = {
    400: "Bad Request",
    401: "Unauthorized",
    403: "Forbidden",
    404: "Not Found",
    408: "Request Timeout",
    409: "Conflict",
    429: "Too Many Requests",
    500: "Internal Server Error",
    502: "Bad Gateway",
    503: "Service Unavailable",
    504: "Gateway Timeout",
}
_STATES = frozenset(
    {
        "creating", "restoring", "destroyed", "destroying", "started", "stopped", "starting",
        "stopping", "error", "build_failed", "pending_build", "building_snapshot", "unknown",
        "pulling_snapshot", "archived", "archiving", "resizing", "snapshotting", "forking",
        "pausing", "paused", "resuming",
    }
)  # fmt: skip


def api_error(
    status: int, message: str, path: str = "", headers: dict[str, str] | None = None
) -> web.Response:
    """The API's error body (NestJS's exception filter)."""
    body = {
        "statusCode": status,
        "timestamp": iso(time.time()),
        "path": path,
        "error": _REASONS.get(status, "Error"),
        "message": message,
    }
    return web.json_response(body, status=status, headers=headers)


class ApiError(Exception):
    """Raised by a handler's helpers; answered as `api_error`."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def _string_map(value: Any, name: str) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        raise ApiError(400, f"{name} must map strings to strings")
    return dict(value)


def _int(body: dict[str, Any], name: str, default: int, minimum: int | None = 0) -> int:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise ApiError(400, f"{name} must be an integer")
    if minimum is not None and value < minimum:
        raise ApiError(400, f"{name} must not be less than {minimum}")
    return value


class Lifecycle(NamedTuple):
    """A create's lifecycle intervals in minutes (`Box` fields of the same names)."""

    auto_stop: int
    auto_delete: int
    auto_archive: int
    ttl: int

    @classmethod
    def of(cls, body: dict[str, Any]) -> Lifecycle:
        return cls(
            auto_stop=_int(body, "autoStopInterval", DEFAULT_AUTO_STOP),
            auto_delete=_int(body, "autoDeleteInterval", -1, minimum=None),
            auto_archive=_int(body, "autoArchiveInterval", DEFAULT_AUTO_ARCHIVE),
            ttl=_int(body, "ttlMinutes", 0),
        )


def network_settings(body: dict[str, Any]) -> dict[str, Any]:
    """A create's (or an update's) network settings as `Box` fields: ``networkBlockAll``,
    ``networkAllowList`` (at most 10 IPv4 CIDRs, comma-separated), ``domainAllowList``."""
    allow, domains = body.get("networkAllowList"), body.get("domainAllowList")
    if allow is not None:
        if not isinstance(allow, str):
            raise ApiError(400, "networkAllowList must be a string")
        cidrs = [c.strip() for c in allow.split(",") if c.strip()]
        if len(cidrs) > MAX_ALLOWED_NETWORKS:
            raise ApiError(400, f"networkAllowList allows at most {MAX_ALLOWED_NETWORKS} CIDRs")
        for cidr in cidrs:
            try:
                ipaddress.IPv4Network(cidr, strict=False)
            except ValueError:
                raise ApiError(400, f"Invalid CIDR in networkAllowList: {cidr}") from None
    if domains is not None and not isinstance(domains, str):
        raise ApiError(400, "domainAllowList must be a string")
    return {
        "network_block_all": bool(body.get("networkBlockAll")),
        "network_allow_list": allow,
        "domain_allow_list": domains,
    }


def bearer(request: web.Request) -> str | None:
    scheme, _, key = request.headers.get("Authorization", "").partition(" ")
    return key if scheme.lower() == "bearer" and key else None


class SandboxApi:
    """The control-plane handlers, over the emulator's core."""

    def __init__(self, emulator: DaytonaEmulator) -> None:
        self.emulator = emulator
        self.core = emulator.core
        self._boots: set[asyncio.Task[None]] = set()  # boots, snapshot copies and removals
        self._preview_tokens: dict[str, str] = {}
        self._signed: dict[str, SignedPreview] = {}
        self._pulls: dict[str, asyncio.Task[None]] = {}  # image snapshots still pulling
        self.warm: WarmPools | None = None  # set by the emulator: creates claim from its pools

    def routes(self) -> list[web.RouteDef]:
        one = "/api/sandbox/{sandbox}"
        return [
            web.get("/api/config", self.config),
            web.post("/api/sandbox", self.create),
            web.get("/api/sandbox", self.list),
            web.get(one, self.get),
            web.delete(one, self.delete),
            web.post(one + "/start", self.start),
            web.post(one + "/stop", self.stop),
            web.post(one + "/last-activity", self.last_activity),
            web.post(one + "/autodelete/{interval}", self.set_auto_delete),
            web.post(one + "/autostop/{interval}", self.set_auto_stop),
            web.post(one + "/autoarchive/{interval}", self.set_auto_archive),
            web.post(one + "/ttl/{interval}", self.set_ttl),
            web.post(one + "/public/{public}", self.set_public),
            web.put(one + "/labels", self.replace_labels),
            web.post(one + "/archive", self.archive),
            web.post(one + "/resize", self.resize),
            web.post(one + "/network-settings", self.update_network),
            web.get(one + "/signing-key", self.signing_key),
            web.post(one + "/signing-key/rotate", self.rotate_signing_key),
            web.get(one + "/telemetry/metrics", self.metrics),
            web.get(one + "/toolbox-proxy-url", self.toolbox_proxy_url),
            web.get(one + "/build-logs-url", self.build_logs_url),
            web.get(one + "/build-logs", self.build_logs),
            web.get(one + "/ports/{port}/preview-url", self.preview_url),
            web.post(one + "/snapshot", self.snapshot),
            web.get("/api/snapshots", self.list_snapshots),
            web.post("/api/snapshots", self.create_snapshot),
            web.post("/api/snapshots/{snapshot}/activate", self.activate_snapshot),
            web.post("/api/snapshots/{snapshot}/deactivate", self.deactivate_snapshot),
            web.get("/api/snapshots/{snapshot}/build-logs-url", self.snapshot_build_logs_url),
            web.get("/api/snapshots/{snapshot}/build-logs", self.snapshot_build_logs),
            web.get("/api/snapshots/{snapshot}", self.get_snapshot),
            web.delete("/api/snapshots/{snapshot}", self.delete_snapshot),
            web.get(one + "/ports/{port}/signed-preview-url", self.signed_preview_url),
            web.post(
                one + "/ports/{port}/signed-preview-url/{token}/expire", self.expire_signed_preview
            ),
            web.route("*", "/preview/{sandbox}/{port}{tail:(/.*)?}", self.preview),
            web.route("*", "/signed-preview/{token}{tail:(/.*)?}", self.signed_preview),
        ]

    @web.middleware
    async def errors(
        self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        """Authenticate, and answer `ApiError` in the API's shape (the preview proxy's too,
        which authenticates by itself)."""
        if request.path.startswith(("/preview/", "/signed-preview/")):
            try:
                return await handler(request)
            except ApiError as exc:
                return api_error(exc.status, exc.message, request.path)
        if (
            not request.path.startswith("/api/")
            or request.path.startswith("/api/socket.io")
            or request.path == "/api/config"
        ):
            return await handler(request)
        if not self.core.key_ok(bearer(request)):
            return api_error(401, "Unauthorized", request.path)
        try:
            return await handler(request)
        except ApiError as exc:
            return api_error(exc.status, exc.message, request.path)

    def key(self, request: web.Request) -> str:
        key = bearer(request)
        assert key is not None
        return key

    def _box(self, request: web.Request) -> Box:
        box = self.core.find(request.match_info["sandbox"], self.key(request))
        if box is None:
            raise ApiError(404, "Sandbox not found")
        return box

    def _dto(self, box: Box, *, listed: bool = False) -> dict[str, Any]:
        return box.dto(self.emulator.toolbox_url, listed=listed)

    async def json_body(self, request: web.Request) -> dict[str, Any]:
        try:
            body = await request.json()
        except (ValueError, UnicodeDecodeError):
            raise ApiError(400, "request body must be JSON") from None
        if not isinstance(body, dict):
            raise ApiError(400, "request body must be a JSON object")
        return body

    async def config(self, request: web.Request) -> web.Response:
        """The deployment's public configuration (``DaytonaConfiguration``): what a client
        reads of it here is ``defaultSnapshot``, the snapshot of a create naming none."""
        url = self.emulator.url
        return web.json_response(
            {
                "version": "0.226.1-emulated",
                "oidc": {
                    "issuer": f"{url}/oidc",
                    "clientId": "daytona-emulator",
                    "audience": "daytona",
                    "provider": "emulated",
                },
                "linkedAccountsEnabled": False,
                "announcements": {},
                "proxyTemplateUrl": f"{url}/preview/{{{{sandboxId}}}}/{{{{PORT}}}}",
                "proxyToolboxUrl": self.emulator.toolbox_url,
                "defaultSnapshot": DEFAULT_SNAPSHOT,
                "dashboardUrl": f"{url}/dashboard",
                "maxAutoArchiveInterval": MAX_AUTO_ARCHIVE,
                "maintananceMode": False,
                "environment": "emulated",
            }
        )

    # -- create -----------------------------------------------------------
    async def create(self, request: web.Request) -> web.Response:
        key = self.key(request)
        body = await self.json_body(request)
        labels = _string_map(body.get("labels"), "labels")
        env = _string_map(body.get("env"), "env")
        snapshot, build_info, captured = self.source(body, key)
        name = body.get("name")
        if name is not None and not isinstance(name, str):
            raise ApiError(400, "name must be a string")
        if name and self.core.find(name, key) is not None:
            raise ApiError(409, f"Sandbox with name {name} already exists")
        sizes = {k: _int(body, k, v) for k, v in DEFAULT_RESOURCES.items()}
        if captured is not None:
            sizes = captured.resources()
        if build_info is None and any(body.get(k) is not None for k in ("cpu", "memory", "disk")):
            raise ApiError(
                400, "Cannot specify Sandbox resources when using a snapshot; use an image"
            )
        intervals = Lifecycle.of(body)
        network = network_settings(body)
        if self.warm is not None and build_info is None and snapshot is not None:
            source = captured.id if captured is not None else snapshot
            claimed = self.warm.claim(
                body, key, source, name=name, labels=labels, intervals=intervals
            )
            if claimed is not None:
                self.core.add(claimed)
                self.emulator.announce("sandbox.created", claimed)
                return web.json_response(self._dto(claimed))
        sandbox_id = str(uuid.uuid4())
        spec = SandboxSpec(
            env=env, labels=labels, template=captured.local_id if captured is not None else None
        )
        try:
            local = await self.core.create(key, spec, home=DAYTONA_HOME, sandbox_id=sandbox_id)
        except QuotaViolation as exc:
            message = CONCURRENCY_MESSAGE if exc.kind == "concurrent" else CREATED_MESSAGE
            cpu_limit = exc.limit * sizes["cpu"] if exc.kind == "concurrent" else exc.limit
            raise ApiError(403, message.format(limit=cpu_limit)) from None
        box = Box(
            id=sandbox_id,
            name=name or sandbox_id,
            api_key=key,
            local=local,
            labels=labels,
            env=env,
            snapshot=snapshot,
            target=str(body.get("target") or "us"),
            **intervals._asdict(),
            public=bool(body.get("public")),
            **network,
            build_info=build_info,
            state="pending_build" if build_info else "creating",
            cpu=sizes["cpu"],
            gpu=sizes["gpu"],
            memory=sizes["memory"],
            disk=sizes["disk"],
        )
        self.core.add(box)
        self.emulator.announce("sandbox.created", box)
        fault = self.core.faults.take("boot", key)
        if fault is None and not self.emulator.boot_seconds and build_info is None:
            self.core.set_state(box, "started")
        else:
            box.boot = self.background(self._boot(box, fault))
        return web.json_response(self._dto(box))

    def background(self, work: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        task = asyncio.create_task(work)
        self._boots.add(task)
        task.add_done_callback(self._boots.discard)
        return task

    def source(
        self, body: dict[str, Any], key: str
    ) -> tuple[str | None, dict[str, Any] | None, Captured | None]:
        """The snapshot name, or the build info of an image, the create names; and the
        snapshot made of a sandbox it names."""
        build_info = body.get("buildInfo")
        snapshot = body.get("snapshot")
        if build_info is not None:
            if not isinstance(build_info, dict) or not isinstance(
                build_info.get("dockerfileContent"), str
            ):
                raise ApiError(400, "buildInfo.dockerfileContent must be a string")
            if snapshot is not None:
                raise ApiError(400, "Cannot specify both a snapshot and a build")
            digest = base64.b32encode(build_info["dockerfileContent"].encode()[:20]).decode()
            return (
                None,
                {
                    "dockerfileContent": build_info["dockerfileContent"],
                    "contextHashes": build_info.get("contextHashes") or [],
                    "snapshotRef": f"daytona-{digest.lower().rstrip('=')}",
                },
                None,
            )
        if snapshot is None:
            return DEFAULT_SNAPSHOT, None, None
        if not isinstance(snapshot, str):
            raise ApiError(400, "snapshot must be a string")
        captured = find(self.emulator.captured.values(), snapshot, org_of(key))
        if captured is not None:
            if captured.state != "active":
                raise ApiError(400, f"Snapshot {snapshot} is {captured.state}")
            return snapshot, None, captured
        known = self.emulator.snapshots
        if known is not None and snapshot not in known:
            raise ApiError(
                400, f"Snapshot {snapshot} not found. Did you add it through the Daytona Dashboard?"
            )
        return snapshot, None, None

    async def _boot(self, box: Box, fault: Any) -> None:
        """Bring a new sandbox to ``started`` (or ``error``) as a runner would."""
        if box.build_info is not None:
            await asyncio.sleep(self.emulator.boot_seconds)
            self.core.set_state(box, "building_snapshot")
        await asyncio.sleep(self.emulator.boot_seconds)
        if fault is not None:
            await apply_delay_or_hang(fault)
            if fault.status is not None:
                failed = "build_failed" if box.build_info is not None else "error"
                self.core.set_state(box, failed, error=fault.message or "runner failed to start")
                return
        if box.state not in GONE:
            box.last_activity = time.time()
            self.core.set_state(box, "started")

    # -- the rest ---------------------------------------------------------
    async def get(self, request: web.Request) -> web.Response:
        return web.json_response(self._dto(self._box(request)))

    async def delete(self, request: web.Request) -> web.Response:
        box = self._box(request)
        view = self._dto(box)
        view.update(state="destroying", desiredState="destroyed")
        await self.core.kill(box.id)
        return web.json_response(view)

    async def start(self, request: web.Request) -> web.Response:
        box = self._box(request)
        if box.state not in ("started", "stopped", "archived"):
            raise ApiError(400, f"Sandbox is not in a startable state (state: {box.state})")
        await self.core.start(box)
        return web.json_response(self._dto(box))

    async def stop(self, request: web.Request) -> web.Response:
        box = self._box(request)
        if box.state not in ("started", "stopped"):
            raise ApiError(400, f"Sandbox is not in a stoppable state (state: {box.state})")
        if box.state == "started":
            await self.core.stop(box)
            if box.auto_delete == 0:
                await self.core.kill(box.id)
        return web.json_response(self._dto(box))

    async def set_auto_delete(self, request: web.Request) -> web.Response:
        """Minutes a stopped sandbox is kept before deletion (0: at once, -1: never)."""
        box = self._box(request)
        box.auto_delete = self._interval(request, -1)
        return web.json_response(self._dto(box))

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
        box = self._box(request)
        box.auto_stop = self._interval(request, 0)
        return web.json_response(self._dto(box))

    async def set_auto_archive(self, request: web.Request) -> web.Response:
        """Minutes a stopped sandbox waits before its archive (0: the longest, 30 days)."""
        box = self._box(request)
        box.auto_archive = self._interval(request, 0) or MAX_AUTO_ARCHIVE
        return web.json_response(self._dto(box))

    async def set_ttl(self, request: web.Request) -> web.Response:
        """Minutes from now until the sandbox is destroyed, whatever its state (0: never)."""
        box = self._box(request)
        box.ttl, box.ttl_from = self._interval(request, 0), time.time()
        return web.json_response(self._dto(box))

    async def set_public(self, request: web.Request) -> web.Response:
        """Whether a port's preview link needs the sandbox's token."""
        box = self._box(request)
        raw = request.match_info["public"]
        if raw not in ("true", "false"):
            raise ApiError(400, f"isPublic must be true or false, got {raw!r}")
        box.public = raw == "true"
        return web.json_response(self._dto(box))

    async def replace_labels(self, request: web.Request) -> web.Response:
        box = self._box(request)
        box.labels = _string_map((await self.json_body(request)).get("labels"), "labels")
        box.updated = time.time()
        return web.json_response({"labels": box.labels})

    async def archive(self, request: web.Request) -> web.Response:
        """Archive a stopped sandbox (an archived one stays so)."""
        box = self._box(request)
        if box.state not in ("stopped", "archived"):
            raise ApiError(400, f"Sandbox is not stopped (state: {box.state})")
        self.core.archive(box)
        return web.json_response(self._dto(box))

    async def signing_key(self, request: web.Request) -> web.Response:
        """The key the SDK signs pre-signed file URLs with (checked by the toolbox proxy)."""
        return web.json_response(self._box(request).signing_key)

    async def rotate_signing_key(self, request: web.Request) -> web.Response:
        """A new signing key: the URLs signed with the old one stop working."""
        box = self._box(request)
        box.signing_key = secrets.token_urlsafe(32)
        return web.json_response(box.signing_key)

    async def update_network(self, request: web.Request) -> web.Response:
        """The settings the body names changed, the others kept."""
        box = self._box(request)
        body = await self.json_body(request)
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
        return web.json_response(self._dto(box))

    async def resize(self, request: web.Request) -> web.Response:
        """New CPU, memory (GB) or disk (GB): a started sandbox only grows CPU and memory, a
        stopped one changes them and grows its disk; it passes through ``resizing``."""
        box = self._box(request)
        body = await self.json_body(request)
        wanted = {k: body[k] for k in ("cpu", "memory", "disk") if body.get(k) is not None}
        if not wanted:
            raise ApiError(400, "At least one of cpu, memory or disk must be given")
        sizes = {k: _int(body, k, 0, minimum=1) for k in wanted}
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
        return web.json_response(self._dto(box))

    async def metrics(self, request: web.Request) -> web.Response:
        """The telemetry series asked for (``metricNames``) over ``from`` .. ``to``: the
        emulator keeps no history, so each holds one point, the sample taken now."""
        box = self._box(request)
        sample = await asyncio.to_thread(metrics, box)
        names = request.query.getall("metricNames", []) or list(_METRICS)
        series = [
            {
                "metricName": name,
                "dataPoints": [{"timestamp": sample["timestamp"], "value": sample[_METRICS[name]]}],
            }
            for name in names
            if name in _METRICS
        ]
        return web.json_response({"series": series})

    # -- snapshots of sandboxes ---------------------------------------------
    async def snapshot(self, request: web.Request) -> web.Response:
        """Start a snapshot of the sandbox: the answer shows it ``snapshotting``; the copy
        runs in the background (`_capture`)."""
        box = self._box(request)
        body = await self.json_body(request)
        name = body.get("name")
        if not isinstance(name, str) or not name.strip():
            raise ApiError(400, "name must be a non-empty string")
        if body.get("includeMemory"):
            raise ApiError(400, "includeMemory is only supported for Windows sandboxes")
        if box.state not in ("started", "stopped"):
            raise ApiError(400, "Sandbox must be in started or stopped state to create a snapshot")
        previous = box.state
        self.core.set_state(box, "snapshotting")
        self.background(self._capture(box, name, previous))
        return web.json_response(self._dto(box))

    async def _capture(self, box: Box, name: str, previous: str) -> None:
        """Copy the sandbox's files into a snapshot, then give the sandbox its state back.

        As on Daytona, a copy that fails (the sandbox deleted meanwhile) or a
        name already taken leaves no snapshot and is reported nowhere: the
        sandbox only leaves ``snapshotting``.
        """
        await asyncio.sleep(self.emulator.boot_seconds)
        try:
            kept = await box.local.snapshot(name)
        except ProviderError:
            kept = None
        if kept is not None:
            if find(self.emulator.captured.values(), name, box.organization_id) is None:
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
                self.emulator.captured[made.id] = made
            else:
                await self.core.local.delete_snapshot(kept.id)
        if box.state == "snapshotting":
            self.core.set_state(box, previous)

    async def create_snapshot(self, request: web.Request) -> web.Response:
        """A snapshot of an image (``imageName``) or a build (``buildInfo``): it answers
        ``pending`` and becomes ``active`` in the background (`_pull`)."""
        key = self.key(request)
        body = await self.json_body(request)
        name, image = body.get("name"), body.get("imageName")
        if not isinstance(name, str) or not name.strip():
            raise ApiError(400, "name must be a non-empty string")
        if find(self.emulator.captured.values(), name, org_of(key)) is not None:
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
            _, build_info, _ = self.source({"buildInfo": build_info}, key)
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
            **{k: _int(body, k, v, minimum=0) for k, v in DEFAULT_RESOURCES.items()},
            state="pending",
            image_name=image,
            build_info=build_info,
            entrypoint=entrypoint,
        )
        self.emulator.captured[snap.id] = snap
        self._pulls[snap.id] = self.background(self._pull(snap))
        return web.json_response(snap.dto())

    async def _pull(self, snap: Captured) -> None:
        """``pulling`` (``building`` for a build), then ``active``, ``boot_seconds`` apart."""
        for state in ("building" if snap.build_info else "pulling", "active"):
            await asyncio.sleep(self.emulator.boot_seconds)
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
        return web.json_response({"url": f"{self.emulator.api_url}/snapshots/{snap.id}/build-logs"})

    async def snapshot_build_logs(self, request: web.Request) -> web.StreamResponse:
        """The build's log, as a sandbox's (`_write_build_log`), once it is over when followed."""
        snap = self._captured(request)
        if snap.build_info is None:
            raise ApiError(400, f"Snapshot {snap.name} has no build")
        response = web.StreamResponse(headers={"Content-Type": "text/plain; charset=utf-8"})
        await response.prepare(request)
        await _write_steps(response, snap.build_info["dockerfileContent"])
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
        found = find(self.emulator.captured.values(), wanted, org_of(self.key(request)))
        if found is None:
            raise ApiError(404, f"Snapshot {wanted} not found")
        return found

    def _general(self) -> list[dict[str, Any]]:
        names = {DEFAULT_SNAPSHOT, *(self.emulator.snapshots or ())}
        return [general(name) for name in sorted(names)]

    async def get_snapshot(self, request: web.Request) -> web.Response:
        wanted = request.match_info["snapshot"]
        found = find(self.emulator.captured.values(), wanted, org_of(self.key(request)))
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
        org = org_of(self.key(request))
        items = [s.dto() for s in self.emulator.captured.values() if s.organization_id == org]
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
            self.background(self._remove(snap))
        return web.Response(status=200)

    async def _remove(self, snap: Captured) -> None:
        await asyncio.sleep(self.emulator.boot_seconds)
        self.emulator.captured.pop(snap.id, None)
        if snap.local_id is not None:
            await self.core.local.delete_snapshot(snap.local_id)

    async def preview_url(self, request: web.Request) -> web.Response:
        """A port's preview link and the token a private sandbox's link wants.

        Daytona's links are ``https://{port}-{id}.proxy.daytona.works``; the
        emulator's proxy is a path of its own server.
        """
        box = self._box(request)
        port = _port(request.match_info["port"])
        token = self._preview_tokens.setdefault(box.id, secrets.token_urlsafe(24))
        url = f"{self.emulator.url}/preview/{box.id}/{port}"
        return web.json_response({"sandboxId": box.id, "url": url, "token": token})

    async def preview(self, request: web.Request) -> web.StreamResponse:
        """The preview proxy: a private sandbox's link wants its token (``X-Daytona-Preview-Token``)
        or an API key of its organization (``Authorization: Bearer``); then the request is
        forwarded to the port inside the sandbox."""
        box = self._previewed(request.match_info["sandbox"])
        token = self._preview_tokens.get(box.id)
        key = bearer(request)
        authorized = (token is not None and request.headers.get(PREVIEW_TOKEN) == token) or (
            key is not None and self.core.key_ok(key) and org_of(key) == box.organization_id
        )
        if not box.public and not authorized:
            raise ApiError(401, "Unauthorized: send the preview token")
        by_key = key is not None and self.core.key_ok(key)
        drop = _PREVIEW_CREDENTIALS if by_key else frozenset({PREVIEW_TOKEN})
        return await self._forward(request, _port(request.match_info["port"]), drop)

    async def signed_preview_url(self, request: web.Request) -> web.Response:
        """A URL holding its own token, valid ``expiresInSeconds`` (default 60, at most a day)."""
        box = self._box(request)
        port = _port(request.match_info["port"])
        raw = request.query.get("expiresInSeconds", str(SIGNED_PREVIEW_SECONDS))
        if not raw.isdigit() or not 1 <= int(raw) <= MAX_SIGNED_PREVIEW_SECONDS:
            raise ApiError(
                400, f"expiresInSeconds must be between 1 and {MAX_SIGNED_PREVIEW_SECONDS}"
            )
        token = secrets.token_urlsafe(18)
        self._signed[token] = SignedPreview(box.id, port, time.monotonic() + int(raw))
        url = f"{self.emulator.url}/signed-preview/{token}"
        return web.json_response({"sandboxId": box.id, "port": port, "token": token, "url": url})

    async def expire_signed_preview(self, request: web.Request) -> web.Response:
        box = self._box(request)
        port = _port(request.match_info["port"])
        signed = self._signed.get(request.match_info["token"])
        if signed is None or (signed.sandbox_id, signed.port) != (box.id, port):
            raise ApiError(404, "Signed preview URL not found")
        del self._signed[request.match_info["token"]]
        return web.Response(status=200)

    async def signed_preview(self, request: web.Request) -> web.StreamResponse:
        signed = self._signed.get(request.match_info["token"])
        if signed is None or signed.expires <= time.monotonic():
            self._signed.pop(request.match_info["token"], None)
            raise ApiError(401, "Unauthorized: the signed preview URL expired")
        self._previewed(signed.sandbox_id)
        return await self._forward(request, signed.port, frozenset())

    def _previewed(self, sandbox_id: str) -> Box:
        box = self.core.boxes.get(sandbox_id)
        if box is None or box.state in GONE:
            raise ApiError(404, "sandbox not found")
        if box.state != "started":
            raise ApiError(502, f"sandbox is not running (state: {box.state})")
        return box

    @staticmethod
    async def _forward(request: web.Request, port: int, drop: frozenset[str]) -> web.StreamResponse:
        """To the port in the sandbox, the proxy's own credentials (``drop``) kept back."""
        return await forward(request, port, request.match_info["tail"] or "/", drop=drop)

    async def build_logs_url(self, request: web.Request) -> web.Response:
        box = self._box(request)
        return web.json_response({"url": f"{self.emulator.api_url}/sandbox/{box.id}/build-logs"})

    async def build_logs(self, request: web.Request) -> web.StreamResponse:
        """The image build's log, text: a line per Dockerfile instruction, then (with
        ``follow=true``, once the build is over) how it ended."""
        box = self._box(request)
        if box.build_info is None:
            raise ApiError(400, "Sandbox has no build")
        response = web.StreamResponse(headers={"Content-Type": "text/plain; charset=utf-8"})
        await response.prepare(request)
        await _write_steps(response, box.build_info["dockerfileContent"])
        if request.query.get("follow") == "true":
            if box.boot is not None:
                await asyncio.wait({box.boot})
            ref = box.build_info["snapshotRef"]
            ended = f"Build failed: {box.error}" if box.state == "build_failed" else f"Built {ref}"
            await response.write(f"{ended}\n".encode())
        await response.write_eof()
        return response

    async def last_activity(self, request: web.Request) -> web.Response:
        self.core.touch(self._box(request))
        return web.Response(status=201)

    async def toolbox_proxy_url(self, request: web.Request) -> web.Response:
        self._box(request)
        return web.json_response({"url": self.emulator.toolbox_url})

    async def list(self, request: web.Request) -> web.Response:
        key = self.key(request)
        query = request.query
        try:
            wanted = _string_map(json.loads(query["labels"]), "labels") if "labels" in query else {}
        except ValueError:
            raise ApiError(400, "labels must be a JSON object of strings") from None
        states = set(query.getall("states", []))
        if not states <= _STATES:
            raise ApiError(400, f"states must be among {sorted(_STATES)}")
        raw_limit = query.get("limit", "100")
        if not raw_limit.isdigit() or not 1 <= int(raw_limit) <= MAX_PAGE:
            raise ApiError(400, f"limit must be an integer between 1 and {MAX_PAGE}")
        limit = int(raw_limit)
        after = _cursor(query.get("cursor"))
        org = org_of(key)
        found = [
            box
            for box in sorted(self.core.boxes.values(), key=_order)
            if box.organization_id == org
            and box.state not in GONE
            and (after is None or _order(box) > after)
            and (not states or box.state in states)
            and all(box.labels.get(k) == v for k, v in wanted.items())
            and box.id.lower().startswith(query.get("id", "").lower())
            and box.name.lower().startswith(query.get("name", "").lower())
        ]
        page = found[:limit]
        next_cursor = None
        if len(found) > limit:
            created, box_id = _order(page[-1])
            next_cursor = base64.urlsafe_b64encode(f"{-created!r}|{box_id}".encode()).decode()
        return web.json_response(
            {
                "items": [self._dto(box, listed=True) for box in page],
                "nextCursor": next_cursor,
            }
        )


async def _write_steps(response: web.StreamResponse, dockerfile: str) -> None:
    """A build log's line per Dockerfile instruction."""
    steps = [
        line.strip()
        for line in dockerfile.splitlines()
        if line.strip() and not line.lstrip().startswith("#")
    ]
    for number, step in enumerate(steps, 1):
        await response.write(f"Step {number}/{len(steps)} : {step}\n".encode())


def _order(box: Box) -> tuple[float, str]:
    """Newest first, then by id: the order pages follow."""
    return -box.created, box.id


def _positive(query: Any, name: str, default: int) -> int:
    raw = query.get(name)
    if raw is None:
        return default
    if not raw.isdigit() or int(raw) < 1:
        raise ApiError(400, f"{name} must be a positive integer")
    return int(raw)


def _cursor(raw: str | None) -> tuple[float, str] | None:
    """The position after which the next page starts (keyset: deletes never shift pages)."""
    if not raw:
        return None
    try:
        created, _, box_id = base64.urlsafe_b64decode(raw.encode()).decode().partition("|")
        return -float(created), box_id
    except ValueError:
        raise ApiError(400, "invalid cursor") from None


PREVIEW_TOKEN = "X-Daytona-Preview-Token"
_PREVIEW_CREDENTIALS = frozenset({PREVIEW_TOKEN, "Authorization"})
SIGNED_PREVIEW_SECONDS = 60
MAX_SIGNED_PREVIEW_SECONDS = 24 * 60 * 60


class SignedPreview(NamedTuple):
    """What a signed preview URL opens, and until when (monotonic)."""

    sandbox_id: str
    port: int
    expires: float


def _port(raw: str) -> int:
    if not raw.isdigit() or not 1 <= int(raw) <= 65535:
        raise ApiError(400, f"port must be between 1 and 65535, got {raw!r}")
    return int(raw)
