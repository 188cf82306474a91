"""`LocalProvider`: sandboxes on this host, each a directory under the provider's root.

A sandbox's metadata (``<id>.json``: labels, env, its cgroup's path) is
beside its directory, outside the tree its commands may write, so a command
cannot rewrite its own labels and any process on the host can list,
connect to and kill it by id. A snapshot is a copy of a directory under
``<root>/.snapshots/``.
"""

from __future__ import annotations

import asyncio
import builtins
import functools
import hashlib
import json
import logging
import os
import re
import secrets
import shutil
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

from providers.base import Provider, ProviderOptions, SandboxInfo, SandboxSpec
from providers.capabilities import AGENT_WORK, FILE_WORK, Capability
from providers.errors import ConfigError, NotFound
from providers.local.isolation import bwrap_available, cgroup_base
from providers.local.options import LocalOptions
from providers.local.paths import copy_tree
from providers.local.sandbox import LocalSandbox

__all__ = ["LocalProvider"]

_log = logging.getLogger(__name__)

_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,127}")
_SNAPSHOT = re.compile(r"local-snap-[0-9a-f]{16}")
_SNAPSHOTS = ".snapshots"  # under the root; a dot name, so never taken for a sandbox

_CAPABILITIES = (
    frozenset(
        {Capability.RUN_CODE, Capability.STATEFUL_CODE, Capability.PAUSE, Capability.SNAPSHOT}
    )
    | FILE_WORK
    | AGENT_WORK
)


def _default_root() -> Path:
    return Path(tempfile.gettempdir()) / f"sandbox-router-{os.getuid()}" / "local"


