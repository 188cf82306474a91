"""Test your app against the router without any cloud provider.

`ScriptedProvider` is a real `Provider` whose sandboxes are ``local`` ones
(real commands in a private directory) and whose ``create`` fails on
demand, step by step, from a script. Put it in place of a chain entry's
adapter (as httpx's ``MockTransport`` stands in for the network) and drive
the router's failover, quota and error paths from your own tests::

    from providers.errors import Unavailable
    from router import Router
    from router.testing import ScriptedProvider

    flaky = ScriptedProvider("primary", script=[Unavailable("down"), "hang"])
    router = Router.from_config(
        {
            "state_url": "memory://",
            "create_timeout": 1,
            "chain": [
                {"name": "primary", "provider": "local"},  # the kind its options are checked as
                {"name": "local", "provider": "local"},
            ],
        },
        providers={"primary": flaky},
    )

A step is consumed by each ``create``: ``None`` succeeds, an exception is
raised, ``"hang"`` never answers (until the router's deadline cancels it),
``"late"`` creates the sandbox and then never answers (a create that lands
on the provider's side after the caller gave up), and a `threading.Event`
is waited for (set it from the test's thread). When the script is spent,
every create succeeds. The project's own tests use it, and the adapter
contract suite (tests/contract) runs over it like over every real adapter,
so it behaves as they do.

Its sandboxes do the agent-work calls for real on their directory: files are
stored, streamed and packed; ``pause`` marks the sandbox paused on disk
(every call but a resume is refused until then, from any process sharing the
root) and `list` says so; a snapshot is a copy of the directory that a
create with ``SandboxSpec(template=snapshot.id)`` starts from; ``expose``
gives the loopback URL (declared only when its sandboxes share the host's
network, i.e. without bwrap).
"""

from __future__ import annotations

import asyncio
import builtins
import dataclasses
import os
import secrets
import shutil
import stat
import tempfile
import threading
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, BinaryIO, ClassVar, Literal, TypeAlias, TypeVar

from providers.base import (
    FileInfo,
    PortURL,
    Provider,
    Sandbox,
    SandboxInfo,
    SandboxSpec,
    Snapshot,
    check_port,
)
from providers.capabilities import Capability
from providers.errors import NotFound, SandboxError, Unsupported
from providers.files import CHUNK, Chunks
from providers.local import HOME, LocalOptions, LocalProvider, LocalSandbox

__all__ = ["ScriptedProvider", "Step"]

Step: TypeAlias = BaseException | Literal["hang", "late"] | threading.Event | None
"""One scripted answer to a ``create`` (see the module docstring)."""

T = TypeVar("T")
_SNAP = "scripted-snap-"


