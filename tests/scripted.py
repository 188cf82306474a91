"""A scripted provider: a real Provider that fails on demand.

Its sandboxes are real local sandboxes; each ``create`` first consumes the
next item of its script: an exception to raise, ``"hang"`` to never answer
(until the router's deadline cancels it), ``"late"`` to create the sandbox
and then never answer (a create that finished on the provider's side after
our deadline), a `threading.Event` to wait for (set from the test's
thread), or ``None`` to succeed. A sandbox's own ``kill`` (the one a
lease's release makes) first waits for ``kill_gate`` when one is given.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, ClassVar

from providers.base import Provider, Sandbox, SandboxInfo, SandboxSpec
from providers.local import LocalOptions, LocalProvider, LocalSandbox


class ScriptedProvider(Provider):
    kind: ClassVar[str] = "scripted"

    def __init__(
        self,
        name: str,
        root: Path,
        script: Iterable[Any] = (),
        *,
        capabilities: Iterable[str] = ("run_code",),
        unconfigured: str | None = None,
        kill_gate: threading.Event | None = None,
    ) -> None:
        super().__init__(name)
        self.script = list(script)
        self.capabilities = frozenset(capabilities)
        self._unconfigured = unconfigured
        self._kill_gate = kill_gate
        self.local = LocalProvider(name, LocalOptions(root=root / name))
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
        sandbox = await self.local.create(spec)
        self.created.append(sandbox.id)
        return self._gated(sandbox)

    async def connect(self, sandbox_id: str) -> Sandbox:
        return self._gated(await self.local.connect(sandbox_id))

    async def list(self, labels: Mapping[str, str] | None = None) -> list[SandboxInfo]:
        return await self.local.list(labels)

    async def kill(self, sandbox_id: str) -> bool:
        return await self.local.kill(sandbox_id)

    def _gated(self, sandbox: Sandbox) -> Sandbox:
        if self._kill_gate is None or not isinstance(sandbox, LocalSandbox):
            return sandbox
        return _GatedSandbox(self.local, sandbox.id, sandbox.meta, self._kill_gate)

    def alive(self) -> list[str]:
        return [s for s in self.created if (self.local.root / s).exists()]


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
