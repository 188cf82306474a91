"""E2B's control plane: the REST API that creates, finds, extends and kills sandboxes.

Routes (JSON, key in ``X-API-KEY``, errors as ``{"code", "message"}``):

* ``POST /v2/sandboxes``: create; 201 with the sandbox id and envd token.
* ``GET /v2/sandboxes``: list the key's sandboxes, newest first (``order``),
  filtered by ``metadata`` (an url-encoded ``k=v&...`` string), ``state``,
  ``template`` and ``startedAfter``, paged with ``limit`` / ``nextToken`` and
  the ``x-next-token`` response header.
* ``GET|DELETE /sandboxes/{id}``, ``POST /sandboxes/{id}/timeout``,
  ``POST /v2/sandboxes/{id}/connect``, ``POST /sandboxes/{id}/pause``,
  ``POST /sandboxes/{id}/fork``, ``GET /sandboxes/{id}/metrics``.
* ``POST /sandboxes/{id}/snapshots``, ``GET /snapshots`` (by ``sandboxID`` or
  ``name``, paged), ``DELETE /templates/{snapshot id}``.

A sandbox belongs to the key that created it (the key stands for a team):
other keys get 404 for it, as on the real service. Account limits come from
the harness: the concurrency cap answers E2B's own 429 message, a spent
monthly quota answers 403 (the team is blocked).
"""

from __future__ import annotations

import asyncio
import base64
import secrets
import string
import time
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl, unquote

from aiohttp import web

from emulators.e2b.ports import DOMAIN
from emulators.e2b.sandboxes import E2B_HOME, E2BSandbox, E2BSnapshot
from emulators.harness import QuotaViolation
from providers.base import SandboxSpec

if TYPE_CHECKING:
    from emulators.e2b import E2BEmulator

__all__ = ["CONCURRENCY_MESSAGE", "DEFAULT_TIMEOUT", "ControlPlane", "api_error", "new_sandbox_id"]

# The API's default sandbox timeout when a create names none, in seconds.
DEFAULT_TIMEOUT = 15
MAX_TIMEOUT = 24 * 3600
CONCURRENCY_MESSAGE = (
    "you have reached the maximum number of concurrent E2B sandboxes ({limit}). "
    "If you need more, please visit 'https://e2b.dev/docs/billing'"
)
QUOTA_MESSAGE = "team is blocked: the monthly sandbox quota ({limit}) of this account is spent"
_CLIENT_ID = "6532622b"
_ID_ALPHABET = string.ascii_lowercase + string.digits


def new_sandbox_id() -> str:
    return "i" + "".join(secrets.choice(_ID_ALPHABET) for _ in range(19))


def api_error(status: int, message: str, headers: dict[str, str] | None = None) -> web.Response:
    """The control plane's error body."""
    return web.json_response({"code": status, "message": message}, status=status, headers=headers)


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).isoformat().replace("+00:00", "Z")


def _string_map(value: Any, field: str) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        raise web.HTTPBadRequest(
            text=f'{{"code": 400, "message": "{field} must map strings to strings"}}',
            content_type="application/json",
        )
    return dict(value)


def _quota_error(violation: QuotaViolation) -> dict[str, Any]:
    """E2B's answer to an account limit: 429 for the concurrency cap, 403 for the quota."""
    if violation.kind == "concurrent":
        return {"code": 429, "message": CONCURRENCY_MESSAGE.format(limit=violation.limit)}
    return {"code": 403, "message": QUOTA_MESSAGE.format(limit=violation.limit)}


def _paged(query: Mapping[str, str], items: list[dict[str, Any]]) -> web.Response:
    """One page of ``items`` (``limit``, ``nextToken``), the next token in ``x-next-token``."""
    try:
        limit = int(query.get("limit", "100"))
        offset = int(base64.urlsafe_b64decode(query["nextToken"])) if "nextToken" in query else 0
    except ValueError:
        return api_error(400, "invalid limit or nextToken")
    if not 0 < limit <= 1000:
        return api_error(400, "limit must be between 1 and 1000")
    headers = {}
    if offset + limit < len(items):
        headers["x-next-token"] = base64.urlsafe_b64encode(str(offset + limit).encode()).decode()
    return web.json_response(items[offset : offset + limit], headers=headers)


