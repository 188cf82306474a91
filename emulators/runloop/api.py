"""Runloop's REST API for devboxes: what every route shares, and the devboxes' own routes.

Routes (JSON in snake_case, key in ``Authorization: Bearer``, errors as
``{"status", "message"}``), all under ``/v1/devboxes``; the commands run in
a devbox are `emulators.runloop.executions`, its files `emulators.runloop.files`,
its disk snapshots `emulators.runloop.disk_snapshots`, the blueprints it
starts from `emulators.runloop.blueprints` and the objects it mounts
`emulators.runloop.objects`, each over `DevboxApi` (which holds the key
check, the devbox lookups, body parsing and the error middleware). Here:

* ``POST /v1/devboxes`` creates a devbox (``provisioning`` at first, then
  ``initializing`` while its ``launch_commands`` run in turn: one that fails
  ends the devbox in ``failure``); a create's ``entrypoint`` then runs as
  the devbox's main process, and its end shuts the devbox down
  (``entrypoint_exit``; a suspend stops it, a resume does not restart it);
  ``POST /v1/devboxes/create_and_await_running`` also holds until it boots,
  at most ``CREATE_HOLD_MAX`` seconds (the SDK's default read timeout, 30 s,
  must not pass first: it polls ``wait_for_status`` for the rest).
  A create repeated with the same ``x-request-id`` (an SDK retry) answers
  the devbox the first one made. A create with ``snapshot_id`` starts from
  that disk; one with ``blueprint_id`` or ``blueprint_name`` (the newest
  built blueprint of that name) from the blueprint's disk, environment,
  working directory and launch parameters, its ``blueprint_id`` in its view.
  A blueprint not built answers 400, a deleted or unknown one 404 (a name
  or id the emulator's ``blueprints`` lists, or any when it is None, is
  played as a blueprint made elsewhere: an empty image). A create's
  ``mounts`` are written into the devbox before it boots: an
  ``object_mount`` places a ``READ_ONLY`` object of the key's at its
  ``object_path`` (an archive, ``tar`` or ``tgz``, unpacked into that
  directory; `emulators.runloop.objects`), a ``file_mount`` its ``content``
  at its ``target``, as the older ``file_mounts`` do; a copy, so deleting
  the object later leaves the devbox's alone. ``code_mounts`` and
  ``broker_mount`` are not modelled (no GitHub, no axon streams).
* ``GET /v1/devboxes`` lists the key's devboxes, newest first, paged with
  ``limit`` (20 when unset or 0) / ``starting_after`` (``has_more``,
  ``total_count``), filtered
  by ``status``; ``GET /v1/devboxes/{id}``; ``POST /v1/devboxes/{id}``
  updates its ``name`` and ``metadata``; ``POST .../wait_for_status``
  long-polls (at most 30 s) and answers 408 when the hold passes.
* ``GET .../logs`` gives the executions' log lines (``source`` exec: the
  command, each output line, stdout ``info`` and stderr ``error``, and the
  exit code), optionally of one ``execution_id``; the launch commands'
  (``setup_commands``) come first. ``GET .../usage`` bills the devbox's
  size: vCPU and memory over the time not suspended, disk over all of it.
* ``POST .../keep_alive`` resets the idle timer; ``POST .../shutdown``.
* ``POST .../suspend`` (``suspending`` -> ``suspended``: every execution
  ends, the disk stays) and ``POST .../resume`` (``resuming`` -> ``running``;
  429 when the devbox would break the concurrency cap, as a create would).
* ``POST .../enable_tunnel`` (``auth_mode`` open or authenticated; or a
  create's ``tunnel``) gives the devbox's one tunnel (a second call answers
  it again), shown as ``tunnel`` in the devbox's view; ``POST
  .../remove_tunnel``. The tunnel is served by the emulator's ingress
  (`emulators.runloop.RunloopEmulator`).
* ``POST .../create_ssh_key`` makes an ed25519 key (with the host's
  ``ssh-keygen``) and appends its public half to the devbox's
  ``~/.ssh/authorized_keys``; no SSH server answers on the ``url`` it gives.

A devbox belongs to the key that created it: other keys get 404. Commands
and files on a devbox that is shut down answer 404, on one still booting
400. Account limits come from the harness: the concurrency cap answers 429,
a spent quota of created devboxes 403, both with a message naming the limit.
"""

