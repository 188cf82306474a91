"""Daytona's warm pools: sandboxes of a snapshot made before anyone asks for them.

Routes, under ``/api/warm-pools`` (`WarmPoolsApi` in the SDK's generated client):
``GET`` lists the organization's pools, ``POST`` (``{snapshot, pool, target}``)
creates one, ``PATCH /{id}`` (``{pool}``) resizes it and ``DELETE /{id}``
removes it; an unknown id is a 404 in the API's error shape. As on Daytona
(docs "Warm Pools"), an organization has one pool per snapshot per target
(a second is a 409), the snapshot must exist and be active, and ``pool`` is
at least 1 on create (0 on an update drains the pool).

A pool makes its missing sandboxes in the background, each a create as the
emulator makes any (quota and latency profile included, since a warm sandbox
counts against the organization's quota and takes as long to make), then
booted for ``boot_seconds``. Until claimed a warm sandbox is nobody's: it is
not listed and no API call finds it. ``currentSize`` counts the ready ones.

A sandbox create claims a ready one (`WarmPools.claim`) when it asks for
what a warm sandbox already is: the pool's snapshot and target, the
snapshot's resources, the default OS user and no env, volumes or secrets.
The claim answers at once, ``started``, with no latency drawn: Daytona hands
the sandbox over and applies the request's name, labels, lifecycle
intervals and network settings; the emulator applies ``ttlMinutes`` too and
starts the sandbox's clocks (creation, activity) at the claim. The pool then
makes a new one. `Box.from_pool` records which pool served a create.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from aiohttp import web

from emulators.daytona.api import (
    CONCURRENCY_MESSAGE,
    CREATED_MESSAGE,
    DEFAULT_RESOURCES,
    ApiError,
    Lifecycle,
    network_settings,
)
from emulators.daytona.sandboxes import DAYTONA_HOME, Box, iso, org_of
from emulators.harness import QuotaViolation
from providers.base import SandboxSpec
from providers.errors import ProviderError

if TYPE_CHECKING:
    from emulators.daytona.api import SandboxApi

__all__ = ["WarmPool", "WarmPools"]

OS_USER = "daytona"
RETRY_SECONDS = 1.0  # how soon a pool that could not make a sandbox tries again


@dataclass
class WarmPool:
    """One pool: its Daytona fields, its ready sandboxes and how many are being made."""

    id: str
    api_key: str
    snapshot: str  # as the create named it
    source: str  # the snapshot it resolves to: a captured snapshot's id, else its name
    template: str | None  # the local copy a captured snapshot's sandboxes start from
    target: str
    size: int
    resources: dict[str, int]
    ready: list[Box] = field(default_factory=list)
    making: int = 0
    error: str | None = None
    created: float = field(default_factory=time.time)
    updated: float = field(default_factory=time.time)

    @property
    def organization_id(self) -> str:
        return org_of(self.api_key)

    def dto(self) -> dict[str, Any]:
        """The pool as the API shows it (``WarmPool``)."""
        return {
            "id": self.id,
            "organizationId": self.organization_id,
            "snapshot": self.snapshot,
            "target": self.target,
            "pool": self.size,
            "currentSize": len(self.ready),
            "cpu": self.resources["cpu"],
            "mem": self.resources["memory"],
            "disk": self.resources["disk"],
            "osUser": OS_USER,
            "env": {},
            "errorReason": self.error,
            "createdAt": iso(self.created),
            "updatedAt": iso(self.updated),
        }


class WarmPools:
    """The warm-pool handlers and the pools' background filling, over `SandboxApi`."""

    def __init__(self, api: SandboxApi) -> None:
        self.api = api
        self.core = api.core
        self.pools: dict[str, WarmPool] = {}

    def routes(self) -> list[web.RouteDef]:
        return [
            web.get("/api/warm-pools", self.list),
            web.post("/api/warm-pools", self.create),
            web.patch("/api/warm-pools/{pool}", self.update),
            web.delete("/api/warm-pools/{pool}", self.delete),
        ]

    # -- handlers ---------------------------------------------------------
    async def list(self, request: web.Request) -> web.Response:
        org = org_of(self.api.key(request))
        mine = [pool for pool in self.pools.values() if pool.organization_id == org]
        return web.json_response([pool.dto() for pool in sorted(mine, key=lambda p: p.created)])

    async def create(self, request: web.Request) -> web.Response:
        key = self.api.key(request)
        body = await self.api.json_body(request)
        snapshot = body.get("snapshot")
        if not isinstance(snapshot, str) or not snapshot:
            raise ApiError(400, "snapshot must be a non-empty string")
        size = _size(body, minimum=1)
        target = body.get("target") or "us"
        if not isinstance(target, str):
            raise ApiError(400, "target must be a string")
        name, _, captured = self.api.source({"snapshot": snapshot}, key)
        assert name is not None
        source = captured.id if captured is not None else name
        if self._find(org_of(key), source, target) is not None:
            raise ApiError(
                409, f"Warm pool for snapshot {snapshot} in region {target} already exists"
            )
        resources = dict(DEFAULT_RESOURCES) if captured is None else captured.resources()
        pool = WarmPool(
            id=str(uuid.uuid4()),
            api_key=key,
            snapshot=snapshot,
            source=source,
            template=captured.local_id if captured is not None else None,
            target=target,
            size=size,
            resources=resources,
        )
        self.pools[pool.id] = pool
        self._refill(pool)
        return web.json_response(pool.dto(), status=201)

    async def update(self, request: web.Request) -> web.Response:
        pool = self._pool(request)
        pool.size = _size(await self.api.json_body(request), minimum=0)
        pool.updated = time.time()
        await self._drain(pool, keep=pool.size)
        self._refill(pool)
        return web.json_response(pool.dto())

    async def delete(self, request: web.Request) -> web.Response:
        pool = self._pool(request)
        del self.pools[pool.id]
        await self._drain(pool, keep=0)
        return web.Response(status=204)

    def _pool(self, request: web.Request) -> WarmPool:
        wanted = request.match_info["pool"]
        pool = self.pools.get(wanted)
        if pool is None or pool.organization_id != org_of(self.api.key(request)):
            raise ApiError(404, f"Warm pool {wanted} not found")
        return pool

    def _find(self, org: str, source: str, target: str) -> WarmPool | None:
        return next(
            (
                pool
                for pool in self.pools.values()
                if (pool.organization_id, pool.source, pool.target) == (org, source, target)
            ),
            None,
        )

    # -- claims -----------------------------------------------------------
    def claim(
        self,
        body: dict[str, Any],
        key: str,
        source: str,
        *,
        name: str | None,
        labels: dict[str, str],
        intervals: Lifecycle,
    ) -> Box | None:
        """Hand a ready sandbox of the matching pool to this create, or None (a normal
        create): the request must ask for nothing a warm sandbox is not already.

        Args:
            body: the create's request.
            key: the API key creating.
            source: the snapshot the create resolves to (`WarmPool.source`).
            name, labels, intervals: the create's, checked.
        """
        if (
            body.get("env")
            or body.get("volumes")
            or body.get("secrets")
            or body.get("user") not in (None, OS_USER)
            or any(body.get(k) is not None for k in ("cpu", "gpu", "memory", "disk"))
        ):
            return None
        pool = self._find(org_of(key), source, str(body.get("target") or "us"))
        if pool is None or not pool.ready:
            return None
        box = pool.ready.pop(0)
        now = time.time()
        box.name = name or box.id
        box.labels = dict(labels)
        box.auto_stop, box.auto_delete, box.auto_archive, box.ttl = intervals
        box.public = bool(body.get("public"))
        for setting, value in network_settings(body).items():
            setattr(box, setting, value)
        box.created = box.updated = box.last_activity = now
        box.from_pool = pool.id
        record = self.core.records.get(box.id)
        if record is not None:
            record.labels = dict(box.labels)
        self._refill(pool)
        return box

    # -- filling ----------------------------------------------------------
    def _refill(self, pool: WarmPool) -> None:
        """Start making the sandboxes the pool lacks (those being made count)."""
        while len(pool.ready) + pool.making < pool.size:
            pool.making += 1
            self.api.background(self._make(pool))

    async def _make(self, pool: WarmPool) -> None:
        """Make one warm sandbox; keep it if the pool still wants it, else delete it."""
        sandbox_id = str(uuid.uuid4())
        try:
            local = await self.core.create(
                pool.api_key,
                SandboxSpec(template=pool.template),
                home=DAYTONA_HOME,
                sandbox_id=sandbox_id,
            )
        except QuotaViolation as exc:
            message = CONCURRENCY_MESSAGE if exc.kind == "concurrent" else CREATED_MESSAGE
            pool.making -= 1
            await self._failed(pool, message.format(limit=exc.limit))
            return
        except (ProviderError, OSError) as exc:
            pool.making -= 1
            await self._failed(pool, str(exc))
            return
        box = Box(
            id=sandbox_id,
            name=sandbox_id,
            api_key=pool.api_key,
            local=local,
            labels={},
            env={},
            snapshot=pool.snapshot,
            target=pool.target,
            auto_stop=0,
            auto_delete=-1,
            auto_archive=0,
            ttl=0,
            cpu=pool.resources["cpu"],
            gpu=pool.resources["gpu"],
            memory=pool.resources["memory"],
            disk=pool.resources["disk"],
        )
        await asyncio.sleep(self.api.emulator.boot_seconds)
        pool.making -= 1
        if self.pools.get(pool.id) is pool and len(pool.ready) < pool.size:
            box.state = "started"
            pool.ready.append(box)
            pool.error = None
        else:
            await self.core.kill(sandbox_id)

    async def _failed(self, pool: WarmPool, reason: str) -> None:
        """Say why the pool is short (``errorReason``) and try again a little later."""
        pool.error = reason
        await asyncio.sleep(RETRY_SECONDS)
        if self.pools.get(pool.id) is pool:
            self._refill(pool)

    async def _drain(self, pool: WarmPool, *, keep: int) -> None:
        """Delete the ready sandboxes past ``keep`` (those being made are deleted when done)."""
        extra, pool.ready = pool.ready[keep:], pool.ready[:keep]
        for box in extra:
            await self.core.kill(box.id)


def _size(body: dict[str, Any], *, minimum: int) -> int:
    value = body.get("pool")
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ApiError(400, "pool must be an integer")
    if value < minimum:
        raise ApiError(400, f"pool must not be less than {minimum}")
    return value
