"""Daytona's control-plane REST API: what every route shares, and the sandboxes' own routes.

Routes (JSON in camelCase, key in ``Authorization: Bearer``, errors as the
API's ``{statusCode, timestamp, path, error, message}``), under ``/api``.
`SandboxApi` holds what all of them use (the key check and the error
middleware, the sandbox lookup, body parsing, background tasks); the
other routes are handlers over it, each in a module of its own: a
sandbox's settings (`emulators.daytona.sandbox_settings`), snapshots
(`emulators.daytona.snapshot_api`), preview links and their proxy
(`emulators.daytona.previews`), warm pools (`emulators.daytona.warm_pools`)
and volumes (`emulators.daytona.volumes`). Here:

* ``POST /api/sandbox`` creates a sandbox from a snapshot (``snapshot``) or
  an image (``buildInfo``); it answers at once in ``creating`` (or
  ``pending_build``) and the sandbox boots in the background, announcing
  each state over Socket.IO. With ``boot_seconds=0`` and no boot fault it
  answers ``started``. A create matching a warm pool is served by one of
  its ready sandboxes; ``volumes`` are mounted (`Volumes.mounts`).
* ``GET /api/sandbox`` lists the organization's sandboxes, newest first,
  filtered by ``labels`` (JSON), ``states``, ``id`` / ``name`` prefixes,
  paged by ``limit`` / ``cursor`` (``nextCursor`` is null on the last page).
* ``GET|DELETE /api/sandbox/{idOrName}``; ``POST .../start``, ``.../stop``,
  ``.../archive`` (a stopped sandbox);
  ``POST /api/sandbox/{id}/last-activity`` (resets the auto-stop timer);
  ``GET /api/sandbox/{id}/toolbox-proxy-url``; ``.../build-logs-url`` and
  ``.../build-logs`` (an image create's emulated build: no image is built,
  the sandbox is the default one); ``GET .../telemetry/metrics`` (one
  sample, now).
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
import time
import uuid
from collections.abc import Awaitable, Callable, Coroutine
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from aiohttp import web

from emulators.daytona.sandboxes import DAYTONA_HOME, GONE, Box, iso, metrics, org_of
from emulators.daytona.snapshots import Captured, find
from emulators.harness import QuotaViolation, apply_delay_or_hang
from providers.base import SandboxSpec

if TYPE_CHECKING:
    from emulators.daytona import DaytonaEmulator
    from emulators.daytona.volumes import Volumes
    from emulators.daytona.warm_pools import WarmPools

__all__ = [
    "CONCURRENCY_MESSAGE",
    "CREATED_MESSAGE",
    "ApiError",
    "Lifecycle",
    "SandboxApi",
    "api_error",
    "bearer",
    "int_field",
    "network_settings",
    "string_map",
    "write_steps",
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


def string_map(value: Any, name: str) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        raise ApiError(400, f"{name} must map strings to strings")
    return dict(value)


def int_field(body: dict[str, Any], name: str, default: int, minimum: int | None = 0) -> int:
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
            auto_stop=int_field(body, "autoStopInterval", DEFAULT_AUTO_STOP),
            auto_delete=int_field(body, "autoDeleteInterval", -1, minimum=None),
            auto_archive=int_field(body, "autoArchiveInterval", DEFAULT_AUTO_ARCHIVE),
            ttl=int_field(body, "ttlMinutes", 0),
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
    """The sandbox handlers, over the emulator's core, and what the other handlers use of them."""

    def __init__(self, emulator: DaytonaEmulator) -> None:
        self.emulator = emulator
        self.core = emulator.core
        self._boots: set[asyncio.Task[None]] = set()  # boots, snapshot copies and removals
        self.warm: WarmPools | None = None  # set by the emulator: creates claim from its pools
        self.volumes: Volumes | None = None  # set by the emulator: creates mount them

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
            web.post(one + "/archive", self.archive),
            web.get(one + "/telemetry/metrics", self.metrics),
            web.get(one + "/toolbox-proxy-url", self.toolbox_proxy_url),
            web.get(one + "/build-logs-url", self.build_logs_url),
            web.get(one + "/build-logs", self.build_logs),
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

    def box_of(self, request: web.Request) -> Box:
        box = self.core.find(request.match_info["sandbox"], self.key(request))
        if box is None:
            raise ApiError(404, "Sandbox not found")
        return box

    def dto(self, box: Box, *, listed: bool = False) -> dict[str, Any]:
        return box.dto(self.emulator.viewed_toolbox_url, listed=listed)

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
        labels = string_map(body.get("labels"), "labels")
        env = string_map(body.get("env"), "env")
        snapshot, build_info, captured = self.source(body, key)
        name = body.get("name")
        if name is not None and not isinstance(name, str):
            raise ApiError(400, "name must be a string")
        if name and self.core.find(name, key) is not None:
            raise ApiError(409, f"Sandbox with name {name} already exists")
        sizes = {k: int_field(body, k, v) for k, v in DEFAULT_RESOURCES.items()}
        if captured is not None:
            sizes = captured.resources()
        if build_info is None and any(body.get(k) is not None for k in ("cpu", "memory", "disk")):
            raise ApiError(
                400, "Cannot specify Sandbox resources when using a snapshot; use an image"
            )
        intervals = Lifecycle.of(body)
        network = network_settings(body)
        volumes: list[dict[str, str]] = []
        mounts: dict[str, Path] = {}
        if self.volumes is not None:
            volumes, mounts = self.volumes.mounts(body.get("volumes"), key)
        if self.warm is not None and build_info is None and snapshot is not None:
            source = captured.id if captured is not None else snapshot
            claimed = self.warm.claim(
                body, key, source, name=name, labels=labels, intervals=intervals
            )
            if claimed is not None:
                self.core.add(claimed)
                self.emulator.announce("sandbox.created", claimed)
                return web.json_response(self.dto(claimed))
        sandbox_id = str(uuid.uuid4())
        spec = SandboxSpec(
            env=env, labels=labels, template=captured.local_id if captured is not None else None
        )
        try:
            local = await self.core.create(
                key, spec, home=DAYTONA_HOME, sandbox_id=sandbox_id, mounts=mounts
            )
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
            volumes=volumes,
            state="pending_build" if build_info else "creating",
            cpu=sizes["cpu"],
            gpu=sizes["gpu"],
            memory=sizes["memory"],
            disk=sizes["disk"],
        )
        self.core.add(box)
        if self.volumes is not None:
            self.volumes.mounted(volumes, box.created)
        self.emulator.announce("sandbox.created", box)
        fault = self.core.faults.take("boot", key)
        if fault is None and not self.emulator.boot_seconds and build_info is None:
            self.core.set_state(box, "started")
        else:
            box.boot = self.background(self._boot(box, fault))
        return web.json_response(self.dto(box))

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
        return web.json_response(self.dto(self.box_of(request)))

    async def delete(self, request: web.Request) -> web.Response:
        box = self.box_of(request)
        view = self.dto(box)
        view.update(state="destroying", desiredState="destroyed")
        await self.core.kill(box.id)
        return web.json_response(view)

    async def start(self, request: web.Request) -> web.Response:
        box = self.box_of(request)
        if box.state not in ("started", "stopped", "archived"):
            raise ApiError(400, f"Sandbox is not in a startable state (state: {box.state})")
        await self.core.start(box)
        return web.json_response(self.dto(box))

    async def stop(self, request: web.Request) -> web.Response:
        box = self.box_of(request)
        if box.state not in ("started", "stopped"):
            raise ApiError(400, f"Sandbox is not in a stoppable state (state: {box.state})")
        if box.state == "started":
            await self.core.stop(box)
            if box.auto_delete == 0:
                await self.core.kill(box.id)
        return web.json_response(self.dto(box))

    async def archive(self, request: web.Request) -> web.Response:
        """Archive a stopped sandbox (an archived one stays so)."""
        box = self.box_of(request)
        if box.state not in ("stopped", "archived"):
            raise ApiError(400, f"Sandbox is not stopped (state: {box.state})")
        self.core.archive(box)
        return web.json_response(self.dto(box))

    async def metrics(self, request: web.Request) -> web.Response:
        """The telemetry series asked for (``metricNames``) over ``from`` .. ``to``: the
        emulator keeps no history, so each holds one point, the sample taken now."""
        box = self.box_of(request)
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

    async def build_logs_url(self, request: web.Request) -> web.Response:
        box = self.box_of(request)
        return web.json_response({"url": f"{self.emulator.api_url}/sandbox/{box.id}/build-logs"})

    async def build_logs(self, request: web.Request) -> web.StreamResponse:
        """The image build's log, text: a line per Dockerfile instruction, then (with
        ``follow=true``, once the build is over) how it ended."""
        box = self.box_of(request)
        if box.build_info is None:
            raise ApiError(400, "Sandbox has no build")
        response = web.StreamResponse(headers={"Content-Type": "text/plain; charset=utf-8"})
        await response.prepare(request)
        await write_steps(response, box.build_info["dockerfileContent"])
        if request.query.get("follow") == "true":
            if box.boot is not None:
                await asyncio.wait({box.boot})
            ref = box.build_info["snapshotRef"]
            ended = f"Build failed: {box.error}" if box.state == "build_failed" else f"Built {ref}"
            await response.write(f"{ended}\n".encode())
        await response.write_eof()
        return response

    async def last_activity(self, request: web.Request) -> web.Response:
        self.core.touch(self.box_of(request))
        return web.Response(status=201)

    async def toolbox_proxy_url(self, request: web.Request) -> web.Response:
        self.box_of(request)
        return web.json_response({"url": self.emulator.toolbox_url})

    async def list(self, request: web.Request) -> web.Response:
        key = self.key(request)
        query = request.query
        try:
            wanted = string_map(json.loads(query["labels"]), "labels") if "labels" in query else {}
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
                "items": [self.dto(box, listed=True) for box in page],
                "nextCursor": next_cursor,
            }
        )


async def write_steps(response: web.StreamResponse, dockerfile: str) -> None:
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


def _cursor(raw: str | None) -> tuple[float, str] | None:
    """The position after which the next page starts (keyset: deletes never shift pages)."""
    if not raw:
        return None
    try:
        created, _, box_id = base64.urlsafe_b64decode(raw.encode()).decode().partition("|")
        return -float(created), box_id
    except ValueError:
        raise ApiError(400, "invalid cursor") from None