from __future__ import annotations

import asyncio
import posixpath
import secrets
import tarfile
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from aiohttp import web

from emulators.filesystem import GuestSandbox, PathRefused, mountable
from emulators.harness import QuotaViolation, apply_delay_or_hang
from emulators.runloop.devboxes import (
    DEFAULT_KEEP_ALIVE,
    RUNLOOP_HOME,
    TERMINAL,
    Devbox,
    DiskSnapshot,
    Execution,
    Tunnel,
    copy_disk,
    new_id,
)
from providers.base import SandboxSpec
from providers.errors import SandboxError

if TYPE_CHECKING:
    from emulators.runloop import RunloopEmulator
    from emulators.runloop.blueprints import Blueprint
    from emulators.runloop.objects import StoredObject

__all__ = [
    "CONCURRENCY_MESSAGE",
    "QUOTA_MESSAGE",
    "ApiError",
    "DevboxApi",
    "api_error",
    "launch_parameters",
    "number",
    "optional_text",
    "page",
    "string_map",
]

CONCURRENCY_MESSAGE = (
    "Too many concurrent devboxes: this account may run at most {limit} devboxes at once. "
    "Shut down a running devbox or contact support to raise the limit."
)
QUOTA_MESSAGE = (
    "Usage limit exceeded: this account's quota of {limit} devboxes is spent. "
    "Upgrade your plan or wait for the quota to reset."
)
STATUS_HOLD_MAX = 30.0
CREATE_HOLD_MAX = 20.0
MAX_KEEP_ALIVE = 172800
DEFAULT_PAGE = 20
_DEVBOX_STATUSES = frozenset(
    {
        "scheduled",
        "queued",
        "provisioning",
        "initializing",
        "running",
        "suspending",
        "suspended",
        "resuming",
        "failure",
        "shutdown",
    }
)
_SIZES = frozenset({"X_SMALL", "SMALL", "MEDIUM", "LARGE", "X_LARGE", "XX_LARGE", "CUSTOM_SIZE"})


def api_error(status: int, message: str, headers: dict[str, str] | None = None) -> web.Response:
    """The API's error body."""
    return web.json_response({"status": status, "message": message}, status=status, headers=headers)


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


def optional_text(value: Any, name: str) -> str | None:
    if value is not None and not isinstance(value, str):
        raise ApiError(400, f"{name} must be a string")
    return value


def number(value: Any, name: str, default: float, maximum: float) -> float:
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        raise ApiError(400, f"{name} must be a non-negative number")
    return min(float(value), maximum)


def page(query: Mapping[str, str], items: list[Any], field: str) -> dict[str, Any]:
    """One cursor page of ``items`` (each with an ``id`` and a ``view()``) under ``field``:
    ``limit`` (20 when unset or 0, at most 5000) after the ``starting_after`` id, ``has_more``
    and, unless ``include_total_count`` is false, ``total_count``."""
    try:
        limit = int(query.get("limit", "0")) or DEFAULT_PAGE
    except ValueError:
        raise ApiError(400, "limit must be an integer") from None
    if not 0 < limit <= 5000:
        raise ApiError(400, "limit must be between 0 and 5000")
    start = 0
    after = query.get("starting_after")
    if after:
        ids = [item.id for item in items]
        start = ids.index(after) + 1 if after in ids else len(ids)
    answer: dict[str, Any] = {
        field: [item.view() for item in items[start : start + limit]],
        "has_more": start + limit < len(items),
    }
    if query.get("include_total_count", "true") != "false":
        answer["total_count"] = len(items)
    return answer