class ScriptedProvider(Provider):
    """A provider that creates local sandboxes and fails on demand.

    Args:
        name: the chain entry it stands in for.
        root: where its sandboxes' directories go (``root / name``); by
            default a temporary directory removed by `aclose`.
        script: the answers of the next creates, in order (`Step`).
        capabilities: what the entry offers to ``acquire(requires=...)``; by
            default what its local sandboxes do (streams, processes, terminals...)
            and the files, pause and snapshot calls (``port`` too without bwrap).
        unconfigured: a reason the entry is unusable (as a missing API key).
        kill_gate: when given, each sandbox's own ``kill`` (the one a lease's
            release makes) first waits for this event.

    Attributes:
        script: the steps not consumed yet; a test may replace it.
        creates: how many creates were asked for.
        created: the ids of every sandbox it created.
    """

    kind: ClassVar[str] = "scripted"

    def __init__(
        self,
        name: str = "scripted",
        root: Path | None = None,
        script: Iterable[Step] = (),
        *,
        capabilities: Iterable[str] | None = None,
        unconfigured: str | None = None,
        kill_gate: threading.Event | None = None,
    ) -> None:
        super().__init__(name)
        self.script: list[Step] = list(script)
        self._unconfigured = unconfigured
        self._kill_gate = kill_gate
        self._own_root = None
        if root is None:
            root = self._own_root = Path(tempfile.mkdtemp(prefix="sandbox-router-scripted-"))
        self.local = LocalProvider(name, LocalOptions(root=root / name))
        if capabilities is None:
            own = {Capability.FILES_MANAGE, Capability.FILES_STREAM, Capability.PAUSE}
            own |= {Capability.SNAPSHOT} | (set() if self.local.use_bwrap else {Capability.PORT})
            capabilities = LocalProvider.capabilities | own
        self.capabilities = frozenset(capabilities)
        self.creates = 0
        self.created: list[str] = []

    def unconfigured_reason(self) -> str | None:
        return self._unconfigured

    async def create(self, spec: SandboxSpec, *, timeout: float) -> Sandbox:
        self.creates += 1
        step = self.script.pop(0) if self.script else None
        if step == "hang":
            await asyncio.Event().wait()
        elif step == "late":
            sandbox = await self.local.create(spec)
            self.created.append(sandbox.id)
            await asyncio.Event().wait()
        elif isinstance(step, threading.Event):
            await asyncio.to_thread(step.wait)
        elif isinstance(step, BaseException):
            raise step
        snapshot = spec.template if spec.template and spec.template.startswith(_SNAP) else None
        if snapshot is not None and not self._snapshot(snapshot).is_dir():
            raise NotFound(f"no scripted snapshot {snapshot!r}", provider=self.name)
        sandbox = await self.local.create(dataclasses.replace(spec, template=None))
        if snapshot is not None:
            await asyncio.to_thread(_copy_into, self._snapshot(snapshot), sandbox.dir)
        self.created.append(sandbox.id)
        return self._wrap(sandbox)

    async def connect(self, sandbox_id: str) -> Sandbox:
        return self._wrap(await self.local.connect(sandbox_id))

    async def resume(self, sandbox_id: str, *, timeout: float) -> Sandbox:
        sandbox = self._wrap(await self.local.connect(sandbox_id))
        self.paused_mark(sandbox_id).unlink(missing_ok=True)
        return sandbox

    async def delete_snapshot(self, snapshot_id: str) -> bool:
        if not snapshot_id.startswith(_SNAP) or not self._snapshot(snapshot_id).is_dir():
            return False
        await asyncio.to_thread(shutil.rmtree, self._snapshot(snapshot_id))
        return True

    async def list(self, labels: Mapping[str, str] | None = None) -> list[SandboxInfo]:
        found = await self.local.list(labels)
        paused = [self.paused_mark(info.id).exists() for info in found]
        return [
            dataclasses.replace(info, state="paused") if stopped else info
            for info, stopped in zip(found, paused, strict=True)
        ]

    async def kill(self, sandbox_id: str) -> bool:
        self.paused_mark(sandbox_id).unlink(missing_ok=True)
        return await self.local.kill(sandbox_id)

    def paused_mark(self, sandbox_id: str) -> Path:
        """The file that says a sandbox is paused (a dot name: never listed as a sandbox)."""
        return self.local.root / f".{sandbox_id}.paused"

    def _snapshot(self, snapshot_id: str) -> Path:
        return self.local.root / ".snapshots" / snapshot_id

    async def aclose(self) -> None:
        """Remove the temporary root it made (a given ``root`` is left alone)."""
        if self._own_root is not None:
            await asyncio.to_thread(shutil.rmtree, self._own_root, ignore_errors=True)

    def alive(self) -> builtins.list[str]:
        """The ids of the sandboxes it created that are not killed yet."""
        return [s for s in self.created if (self.local.root / s).exists()]

    def paused(self) -> builtins.list[str]:
        """The ids of the sandboxes it created that are paused."""
        return [s for s in self.alive() if self.paused_mark(s).exists()]

    def _wrap(self, sandbox: LocalSandbox) -> Sandbox:
        return _ScriptedSandbox(self, sandbox.id, sandbox.meta)