class LocalProvider(Provider):
    """Sandboxes on this host: always configured, the chain's last resort.

    ``capabilities`` on the class is what every entry has; an entry whose
    sandboxes share the host's network (no bwrap, or ``network: true``) adds
    ``port``.
    """

    kind: ClassVar[str] = "local"
    Options: ClassVar[type[ProviderOptions]] = LocalOptions
    capabilities: frozenset[str] = _CAPABILITIES

    def __init__(self, name: str = "local", options: ProviderOptions | None = None) -> None:
        super().__init__(name, options)
        opts = self.opts
        self.root = (opts.root or _default_root()).resolve()
        self.snapshots = self.root / _SNAPSHOTS
        self.use_bwrap = _resolve_isolation(opts.isolation, name)
        self.cgroup_base = cgroup_base() if opts.cgroup else None
        self._root_hash = hashlib.sha256(str(self.root).encode()).hexdigest()[:12]
        self.share_net = opts.network or not self.use_bwrap
        if self.share_net:
            self.capabilities = _CAPABILITIES | {Capability.PORT}

    def marker(self, sandbox_id: str) -> str:
        """The value of ``SANDBOX_ROUTER_SANDBOX`` in the sandbox's processes: unique per root."""
        return f"{sandbox_id}.{self._root_hash}"

    @property
    def opts(self) -> LocalOptions:
        assert isinstance(self.options, LocalOptions)
        return self.options

    async def create(
        self, spec: SandboxSpec, *, timeout: float = 60.0, sandbox_id: str | None = None
    ) -> LocalSandbox:
        """Create a sandbox directory; ``sandbox_id`` lets an emulator mint vendor-shaped ids.

        A ``template`` naming a snapshot (`LocalSandbox.snapshot`) starts from
        a copy of it; any other template is ignored (there are no images here).

        Raises:
            NotFound: the snapshot ``template`` names is gone.
        """
        sandbox_id = sandbox_id or "local-" + secrets.token_hex(8)
        if not _ID.fullmatch(sandbox_id):
            raise ValueError(f"invalid local sandbox id {sandbox_id!r}")
        copied = spec.template is not None and spec.template.startswith("local-snap-")
        if copied:
            assert spec.template is not None
            await asyncio.to_thread(self._copy_snapshot, spec.template, sandbox_id)
        meta = {
            "id": sandbox_id,
            "labels": dict(spec.labels),
            "env": dict(spec.env),
            "created_at": time.time(),
            "language": spec.language,
            "cgroup": os.path.join(self.cgroup_base, "sandbox-router." + self.marker(sandbox_id))
            if self.cgroup_base
            else None,
        }
        # A mkdir and a small file: cheaper inline than a hop to a worker thread.
        self._write_meta(sandbox_id, meta, made=copied)
        return LocalSandbox(self, sandbox_id, meta)

    def _snapshot_dir(self, snapshot_id: str) -> Path:
        return self.snapshots / snapshot_id

    def _copy_snapshot(self, snapshot_id: str, sandbox_id: str) -> None:
        source = self._snapshot_dir(snapshot_id)
        if not _SNAPSHOT.fullmatch(snapshot_id) or not source.is_dir():
            raise NotFound(f"no local snapshot {snapshot_id!r}", provider=self.name)
        target = self.root / sandbox_id
        try:
            copy_tree(source, target)
        except BaseException:
            shutil.rmtree(target, ignore_errors=True)
            raise
        os.chmod(target, 0o700)

    def _write_meta(self, sandbox_id: str, meta: dict[str, Any], *, made: bool = False) -> None:
        root = str(self.root)
        try:
            if not made:
                os.mkdir(os.path.join(root, sandbox_id), mode=0o700)
        except FileNotFoundError:  # the first sandbox under this root
            os.makedirs(os.path.join(root, sandbox_id), mode=0o700)
        tmp = os.path.join(root, f".{sandbox_id}.json.tmp")
        with open(tmp, "w") as f:
            f.write(json.dumps(meta))
        os.replace(tmp, os.path.join(root, f"{sandbox_id}.json"))

    def _read_meta(self, sandbox_id: str) -> dict[str, Any]:
        if not _ID.fullmatch(sandbox_id):
            raise NotFound(f"no local sandbox {sandbox_id!r}", provider=self.name)
        try:
            meta: dict[str, Any] = json.loads((self.root / f"{sandbox_id}.json").read_text())
        except FileNotFoundError:
            raise NotFound(
                f"no local sandbox {sandbox_id!r}", provider=self.name, sandbox_id=sandbox_id
            ) from None
        return meta

    async def connect(self, sandbox_id: str) -> LocalSandbox:
        meta = await asyncio.to_thread(self._read_meta, sandbox_id)
        sandbox = LocalSandbox(self, sandbox_id, meta)
        sandbox._check_alive()
        return sandbox

    async def list(self, labels: Mapping[str, str] | None = None) -> list[SandboxInfo]:
        return await asyncio.to_thread(self._list, dict(labels or {}))

    def _list(self, labels: dict[str, str]) -> builtins.list[SandboxInfo]:
        found = []
        for meta_path in sorted(self.root.glob("[!.]*.json")) if self.root.exists() else []:
            try:
                meta = json.loads(meta_path.read_text())
            except (OSError, ValueError):
                continue
            if all(meta["labels"].get(k) == v for k, v in labels.items()):
                paused = os.path.exists(self.root / f"{meta['id']}.paused")
                state = "paused" if paused else "running"
                found.append(SandboxInfo(meta["id"], meta["labels"], state, meta["created_at"]))
        return found

    async def kill(self, sandbox_id: str) -> bool:
        """Kill by id (the janitor's reap, maybe in another process than the creator's).

        The metadata is enough: it names the cgroup, and a kill that stopped
        halfway (its directory gone, the metadata left) is finished.
        """
        try:
            meta = self._read_meta(sandbox_id)
        except NotFound:
            return False
        await LocalSandbox(self, sandbox_id, meta).kill()
        return True

    async def resume(self, sandbox_id: str, *, timeout: float) -> LocalSandbox:
        """Thaw a paused sandbox's processes (at once: nothing to load), on the same id."""
        sandbox = await self.connect(sandbox_id)
        await sandbox.thaw()
        return sandbox

    async def delete_snapshot(self, snapshot_id: str) -> bool:
        if not _SNAPSHOT.fullmatch(snapshot_id):
            return False
        doomed = self.snapshots / f".{snapshot_id}.{secrets.token_hex(4)}.dead"
        try:
            os.rename(self._snapshot_dir(snapshot_id), doomed)
        except FileNotFoundError:
            return False
        await asyncio.to_thread(shutil.rmtree, doomed, ignore_errors=True)
        return True


def _resolve_isolation(isolation: str, name: str) -> bool:
    if isolation == "none":
        return False
    if bwrap_available():
        return True
    if isolation == "bwrap":
        raise ConfigError(f"entry {name!r}: isolation 'bwrap' requested but bwrap is not on PATH")
    _warn_no_bwrap()
    return False


@functools.cache
def _warn_no_bwrap() -> None:
    """Said once per process (every provider would otherwise repeat it), through the
    standard ``logging`` module: the app's handlers if it set any, else one plain line."""
    _log.warning(
        "bubblewrap (bwrap) is not on PATH: local sandboxes run without namespace "
        "isolation, with rlimits and a private directory only"
    )
