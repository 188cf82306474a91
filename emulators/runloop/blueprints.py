"""Runloop's blueprints: their builds and the routes that make, list and delete them.

A blueprint is a devbox image built once (`Blueprint`): a create answers it
``provisioning``, then it is ``building`` and, ``build_seconds`` later,
``build_complete`` or ``failed`` (``failure_reason`` ``build_failed``, the
build logs saying why). The build happens in a scratch sandbox (not a
devbox: no quota, no record), in Runloop's order:

* the base blueprint's disk and image (``base_blueprint_id``, or the newest
  built one named ``base_blueprint_name``), then the ``dockerfile`` read by
  `emulators.runloop.dockerfiles`: ``ENV`` and ``WORKDIR`` kept, ``RUN``
  steps skipped (the system is the host's), ``COPY`` and ``ADD`` copying
  from the ``build_context`` object into the image's disk
  (`emulators.runloop.build_context`; without one they fail the build), a
  Dockerfile Docker would refuse failing the build;
* the ``file_mounts`` written (relative paths from ``/home/user``);
* the ``system_setup_commands`` run in turn, as the devbox's user, from the
  ``WORKDIR`` with the image's environment: each one's output is logged and
  the first that fails fails the build. They run at build time, as on
  Runloop (which makes them ``RUN`` steps of the image), so what they write
  is in every devbox made from the blueprint. Their package installs
  cannot happen (the system directories are the host's, read-only): in a
  build ``sudo`` runs its command as it is and ``apt-get``, ``apt``,
  ``apk``, ``yum``, ``dnf`` and ``microdnf`` only log that they were
  skipped; anything else (``pip install --user``, a download) really runs.

The resulting disk is the blueprint's; a devbox created with its
``blueprint_id`` or ``blueprint_name`` (`emulators.runloop.api`) starts from
a copy of it, with the image's ``ENV`` under its own
``environment_variables``, its commands starting in the ``WORKDIR``, and the
blueprint's ``launch_parameters`` under its own. ``code_mounts``,
``secrets``, ``services``, ``build_args`` and ``network_policy_id`` are kept
in the blueprint's parameters; no repository is cloned (the emulator
reaches no GitHub), no secret resolved (it has no secret store), no service
image pulled. A ``build_context`` must name a ``READ_ONLY`` object of the
key's (404 when it has none such, 400 while it is uploading); deleting the
object before the build reads it fails the build.

Routes, under ``/v1/blueprints``: ``POST`` creates (a create repeated with
the same ``x-request-id`` answers the first one's blueprint); ``GET`` lists
the key's blueprints not deleted, newest first, paged as devboxes are, by
``name`` and ``status``; ``GET .../list_public`` lists the public ones (the
emulator has none); ``POST .../preview`` answers the Dockerfile a create
would build (the ``dockerfile``, then each setup command as a ``RUN``);
``GET .../{id}``, ``GET .../{id}/logs`` and ``POST .../{id}/delete`` (its
``state`` is ``deleted`` from then on, its view still retrievable; 400 while
a disk snapshot of a devbox made from it exists, as on Runloop).
"""

from __future__ import annotations

import asyncio
import posixpath
import shutil
import tarfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from aiohttp import web

from emulators.filesystem import GUEST_BIN, GuestSandbox, PathRefused
from emulators.runloop.api import ApiError, launch_parameters, optional_text, page, string_map
from emulators.runloop.build_context import ContextError, Placement, plan
from emulators.runloop.devboxes import RUNLOOP_HOME, copy_disk, new_id, now_ms
from emulators.runloop.dockerfiles import (
    DEFAULT_PATH,
    Copy,
    DockerfileError,
    Image,
    read_dockerfile,
)
from emulators.runloop.objects import unpack
from providers.base import SandboxSpec
from providers.errors import SandboxError

if TYPE_CHECKING:
    from emulators.runloop.api import DevboxApi

__all__ = ["Blueprint", "Blueprints"]

