"""Runloop's REST API for devboxes: the handlers the SDK talks to.

Routes (JSON in snake_case, key in ``Authorization: Bearer``, errors as
``{"status", "message"}``), all under ``/v1/devboxes``:

* ``POST /v1/devboxes`` creates a devbox (``provisioning`` at first, then
  ``initializing`` while its ``launch_commands`` run in turn: one that fails
  ends the devbox in ``failure``); a create's ``entrypoint`` then runs as
  the devbox's main process, and its end shuts the devbox down
  (``entrypoint_exit``; a suspend stops it, a resume does not restart it);
  ``POST /v1/devboxes/create_and_await_running`` also holds until it boots,
  at most ``CREATE_HOLD_MAX`` seconds (the SDK's default read timeout, 30 s,
  must not pass first: it polls ``wait_for_status`` for the rest).
  A create repeated with the same ``x-request-id`` (an SDK retry) answers
  the devbox the first one made.
* ``GET /v1/devboxes`` lists the key's devboxes, newest first, paged with
  ``limit`` (20 when unset or 0) / ``starting_after`` (``has_more``,
  ``total_count``), filtered
  by ``status``; ``GET /v1/devboxes/{id}``; ``POST /v1/devboxes/{id}``
  updates its ``name`` and ``metadata``; ``POST .../wait_for_status``
  long-polls (at most 30 s) and answers 408 when the hold passes.
* ``POST .../execute_sync`` (deprecated) holds until the command ends and
  answers all of its output.
* ``POST .../execute`` (waits ``optimistic_timeout`` seconds, at most 25,
  for the command; a repeated ``command_id`` answers the same execution) and
  ``.../execute_async`` (with ``attach_stdin`` the command's stdin stays
  open); ``GET|POST .../executions/{eid}`` (retrieve, ``wait_for_status``
  up to 25 s then 408, ``kill``, ``send_std_in``: nonempty ``text`` or the
  ``signal`` EOF / INTERRUPT) and the SSE streams ``stream_stdout_updates``
  / ``stream_stderr_updates`` from a byte ``offset``. Output in a view is
  the last ``last_n`` lines (100 by default) with ``*_truncated`` set when
  lines were dropped; the streams give all of it.
* ``POST .../write_file_contents``, ``read_file_contents`` (plain text),
  ``upload_file`` (multipart ``path`` + ``file``; without a file part, an
  empty file), ``download_file`` (bytes).
  Uploads stream to disk part by part and downloads go out in chunks: a
  file is never held whole.
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
* ``POST .../snapshot_disk`` (answers once the copy is done) and
  ``.../snapshot_disk_async`` (answers at once) keep the devbox's disk as
  ``snp_...``; ``GET /v1/devboxes/disk_snapshots`` lists them (paged as
  devboxes are, by ``devbox_id`` or ``source_blueprint_id``),
  ``GET .../disk_snapshots/{id}/status`` tells the copy's progress,
  ``POST .../disk_snapshots/{id}`` updates its name, commit message and
  metadata and ``POST .../disk_snapshots/{id}/delete`` deletes one (its
  status says ``deleted`` from then on; anything else on it is a 404). A create
  with ``snapshot_id`` starts from that disk.

A devbox belongs to the key that created it: other keys get 404. Commands
and files on a devbox that is shut down answer 404, on one still booting
400. Account limits come from the harness: the concurrency cap answers 429,
a spent quota of created devboxes 403, both with a message naming the limit.
"""

from __future__ import annotations

import asyncio
import codecs
import functools
import json
import os
import secrets
import tempfile
from collections.abc import Mapping
from pathlib import Path
from signal import SIGINT
from typing import TYPE_CHECKING, Any

from aiohttp import BodyPartReader, web

