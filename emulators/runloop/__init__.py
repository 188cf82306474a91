"""A Runloop emulator: the unmodified ``runloop-api-client`` SDK runs against it.

One loopback HTTP server plays Runloop's devbox API (`emulators.runloop.api`,
with the routes of `emulators.runloop.executions`, `emulators.runloop.files`,
`emulators.runloop.disk_snapshots`, `emulators.runloop.blueprints` and
`emulators.runloop.objects`): the low-level ``Runloop`` / ``AsyncRunloop``
clients and the object SDKs (``RunloopSDK`` / ``AsyncRunloopSDK``) create
devboxes, long-poll their status, run commands, move files and shut them
down, build blueprints to start devboxes from and keep objects in object
storage (uploaded and downloaded through presigned URLs the same server
answers) to mount in devboxes and build blueprints from. Devboxes are real
local sandboxes (`emulators.runloop.devboxes`) that boot in ``boot_seconds``
and end after their keep-alive or idle time, as on Runloop; a blueprint
builds in ``build_seconds`` plus its setup commands' time (its Dockerfile
read by `emulators.runloop.dockerfiles`, not run; its ``COPY`` and ``ADD``
copying from a build context object, `emulators.runloop.build_context`).
`sdk_env` gives the SDK's variables for it.

Tunnels are served by a second loopback server, the ingress: it routes on
the ``Host`` header, ``{port}-{tunnel_key}.tunnel.{domain}`` as the SDK's
``get_tunnel_url`` builds it (``domain`` is the API's host without
``api.``; here the emulator's own host), checks
``X-Runloop-Tunnel-Authorization: Bearer <auth_token>`` on an authenticated
tunnel (401 without it) and forwards to the port inside the devbox. A
suspended devbox's tunnel answers 503. `RunloopEmulator.resolve` points
those names at the ingress, as Runloop's DNS does.

Faults come from the shared harness, per operation: ``create`` (both create
routes), ``list``, ``get``, ``wait`` (the devbox status long-poll),
``kill`` (shutdown), ``keepalive``, ``exec`` (execute, execute_async, execute_sync and
everything under ``executions/``), ``files``, ``pause`` (suspend),
``resume``, ``port`` (enable_tunnel) and ``snapshot`` (snapshot_disk,
snapshot_disk_async and ``disk_snapshots/``), ``blueprint`` (everything
under ``/v1/blueprints``) and ``object`` (everything under ``/v1/objects``;
not the presigned URLs, which are the storage's); plus ``boot``, taken when a
devbox starts booting: a status fault makes it end in ``failure``, a delay
slows the boot, a hang keeps it ``provisioning``. A status fault answers
Runloop's error body ``{"status", "message"}``, with ``Retry-After`` when
the fault has one.

    with RunloopEmulator() as emu:
        client = Runloop(**emu.sdk_kwargs())
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from aiohttp import web

from emulators.harness import (
    Emulator,
    FaultSpec,
    free_port,
    http_fault_middleware,
    unknown_route_middleware,
)
from emulators.ingress import forward
from emulators.runloop.api import DevboxApi, api_error
from emulators.runloop.blueprints import Blueprints
from emulators.runloop.devboxes import RunloopCore
from emulators.runloop.disk_snapshots import DiskSnapshots
from emulators.runloop.executions import Executions
from emulators.runloop.files import Files
from emulators.runloop.objects import Objects

__all__ = ["TEST_API_KEY", "RunloopEmulator"]

TEST_API_KEY = "ak_" + "3f9c" * 8

_DEFAULT_MESSAGES = {
    401: "Unauthorized: the API key is missing, invalid or revoked",
    403: "Forbidden: this API key may not perform this action",
    404: "Not found",
    408: "Request timed out",
    429: "Too many requests: rate limit exceeded, slow down",
    500: "Internal server error",
    502: "Bad gateway",
    503: "Service unavailable: no capacity to place a devbox right now",
    504: "Gateway timeout",
}

_SUB_OPS = {
    "wait_for_status": "wait",
    "shutdown": "kill",
    "keep_alive": "keepalive",
    "execute": "exec",
    "execute_async": "exec",
    "execute_sync": "exec",
    "write_file_contents": "files",
    "read_file_contents": "files",
    "upload_file": "files",
    "download_file": "files",
    "suspend": "pause",
    "resume": "resume",
    "enable_tunnel": "port",
    "remove_tunnel": "port",
    "snapshot_disk": "snapshot",
    "snapshot_disk_async": "snapshot",
}
TUNNEL_AUTH_HEADER = "X-Runloop-Tunnel-Authorization"
_TUNNEL_HOST = re.compile(r"(?P<port>\d{1,5})-(?P<key>[A-Za-z0-9]+)\.tunnel\.(?P<domain>.+)")


def _op_for(request: web.Request) -> str | None:
    parts = request.path.strip("/").split("/")
    if parts[:2] == ["v1", "blueprints"]:
        return "blueprint"
    if parts[:2] == ["v1", "objects"]:
        return "object"
    if parts[:2] != ["v1", "devboxes"]:
        return None
    rest = parts[2:]
    if rest[:1] == ["disk_snapshots"]:
        return "snapshot"
    if not rest:
        return {"POST": "create", "GET": "list"}.get(request.method)
    if rest == ["create_and_await_running"]:
        return "create"
    if len(rest) == 1:
        return "get" if request.method == "GET" else None
    if rest[1] == "executions":
        return "exec"
    return _SUB_OPS.get(rest[1]) if len(rest) == 2 else None


def _key_for(request: web.Request) -> str | None:
    scheme, _, key = request.headers.get("Authorization", "").partition(" ")
    return key if scheme.lower() == "bearer" else None


def _fault_response(fault: FaultSpec) -> web.StreamResponse:
    status = fault.status or 500
    headers = {"Retry-After": f"{fault.retry_after:g}"} if fault.retry_after else None
    return api_error(status, fault.message or _DEFAULT_MESSAGES.get(status, "Error"), headers)


class RunloopEmulator(Emulator):
    """Runloop's devbox API on one loopback port.

    Args:
        blueprints: blueprint names and ids a create may use besides the blueprints built
            here, as blueprints made elsewhere; None accepts any (an unknown one answers 404
            when a set is given).
        snapshots: snapshot ids a create may use besides the disk snapshots the
            emulator made, likewise.
        boot_seconds: how long a devbox takes from ``provisioning`` to ``running``.
        build_seconds: how long a blueprint build takes besides its setup commands.
        **kwargs: `emulators.harness.Emulator` arguments (``port``, ``root``...).
    """

    name = "runloop"

    def __init__(
        self,
        *,
        blueprints: Iterable[str] | None = None,
        snapshots: Iterable[str] | None = None,
        boot_seconds: float = 0.1,
        build_seconds: float = 0.1,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.core: RunloopCore = RunloopCore(
            self.name, self.core.local.root, isolation=self.core.isolation
        )
        self.blueprints = set(blueprints) if blueprints is not None else None
        self.snapshots = set(snapshots) if snapshots is not None else None
        self.boot_seconds = boot_seconds
        self.build_seconds = build_seconds
        self.ingress_port = free_port()

    @property
    def domain(self) -> str:
        """The tunnels' domain, as the SDK derives it from the API's host."""
        return self.host[4:] if self.host.startswith("api.") else self.host

    def resolve(self, host: str) -> tuple[str, int] | None:
        """``*.tunnel.<domain>`` names point at the ingress."""
        name = host.rsplit(":", 1)[0] if host.count(":") == 1 else host
        match = _TUNNEL_HOST.fullmatch(name)
        if match is None or match["domain"] != self.domain:
            return None
        return self.host, self.ingress_port

    def sdk_env(self) -> dict[str, str]:
        return {"RUNLOOP_BASE_URL": self.url, "RUNLOOP_API_KEY": TEST_API_KEY}

    def sdk_kwargs(self, api_key: str = TEST_API_KEY) -> dict[str, Any]:
        """Keyword arguments pointing an SDK client here, SDK retries off."""
        return {"bearer_token": api_key, "base_url": self.url, "max_retries": 0}

    async def serve(self) -> Callable[[], Awaitable[None]]:
        app = web.Application(
            middlewares=[
                unknown_route_middleware(lambda _, status, message: api_error(status, message)),
                http_fault_middleware(self.core, _op_for, _key_for, _fault_response),
                DevboxApi.errors,
            ],
            client_max_size=256 * 1024 * 1024,
        )
        api = DevboxApi(self)
        app.add_routes(  # the disk snapshots first: /v1/devboxes/{devbox_id} matches theirs
            DiskSnapshots(api).routes()
            + api.routes()
            + Executions(api).routes()
            + Files(api).routes()
            + Blueprints(api).routes()
            + Objects(api).routes()
        )
        runner = web.AppRunner(app, access_log=None, handler_cancellation=True)
        await runner.setup()
        await web.TCPSite(runner, self.host, self.port).start()
        ingress = web.Application(client_max_size=0)
        ingress.router.add_route("*", "/{path:.*}", self._tunnel)
        edge = web.AppRunner(ingress, access_log=None, handler_cancellation=True)
        await edge.setup()
        await web.TCPSite(edge, self.host, self.ingress_port).start()

        async def stop() -> None:
            await edge.cleanup()
            await runner.cleanup()

        return stop

    async def _tunnel(self, request: web.Request) -> web.StreamResponse:
        """A request to ``{port}-{key}.tunnel.{domain}``, forwarded to the devbox's port."""
        match = _TUNNEL_HOST.fullmatch(request.host.rsplit(":", 1)[0])
        devbox = self.core.by_tunnel(match["key"]) if match is not None else None
        if match is None or devbox is None or devbox.tunnel is None:
            return api_error(404, "Tunnel not found")
        tunnel = devbox.tunnel
        if tunnel.auth_token is not None:
            scheme, _, token = request.headers.get(TUNNEL_AUTH_HEADER, "").partition(" ")
            if scheme.lower() != "bearer" or token != tunnel.auth_token:
                return api_error(401, "Unauthorized: missing or invalid tunnel token")
        if devbox.status != "running":
            return api_error(503, f"Devbox {devbox.id} is {devbox.status}")
        port = int(match["port"])
        if not 0 < port < 65536:
            return api_error(400, f"port {port} is out of range")
        if tunnel.http_keep_alive:
            self.core.touch(devbox)
        return await forward(
            request, port, request.rel_url.raw_path, drop=frozenset({TUNNEL_AUTH_HEADER})
        )
