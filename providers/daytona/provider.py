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

When a create fails after Daytona accepted it, the sandbox is deleted
before the error is raised: the SDK names it on a timeout and in an
``error``-state message (its error reason is then added to ours); otherwise
(a connection lost while waiting, or a cancelled create) the sandboxes
carrying the create's router lease label are found and deleted.
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import math
from collections.abc import Mapping
from datetime import datetime
from typing import TYPE_CHECKING, Any, ClassVar

from providers.account import KeyedProvider
from providers.base import LABEL_LEASE, ProviderOptions, SandboxInfo, SandboxSpec
from providers.capabilities import AGENT_WORK, FILE_WORK, Capability
from providers.daytona.errors import sdk_errors
from providers.daytona.options import API_KEY_ENV, DaytonaOptions
from providers.daytona.sandbox import DaytonaSandbox
from providers.daytona.states import DELETED, SNAPSHOT_REMOVING, STARTABLE, UNUSABLE, state
from providers.errors import NotFound, ProviderError, Unavailable
from providers.logs import Log

if TYPE_CHECKING:
    from daytona import AsyncDaytona, AsyncSandbox
    from daytona.common.warm_pool import WarmPool

__all__ = ["DaytonaProvider"]

log = Log("sandbox_router.daytona")

CODE_LANGUAGES = frozenset({"python", "javascript", "typescript"})
_KILL_TIMEOUT = 10.0