from emulators.filesystem import PathRefused
from emulators.harness import QuotaViolation, apply_delay_or_hang
from emulators.runloop.devboxes import (
    ASLEEP,
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

__all__ = ["CONCURRENCY_MESSAGE", "QUOTA_MESSAGE", "DevboxApi", "api_error"]

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
EXEC_HOLD_MAX = 25.0
MAX_KEEP_ALIVE = 172800
DEFAULT_LAST_N = 100
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
_EXEC_STATUSES = frozenset({"queued", "running", "completed"})
_CHUNK = 1 << 20
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


def _string_map(value: Any, name: str) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        raise ApiError(400, f"{name} must map strings to strings")
    return dict(value)


def _optional_text(value: Any, name: str) -> str | None:
    if value is not None and not isinstance(value, str):
        raise ApiError(400, f"{name} must be a string")
    return value


def _number(value: Any, name: str, default: float, maximum: float) -> float:
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        raise ApiError(400, f"{name} must be a non-negative number")
    return min(float(value), maximum)


def _tail(data: bytes, last_n: int) -> tuple[str, bool]:
    lines = data.decode("utf-8", "replace").splitlines(keepends=True)
    if len(lines) <= last_n:
        return "".join(lines), False
    return "".join(lines[-last_n:]) if last_n else "", True


def _last_n(request: web.Request) -> int:
    raw = request.query.get("last_n")
    if raw is None:
        return DEFAULT_LAST_N
    if not raw.isdigit():
        raise ApiError(400, "last_n must be a non-negative integer")
    return int(raw)


def _execution_view(execution: Execution, last_n: int = DEFAULT_LAST_N) -> dict[str, Any]:
    view: dict[str, Any] = {
        "devbox_id": execution.devbox_id,
        "execution_id": execution.id,
        "status": execution.status,
        "exit_status": execution.exit_status,
    }
    if execution.exit_status is not None:
        view["stdout"], view["stdout_truncated"] = _tail(bytes(execution.stdout), last_n)
        view["stderr"], view["stderr_truncated"] = _tail(bytes(execution.stderr), last_n)
    return view


def _page(query: Mapping[str, str], items: list[Any], field: str) -> dict[str, Any]:
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


def _launch_parameters(raw: Any) -> tuple[dict[str, Any], int, int | None]:
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
    """The handlers, over the emulator's core."""

    def __init__(self, emulator: RunloopEmulator) -> None:
        self.emulator = emulator
        self.core = emulator.core

    def routes(self) -> list[web.RouteDef]:
        base = "/v1/devboxes/{devbox_id}"
        execution = base + "/executions/{execution_id}"
        snapshot = "/v1/devboxes/disk_snapshots/{snapshot_id}"
        return [
            web.get("/v1/devboxes/disk_snapshots", self.list_snapshots),
            web.get(snapshot + "/status", self.snapshot_status),
            web.post(snapshot + "/delete", self.delete_snapshot),
            web.post(snapshot, self.update_snapshot),
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
            web.post(base + "/snapshot_disk", self.snapshot_disk),
            web.post(base + "/snapshot_disk_async", self.snapshot_disk_async),
            web.post(base + "/execute", self.execute),
            web.post(base + "/execute_async", self.execute_async),
            web.post(base + "/execute_sync", self.execute_sync),
            web.get(execution, self.execution),
            web.post(execution + "/wait_for_status", self.wait_for_execution),
            web.post(execution + "/kill", self.kill_execution),
            web.post(execution + "/send_std_in", self.send_std_in),
            web.get(execution + "/stream_stdout_updates", self.stream_stdout),
            web.get(execution + "/stream_stderr_updates", self.stream_stderr),
            web.post(base + "/write_file_contents", self.write_file_contents),
            web.post(base + "/read_file_contents", self.read_file_contents),
            web.post(base + "/upload_file", self.upload_file),
            web.post(base + "/download_file", self.download_file),
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

    def execution_of(self, request: web.Request) -> tuple[Devbox, Execution]:
        devbox = self.devbox(request)
        execution_id = request.match_info["execution_id"]
        execution = devbox.executions.get(execution_id)
        if execution is None:
            raise ApiError(404, f"Execution {execution_id} not found on devbox {devbox.id}")
        return devbox, execution

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
        for source in sources:
            if source == "snapshot_id":
                disk = self.core.snapshots.get(body[source])
                if disk is not None and (disk.api_key != key or disk.status != "complete"):
                    disk = None
                known = self.emulator.snapshots
                if disk is None and known is not None and body[source] not in known:
                    raise ApiError(404, f"Snapshot {body[source]} not found")
            elif (
                self.emulator.blueprints is not None
                and body[source] not in self.emulator.blueprints
            ):
                raise ApiError(404, f"Blueprint {body[source]} not found")
        params, keep_alive, idle = _launch_parameters(body.get("launch_parameters"))
        tunnel = _tunnel(body["tunnel"]) if body.get("tunnel") is not None else None
        metadata = _string_map(body.get("metadata"), "metadata")
        env = _string_map(body.get("environment_variables"), "environment_variables")
        name = body.get("name")
        entrypoint = _optional_text(body.get("entrypoint"), "entrypoint")
        devbox_id = new_id("dbx")
        try:
            local = await self.core.create(
                key, SandboxSpec(env=env, labels=metadata), home=RUNLOOP_HOME, sandbox_id=devbox_id
            )
        except QuotaViolation as violation:
            if violation.kind == "concurrent":
                raise ApiError(429, CONCURRENCY_MESSAGE.format(limit=violation.limit)) from None
            raise ApiError(403, QUOTA_MESSAGE.format(limit=violation.limit)) from None
        if disk is not None:
            await asyncio.to_thread(copy_disk, disk.path, local.root)
        devbox = Devbox(
            id=devbox_id,
            api_key=key,
            local=local,
            metadata=metadata,
            launch_parameters=params,
            keep_alive=keep_alive,
            idle_seconds=idle,
            source={s: body[s] for s in sources},
            name=name if isinstance(name, str) else None,
            tunnel=tunnel,
            entrypoint=entrypoint or None,
        )
        self.core.add(devbox)
        if request_id:
            self.core.created_by_request[key, request_id] = devbox_id
        devbox.boot = asyncio.create_task(self._boot(devbox))
        return devbox

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
            process = await devbox.local.spawn(command)
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
        return web.json_response(_page(request.query, matching, "devboxes"))

    async def retrieve(self, request: web.Request) -> web.Response:
        return web.json_response(self.devbox(request).view())

    async def update(self, request: web.Request) -> web.Response:
        """``name`` and ``metadata`` replace what the devbox had; empty ones clear it."""
        devbox = self.devbox(request)
        body = await self.body(request)
        if body.get("name") is not None:
            devbox.name = _optional_text(body["name"], "name") or None
        if body.get("metadata") is not None:
            devbox.metadata = _string_map(body["metadata"], "metadata")
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
        hold = _number(
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

    def _alive(self, request: web.Request) -> Devbox:
        devbox = self.devbox(request)
        if devbox.status in TERMINAL:
            raise ApiError(404, f"Devbox {devbox.id} is {devbox.status} and no longer available")
        return devbox

    async def suspend(self, request: web.Request) -> web.Response:
        """Suspend a running devbox: its executions end, its disk stays."""
        devbox = self._alive(request)
        if devbox.status != "running":
            raise ApiError(400, f"Devbox {devbox.id} cannot be suspended from {devbox.status}")
        await self.core.suspend(devbox)
        return web.json_response(devbox.view())

    async def resume(self, request: web.Request) -> web.Response:
        """Wake a suspended devbox; it is ``resuming`` until it runs again."""
        devbox = self._alive(request)
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
        devbox = self._alive(request)
        body = await self.body(request)
        if devbox.tunnel is None:
            devbox.tunnel = _tunnel(body)
        return web.json_response(devbox.tunnel.view())

    async def remove_tunnel(self, request: web.Request) -> web.Response:
        devbox = self._alive(request)
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

    # -- disk snapshots ----------------------------------------------------------
    async def _snapshot(self, request: web.Request) -> DiskSnapshot:
        devbox = self._alive(request)
        if devbox.status not in ("running", *ASLEEP):
            raise ApiError(400, f"Devbox {devbox.id} cannot be snapshotted while {devbox.status}")
        body = await self.body(request)
        name, message = body.get("name"), body.get("commit_message")
        snapshot_id = new_id("snp")
        snap = DiskSnapshot(
            id=snapshot_id,
            api_key=devbox.api_key,
            source_devbox_id=devbox.id,
            path=self.core.snapshot_root / snapshot_id,
            name=name if isinstance(name, str) else None,
            metadata=_string_map(body.get("metadata"), "metadata"),
            commit_message=message if isinstance(message, str) else None,
            source_blueprint_id=devbox.source.get("blueprint_id"),
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
            or snap.api_key != self.key(request)
            or (snap.status == "deleted" and not deleted)
        ):
            raise ApiError(404, f"Snapshot {snapshot_id} not found")
        return snap

    async def snapshot_status(self, request: web.Request) -> web.Response:
        return web.json_response(self.snapshot_of(request, deleted=True).status_view())

    async def update_snapshot(self, request: web.Request) -> web.Response:
        """``name``, ``commit_message`` and ``metadata`` (whole) replace what it had."""
        snap = self.snapshot_of(request)
        body = await self.body(request)
        if body.get("name") is not None:
            snap.name = _optional_text(body["name"], "name")
        if body.get("commit_message") is not None:
            snap.commit_message = _optional_text(body["commit_message"], "commit_message")
        if body.get("metadata") is not None:
            snap.metadata = _string_map(body["metadata"], "metadata")
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
        key = self.key(request)
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
        return web.json_response(_page(query, matching, "snapshots"))

    # -- executions ----------------------------------------------------------
    async def _start(self, devbox: Devbox, body: dict[str, Any]) -> Execution:
        command = body.get("command")
        if not isinstance(command, str) or not command:
            raise ApiError(400, "command is required")
        command_id = body.get("command_id")
        if isinstance(command_id, str) and command_id in devbox.by_command_id:
            return devbox.executions[devbox.by_command_id[command_id]]
        attach_stdin = body.get("attach_stdin")
        if attach_stdin is not None and not isinstance(attach_stdin, bool):
            raise ApiError(400, "attach_stdin must be a boolean")
        try:
            process = await devbox.local.spawn(command)
        except SandboxError as exc:
            raise ApiError(400, exc.message) from None
        if process.proc.stdin is not None and not attach_stdin:
            process.proc.stdin.close()
        execution = Execution(
            id=new_id("exn"),
            devbox_id=devbox.id,
            command_id=command_id if isinstance(command_id, str) else None,
            process=process,
            stdin_attached=bool(attach_stdin),
            command=command,
        )
        devbox.executions[execution.id] = execution
        if execution.command_id:
            devbox.by_command_id[execution.command_id] = execution.id
        execution.task = asyncio.create_task(execution.collect(lambda: self.core.touch(devbox)))
        return execution

    async def execute(self, request: web.Request) -> web.Response:
        devbox = self.running(request)
        last_n = _last_n(request)
        body = await self.body(request)
        hold = _number(
            body.get("optimistic_timeout"), "optimistic_timeout", EXEC_HOLD_MAX, EXEC_HOLD_MAX
        )
        if body.get("attach_stdin"):
            raise ApiError(400, "attach_stdin is only valid for execute_async")
        execution = await self._start(devbox, body)
        await execution.changes.wait_for(lambda: execution.exit_status is not None, hold)
        return web.json_response(_execution_view(execution, last_n))

    async def execute_async(self, request: web.Request) -> web.Response:
        devbox = self.running(request)
        body = await self.body(request)
        return web.json_response(_execution_view(await self._start(devbox, body)))

    async def execute_sync(self, request: web.Request) -> web.Response:
        """Deprecated on Runloop, still served: held to the command's end, all of its output."""
        devbox = self.running(request)
        body = await self.body(request)
        if body.get("attach_stdin"):
            raise ApiError(400, "attach_stdin is not supported by execute_sync")
        execution = await self._start(devbox, body)
        if execution.task is not None:
            await asyncio.shield(execution.task)
        return web.json_response(
            {
                "devbox_id": devbox.id,
                "exit_status": execution.exit_status,
                "stdout": execution.stdout.decode("utf-8", "replace"),
                "stderr": execution.stderr.decode("utf-8", "replace"),
            }
        )

    async def execution(self, request: web.Request) -> web.Response:
        _, execution = self.execution_of(request)
        return web.json_response(_execution_view(execution, _last_n(request)))

    async def wait_for_execution(self, request: web.Request) -> web.Response:
        _, execution = self.execution_of(request)
        last_n = _last_n(request)
        body = await self.body(request)
        wanted = self.statuses(body, _EXEC_STATUSES)
        hold = _number(body.get("timeout_seconds"), "timeout_seconds", EXEC_HOLD_MAX, EXEC_HOLD_MAX)
        if not await execution.changes.wait_for(lambda: execution.status in wanted, hold):
            raise ApiError(408, f"Execution {execution.id} did not reach {sorted(wanted)}")
        return web.json_response(_execution_view(execution, last_n))

    async def kill_execution(self, request: web.Request) -> web.Response:
        devbox, execution = self.execution_of(request)
        await self.body(request)
        await execution.kill()
        self.core.touch(devbox)
        return web.json_response(_execution_view(execution))

    async def send_std_in(self, request: web.Request) -> web.Response:
        """Nonempty ``text`` or a ``signal`` (EOF closes stdin, INTERRUPT is a Ctrl-C)."""
        devbox, execution = self.execution_of(request)
        body = await self.body(request)
        text, signal = body.get("text"), body.get("signal")
        if (text is None) == (signal is None):
            raise ApiError(400, "supply exactly one of text and signal")
        if text is not None and (not isinstance(text, str) or not text):
            raise ApiError(400, "text must be a nonempty string")
        if signal is not None and signal not in ("EOF", "INTERRUPT"):
            raise ApiError(400, "signal must be one of ['EOF', 'INTERRUPT']")
        if not execution.stdin_attached:
            raise ApiError(400, f"Execution {execution.id} was not started with attach_stdin")
        if execution.exit_status is not None:
            raise ApiError(400, f"Execution {execution.id} is not running")
        if signal == "INTERRUPT":
            execution.process.kill(SIGINT)
            sent = True
        else:
            sent = await execution.send_stdin(text.encode() if text is not None else None)
        self.core.touch(devbox)
        return web.json_response(
            {"devbox_id": devbox.id, "execution_id": execution.id, "success": sent}
        )

    async def stream_stdout(self, request: web.Request) -> web.StreamResponse:
        return await self._stream(request, "stdout")

    async def stream_stderr(self, request: web.Request) -> web.StreamResponse:
        return await self._stream(request, "stderr")

    async def _stream(self, request: web.Request, which: str) -> web.StreamResponse:
        """Server-sent events, one ``{"output", "offset"}`` chunk per piece of output.

        A chunk's ``offset`` is the byte offset after it: the SDK's reconnecting
        stream asks for the last chunk's offset again, so it resumes without a repeat.
        """
        _, execution = self.execution_of(request)
        raw_offset = request.query.get("offset", "0")
        if not raw_offset.isdigit():
            raise ApiError(400, "offset must be a non-negative integer")
        offset = int(raw_offset)
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        decoder = codecs.getincrementaldecoder("utf-8")("replace")
        while True:
            buf: bytearray = getattr(execution, which)
            done = execution.exit_status is not None
            if len(buf) > offset:
                chunk = bytes(buf[offset:])
                offset += len(chunk)
                event = {"output": decoder.decode(chunk, final=done), "offset": offset}
                await response.write(f"data: {json.dumps(event)}\n\n".encode())
            elif done:
                break
            else:
                await execution.changes.wait_for(
                    functools.partial(execution.progressed, which, offset), EXEC_HOLD_MAX
                )
        await response.write_eof()
        return response

    # -- files -----------------------------------------------------------------
    async def write_file_contents(self, request: web.Request) -> web.Response:
        devbox = self.running(request)
        body = await self.body(request)
        target = self.path(devbox, body.get("file_path"), "file_path", write=True)
        contents = body.get("contents")
        if not isinstance(contents, str):
            raise ApiError(400, "contents must be a string")
        await self._write(target, contents.encode())
        return web.json_response(
            {"devbox_id": devbox.id, "exit_status": 0, "stdout": "", "stderr": ""}
        )

    async def read_file_contents(self, request: web.Request) -> web.Response:
        devbox = self.running(request)
        body = await self.body(request)
        target = self.path(devbox, body.get("file_path"), "file_path")
        data = await self._read(target, body["file_path"])
        return web.Response(text=data.decode("utf-8", "replace"), content_type="text/plain")

    async def upload_file(self, request: web.Request) -> web.Response:
        """Multipart ``path`` and ``file``, the file streamed to disk part by part."""
        devbox = self.running(request)
        if not request.content_type.startswith("multipart/"):
            raise ApiError(400, "upload_file takes multipart/form-data with path and file")
        reader = await request.multipart()
        spool = self.core.local.root / ".uploads"
        await asyncio.to_thread(spool.mkdir, exist_ok=True)
        fd, name = tempfile.mkstemp(dir=spool)
        os.close(fd)
        staged = Path(name)
        try:
            path: str | None = None
            while (part := await reader.next()) is not None:
                if not isinstance(part, BodyPartReader):
                    raise ApiError(400, "nested multipart is not accepted")
                if part.name == "path":
                    path = await part.text()
                elif part.name == "file":
                    await self._spool(part, staged)
            target = self.path(devbox, path, "path", write=True)
            await self._place(staged, target)
        finally:
            await asyncio.to_thread(staged.unlink, True)
        return web.json_response({})

    @staticmethod
    async def _spool(part: BodyPartReader, staged: Path) -> None:
        handle = await asyncio.to_thread(staged.open, "wb")
        try:
            while chunk := await part.read_chunk(_CHUNK):
                await asyncio.to_thread(handle.write, chunk)
        finally:
            await asyncio.to_thread(handle.close)

    @staticmethod
    async def _place(staged: Path, target: Path) -> None:
        def place() -> None:
            target.parent.mkdir(parents=True, exist_ok=True)
            os.replace(staged, target)

        try:
            await asyncio.to_thread(place)
        except OSError as exc:
            raise ApiError(400, f"cannot write {target.name}: {exc.strerror}") from None

    async def download_file(self, request: web.Request) -> web.StreamResponse:
        """The file's bytes, sent a chunk at a time."""
        devbox = self.running(request)
        body = await self.body(request)
        target = self.path(devbox, body.get("path"), "path")
        try:
            handle = await asyncio.to_thread(target.open, "rb")
        except FileNotFoundError:
            raise ApiError(400, f"No such file or directory: {body['path']}") from None
        except OSError as exc:
            raise ApiError(400, f"cannot read {body['path']}: {exc.strerror}") from None
        try:
            size = os.fstat(handle.fileno()).st_size
            response = web.StreamResponse(headers={"Content-Type": "application/octet-stream"})
            response.content_length = size
            await response.prepare(request)
            while chunk := await asyncio.to_thread(handle.read, _CHUNK):
                await response.write(chunk)
            await response.write_eof()
        finally:
            handle.close()
        return response

    @staticmethod
    async def _write(target: Any, data: bytes) -> None:
        def write() -> None:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)

        try:
            await asyncio.to_thread(write)
        except OSError as exc:
            raise ApiError(400, f"cannot write {target.name}: {exc.strerror}") from None

    @staticmethod
    async def _read(target: Any, path: str) -> bytes:
        try:
            data: bytes = await asyncio.to_thread(target.read_bytes)
        except FileNotFoundError:
            raise ApiError(400, f"No such file or directory: {path}") from None
        except OSError as exc:
            raise ApiError(400, f"cannot read {path}: {exc.strerror}") from None
        return data
