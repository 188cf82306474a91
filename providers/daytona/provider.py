"""`DaytonaProvider`: create, connect, list and kill sandboxes of one Daytona organization.

A create names a snapshot (the entry's ``snapshot``, or Daytona's default)
or an image (``image``; a spec's ``template`` is read as either, per
``template_source``), with the spec's env, labels and language. A spec's
``lifetime`` becomes ``ttlMinutes`` and its ``idle_timeout`` the auto-stop
interval (both in whole minutes, rounded up); sandboxes are deleted when they
stop (``auto_delete_interval`` 0) unless the entry says otherwise. Resources
(cpu, memory, disk) apply to image-based sandboxes: a snapshot fixes its own.
A snapshot made of a sandbox (`DaytonaSandbox.snapshot`) is named by its id,
which names a snapshot whatever ``template_source`` says; `delete_snapshot`
deletes it. `keep_warm` sizes Daytona's own warm pool of the snapshot a
create starts from: Daytona then serves a matching create (no env) from a
sandbox it made before, and makes another.

A create answers at once with the sandbox ``creating`` (or ``started``,
when a warm pool served it); it is then polled until ``started``, every
10 ms for half a second, then every 50 ms (an image being built): Daytona's
Socket.IO notifications, which the SDK waits on, would cost a socket client
per organization, and its import.

The create request is bounded by ``request_timeout`` alone: the router
stops waiting at its create timeout, but an answer cut short would lose the
sandbox Daytona made (one that never comes, a connection lost or a request
timed out, is `Unavailable.unanswered`, and the router looks the sandbox up
by its lease label). The wait until ``started`` is bounded by the create
timeout from that answer. When a create fails after Daytona answered, the
sandbox is deleted before the error is raised (a timeout and an ``error``
state name it; its error reason is then added to ours), and so it is when
the create is cancelled then.
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import json
import math
import os
import re
from collections.abc import Mapping
from datetime import datetime
from typing import TYPE_CHECKING, ClassVar

from providers.account import KeyedProvider
from providers.base import ProviderOptions, SandboxInfo, SandboxSpec
from providers.capabilities import AGENT_WORK, FILE_WORK, Capability
from providers.daytona.errors import sdk_errors
from providers.daytona.handle import LANGUAGE_LABEL
from providers.daytona.options import API_KEY_ENV, API_URL_ENV, DaytonaOptions
from providers.daytona.sandbox import DaytonaSandbox
from providers.daytona.states import (
    DELETED,
    FAILED,
    SNAPSHOT_REMOVING,
    STARTABLE,
    UNUSABLE,
    failed,
    state,
)
from providers.errors import CapacityExceeded, NotFound, ProviderError, Unavailable
from providers.logs import Log

if TYPE_CHECKING:
    from daytona_api_client_async.models.create_sandbox import CreateSandbox
    from daytona_api_client_async.models.sandbox import Sandbox as SandboxDto
    from daytona_api_client_async.models.warm_pool import WarmPool

    from providers.daytona.client import DaytonaClient

__all__ = ["DaytonaProvider"]

log = Log("sandbox_router.daytona")

CODE_LANGUAGES = frozenset({"python", "javascript", "typescript"})
TARGET_ENV = "DAYTONA_TARGET"
_KILL_TIMEOUT = 10.0
# Between the GETs of a sandbox being started: 10 ms for half a second (a sandbox from a
# snapshot starts in tens of ms; a create is timed to the ms), then 50 ms (an image's build).
_POLL_FIRST = 0.01
_POLL_FIRST_FOR = 0.5
_POLL_LATER = 0.05
# A snapshot's id (a UUID, as Daytona makes them) names a snapshot whatever the entry says.
_SNAPSHOT_ID = re.compile(
    r"^(?:[0-9a-f]{8}-[0-9a-f]{4}-[1-5][0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}"
    r"|00000000-0000-0000-0000-000000000000)$",
    re.IGNORECASE,
)


class DaytonaProvider(KeyedProvider["DaytonaClient"]):
    """One Daytona organization.

    Args:
        name: the chain entry's name.
        options: `DaytonaOptions`.
    """

    kind: ClassVar[str] = "daytona"
    Options: ClassVar[type[ProviderOptions]] = DaytonaOptions
    capabilities = frozenset(
        {
            Capability.RUN_CODE,
            Capability.STATEFUL_CODE,
            Capability.PAUSE,
            Capability.PORT,
            Capability.SNAPSHOT,
            Capability.WARM_SERVER,
            *FILE_WORK,
            *(AGENT_WORK - {Capability.STDIN}),  # an async command's stdin never closes
        }
    )
    api_key_env = API_KEY_ENV

    def __init__(self, name: str = "daytona", options: ProviderOptions | None = None) -> None:
        super().__init__(name, options)
        self._default_snapshot: str | None = None

    @property
    def opts(self) -> DaytonaOptions:
        assert isinstance(self.options, DaytonaOptions)
        return self.options

    @property
    def _target(self) -> str | None:
        return self.opts.target or os.environ.get(TARGET_ENV) or None

    def _open_client(self, api_key: str) -> DaytonaClient:
        from providers.daytona.client import DEFAULT_API_URL, DaytonaClient

        url = self.opts.api_url or os.environ.get(API_URL_ENV) or DEFAULT_API_URL
        return DaytonaClient(api_key, url, self.opts.request_timeout)

    async def _close_client(self, client: DaytonaClient) -> None:
        await client.close()

    def _request(self, spec: SandboxSpec) -> CreateSandbox:
        """The create's body: what the SDK's ``create`` sends for the same parameters."""
        from daytona_api_client_async.models.create_build_info import CreateBuildInfo
        from daytona_api_client_async.models.create_sandbox import CreateSandbox

        opts = self.opts
        language = spec.language if spec.language in CODE_LANGUAGES else "python"
        auto_stop = opts.auto_stop_interval
        if spec.idle_timeout:
            auto_stop = max(1, math.ceil(spec.idle_timeout / 60))
        request = CreateSandbox(
            env=dict(spec.env),
            labels={**spec.labels, LANGUAGE_LABEL: language},
            target=self._target,
            auto_stop_interval=auto_stop,
            auto_archive_interval=opts.auto_archive_interval,
            auto_delete_interval=opts.auto_delete_interval,
            ttl_minutes=max(1, math.ceil(spec.lifetime / 60)) if spec.lifetime else None,
            volumes=[],
        )
        image = opts.image
        snapshot = opts.snapshot
        if spec.template is not None:
            as_image = opts.template_source == "image" and not _SNAPSHOT_ID.match(spec.template)
            image, snapshot = (spec.template, None) if as_image else (None, spec.template)
        if image is None:
            request.snapshot = snapshot
            return request
        request.build_info = CreateBuildInfo(dockerfile_content=f"FROM {image}\n")
        if spec.cpu or spec.memory_mb or spec.disk_gb:
            request.cpu = math.ceil(spec.cpu) if spec.cpu else None
            request.memory = math.ceil(spec.memory_mb / 1024) if spec.memory_mb else None
            request.disk = spec.disk_gb
        return request

    async def create(self, spec: SandboxSpec, *, timeout: float) -> DaytonaSandbox:
        """The create request, bounded by ``request_timeout`` (not by ``timeout``: cut
        short, the answer naming the sandbox Daytona made is lost), then the wait until
        it runs, ``timeout`` from that answer."""
        client = self._api()
        request = self._request(spec)
        made: list[str] = []
        try:
            try:
                dto = await self._create(client, request, made, timeout)
            except TimeoutError as exc:
                raise Unavailable(
                    f"Daytona did not start the sandbox within {timeout:g}s",
                    provider=self.name,
                    sandbox_id=made[0],
                ) from exc
        except asyncio.CancelledError:
            if made:
                self._discard_later(made[0], self.kill)
            raise
        except ProviderError as err:
            if err.sandbox_id is not None:
                reason = await self._discard(err.sandbox_id)
                if reason and reason not in err.message:
                    err.message = f"{err.message} ({reason})"
            raise
        log.debug("sandbox_router.daytona.created", entry=self.name, sandbox_id=dto.id)
        return self._sandbox(client, dto, workdir=spec.workdir)

    async def _create(
        self, client: DaytonaClient, request: CreateSandbox, made: list[str], timeout: float
    ) -> SandboxDto:
        """Create the sandbox (its id in ``made`` once Daytona has it) and wait until it
        runs; a TimeoutError raised is that wait's."""

        async def ask() -> SandboxDto:
            with sdk_errors(self.name):
                async with asyncio.timeout(self.opts.request_timeout):
                    return await client.sandboxes.create_sandbox(request)

        dto = await self._made_or_discarded(ask(), lambda made: made.id, self.kill)
        made.append(dto.id)
        async with asyncio.timeout(timeout):
            return await self._until_started(client, dto)

    async def _until_started(self, client: DaytonaClient, dto: SandboxDto) -> SandboxDto:
        """``dto``'s sandbox once ``started``, polled; `Unavailable` when it fails
        (``error``, ``build_failed``) or is destroyed first, `CapacityExceeded` when
        Daytona destroyed it after its runner queue timed out."""
        loop = asyncio.get_running_loop()
        since = loop.time()
        while True:
            now = state(dto.state)
            if now == "started":
                return dto
            if now in FAILED:
                raise failed(dto, self.name)
            if now in DELETED:
                cls = CapacityExceeded if dto.queue_timed_out_at else Unavailable
                why = (
                    f"after its runner queue timed out at {dto.queue_timed_out_at}"
                    if dto.queue_timed_out_at
                    else "before it started"
                )
                raise cls(
                    f"Sandbox {dto.id} was destroyed {why}", provider=self.name, sandbox_id=dto.id
                )
            early = loop.time() - since < _POLL_FIRST_FOR
            await asyncio.sleep(_POLL_FIRST if early else _POLL_LATER)
            with sdk_errors(self.name, dto.id):
                dto = await client.sandboxes.get_sandbox(dto.id)

    def _sandbox(
        self, client: DaytonaClient, dto: SandboxDto, *, workdir: str | None = None
    ) -> DaytonaSandbox:
        return DaytonaSandbox(
            dto,
            self.name,
            client,
            workdir=workdir,
            request_timeout=self.opts.request_timeout,
            transfer_timeout=self.opts.transfer_timeout,
            snapshot_timeout=self.opts.snapshot_timeout,
        )

    async def _discard(self, sandbox_id: str) -> str | None:
        """Delete a sandbox whose create failed (a failure here is only logged); its error."""
        client = self._api()
        reason = None
        try:
            with sdk_errors(self.name, sandbox_id):
                async with asyncio.timeout(_KILL_TIMEOUT):
                    dto = await client.sandboxes.get_sandbox(sandbox_id)
                    reason = dto.error_reason
                    if state(dto.state) not in DELETED:
                        await client.sandboxes.delete_sandbox(dto.id)
        except NotFound:
            pass
        except ProviderError as err:
            log.warning(
                "sandbox_router.daytona.discard_failed",
                entry=self.name,
                sandbox_id=sandbox_id,
                error=str(err),
            )
            return reason
        log.debug("sandbox_router.daytona.discarded", entry=self.name, sandbox_id=sandbox_id)
        return reason

    async def connect(self, sandbox_id: str) -> DaytonaSandbox:
        client = self._api()
        timeout = self.opts.request_timeout
        with sdk_errors(self.name, sandbox_id):
            async with asyncio.timeout(timeout):
                dto = await client.sandboxes.get_sandbox(sandbox_id)
            if state(dto.state) in STARTABLE:
                async with asyncio.timeout(timeout + 1):
                    dto = await client.sandboxes.start_sandbox(dto.id)
                    dto = await self._until_started(client, dto)
        now = state(dto.state)
        if now in UNUSABLE:
            raise NotFound(
                f"sandbox {sandbox_id} is {now}", provider=self.name, sandbox_id=sandbox_id
            )
        return self._sandbox(client, dto)

    async def resume(self, sandbox_id: str, *, timeout: float) -> DaytonaSandbox:
        """``connect`` starts a stopped (paused) sandbox, on the same id."""
        return await asyncio.wait_for(self.connect(sandbox_id), timeout)

    async def delete_snapshot(self, snapshot_id: str) -> bool:
        """Daytona marks a deleted snapshot ``removing`` and removes it later, and a
        delete of one already removing is no error there: it is gone here (False)."""
        if not snapshot_id:
            return False
        snapshots = self._api().snapshots
        try:
            with sdk_errors(self.name):
                async with asyncio.timeout(self.opts.request_timeout):
                    found = await snapshots.get_snapshot(snapshot_id)
                    if state(found.state) == SNAPSHOT_REMOVING:
                        return False
                    await snapshots.remove_snapshot(found.id)
        except NotFound:
            return False
        log.debug("sandbox_router.daytona.snapshot_deleted", entry=self.name, snapshot=found.id)
        return True

    async def keep_warm(self, template: str | None, size: int) -> int:
        """Size Daytona's warm pool of the snapshot a create of ``template`` starts from.

        Daytona keeps one pool per snapshot and region, and hands one of its
        sandboxes to a create of that snapshot (in the entry's ``target``)
        that asks for the snapshot's own resources, no env, volumes or
        secrets: so a spec with ``env`` is a normal create. The pool is found
        by listing (another replica may have made it; a 409 on create means
        one just did), made when missing, resized when its size differs; 0
        drains it by an update (the SDK's way), so the pool stays for the
        next size. An entry creating from an image has no snapshot to pool.

        Returns:
            The sandboxes Daytona holds ready (``current_size``), as it answered.
        """
        from daytona_api_client_async.models.create_warm_pool import CreateWarmPool
        from daytona_api_client_async.models.update_warm_pool import UpdateWarmPool

        pools = self._api().warm_pools
        with sdk_errors(self.name):
            async with asyncio.timeout(self.opts.request_timeout):
                snapshot = await self._pooled_snapshot(template)
                for _ in range(2):
                    pool = await self._warm_pool(snapshot)
                    if pool is None and size == 0:
                        return 0
                    if pool is None:
                        try:
                            with sdk_errors(self.name):
                                pool = await pools.create_warm_pool(
                                    CreateWarmPool(
                                        snapshot=snapshot, pool=size, target=self._target
                                    )
                                )
                        except ProviderError as err:
                            if err.status == 409:
                                continue
                            raise
                    elif pool.pool != size:
                        pool = await pools.update_warm_pool(pool.id, UpdateWarmPool(pool=size))
                    log.debug(
                        "sandbox_router.daytona.warm_pool",
                        entry=self.name,
                        snapshot=snapshot,
                        size=size,
                        ready=pool.current_size,
                    )
                    return int(pool.current_size)
        raise ProviderError(
            f"Daytona answered 409 for a warm pool of {snapshot} that it does not list",
            provider=self.name,
            status=409,
        )

    async def _pooled_snapshot(self, template: str | None) -> str:
        """The snapshot a create of ``template`` starts from: the template read as
        `_request` reads it, else the entry's snapshot, else Daytona's default (its
        configuration's ``defaultSnapshot``, read once)."""
        opts = self.opts
        image = opts.image
        if template is not None:
            if opts.template_source == "snapshot" or _SNAPSHOT_ID.match(template):
                return template
            image = template
        if image is not None:
            raise ProviderError(
                f"Daytona keeps warm pools of snapshots only; {self.name} creates from "
                f"image {image!r}: give the entry a snapshot",
                provider=self.name,
            )
        if opts.snapshot is not None:
            return opts.snapshot
        if self._default_snapshot is None:
            config = await self._api().config.config_controller_get_config()
            self._default_snapshot = config.default_snapshot
        return self._default_snapshot

    async def _warm_pool(self, snapshot: str) -> WarmPool | None:
        """The organization's pool of ``snapshot`` in the entry's region.

        With no ``target`` set, Daytona's default region is the one pool of the
        snapshot there is; several pools (regions) then need the entry's target.
        """
        target = self._target
        found = [
            pool
            for pool in await self._api().warm_pools.list_warm_pools()
            if pool.snapshot == snapshot and target in (None, pool.target)
        ]
        if len(found) > 1:
            regions = ", ".join(sorted(pool.target for pool in found))
            raise ProviderError(
                f"Daytona has warm pools of {snapshot} in several regions ({regions}): "
                f"set the target of {self.name}",
                provider=self.name,
            )
        return found[0] if found else None

    async def list(self, labels: Mapping[str, str] | None = None) -> builtins.list[SandboxInfo]:
        """The organization's sandboxes (with all of ``labels``), a page at a time."""
        sandboxes = self._api().sandboxes
        query = json.dumps(dict(labels)) if labels else None
        found = []
        cursor: str | None = None
        with sdk_errors(self.name):
            async with asyncio.timeout(self.opts.request_timeout):
                while True:
                    page = await sandboxes.list_sandboxes(labels=query, cursor=cursor)
                    for item in page.items:
                        now = state(item.state)
                        if now not in DELETED:
                            found.append(
                                SandboxInfo(
                                    id=item.id,
                                    labels=dict(item.labels or {}),
                                    state="paused" if now in STARTABLE else now,
                                    created_at=_timestamp(item.created_at),
                                )
                            )
                    cursor = page.next_cursor
                    if not cursor:
                        break
        return sorted(found, key=lambda i: i.created_at or 0.0)

    async def kill(self, sandbox_id: str) -> bool:
        sandboxes = self._api().sandboxes
        try:
            with sdk_errors(self.name, sandbox_id):
                async with asyncio.timeout(self.opts.request_timeout):
                    dto = await sandboxes.get_sandbox(sandbox_id)
                    if state(dto.state) in DELETED:
                        return False
                    await sandboxes.delete_sandbox(dto.id)
        except NotFound:
            return False
        log.debug("sandbox_router.daytona.killed", entry=self.name, sandbox_id=sandbox_id)
        return True


def _timestamp(value: str | None) -> float | None:
    if not value:
        return None
    with contextlib.suppress(ValueError):
        return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    return None