class DaytonaProvider(KeyedProvider["AsyncDaytona"]):
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

    def _open_client(self, api_key: str) -> AsyncDaytona:
        from daytona import AsyncDaytona, DaytonaConfig

        return AsyncDaytona(
            DaytonaConfig(api_key=api_key, api_url=self.opts.api_url, target=self.opts.target)
        )

    async def _close_client(self, client: AsyncDaytona) -> None:
        await client.close()  # type: ignore[no-untyped-call]  # unannotated in the SDK

    def _params(self, spec: SandboxSpec) -> Any:
        from daytona import CreateSandboxFromImageParams, CreateSandboxFromSnapshotParams, Resources
        from daytona.common.snapshot import is_snapshot_id

        opts = self.opts
        common: dict[str, Any] = {
            "labels": dict(spec.labels),
            "env_vars": dict(spec.env),
            "auto_delete_interval": opts.auto_delete_interval,
            "auto_archive_interval": opts.auto_archive_interval,
        }
        if spec.language in CODE_LANGUAGES:
            common["language"] = spec.language
        auto_stop = opts.auto_stop_interval
        if spec.idle_timeout:
            auto_stop = max(1, math.ceil(spec.idle_timeout / 60))
        common["auto_stop_interval"] = auto_stop
        if spec.lifetime:
            common["ttl_minutes"] = max(1, math.ceil(spec.lifetime / 60))
        image = opts.image
        snapshot = opts.snapshot
        if spec.template is not None:
            as_image = opts.template_source == "image" and not is_snapshot_id(spec.template)
            image, snapshot = (spec.template, None) if as_image else (None, spec.template)
        if image is None:
            return CreateSandboxFromSnapshotParams(snapshot=snapshot, **common)
        resources = None
        if spec.cpu or spec.memory_mb or spec.disk_gb:
            resources = Resources(
                cpu=math.ceil(spec.cpu) if spec.cpu else None,
                memory=math.ceil(spec.memory_mb / 1024) if spec.memory_mb else None,
                disk=spec.disk_gb,
            )
        return CreateSandboxFromImageParams(image=image, resources=resources, **common)

    async def create(self, spec: SandboxSpec, *, timeout: float) -> DaytonaSandbox:
        daytona = self._api()
        params = self._params(spec)
        try:
            with sdk_errors(self.name):
                async with asyncio.timeout(timeout + 0.5):
                    native = await daytona.create(params, timeout=max(timeout, 0.001))
        except asyncio.CancelledError:
            if spec.labels.get(LABEL_LEASE):
                self._in_background(self._sweep(spec))
            raise
        except ProviderError as err:
            reason = await self._clean_up(err, spec)
            if reason and reason not in err.message:
                err.message = f"{err.message} ({reason})"
            raise
        log.debug("sandbox_router.daytona.created", entry=self.name, sandbox_id=native.id)
        return self._sandbox(native, workdir=spec.workdir)

    def _sandbox(self, native: AsyncSandbox, *, workdir: str | None = None) -> DaytonaSandbox:
        return DaytonaSandbox(
            native,
            self.name,
            self._api().snapshot,
            workdir=workdir,
            request_timeout=self.opts.request_timeout,
            transfer_timeout=self.opts.transfer_timeout,
            snapshot_timeout=self.opts.snapshot_timeout,
        )

    async def _clean_up(self, err: ProviderError, spec: SandboxSpec) -> str | None:
        """Delete what a failed create left: the sandbox it names, or its lease's.

        Returns:
            Why Daytona says the named sandbox failed, when it says (its event
            carries only the new state, so the SDK's own error has no reason).
        """
        if err.sandbox_id is not None:
            return await self._discard(err.sandbox_id)
        if isinstance(err, Unavailable):
            await self._sweep(spec)
        return None

    async def _discard(self, sandbox_id: str) -> str | None:
        """Delete a sandbox whose create failed (a failure here is only logged); its error."""
        daytona = self._api()
        reason = None
        try:
            with sdk_errors(self.name, sandbox_id):
                async with asyncio.timeout(_KILL_TIMEOUT):
                    native = await daytona.get(sandbox_id)
                    reason = native.error_reason
                    if state(native.state) not in DELETED:
                        await daytona.delete(native)
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

    async def _sweep(self, spec: SandboxSpec) -> None:
        """Delete the sandboxes of the create's lease (when the router labelled it)."""
        lease = spec.labels.get(LABEL_LEASE)
        if not lease:
            return
        try:
            async with asyncio.timeout(_KILL_TIMEOUT):
                found = await self.list({LABEL_LEASE: lease})
        except (ProviderError, TimeoutError) as exc:
            log.warning(
                "sandbox_router.daytona.sweep_failed", entry=self.name, lease=lease, error=str(exc)
            )
            return
        for info in found:
            await self._discard(info.id)

    async def connect(self, sandbox_id: str) -> DaytonaSandbox:
        daytona = self._api()
        timeout = self.opts.request_timeout
        with sdk_errors(self.name, sandbox_id):
            async with asyncio.timeout(timeout):
                native = await daytona.get(sandbox_id)
            if state(native.state) in STARTABLE:
                async with asyncio.timeout(timeout + 1):
                    await native.start(timeout=timeout)
        now = state(native.state)
        if now in UNUSABLE:
            raise NotFound(
                f"sandbox {sandbox_id} is {now}", provider=self.name, sandbox_id=sandbox_id
            )
        return self._sandbox(native)

    async def resume(self, sandbox_id: str, *, timeout: float) -> DaytonaSandbox:
        """``connect`` starts a stopped (paused) sandbox, on the same id."""
        return await asyncio.wait_for(self.connect(sandbox_id), timeout)

    async def delete_snapshot(self, snapshot_id: str) -> bool:
        """Daytona marks a deleted snapshot ``removing`` and removes it later, and a
        delete of one already removing is no error there: it is gone here (False)."""
        if not snapshot_id:
            return False
        snapshots = self._api().snapshot
        try:
            with sdk_errors(self.name):
                async with asyncio.timeout(self.opts.request_timeout):
                    found = await snapshots.get(snapshot_id)
                    if state(found.state) == SNAPSHOT_REMOVING:
                        return False
                    await snapshots.delete(found)
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
        daytona = self._api()
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
                                pool = await daytona.warm_pool.create(
                                    snapshot, size, target=self.opts.target
                                )
                        except ProviderError as err:
                            if err.status == 409:
                                continue
                            raise
                    elif pool.pool != size:
                        pool = await daytona.warm_pool.update(pool.id, size)
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
        `_params` reads it, else the entry's snapshot, else Daytona's default (its
        configuration's ``defaultSnapshot``, read once)."""
        from daytona.common.snapshot import is_snapshot_id

        opts = self.opts
        image = opts.image
        if template is not None:
            if opts.template_source == "snapshot" or is_snapshot_id(template):
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
            # The SDK reads /config only for itself (`_config_api`); it has no public call.
            config = await self._api()._config_api.config_controller_get_config()
            self._default_snapshot = config.default_snapshot
        return self._default_snapshot

    async def _warm_pool(self, snapshot: str) -> WarmPool | None:
        """The organization's pool of ``snapshot`` in the entry's region.

        With no ``target`` set, Daytona's default region is the one pool of the
        snapshot there is; several pools (regions) then need the entry's target.
        """
        target = self.opts.target
        found = [
            pool
            for pool in await self._api().warm_pool.list()
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
        from daytona import ListSandboxesQuery

        query = ListSandboxesQuery(labels=dict(labels or {}) or None)
        found = []
        with sdk_errors(self.name):
            async with asyncio.timeout(self.opts.request_timeout):
                async for native in self._api().list(query):
                    now = state(native.state)
                    if now not in DELETED:
                        found.append(
                            SandboxInfo(
                                id=native.id,
                                labels=dict(native.labels or {}),
                                state="paused" if now in STARTABLE else now,
                                created_at=_timestamp(native.created_at),
                            )
                        )
        return sorted(found, key=lambda i: i.created_at or 0.0)

    async def kill(self, sandbox_id: str) -> bool:
        daytona = self._api()
        try:
            with sdk_errors(self.name, sandbox_id):
                async with asyncio.timeout(self.opts.request_timeout):
                    native = await daytona.get(sandbox_id)
                    if state(native.state) in DELETED:
                        return False
                    await daytona.delete(native)
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