def launch_parameters(raw: Any) -> tuple[dict[str, Any], int, int | None]:
    """Validated launch parameters, the keep-alive and the idle shutdown time."""
    params = dict(raw) if isinstance(raw, dict) else {}
    if raw is not None and not isinstance(raw, dict):
        raise ApiError(400, "launch_parameters must be an object")
    keep_alive = params.get("keep_alive_time_seconds")
    if keep_alive is None:
        keep_alive = DEFAULT_KEEP_ALIVE
    if isinstance(keep_alive, bool) or not isinstance(keep_alive, int):
        raise ApiError(400, "keep_alive_time_seconds must be an integer")
    if not 0 < keep_alive <= MAX_KEEP_ALIVE:
        raise ApiError(400, f"keep_alive_time_seconds must be between 1 and {MAX_KEEP_ALIVE}")
    lifecycle = params.get("lifecycle")
    after_idle = params.get("after_idle") or (
        lifecycle.get("after_idle") if isinstance(lifecycle, dict) else None
    )
    idle: int | None = None
    if after_idle is not None:
        idle = after_idle.get("idle_time_seconds") if isinstance(after_idle, dict) else None
        if isinstance(idle, bool) or not isinstance(idle, int) or idle <= 0:
            raise ApiError(400, "after_idle.idle_time_seconds must be a positive integer")
        if after_idle.get("on_idle") != "shutdown":
            raise ApiError(400, "the emulator models on_idle 'shutdown' only")
    commands = params.get("launch_commands")
    if commands is not None and (
        not isinstance(commands, list) or not all(isinstance(c, str) for c in commands)
    ):
        raise ApiError(400, "launch_commands must be a list of strings")
    for custom in ("custom_cpu_cores", "custom_gb_memory", "custom_disk_size"):
        value = params.get(custom)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)):
            raise ApiError(400, f"{custom} must be a number")
    size = params.get("resource_size_request")
    if size is not None and size not in _SIZES:
        raise ApiError(400, f"resource_size_request must be one of {sorted(_SIZES)}")
    return params, keep_alive, idle


def _place_mounts(local: GuestSandbox, mounts: list[tuple[str, StoredObject | str]]) -> None:
    """Write each mount into the new devbox's disk, off the loop."""
    for path, what in mounts:
        target = local.host(path, write=True)
        if isinstance(what, str):
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(what)
        else:
            what.place(target)


def _tunnel(config: Any) -> Tunnel:
    """A new tunnel from ``enable_tunnel``'s body or a create's ``tunnel`` (open by default)."""
    if not isinstance(config, dict):
        raise ApiError(400, "tunnel must be an object")
    mode = config.get("auth_mode") or "open"
    if mode not in ("open", "authenticated"):
        raise ApiError(400, "auth_mode must be one of ['authenticated', 'open']")
    return Tunnel(
        key=secrets.token_hex(12),
        auth_mode=mode,
        auth_token=secrets.token_urlsafe(24) if mode == "authenticated" else None,
        http_keep_alive=config.get("http_keep_alive") is not False,
        wake_on_http=bool(config.get("wake_on_http")),
    )