_BUILDING = frozenset({"queued", "provisioning", "building"})
_STATUSES = frozenset({*_BUILDING, "awaiting_upload", "failed", "build_complete"})
_DEFAULT_BASE = "runloop:runloop/starter-x86_64"
_SHIMS = "/__emulator/build"
_SUDO = """#!/bin/sh
# sudo in a blueprint build: the build already runs as the devbox's user.
while [ $# -gt 0 ]; do
  case "$1" in
    -u|-g|-p|-C|-D|-r|-t|-U) shift 2 ;;
    --) shift; break ;;
    -*) shift ;;
    *) break ;;
  esac
done
while [ $# -gt 0 ]; do
  case "$1" in
    *=*) export "$1"; shift ;;
    *) break ;;
  esac
done
exec "$@"
"""
_PACKAGES = """#!/bin/sh
echo "emulator: '$(basename "$0") $*' skipped: a devbox's system packages are the host's"
"""
_PACKAGE_MANAGERS = ("apt-get", "apt", "apk", "yum", "dnf", "microdnf")


class BuildFailed(Exception):
    """A build step failed; the message is the build log's last line."""


@dataclass
class Blueprint:
    """One blueprint: its build parameters, its status and, once built, its image."""

    id: str
    api_key: str
    name: str
    parameters: dict[str, Any]
    metadata: dict[str, str]
    path: Path  # the built disk
    base: Blueprint | None = None
    image: Image = field(default_factory=Image)
    dirs: tuple[str, ...] = ()  # directories of the image outside the usual ones
    status: str = "provisioning"
    state: str = "created"
    failure_reason: str | None = None
    created_ms: int = field(default_factory=now_ms)
    finished_ms: int | None = None
    logs: list[dict[str, Any]] = field(default_factory=list)
    build: asyncio.Task[None] | None = None

    @property
    def launch_parameters(self) -> dict[str, Any]:
        return dict(self.parameters.get("launch_parameters") or {})

    def log(self, level: str, message: str) -> None:
        self.logs.append({"level": level, "message": message, "timestamp_ms": now_ms()})

    def view(self) -> dict[str, Any]:
        """``BlueprintView``."""
        return {
            "id": self.id,
            "name": self.name,
            "create_time_ms": self.created_ms,
            "build_finish_time_ms": self.finished_ms,
            "parameters": self.parameters,
            "state": self.state,
            "status": self.status,
            "failure_reason": self.failure_reason,
            "base_blueprint_id": self.base.id if self.base is not None else None,
            "containerized_services": self.parameters.get("services"),
            "devbox_capabilities": [],
            "is_public": False,
            "metadata": self.metadata,
        }


def _commands(value: Any) -> list[str]:
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(c, str) for c in value):
        raise ApiError(400, "system_setup_commands must be a list of strings")
    return list(value)


def _objects(value: Any, name: str, required: tuple[str, ...]) -> list[dict[str, Any]]:
    if value is None:
        return []
    if not isinstance(value, list) or not all(
        isinstance(v, dict) and all(isinstance(v.get(k), str) for k in required) for v in value
    ):
        raise ApiError(400, f"{name} must be a list of objects with {', '.join(required)}")
    return list(value)