class ControlPlane:
    """The REST handlers, over the emulator's core."""

    def __init__(self, emulator: E2BEmulator) -> None:
        self.emulator = emulator
        self.core = emulator.core

    def routes(self) -> list[web.RouteDef]:
        return [
            web.post("/v2/sandboxes", self.create),
            web.get("/v2/sandboxes", self.list),
            web.get("/sandboxes/{sandbox_id}", self.get),
            web.delete("/sandboxes/{sandbox_id}", self.kill),
            web.post("/sandboxes/{sandbox_id}/timeout", self.set_timeout),
            web.post("/v2/sandboxes/{sandbox_id}/connect", self.connect),
            web.post("/sandboxes/{sandbox_id}/pause", self.pause),
            web.post("/sandboxes/{sandbox_id}/snapshots", self.snapshot),
            web.post("/sandboxes/{sandbox_id}/fork", self.fork),
            web.get("/sandboxes/{sandbox_id}/metrics", self.metrics),
            web.get("/snapshots", self.list_snapshots),
            web.delete("/templates/{template_id}", self.delete_template),
        ]

    # -- helpers -----------------------------------------------------------
    def _key(self, request: web.Request) -> str:
        key = request.headers.get("X-API-KEY")
        if key is None or not self.core.key_ok(key):
            raise web.HTTPUnauthorized(
                text='{"code": 401, "message": "Invalid API key, please visit '
                'https://e2b.dev/docs/api-key for more information."}',
                content_type="application/json",
            )
        return key

    def _owned(self, request: web.Request) -> E2BSandbox:
        key = self._key(request)
        sandbox_id = request.match_info["sandbox_id"]
        sandbox = self.core.alive_sandbox(sandbox_id)
        if sandbox is None or sandbox.api_key != key:
            raise web.HTTPNotFound(
                text=f'{{"code": 404, "message": "sandbox \\"{sandbox_id}\\" not found"}}',
                content_type="application/json",
            )
        return sandbox

    async def _body(self, request: web.Request) -> dict[str, Any]:
        if not request.can_read_body:
            return {}
        try:
            body = await request.json()
        except ValueError:
            body = None
        if not isinstance(body, dict):
            raise web.HTTPBadRequest(
                text='{"code": 400, "message": "request body must be a JSON object"}',
                content_type="application/json",
            )
        return body

    def _expires_at(self, sandbox: E2BSandbox) -> float:
        record = self.core.records[sandbox.id]
        return record.expires_at or time.time()

    def _created(self, sandbox: E2BSandbox) -> dict[str, Any]:
        return {
            "templateID": sandbox.template,
            "sandboxID": sandbox.id,
            "alias": sandbox.template,
            "clientID": _CLIENT_ID,
            "envdVersion": self.emulator.envd_version,
            "envdAccessToken": sandbox.token,
            "trafficAccessToken": sandbox.traffic_token,
            "domain": DOMAIN,
        }

    def _listed(self, sandbox: E2BSandbox) -> dict[str, Any]:
        return {
            "templateID": sandbox.template,
            "alias": sandbox.template,
            "sandboxID": sandbox.id,
            "clientID": _CLIENT_ID,
            "startedAt": _iso(sandbox.started_at),
            "endAt": _iso(self._expires_at(sandbox)),
            "cpuCount": sandbox.cpu_count,
            "memoryMB": sandbox.memory_mb,
            "diskSizeMB": 10240,
            "state": "paused" if self.core.records[sandbox.id].paused else "running",
            "envdVersion": self.emulator.envd_version,
            "metadata": dict(self.core.records[sandbox.id].labels),
        }

    # -- handlers ----------------------------------------------------------
    async def create(self, request: web.Request) -> web.Response:
        key = self._key(request)
        body = await self._body(request)
        template = body.get("templateID")
        if not isinstance(template, str) or not template:
            return api_error(400, "templateID is required")
        templates = self.emulator.templates
        snapshot = self.core.snapshots.get(template)
        if snapshot is not None and snapshot.api_key != key:
            snapshot = None
        if snapshot is None and templates is not None and template not in templates:
            return api_error(404, f"template '{template}' not found")
        timeout = body.get("timeout", DEFAULT_TIMEOUT)
        if not isinstance(timeout, int) or not 0 < timeout <= MAX_TIMEOUT:
            return api_error(400, f"timeout must be between 1 and {MAX_TIMEOUT} seconds")
        metadata = _string_map(body.get("metadata"), "metadata")
        env = _string_map(body.get("envVars"), "envVars")
        spec = SandboxSpec(
            template=snapshot.local_id if snapshot else template, env=env, labels=metadata
        )
        try:
            sandbox = await self._start(key, template, spec, timeout, body)
        except QuotaViolation as violation:
            error = _quota_error(violation)
            return api_error(error["code"], error["message"])
        return web.json_response(self._created(sandbox), status=201)

    async def _start(
        self, key: str, template: str, spec: SandboxSpec, timeout: int, body: dict[str, Any]
    ) -> E2BSandbox:
        """Create a sandbox of ``spec`` for ``key`` as a create request ``body`` asks.

        Raises:
            QuotaViolation: the account's concurrency cap or quota is reached.
        """
        sandbox_id = new_sandbox_id()
        local = await self.core.create(
            key, spec, home=E2B_HOME, lifetime=timeout, sandbox_id=sandbox_id
        )
        sandbox = E2BSandbox(
            id=sandbox_id,
            template=template,
            api_key=key,
            token=secrets.token_urlsafe(24),
            local=local,
            auto_pause=body.get("autoPause") is True,
            auto_pause_memory=body.get("autoPauseMemory") is not False,
            auto_resume=isinstance(resume := body.get("autoResume"), dict)
            and resume.get("enabled") is True,
            timeout=timeout,
        )
        sandbox.boot()
        network = body.get("network")
        if isinstance(network, dict) and network.get("allowPublicTraffic") is False:
            sandbox.traffic_token = secrets.token_urlsafe(24)
        self.core.e2b[sandbox_id] = sandbox
        return sandbox

    async def fork(self, request: web.Request) -> web.Response:
        """``count`` new sandboxes from one copy of the source's files, its template,
        metadata and environment (its memory is not emulated: processes start afresh);
        each fork succeeds or fails on its own."""
        source = self._owned(request)
        body = await self._body(request)
        count, timeout = body.get("count", 1), body.get("timeout", DEFAULT_TIMEOUT)
        if not isinstance(count, int) or not 1 <= count <= 100:
            return api_error(400, "count must be between 1 and 100")
        if not isinstance(timeout, int) or not 0 < timeout <= MAX_TIMEOUT:
            return api_error(400, f"timeout must be between 1 and {MAX_TIMEOUT} seconds")
        kept = await source.local.snapshot()
        spec = SandboxSpec(
            template=kept.id,
            env=dict(source.local.meta.get("env", {})),
            labels=dict(self.core.records[source.id].labels),
        )
        results: list[dict[str, Any]] = []
        try:
            for _ in range(count):
                try:
                    fork = await self._start(source.api_key, source.template, spec, timeout, {})
                except QuotaViolation as violation:
                    results.append({"error": _quota_error(violation)})
                    continue
                fork.traffic_token = secrets.token_urlsafe(24) if source.traffic_token else None
                results.append({"sandbox": self._created(fork)})
        finally:
            await self.core.local.delete_snapshot(kept.id)
        return web.json_response(results, status=201)

    async def list(self, request: web.Request) -> web.Response:
        key = self._key(request)
        query = request.query
        wanted = {unquote(k): unquote(v) for k, v in parse_qsl(query.get("metadata", ""))}
        states = set(query.get("state", "running,paused").split(","))
        template = query.get("template")
        order = query.get("order", "desc")
        try:
            started_after = (
                datetime.fromisoformat(query["startedAfter"].replace(" ", "+"))
                if "startedAfter" in query
                else None
            )
        except ValueError:
            return api_error(400, "invalid startedAfter")
        if started_after is not None and started_after.tzinfo is None:
            started_after = started_after.replace(tzinfo=UTC)
        if order not in ("asc", "desc"):
            return api_error(400, "order must be asc or desc")
        matching = sorted(
            (
                s
                for s in self.core.e2b.values()
                if s.api_key == key
                and self.core.alive_sandbox(s.id) is not None
                and ("paused" if self.core.records[s.id].paused else "running") in states
                and all(self.core.records[s.id].labels.get(k) == v for k, v in wanted.items())
                and (template is None or template == s.template)
                and (
                    started_after is None
                    or datetime.fromtimestamp(s.started_at, UTC) >= started_after
                )
            ),
            key=lambda s: (s.started_at, s.id),
            reverse=order == "desc",
        )
        return _paged(query, [self._listed(s) for s in matching])

    async def list_snapshots(self, request: web.Request) -> web.Response:
        """The key's snapshots, newest first, of one sandbox (``sandboxID``) or name."""
        key = self._key(request)
        query = request.query
        matching = sorted(
            (
                s
                for s in self.core.snapshots.values()
                if s.api_key == key
                and query.get("sandboxID", s.sandbox_id) == s.sandbox_id
                and ("name" not in query or query["name"] == s.name)
            ),
            key=lambda s: s.created_at,
            reverse=True,
        )
        return _paged(query, [{"snapshotID": s.id, "names": s.names} for s in matching])

    async def get(self, request: web.Request) -> web.Response:
        sandbox = self._owned(request)
        detail = {
            **self._listed(sandbox),
            "envdAccessToken": sandbox.token,
            "domain": DOMAIN,
            "lifecycle": {
                "onTimeout": "pause" if sandbox.auto_pause else "kill",
                "autoResume": sandbox.auto_resume,
            },
        }
        if self.core.records[sandbox.id].paused:
            detail["pauseMode"] = "full" if sandbox.memory_kept else "filesystem"
        return web.json_response(detail)

    async def metrics(self, request: web.Request) -> web.Response:
        """The sandbox's samples from ``start`` to ``end`` (unix seconds); a running
        sandbox is sampled first."""
        sandbox = self._owned(request)
        try:
            start, end = (
                int(request.query[k]) if k in request.query else None for k in ("start", "end")
            )
        except ValueError:
            return api_error(400, "start and end must be unix timestamps in seconds")
        if not self.core.records[sandbox.id].paused:
            pids = [p.local.proc.pid for p in sandbox.processes.values()]
            await asyncio.to_thread(
                sandbox.metrics.sample,
                sandbox.local.root,
                pids,
                sandbox.cpu_count,
                sandbox.memory_mb,
            )
        return web.json_response(sandbox.metrics.between(start, end))

    async def kill(self, request: web.Request) -> web.Response:
        sandbox = self._owned(request)
        await self.core.kill(sandbox.id)
        return web.Response(status=204)

    async def set_timeout(self, request: web.Request) -> web.Response:
        sandbox = self._owned(request)
        timeout = (await self._body(request)).get("timeout")
        if not isinstance(timeout, int) or not 0 <= timeout <= MAX_TIMEOUT:
            return api_error(400, f"timeout must be between 0 and {MAX_TIMEOUT} seconds")
        self.core.set_lifetime(sandbox.id, timeout)
        return web.Response(status=204)

    async def pause(self, request: web.Request) -> web.Response:
        """Pause the sandbox: a "full" pause (``memory`` true or unset) keeps its processes
        where they are, to go on after `connect`; a filesystem-only one keeps its files."""
        sandbox = self._owned(request)
        memory = (await self._body(request)).get("memory")
        if not await self.core.pause(sandbox.id, memory=memory is not False):
            return api_error(409, f"sandbox {sandbox.id} is already paused")
        return web.Response(status=204)

    async def snapshot(self, request: web.Request) -> web.Response:
        """The sandbox's filesystem kept as a template (memory is not: a sandbox made
        from it starts its processes afresh)."""
        sandbox = self._owned(request)
        name = (await self._body(request)).get("name")
        name = name if isinstance(name, str) and name else None
        kept = await sandbox.local.snapshot(name)
        snapshot = E2BSnapshot(
            id=f"snapshot-{secrets.token_hex(8)}",
            local_id=kept.id,
            sandbox_id=sandbox.id,
            api_key=sandbox.api_key,
            name=name,
            names=[f"{_CLIENT_ID}/{name}:default"] if name else [],
        )
        self.core.snapshots[snapshot.id] = snapshot
        return web.json_response({"snapshotID": snapshot.id, "names": snapshot.names}, status=201)

    async def delete_template(self, request: web.Request) -> web.Response:
        key = self._key(request)
        template_id = request.match_info["template_id"]
        snapshot = self.core.snapshots.get(template_id)
        if snapshot is None or snapshot.api_key != key:
            return api_error(404, f"template '{template_id}' not found")
        del self.core.snapshots[template_id]
        await self.core.local.delete_snapshot(snapshot.local_id)
        return web.Response(status=204)

    async def connect(self, request: web.Request) -> web.Response:
        sandbox = self._owned(request)
        record = self.core.records[sandbox.id]
        if record.paused:  # connect resumes a paused sandbox
            await self.core.resume(sandbox.id, DEFAULT_TIMEOUT)
        timeout = (await self._body(request)).get("timeout")
        if isinstance(timeout, int) and time.time() + timeout > self._expires_at(sandbox):
            self.core.set_lifetime(sandbox.id, timeout)
        return web.json_response(self._created(sandbox))
