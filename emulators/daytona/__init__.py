"""A Daytona emulator: the unmodified ``daytona`` SDK (sync and async) runs against it.

One loopback HTTP server plays three Daytona services on one port:

* the control-plane API under ``/api`` (`emulators.daytona.api`): create,
  get, list, delete, start, stop, archive, last-activity, metrics and the
  deployment's configuration (``/api/config``); a sandbox's settings
  (`emulators.daytona.sandbox_settings`: labels, lifecycle intervals,
  public, network, resize, the signing key of pre-signed file URLs);
  preview links, signed or not, and the preview proxy itself
  (`emulators.daytona.previews`); snapshots (`emulators.daytona.snapshot_api`
  over `emulators.daytona.snapshots`: of sandboxes, of images, and the
  general ones); warm pools, which make sandboxes of a snapshot ahead of the
  creates they serve (`emulators.daytona.warm_pools`); volumes, directories
  that sandboxes mount and share and that outlive them
  (`emulators.daytona.volumes`);
* the notification gateway, Socket.IO at ``/api/socket.io/``: a client
  authenticates with ``auth={"token": <API key>}``, joins its
  organization's room and receives ``sandbox.created`` and
  ``sandbox.state.updated`` (``{sandbox, oldState, newState}``), which is
  how the SDK learns that a sandbox has started, and the volumes' own
  (``volume.created``, ``volume.state.updated``, ``volume.lastUsedAt.updated``);
* the toolbox proxy under ``/toolbox`` (`emulators.daytona.toolbox`), the
  ``toolboxProxyUrl`` of every sandbox: commands, sessions and code
  (`emulators.daytona.processes`), terminals (`emulators.daytona.terminals`),
  interpreter contexts (`emulators.daytona.interpreter`), files
  (`emulators.daytona.files`, and `emulators.daytona.transfers` for uploads
  and downloads). Git, LSP and computer use are not emulated (their routes
  answer the daemon's 404).

Sandboxes are real local sandboxes (`emulators.daytona.sandboxes`) that boot
in ``boot_seconds`` and stop or go away on Daytona's lifecycle intervals,
counted in minutes of ``minute`` seconds. `sdk_env` gives the SDK's
variables for it.

Faults come from the shared harness, per operation: ``create``, ``list``,
``get``, ``kill`` (delete), ``start``, ``stop``, ``keepalive``
(last-activity), ``toolbox_url`` (toolbox-proxy-url), ``snapshot`` (a
sandbox's snapshot and ``/api/snapshots``), ``warm_pool``
(``/api/warm-pools``), ``volume`` (``/api/volumes``), ``exec``
(everything under ``/process``) and ``files``;
plus ``boot``, taken when a sandbox starts booting: a status fault makes it
end in ``error`` (``build_failed`` for an image) with the fault's message,
a delay slows the boot, a hang keeps it ``creating``. A status fault on the
API answers its error body (on the toolbox, the daemon's), with
``Retry-After`` when the fault has one; a bare 403 on ``create`` carries
Daytona's quota message.

    with DaytonaEmulator() as emu:
        daytona = Daytona(DaytonaConfig(**emu.sdk_config()))
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from aiohttp import web

from emulators.daytona.api import CONCURRENCY_MESSAGE, SandboxApi, api_error, bearer
from emulators.daytona.files import Files
from emulators.daytona.interpreter import Interpreters
from emulators.daytona.previews import Previews
from emulators.daytona.processes import Processes
from emulators.daytona.sandbox_settings import SandboxSettings
from emulators.daytona.sandboxes import Box, DaytonaCore
from emulators.daytona.snapshot_api import SnapshotApi
from emulators.daytona.snapshots import Captured
from emulators.daytona.terminals import Terminals
from emulators.daytona.toolbox import PROXY, Toolbox, daemon_error
from emulators.daytona.transfers import Transfers
from emulators.daytona.volumes import Volumes
from emulators.daytona.warm_pools import WarmPools
from emulators.harness import Emulator, FaultSpec, http_fault_middleware, unknown_route_middleware

__all__ = ["TEST_API_KEY", "DaytonaEmulator"]

TEST_API_KEY = "dtn_" + "5e1d" * 16

_DEFAULT_MESSAGES = {
    401: "Unauthorized",
    403: "Forbidden resource",
    404: "Sandbox not found",
    408: "Request Timeout",
    429: "ThrottlerException: Too Many Requests",
    500: "Internal server error",
    502: "Bad Gateway",
    503: "Service Unavailable",
    504: "Gateway Timeout",
}
_SANDBOX_OPS = {
    ("GET", 0): "get",
    ("DELETE", 0): "kill",
    ("POST", "start"): "start",
    ("POST", "stop"): "stop",
    ("POST", "last-activity"): "keepalive",
    ("POST", "snapshot"): "snapshot",
    ("GET", "toolbox-proxy-url"): "toolbox_url",
}


def _op_for(request: web.Request) -> str | None:
    parts = request.path.strip("/").split("/")
    if parts[0] == "toolbox" and len(parts) >= 3:
        return {"process": "exec", "files": "files"}.get(parts[2])
    if parts[:2] == ["api", "snapshots"]:
        return "snapshot"
    if parts[:2] == ["api", "warm-pools"]:
        return "warm_pool"
    if parts[:2] == ["api", "volumes"]:
        return "volume"
    if parts[:2] != ["api", "sandbox"]:
        return None
    rest = parts[2:]
    if not rest:
        return {"POST": "create", "GET": "list"}.get(request.method)
    key: tuple[str, int | str] = (request.method, rest[1] if len(rest) == 2 else len(rest) - 1)
    return _SANDBOX_OPS.get(key)


def _fault_response(fault: FaultSpec) -> web.StreamResponse:
    status = fault.status or 500
    headers = {"Retry-After": f"{fault.retry_after:g}"} if fault.retry_after else None
    message = fault.message
    if fault.op in ("exec", "files"):
        code = {401: "UNAUTHORIZED", 403: "FORBIDDEN", 404: "NOT_FOUND"}.get(status, "")
        return daemon_error(
            status,
            message or _DEFAULT_MESSAGES.get(status, "Error"),
            code,
            headers=headers,
            source=PROXY,
        )
    if message is None:
        message = (
            CONCURRENCY_MESSAGE.format(limit=10)
            if status == 403 and fault.op == "create"
            else _DEFAULT_MESSAGES.get(status, "Error")
        )
    return api_error(status, message, headers=headers)


class DaytonaEmulator(Emulator):
    """Daytona's API, notification gateway and toolbox proxy on one loopback port.

    Args:
        snapshots: snapshot names a create may use besides the snapshots made
            of sandboxes (`captured`); None accepts any (an unknown one answers
            400, "Snapshot ... not found", as Daytona does).
        boot_seconds: how long a sandbox takes from ``creating`` to ``started``
            (0: the create answers ``started``).
        minute: seconds in one of Daytona's lifecycle minutes (auto-stop,
            auto-delete, TTL); tests shorten it.
        **kwargs: `emulators.harness.Emulator` arguments (``port``, ``root``...).
    """

    name = "daytona"

    def __init__(
        self,
        *,
        snapshots: Iterable[str] | None = None,
        boot_seconds: float = 0.05,
        minute: float = 60.0,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.core: DaytonaCore = DaytonaCore(
            self.name,
            self.core.local.root,
            isolation=self.core.isolation,
            minute=minute,
        )
        self.core.on_state = self._state_changed
        self.snapshots = set(snapshots) if snapshots is not None else None
        self.captured: dict[str, Captured] = {}  # the snapshots made of sandboxes, by id
        self.boot_seconds = boot_seconds
        # False: sandbox views carry an empty toolboxProxyUrl, as Daytona's may, and
        # clients ask ``/sandbox/{id}/toolbox-proxy-url`` for it
        self.toolbox_in_views = True
        self.warm_pools: WarmPools | None = None  # made when serving: they run on its loop
        self.volumes: Volumes | None = None  # made when serving, as the warm pools
        self._sio: Any = None
        self._emits: set[asyncio.Task[None]] = set()

    @property
    def api_url(self) -> str:
        return f"{self.url}/api"

    @property
    def toolbox_url(self) -> str:
        return f"{self.url}/toolbox"

    @property
    def viewed_toolbox_url(self) -> str:
        """The toolboxProxyUrl a sandbox's view carries (`toolbox_in_views`)."""
        return self.toolbox_url if self.toolbox_in_views else ""

    def sdk_env(self) -> dict[str, str]:
        return {"DAYTONA_API_URL": self.api_url, "DAYTONA_API_KEY": TEST_API_KEY}

    def sdk_config(self, api_key: str = TEST_API_KEY) -> dict[str, Any]:
        """Keyword arguments of a ``DaytonaConfig`` pointing an SDK client here."""
        return {"api_key": api_key, "api_url": self.api_url, "target": "us"}

    # -- notifications ------------------------------------------------------
    def announce(self, event: str, box: Box, payload: dict[str, Any] | None = None) -> None:
        """Emit ``event`` to the sandbox's organization (from the emulator's loop)."""
        data = payload if payload is not None else box.dto(self.viewed_toolbox_url)
        self.notify(event, box.organization_id, data)

    def notify(self, event: str, organization_id: str, data: dict[str, Any]) -> None:
        """Emit ``event`` with ``data`` to an organization's room (from the emulator's loop)."""
        if self._sio is None:
            return
        task = asyncio.get_running_loop().create_task(
            self._sio.emit(event, data, to=organization_id)
        )
        self._emits.add(task)
        task.add_done_callback(self._emits.discard)

    def _state_changed(self, box: Box, old: str, new: str) -> None:
        self.announce(
            "sandbox.state.updated",
            box,
            {"sandbox": box.dto(self.viewed_toolbox_url), "oldState": old, "newState": new},
        )

    def _gateway(self, app: web.Application) -> Any:
        import socketio  # type: ignore[import-untyped]

        from emulators.daytona.sandboxes import org_of

        sio = socketio.AsyncServer(
            async_mode="aiohttp", logger=False, engineio_logger=False, cors_allowed_origins="*"
        )
        core = self.core

        async def connect(sid: str, environ: dict[str, Any], auth: Any) -> None:
            token = auth.get("token") if isinstance(auth, dict) else None
            if not isinstance(token, str) or not core.key_ok(token):
                raise socketio.exceptions.ConnectionRefusedError("Unauthorized")
            await sio.enter_room(sid, org_of(token))

        sio.on("connect", connect)
        sio.attach(app, socketio_path="api/socket.io")
        return sio

    # -- serving --------------------------------------------------------------
    async def serve(self) -> Callable[[], Awaitable[None]]:
        api = SandboxApi(self)
        api.warm = self.warm_pools = WarmPools(api)
        api.volumes = self.volumes = Volumes(api)
        toolbox = Toolbox(self)
        app = web.Application(
            middlewares=[
                unknown_route_middleware(
                    lambda request, status, message: api_error(status, message, request.path),
                    skip=lambda request: request.path.startswith("/toolbox/"),
                ),
                http_fault_middleware(self.core, _op_for, bearer, _fault_response),
                api.errors,
                toolbox.errors,
            ],
            client_max_size=256 * 1024 * 1024,
        )
        app.add_routes(
            api.routes()
            + SandboxSettings(api).routes()
            + SnapshotApi(api).routes()
            + Previews(api).routes()
            + self.warm_pools.routes()
            + self.volumes.routes()
            + Terminals().routes()
            + Interpreters().routes()
            + Processes().routes()
            + Transfers().routes()
            + Files().routes()
            + toolbox.routes()
        )
        self._sio = self._gateway(app)
        runner = web.AppRunner(app, access_log=None, handler_cancellation=True)
        await runner.setup()
        await web.TCPSite(runner, self.host, self.port).start()

        async def stop() -> None:
            await self._sio.shutdown()
            for task in [*self._emits, *_engineio_tasks()]:
                task.cancel()
            await runner.cleanup()

        return stop


def _engineio_tasks() -> list[asyncio.Task[Any]]:
    """Engine.IO's untracked background tasks (its pings sleep 25 s) on this loop."""
    found = []
    for task in asyncio.all_tasks():
        frame = getattr(task.get_coro(), "cr_frame", None)
        if frame is not None and str(frame.f_globals.get("__name__", "")).startswith("engineio"):
            found.append(task)
    return found