class _ScriptedSandbox(LocalSandbox):
    """A local sandbox with the files, port, pause and snapshot calls done on its directory."""

    def __init__(self, owner: ScriptedProvider, sandbox_id: str, meta: dict[str, Any]) -> None:
        super().__init__(owner.local, sandbox_id, meta)
        self._owner = owner

    def _check_alive(self) -> None:
        super()._check_alive()
        if self._owner.paused_mark(self.id).exists():
            raise SandboxError(
                f"scripted sandbox {self.id} is paused", provider=self.provider, sandbox_id=self.id
            )

    async def kill(self) -> None:
        if self._owner._kill_gate is not None:
            await asyncio.to_thread(self._owner._kill_gate.wait)
        self._owner.paused_mark(self.id).unlink(missing_ok=True)
        await super().kill()

    async def _on_disk(self, op: str, path: str, work: Callable[[], T]) -> T:
        """``work`` on a worker thread; a missing path or an OS refusal names ``path``."""
        self._check_alive()
        try:
            return await asyncio.to_thread(work)
        except OSError as exc:
            raise SandboxError(
                f"{op} {path}: {exc.strerror or exc}", provider=self.provider, sandbox_id=self.id
            ) from None

    def _info(self, host: Path) -> FileInfo:
        st = host.lstat()
        relative = host.relative_to(self.dir.resolve())
        return FileInfo(
            name=host.name or "sandbox",
            path=f"{HOME}/{relative}" if relative != Path() else HOME,
            is_dir=stat.S_ISDIR(st.st_mode),
            size=st.st_size,
            mode=stat.S_IMODE(st.st_mode),
            modified=st.st_mtime,
        )

    async def remove(self, path: str) -> None:
        target = self.resolve(path)

        def remove() -> None:
            if target.is_dir() and not target.is_symlink():
                shutil.rmtree(target)
            else:
                target.unlink()

        await self._on_disk("remove", path, remove)

    async def make_dir(self, path: str) -> bool:
        target = self.resolve(path)

        def make() -> bool:
            existed = target.is_dir()
            target.mkdir(parents=True, exist_ok=True)
            return not existed

        return await self._on_disk("make_dir", path, make)

    async def exists(self, path: str) -> bool:
        return await self._on_disk("exists", path, self.resolve(path).exists)

    async def rename(self, src: str, dst: str) -> FileInfo:
        source, target = self.resolve(src), self.resolve(dst)

        def move() -> FileInfo:
            os.replace(source, target)
            return self._info(target)

        return await self._on_disk("rename", src, move)

    async def stat(self, path: str) -> FileInfo:
        target = self.resolve(path)
        return await self._on_disk("stat", path, lambda: self._info(target))

    async def read_stream(self, path: str) -> AsyncIterator[bytes]:
        target = self.resolve(path)
        handle: BinaryIO = await self._on_disk("read_stream", path, lambda: target.open("rb"))
        try:
            while chunk := await asyncio.to_thread(handle.read, CHUNK):
                yield chunk
        finally:
            handle.close()

    async def write_stream(self, path: str, chunks: Chunks) -> None:
        target = self.resolve(path)

        def open_target() -> BinaryIO:
            target.parent.mkdir(parents=True, exist_ok=True)
            return target.open("wb")

        handle = await self._on_disk("write_stream", path, open_target)
        try:
            async for chunk in chunks:
                await asyncio.to_thread(handle.write, chunk)
        finally:
            handle.close()

    async def expose(self, port: int) -> PortURL:
        if Capability.PORT not in self._owner.capabilities:
            raise Unsupported(self.provider, Capability.PORT)
        check_port(port, "expose(port)")
        self._check_alive()
        return PortURL(port, f"http://127.0.0.1:{port}")

    async def pause(self) -> None:
        self._check_alive()
        self._owner.paused_mark(self.id).touch()

    async def snapshot(self, name: str | None = None) -> Snapshot:
        snapshot_id = _SNAP + secrets.token_hex(8)
        target = self._owner._snapshot(snapshot_id)
        await self._on_disk("snapshot", ".", lambda: _copy_into(self.dir, target))
        return Snapshot(snapshot_id, self.provider, name)


def _copy_into(source: Path, target: Path) -> None:
    shutil.copytree(source, target, symlinks=True, dirs_exist_ok=True)