class Blueprints:
    """The blueprint handlers and builds, over `DevboxApi`."""

    def __init__(self, api: DevboxApi) -> None:
        self.api = api
        self.core = api.core
        self.build_seconds = api.emulator.build_seconds

    def routes(self) -> list[web.RouteDef]:
        one = "/v1/blueprints/{blueprint_id}"
        return [
            web.post("/v1/blueprints", self.create),
            web.get("/v1/blueprints", self.list),
            web.get("/v1/blueprints/list_public", self.list_public),
            web.post("/v1/blueprints/preview", self.preview),
            web.get(one, self.retrieve),
            web.get(one + "/logs", self.logs),
            web.post(one + "/delete", self.delete),
        ]

    # -- parameters ------------------------------------------------------------
    def _parameters(
        self, key: str, body: dict[str, Any]
    ) -> tuple[dict[str, Any], Blueprint | None]:
        """The validated build parameters (``BlueprintBuildParameters``) and the base."""
        name = body.get("name")
        if not isinstance(name, str) or not name:
            raise ApiError(400, "name is required")
        params: dict[str, Any] = {"name": name}
        if body.get("build_context") is not None:
            params["build_context"] = self._context(key, body["build_context"])
        for text in ("dockerfile", "network_policy_id"):
            if body.get(text) is not None:
                params[text] = optional_text(body[text], text)
        for mapping in ("build_args", "file_mounts", "secrets"):
            if body.get(mapping) is not None:
                params[mapping] = string_map(body[mapping], mapping)
        if body.get("system_setup_commands") is not None:
            params["system_setup_commands"] = _commands(body["system_setup_commands"])
        if body.get("code_mounts") is not None:
            params["code_mounts"] = _objects(
                body["code_mounts"], "code_mounts", ("repo_name", "repo_owner")
            )
        if body.get("services") is not None:
            params["services"] = _objects(body["services"], "services", ("image", "name"))
        if body.get("launch_parameters") is not None:
            launch_parameters(body["launch_parameters"])
            params["launch_parameters"] = body["launch_parameters"]
        if body.get("metadata") is not None:
            params["metadata"] = string_map(body["metadata"], "metadata")
        base_id, base_name = body.get("base_blueprint_id"), body.get("base_blueprint_name")
        if base_id and base_name:
            raise ApiError(400, "only one of base_blueprint_id and base_blueprint_name")
        base = None
        if base_id or base_name:
            wanted = optional_text(base_id or base_name, "base_blueprint")
            base = self.core.blueprint_for(key, base_id, base_name)
            if base is None or base.state == "deleted":
                raise ApiError(404, f"Blueprint {wanted} not found")
            if base.status != "build_complete":
                raise ApiError(400, f"Base blueprint {base.id} is not built (status {base.status})")
            params["base_blueprint_id" if base_id else "base_blueprint_name"] = wanted
        return params, base

    def _context(self, key: str, context: Any) -> dict[str, str]:
        """A ``build_context``: an uploaded object of the key's."""
        object_id = context.get("object_id") if isinstance(context, dict) else None
        if not isinstance(object_id, str) or context.get("type") != "object":
            raise ApiError(400, "build_context must be {'type': 'object', 'object_id': ...}")
        self.api.uploaded(key, object_id)
        return {"type": "object", "object_id": object_id}

    # -- routes ----------------------------------------------------------------
    async def create(self, request: web.Request) -> web.Response:
        key = self.api.key(request)
        request_id = request.headers.get("x-request-id")
        made = self.core.blueprints_by_request.get((key, request_id or ""))
        if request_id and made is not None:
            return web.json_response(self.core.blueprints[made].view())
        params, base = self._parameters(key, await self.api.body(request))
        blueprint_id = new_id("bpt")
        bp = Blueprint(
            id=blueprint_id,
            api_key=key,
            name=params["name"],
            parameters=params,
            metadata=params.get("metadata", {}),
            path=self.core.blueprint_root / blueprint_id,
            base=base,
        )
        self.core.blueprints[bp.id] = bp
        if request_id:
            self.core.blueprints_by_request[key, request_id] = bp.id
        bp.build = asyncio.create_task(self._build(bp))
        return web.json_response(bp.view())

    def blueprint_of(self, request: web.Request) -> Blueprint:
        blueprint_id = request.match_info["blueprint_id"]
        bp = self.core.blueprints.get(blueprint_id)
        if bp is None or bp.api_key != self.api.key(request):
            raise ApiError(404, f"Blueprint {blueprint_id} not found")
        return bp

    async def retrieve(self, request: web.Request) -> web.Response:
        return web.json_response(self.blueprint_of(request).view())

    async def logs(self, request: web.Request) -> web.Response:
        bp = self.blueprint_of(request)
        return web.json_response({"blueprint_id": bp.id, "logs": bp.logs})

    async def delete(self, request: web.Request) -> web.Response:
        bp = self.blueprint_of(request)
        if bp.state == "deleted":
            raise ApiError(404, f"Blueprint {bp.id} not found")
        if any(
            s.source_blueprint_id == bp.id and s.status == "complete"
            for s in self.core.snapshots.values()
        ):
            raise ApiError(
                400,
                f"Blueprint {bp.id} has dependent snapshots: delete them first "
                f"(GET /v1/devboxes/disk_snapshots?source_blueprint_id={bp.id})",
            )
        if bp.build is not None:
            bp.build.cancel()
        bp.state = "deleted"
        await asyncio.to_thread(shutil.rmtree, bp.path, True)
        return web.json_response({})

    async def list(self, request: web.Request) -> web.Response:
        """The key's blueprints not deleted, newest first, paged; by ``name`` and ``status``."""
        key = self.api.key(request)
        name, status = request.query.get("name"), request.query.get("status")
        if status is not None and status not in _STATUSES:
            raise ApiError(400, f"status must be one of {sorted(_STATUSES)}")
        matching = [
            bp
            for bp in reversed(self.core.blueprints.values())
            if bp.api_key == key
            and bp.state == "created"
            and (name is None or bp.name == name)
            and (status is None or bp.status == status)
        ]
        return web.json_response(page(request.query, matching, "blueprints"))

    async def list_public(self, request: web.Request) -> web.Response:
        self.api.key(request)
        return web.json_response(page(request.query, [], "blueprints"))

    async def preview(self, request: web.Request) -> web.Response:
        """The Dockerfile a create would build: the base, the ``dockerfile``, the setup
        commands as ``RUN`` steps."""
        params, base = self._parameters(self.api.key(request), await self.api.body(request))
        lines = [f"FROM {base.id}" if base is not None else f"FROM {_DEFAULT_BASE}"]
        if params.get("dockerfile"):
            lines = params["dockerfile"].strip().splitlines()
        lines += [f"RUN {command}" for command in params.get("system_setup_commands", [])]
        return web.json_response({"dockerfile": "\n".join(lines) + "\n"})

    # -- the build ---------------------------------------------------------------
    def _status(self, bp: Blueprint, status: str, failure: str | None = None) -> None:
        bp.status, bp.failure_reason = status, failure
        if status not in _BUILDING:
            bp.finished_ms = now_ms()

    async def _build(self, bp: Blueprint) -> None:
        await asyncio.sleep(self.build_seconds / 2)
        self._status(bp, "building")
        try:
            await self._steps(bp)
        except (BuildFailed, OSError) as failed:
            bp.log("error", f"Build failed: {failed}")
            self._status(bp, "failed", "build_failed")
            await asyncio.to_thread(shutil.rmtree, bp.path, True)
            return
        await asyncio.sleep(self.build_seconds / 2)
        bp.log("info", "Build complete")
        self._status(bp, "build_complete")

    async def _steps(self, bp: Blueprint) -> None:
        """Read the Dockerfile, then make the image's disk in a scratch sandbox."""
        base = bp.base.image if bp.base is not None else Image()
        bp.dirs = bp.base.dirs if bp.base is not None else ()
        try:
            bp.image, steps, copies = read_dockerfile(
                bp.parameters.get("dockerfile") or "", bp.parameters.get("build_args", {}), base
            )
        except DockerfileError as exc:
            raise BuildFailed(str(exc)) from None
        for step in steps:
            bp.log("info", step)
        for mount in bp.parameters.get("code_mounts", []):
            repo = f"{mount['repo_owner']}/{mount['repo_name']}"
            bp.log("info", f"code mount {repo}: kept, not cloned (the emulator reaches no GitHub)")
        context = bp.path.with_name(bp.id + ".context")
        try:
            await self._build_disk(bp, copies, context)
        finally:
            await asyncio.to_thread(shutil.rmtree, context, True)

    async def _build_disk(self, bp: Blueprint, copies: Sequence[Copy], context: Path) -> None:
        """The base's disk, the copies from the build context (unpacked into ``context``),
        the file mounts and the setup commands, in a scratch sandbox; then the blueprint's."""
        placements = await self._placements(bp, copies, context)
        mounts = bp.parameters.get("file_mounts", {})
        made = [bp.image.workdir] if bp.image.workdir is not None else []
        made += [p.directory for p in placements]
        made += [posixpath.dirname(posixpath.join(RUNLOOP_HOME, path)) for path in mounts]
        bp.dirs = tuple(dict.fromkeys([*bp.dirs, *made]))
        local = await self.core.local.create(SandboxSpec(env=bp.image.env), sandbox_id=bp.id)
        try:
            sandbox = GuestSandbox(
                local, RUNLOOP_HOME, confinement=self.core.confinement, dirs=bp.dirs
            )
        except OSError:
            await local.kill()
            raise
        try:
            if bp.base is not None:
                await asyncio.to_thread(copy_disk, bp.base.path, sandbox.root)
            try:
                for placement in placements:
                    await asyncio.to_thread(placement.apply, sandbox)
                await asyncio.to_thread(_prepare, sandbox, bp.dirs, mounts)
            except (PathRefused, tarfile.TarError) as exc:
                raise BuildFailed(str(exc)) from None
            for command in bp.parameters.get("system_setup_commands", []):
                await self._setup(bp, sandbox, command)
            await asyncio.to_thread(shutil.rmtree, sandbox.root / _SHIMS.lstrip("/"), True)
            await asyncio.to_thread(copy_disk, sandbox.root, bp.path)
        finally:
            await sandbox.kill()

    async def _placements(
        self, bp: Blueprint, copies: Sequence[Copy], context: Path
    ) -> Sequence[Placement]:
        """Where the Dockerfile's copies go, the build context unpacked into ``context``."""
        if not copies:
            return []
        first = copies[0]
        source = bp.parameters.get("build_context")
        if source is None:
            raise BuildFailed(
                f"{first.step}: {first.instruction} failed: no build context to copy from "
                "(give the blueprint a build_context object)"
            )
        obj = self.core.object_for(bp.api_key, source["object_id"])
        if obj is None or obj.state != "READ_ONLY":
            state = obj.state if obj is not None else "gone"
            raise BuildFailed(f"build context: object {source['object_id']} is {state}")
        try:
            await asyncio.to_thread(unpack, obj.path, context)
            return await asyncio.to_thread(plan, copies, context)
        except tarfile.TarError as exc:
            raise BuildFailed(
                f"build context: object {obj.id} is not a tar archive ({exc})"
            ) from None
        except ContextError as exc:
            raise BuildFailed(str(exc)) from None

    async def _setup(self, bp: Blueprint, sandbox: GuestSandbox, command: str) -> None:
        """Run one setup command to its end, its output logged; BuildFailed when it fails."""
        bp.log("info", f"RUN {command}")
        path = bp.image.env.get("PATH") or f"{DEFAULT_PATH}:{sandbox.inside(GUEST_BIN)}"
        try:
            process = await sandbox.spawn(
                command,
                env={"PATH": f"{sandbox.inside(_SHIMS)}:{path}"},
                cwd=bp.image.workdir,
            )
        except SandboxError as exc:
            raise BuildFailed(exc.message) from None
        out, err, code, _ = await process.communicate(None, None)
        for level, data in (("info", out), ("error", err)):
            for line in data.decode("utf-8", "replace").splitlines():
                bp.log(level, line)
        if code != 0:
            raise BuildFailed(f"system setup command {command!r} exited with code {code}")


def _prepare(sandbox: GuestSandbox, dirs: tuple[str, ...], mounts: dict[str, str]) -> None:
    """Make the image's directories, write the file mounts and the build's command shims."""
    for directory in dirs:
        sandbox.host(directory, write=True).mkdir(parents=True, exist_ok=True)
    for path, contents in mounts.items():
        target = sandbox.host(path, write=True)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(contents)
    shims = sandbox.root / _SHIMS.lstrip("/")
    shims.mkdir(parents=True, exist_ok=True)
    for name, script in [("sudo", _SUDO), *((n, _PACKAGES) for n in _PACKAGE_MANAGERS)]:
        (shims / name).write_text(script)
        (shims / name).chmod(0o755)
