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
on the provider's side after the caller gave up), ``"dropped"`` creates it
and then fails as a connection lost before the answer
(`providers.errors.Unavailable` with ``unanswered``), and a `threading.Event`
is waited for (set it from the test's thread). When the script is spent,
every create succeeds. The project's own tests use it, and the adapter
contract suite (tests/contract) runs over it like over every real adapter,
so it behaves as they do.
"""

from __future__ import annotations

import asyncio
import builtins
import shutil
import tempfile
import threading
import weakref
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, ClassVar, Literal, TypeAlias

from providers.base import Provider, Sandbox, SandboxInfo, SandboxSpec
from providers.errors import Unavailable
from providers.local import LocalOptions, LocalProvider, LocalSandbox

__all__ = ["ScriptedProvider", "Step"]

Step: TypeAlias = BaseException | Literal["hang", "late", "dropped"] | threading.Event | None
"""One scripted answer to a ``create`` (see the module docstring)."""


class ScriptedProvider(Provider):
    """A provider that creates local sandboxes and fails on demand.

    Args:
        name: the chain entry it stands in for.
        root: where its sandboxes' directories go (``root / name``); by
            default a temporary directory removed by `aclose`.
        script: the answers of the next creates, in order (`Step`).
        capabilities: what the entry offers to ``acquire(requires=...)``; by
            default what its local sandboxes do (streams, processes, terminals...).
        unconfigured: a reason the entry is unusable (as a missing API key).
        kill_gate: when given, each sandbox's own ``kill`` (the one a lease's
            release makes) first waits for this event.

    Attributes:
        script: the steps not consumed yet; a test may replace it.
        creates: how many creates were asked for.
        connects: how many connects were asked for.
        connected: the ids of the sandboxes a connect answered with, in order
            (a connect is counted in ``connects`` before it answers).
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
        self._remove_root: weakref.finalize[[str], ScriptedProvider] | None = None
        if root is None:
            root = Path(tempfile.mkdtemp(prefix="sandbox-router-scripted-"))
            # gone with the provider (or at exit) even if it is never closed
            self._remove_root = weakref.finalize(self, _remove_tree, str(root))
        self.local = LocalProvider(name, LocalOptions(root=root / name))
        self.capabilities = frozenset(
            self.local.capabilities if capabilities is None else capabilities
        )
        self.local.capabilities = self.capabilities  # its sandboxes refuse what it lacks
        self.creates = 0
        self.connects = 0
        self.connected: list[str] = []
        self.created: list[str] = []

    def unconfigured_reason(self) -> str | None:
        return self._unconfigured

    async def create(self, spec: SandboxSpec, *, timeout: float) -> Sandbox:
        self.creates += 1
        step = self.script.pop(0) if self.script else None
        if step == "hang":
            await asyncio.Event().wait()
        elif step in ("late", "dropped"):
            sandbox = await self.local.create(spec)
            self.created.append(sandbox.id)
            if step == "dropped":
                raise Unavailable("the connection was lost", provider=self.name, unanswered=True)
            await asyncio.Event().wait()
        elif isinstance(step, threading.Event):
            await asyncio.to_thread(step.wait)
        elif isinstance(step, BaseException):
            raise step
        sandbox = await self.local.create(spec)
        self.created.append(sandbox.id)
        return self._gated(sandbox)

    async def connect(self, sandbox_id: str) -> Sandbox:
        self.connects += 1
        sandbox = await self.local.connect(sandbox_id)
        self.connected.append(sandbox.id)
        return self._gated(sandbox)

    async def list(self, labels: Mapping[str, str] | None = None) -> list[SandboxInfo]:
        return await self.local.list(labels)

    async def kill(self, sandbox_id: str) -> bool:
        return await self.local.kill(sandbox_id)

    async def resume(self, sandbox_id: str, *, timeout: float) -> Sandbox:
        return self._gated(await self.local.resume(sandbox_id, timeout=timeout))

    async def delete_snapshot(self, snapshot_id: str) -> bool:
        return await self.local.delete_snapshot(snapshot_id)

    async def aclose(self) -> None:
        """Remove the temporary root it made (a given ``root`` is left alone)."""
        if self._remove_root is not None:
            await asyncio.to_thread(self._remove_root)

    def alive(self) -> builtins.list[str]:
        """The ids of the sandboxes it created that are not killed yet."""
        return [s for s in self.created if (self.local.root / s).exists()]

    def paused(self) -> builtins.list[str]:
        """The ids of the sandboxes it created that are paused."""
        return [s for s in self.alive() if (self.local.root / f"{s}.paused").exists()]

    def _gated(self, sandbox: LocalSandbox) -> Sandbox:
        if self._kill_gate is None:
            return sandbox
        return _GatedSandbox(self.local, sandbox.id, sandbox.meta, self._kill_gate)


class _GatedSandbox(LocalSandbox):
    """A local sandbox whose kill first waits for the provider's ``kill_gate``."""

    def __init__(
        self, provider: LocalProvider, sandbox_id: str, meta: dict[str, Any], gate: threading.Event
    ) -> None:
        super().__init__(provider, sandbox_id, meta)
        self._gate = gate

    async def kill(self) -> None:
        await asyncio.to_thread(self._gate.wait)
        await super().kill()


def _remove_tree(path: str) -> None:
    shutil.rmtree(path, ignore_errors=True)