class DevboxApi:
    """The devbox handlers, over the emulator's core, and what the other handlers use of them."""

    def __init__(self, emulator: RunloopEmulator) -> None:
        self.emulator = emulator
        self.core = emulator.core

    def routes(self) -> list[web.RouteDef]:
        base = "/v1/devboxes/{devbox_id}"
        return [
            web.post("/v1/devboxes", self.create),
            web.post("/v1/devboxes/create_and_await_running", self.create_and_await_running),
            web.get("/v1/devboxes", self.list),
            web.get(base, self.retrieve),
            web.post(base, self.update),
            web.get(base + "/logs", self.logs),
            web.get(base + "/usage", self.usage),
            web.post(base + "/wait_for_status", self.wait_for_status),
            web.post(base + "/shutdown", self.shutdown),
            web.post(base + "/keep_alive", self.keep_alive),
            web.post(base + "/suspend", self.suspend),
            web.post(base + "/resume", self.resume),
            web.post(base + "/enable_tunnel", self.enable_tunnel),
            web.post(base + "/remove_tunnel", self.remove_tunnel),
            web.post(base + "/create_ssh_key", self.create_ssh_key),
        ]

    @staticmethod
    @web.middleware
    async def errors(request: web.Request, handler: Any) -> web.StreamResponse:
        """Answer `ApiError` raised anywhere in a handler as the API's error body."""
        try:
            response: web.StreamResponse = await handler(request)
        except ApiError as exc:
            return api_error(exc.status, exc.message)
        return response

    # -- helpers -----------------------------------------------------------
    def key(self, request: web.Request) -> str:
        scheme, _, key = request.headers.get("Authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not self.core.key_ok(key):
            raise ApiError(401, "Unauthorized: the API key is missing, invalid or revoked")
        return key

    def devbox(self, request: web.Request) -> Devbox:
        devbox_id = request.match_info["devbox_id"]
        devbox = self.core.owned(devbox_id, self.key(request))
        if devbox is None:
            raise ApiError(404, f"Devbox {devbox_id} not found")
        return devbox

    def running(self, request: web.Request) -> Devbox:
        """The devbox of the request, which must be running (404 once it is gone)."""
        devbox = self.devbox(request)
        if devbox.status in TERMINAL:
            raise ApiError(404, f"Devbox {devbox.id} is {devbox.status} and no longer available")
        if devbox.status != "running":
            raise ApiError(400, f"Devbox {devbox.id} is not running yet (status {devbox.status})")
        self.core.touch(devbox)
        return devbox

    @staticmethod
    async def body(request: web.Request) -> dict[str, Any]:
        if not request.can_read_body:
            return {}
        try:
            body = await request.json()
        except ValueError:
            body = None
        if not isinstance(body, dict):
            raise ApiError(400, "request body must be a JSON object")
        return body

    @staticmethod
    def statuses(body: dict[str, Any], allowed: frozenset[str]) -> set[str]:
        statuses = body.get("statuses")
        if not isinstance(statuses, list) or not statuses or not set(statuses) <= allowed:
            raise ApiError(400, f"statuses must be a non-empty list of {sorted(allowed)}")
        return set(statuses)

    def path(self, devbox: Devbox, path: Any, name: str, *, write: bool = False) -> Any:
        if not isinstance(path, str) or not path:
            raise ApiError(400, f"{name} is required")
        try:
            return devbox.local.host(path, write=write)
        except PathRefused as exc:
            raise ApiError(400, str(exc)) from None

    # -- devboxes ------------------------------------------------------------
    async def _create(self, request: web.Request) -> Devbox:
        key = self.key(request)
        request_id = request.headers.get("x-request-id")
        if request_id and (key, request_id) in self.core.created_by_request:
            return self.core.devboxes[self.core.created_by_request[key, request_id]]
        body = await self.body(request)
        sources = [s for s in ("blueprint_id", "blueprint_name", "snapshot_id") if body.get(s)]
        if len(sources) > 1:
            raise ApiError(400, "only one of blueprint_id, blueprint_name and snapshot_id")
        disk: DiskSnapshot | None = None
        blueprint: Blueprint | None = None
        for source in sources:
            if source == "snapshot_id":
                disk = self.core.snapshots.get(body[source])
                if disk is not None and (disk.api_key != key or disk.status != "complete"):
                    disk = None
                known = self.emulator.snapshots
                if disk is None and known is not None and body[source] not in known:
                    raise ApiError(404, f"Snapshot {body[source]} not found")
            else:
                blueprint = self._blueprint(key, source, body[source])
        raw = body.get("launch_parameters")
        if blueprint is not None and isinstance(raw, dict | None):
            raw = blueprint.launch_parameters | (raw or {})
        params, keep_alive, idle = launch_parameters(raw)
        tunnel = _tunnel(body["tunnel"]) if body.get("tunnel") is not None else None
        metadata = string_map(body.get("metadata"), "metadata")
        env = string_map(body.get("environment_variables"), "environment_variables")
        if blueprint is not None:
            env = {**blueprint.image.env, **env}
        name = body.get("name")
        entrypoint = optional_text(body.get("entrypoint"), "entrypoint")
        mounts = self._mounts(key, body)
        dirs = [
            path if not isinstance(what, str) and what.archive else posixpath.dirname(path)
            for path, what in mounts
        ]
        devbox_id = new_id("dbx")
        try:
            local = await self.core.create(
                key,
                SandboxSpec(env=env, labels=metadata),
                home=RUNLOOP_HOME,
                sandbox_id=devbox_id,
                dirs=(*(blueprint.dirs if blueprint is not None else ()), *dirs),
            )
        except QuotaViolation as violation:
            if violation.kind == "concurrent":
                raise ApiError(429, CONCURRENCY_MESSAGE.format(limit=violation.limit)) from None
            raise ApiError(403, QUOTA_MESSAGE.format(limit=violation.limit)) from None
        await self._fill(
            local, disk.path if disk else blueprint.path if blueprint else None, mounts
        )
        devbox = Devbox(
            id=devbox_id,
            api_key=key,
            local=local,
            metadata=metadata,
            launch_parameters=params,
            keep_alive=keep_alive,
            idle_seconds=idle,
            source={s: body[s] for s in sources},
            blueprint_id=blueprint.id if blueprint is not None else body.get("blueprint_id"),
            workdir=blueprint.image.workdir if blueprint is not None else None,
            name=name if isinstance(name, str) else None,
            tunnel=tunnel,
            entrypoint=entrypoint or None,
        )
        self.core.add(devbox)
        if request_id:
            self.core.created_by_request[key, request_id] = devbox_id
        devbox.boot = asyncio.create_task(self._boot(devbox))
        return devbox

    async def _fill(
        self, local: GuestSandbox, image: Path | None, mounts: list[tuple[str, StoredObject | str]]
    ) -> None:
        """A new devbox's disk: a copy of its image's, then its mounts written (one that cannot
        be, a corrupt archive, ends the devbox: 400)."""
        if image is not None:
            await asyncio.to_thread(copy_disk, image, local.root)
        try:
            await asyncio.to_thread(_place_mounts, local, mounts)
        except (OSError, PathRefused, tarfile.TarError) as exc:
            await self.core.kill(local.id)
            raise ApiError(400, f"mounts: {exc}") from None

    def _mounts(self, key: str, body: dict[str, Any]) -> list[tuple[str, StoredObject | str]]:
        """The create's object and file mounts (and ``file_mounts``): each absolute path and
        the object or the text to write there."""
        raw = body.get("mounts") or []
        if not isinstance(raw, list) or not all(isinstance(m, dict) for m in raw):
            raise ApiError(400, "mounts must be a list of objects")
        wanted: list[tuple[Any, StoredObject | str]] = []
        for mount in raw:
            if mount.get("type") == "object_mount":
                object_id = mount.get("object_id")
                if not isinstance(object_id, str) or not object_id:
                    raise ApiError(400, "object_mount needs an object_id")
                obj = self.uploaded(key, object_id)
                wanted.append((mount.get("object_path"), obj))
            elif mount.get("type") == "file_mount":
                content = mount.get("content")
                if not isinstance(content, str):
                    raise ApiError(400, "a file_mount's content must be a string")
                wanted.append((mount.get("target"), content))
        wanted += string_map(body.get("file_mounts"), "file_mounts").items()
        mounts: list[tuple[str, StoredObject | str]] = []
        for path, what in wanted:
            if not isinstance(path, str) or not path:
                raise ApiError(400, "a mount needs its path (object_path or target)")
            absolute = posixpath.normpath(posixpath.join(RUNLOOP_HOME, path))
            if not mountable(absolute):
                raise ApiError(400, f"mount path {path}: read-only file system")
            mounts.append((absolute, what))
        return mounts

    def uploaded(self, key: str, object_id: str) -> StoredObject:
        """The key's object ``object_id``, which must be uploaded (a mount or a build
        context names it)."""
        obj = self.core.object_for(key, object_id)
        if obj is None or obj.state == "DELETED":
            raise ApiError(404, f"Object {object_id} not found")
        if obj.state != "READ_ONLY":
            raise ApiError(400, f"Object {object_id} is {obj.state}: complete its upload first")
        return obj

    def _blueprint(self, key: str, source: str, wanted: Any) -> Blueprint | None:
        """The built blueprint a create names; None for a name or id the emulator plays as a
        blueprint made elsewhere (any, or those of the ``blueprints`` it was given)."""
        if not isinstance(wanted, str):
            raise ApiError(400, f"{source} must be a string")
        by_id = source == "blueprint_id"
        found = self.core.blueprint_for(key, wanted if by_id else None, None if by_id else wanted)
        known = self.emulator.blueprints
        if (found is None and known is not None and wanted not in known) or (
            found is not None and found.state == "deleted"
        ):
            raise ApiError(404, f"Blueprint {wanted} not found")
        if found is not None and found.status != "build_complete":
            raise ApiError(400, f"Blueprint {found.id} is not built (status {found.status})")
        return found

    async def _boot(self, devbox: Devbox) -> None:
        """Provision and initialize; a ``boot`` fault delays, hangs or fails it."""
        fault = self.core.faults.take("boot", devbox.api_key)
        if fault is not None:
            await apply_delay_or_hang(fault)
            if fault.status is not None or fault.drop:
                await self.core.fail(devbox, "execution_failed")
                return
        await asyncio.sleep(self.emulator.boot_seconds / 2)
        devbox.set_status("initializing")
        await asyncio.sleep(self.emulator.boot_seconds / 2)
        if not await self._launch_commands(devbox):
            await self.core.fail(devbox, "execution_failed")
            return
        devbox.set_status("running")
        self.core.touch(devbox)
        if devbox.entrypoint is not None:
            await self._entrypoint(devbox, devbox.entrypoint)

    async def _entrypoint(self, devbox: Devbox, command: str) -> None:
        """The devbox's main process (logged as ``entrypoint``): its end shuts the devbox down,
        unless a suspend ended it."""
        main = await self._setup_process(devbox, command, "entrypoint")
        if main is not None and devbox.status == "running":
            devbox.boot = None
            await self.core.kill(devbox.id, "entrypoint_exit")

    async def _setup_process(self, devbox: Devbox, command: str, source: str) -> Execution | None:
        """Run ``command`` to its end as a process of the devbox itself; None if it cannot start."""
        try:
            process = await devbox.local.spawn(command, cwd=devbox.workdir)
        except SandboxError:
            return None
        if process.proc.stdin is not None:
            process.proc.stdin.close()
        run = Execution(
            id=new_id("exn"),
            devbox_id=devbox.id,
            command_id=None,
            process=process,
            command=command,
            source=source,
        )
        devbox.setup.append(run)
        try:
            await run.collect(lambda: None)
        finally:
            if run.exit_status is None:
                process.kill()
        return run

    async def _launch_commands(self, devbox: Devbox) -> bool:
        """Run the launch commands in turn, logged as ``setup_commands``; False when one fails."""
        for command in devbox.launch_parameters.get("launch_commands") or []:
            setup = await self._setup_process(devbox, command, "setup_commands")
            if setup is None or setup.exit_status != 0:
                return False
        return True

    async def create(self, request: web.Request) -> web.Response:
        devbox = await self._create(request)
        return web.json_response(devbox.view())

    async def create_and_await_running(self, request: web.Request) -> web.Response:
        devbox = await self._create(request)
        await devbox.changes.wait_for(
            lambda: devbox.status == "running" or devbox.status in TERMINAL, CREATE_HOLD_MAX
        )
        return web.json_response(devbox.view())

    async def list(self, request: web.Request) -> web.Response:
        key = self.key(request)
        status = request.query.get("status")
        if status is not None and status not in _DEVBOX_STATUSES:
            raise ApiError(400, f"status must be one of {sorted(_DEVBOX_STATUSES)}")
        matching = sorted(
            (
                d
                for d in self.core.devboxes.values()
                if d.api_key == key and (status is None or d.status == status)
            ),
            key=lambda d: (-d.created_ms, d.id),
        )
        return web.json_response(page(request.query, matching, "devboxes"))

    async def retrieve(self, request: web.Request) -> web.Response:
        return web.json_response(self.devbox(request).view())

    async def update(self, request: web.Request) -> web.Response:
        """``name`` and ``metadata`` replace what the devbox had; empty ones clear it."""
        devbox = self.devbox(request)
        body = await self.body(request)
        if body.get("name") is not None:
            devbox.name = optional_text(body["name"], "name") or None
        if body.get("metadata") is not None:
            devbox.metadata = string_map(body["metadata"], "metadata")
        return web.json_response(devbox.view())

    async def usage(self, request: web.Request) -> web.Response:
        return web.json_response(self.devbox(request).usage())

    async def logs(self, request: web.Request) -> web.Response:
        """Every execution's log lines, oldest first, or one execution's (``execution_id``)."""
        devbox = self.devbox(request)
        only = request.query.get("execution_id")
        executions = [
            e for e in (*devbox.setup, *devbox.executions.values()) if only is None or e.id == only
        ]
        lines = sorted(
            (line for e in executions for line in e.log), key=lambda x: x["timestamp_ms"]
        )
        return web.json_response({"logs": lines})

    async def wait_for_status(self, request: web.Request) -> web.Response:
        devbox = self.devbox(request)
        body = await self.body(request)
        wanted = self.statuses(body, _DEVBOX_STATUSES)
        hold = number(
            body.get("timeout_seconds"), "timeout_seconds", STATUS_HOLD_MAX, STATUS_HOLD_MAX
        )
        if not await devbox.changes.wait_for(lambda: devbox.status in wanted, hold):
            raise ApiError(408, f"Devbox {devbox.id} did not reach {sorted(wanted)} in {hold:g}s")
        return web.json_response(devbox.view())

    async def shutdown(self, request: web.Request) -> web.Response:
        devbox = self.devbox(request)
        await self.core.kill(devbox.id)
        return web.json_response(devbox.view())

    async def keep_alive(self, request: web.Request) -> web.Response:
        self.running(request)
        return web.json_response({})

    def alive(self, request: web.Request) -> Devbox:
        devbox = self.devbox(request)
        if devbox.status in TERMINAL:
            raise ApiError(404, f"Devbox {devbox.id} is {devbox.status} and no longer available")
        return devbox

    async def suspend(self, request: web.Request) -> web.Response:
        """Suspend a running devbox: its executions end, its disk stays."""
        devbox = self.alive(request)
        if devbox.status != "running":
            raise ApiError(400, f"Devbox {devbox.id} cannot be suspended from {devbox.status}")
        await self.core.suspend(devbox)
        return web.json_response(devbox.view())

    async def resume(self, request: web.Request) -> web.Response:
        """Wake a suspended devbox; it is ``resuming`` until it runs again."""
        devbox = self.alive(request)
        if devbox.status != "suspended":
            raise ApiError(400, f"Devbox {devbox.id} cannot be resumed from {devbox.status}")
        limit = self.core.wake_refused(devbox)
        if limit is not None:
            raise ApiError(429, CONCURRENCY_MESSAGE.format(limit=limit))
        devbox.set_status("resuming")
        devbox.boot = asyncio.create_task(self._wake(devbox))
        return web.json_response(devbox.view())

    async def _wake(self, devbox: Devbox) -> None:
        if self.core.resume_latency is None:
            await asyncio.sleep(self.emulator.boot_seconds / 2)
        await self.core.waking()
        devbox.set_status("running")
        self.core.touch(devbox)

    # -- tunnels -------------------------------------------------------------
    async def enable_tunnel(self, request: web.Request) -> web.Response:
        devbox = self.alive(request)
        body = await self.body(request)
        if devbox.tunnel is None:
            devbox.tunnel = _tunnel(body)
        return web.json_response(devbox.tunnel.view())

    async def remove_tunnel(self, request: web.Request) -> web.Response:
        devbox = self.alive(request)
        devbox.tunnel = None
        return web.json_response({})

    async def create_ssh_key(self, request: web.Request) -> web.Response:
        """A new ed25519 key, its public half appended to the devbox's ``authorized_keys``."""
        devbox = self.running(request)
        with tempfile.TemporaryDirectory() as scratch:
            private = Path(scratch) / "key"
            try:
                keygen = await asyncio.create_subprocess_exec(
                    *("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", devbox.id),
                    *("-f", str(private)),
                    stdin=asyncio.subprocess.DEVNULL,
                    stdout=asyncio.subprocess.DEVNULL,
                    stderr=asyncio.subprocess.DEVNULL,
                )
            except FileNotFoundError:
                raise ApiError(500, "ssh-keygen is not installed on the emulator's host") from None
            if await keygen.wait() != 0:
                raise ApiError(500, "ssh-keygen failed")
            secret = await asyncio.to_thread(private.read_text)
            public = await asyncio.to_thread(private.with_suffix(".pub").read_text)
        trusted = self.path(devbox, f"{RUNLOOP_HOME}/.ssh/authorized_keys", "path", write=True)

        def authorize() -> None:
            trusted.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            with trusted.open("a") as keys:
                keys.write(public)

        await asyncio.to_thread(authorize)
        return web.json_response(
            {
                "id": devbox.id,
                "ssh_private_key": secret,
                "ssh_user": "user",
                "url": f"{devbox.id}.ssh.{self.emulator.domain}",
            }
        )
