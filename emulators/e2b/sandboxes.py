"""The emulated E2B sandboxes: who owns them, their envd token, processes and kernel.

An E2B sandbox is a `providers.local.LocalSandbox` (real commands, real
files) plus what E2B adds around it: the API key that created it, the
access token envd checks, the template, the processes started through envd
and the code interpreter's contexts (a kernel each). Paths are E2B's: the user's home is
``/home/user`` and relative paths start there; the rest of the sandbox's
filesystem is `emulators.filesystem.GuestSandbox`'s.
"""

from __future__ import annotations

import itertools
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from emulators.filesystem import GuestSandbox
from emulators.harness import EmulatorCore

if TYPE_CHECKING:
    from emulators.e2b.interpreter import Contexts
    from emulators.e2b.processes import RunningProcess

from emulators.e2b.metrics import Metrics
from emulators.e2b.watch import WatcherService

__all__ = [
    "BOOT_ID",
    "E2B_HOME",
    "INTERPRETER_TEMPLATES",
    "PAUSED_KEPT",
    "E2BCore",
    "E2BSandbox",
    "E2BSnapshot",
]

E2B_HOME = "/home/user"
BOOT_ID = "/proc/sys/kernel/random/boot_id"
PAUSED_KEPT = 30 * 24 * 3600  # E2B keeps a paused sandbox until it is killed (30 days here)
INTERPRETER_TEMPLATES = "code-interpreter"  # the prefix of the templates that run a kernel


def _contexts() -> Contexts:
    from emulators.e2b.interpreter import Contexts

    return Contexts()


@dataclass
class E2BSandbox:
    """One emulated E2B sandbox."""

    id: str
    template: str
    api_key: str
    token: str
    local: GuestSandbox
    started_at: float = field(default_factory=time.time)
    cpu_count: int = 2
    memory_mb: int = 512
    processes: dict[int, RunningProcess] = field(default_factory=dict)
    contexts: Contexts = field(default_factory=_contexts)
    traffic_token: str | None = None  # set when public traffic to its ports is restricted
    watchers: WatcherService = field(default_factory=WatcherService)
    metrics: Metrics = field(default_factory=Metrics)
    auto_pause: bool = False  # the timeout pauses it (lifecycle on_timeout "pause")
    auto_pause_memory: bool = True  # ... keeping its memory (False: filesystem only)
    memory_kept: bool = True  # while paused: resuming continues its processes
    auto_resume: bool = False  # traffic to it while paused resumes it
    timeout: int = 15  # the seconds it runs for after an auto-resume
    _pids: itertools.count[int] = field(default_factory=lambda: itertools.count(1000))

    @property
    def has_interpreter(self) -> bool:
        """True when the template runs the code interpreter (a Jupyter server on port 49999)."""
        return self.template.startswith(INTERPRETER_TEMPLATES)

    def next_pid(self) -> int:
        return next(self._pids)

    def host(self, path: str | None, *, write: bool = False) -> Path:
        """The host path of an E2B path (none: the home).

        Raises:
            PathRefused: a write into a read-only system directory.
        """
        return self.local.host(path or E2B_HOME, write=write)

    def boot(self) -> None:
        """A fresh kernel boot id: the sandbox (re)booted, as a cold start does."""
        path = self.host(BOOT_ID, write=True)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"{uuid.uuid4()}\n")

    def shutdown(self) -> None:
        """Kill every process and the kernel (the sandbox is being destroyed); the streams
        watching a process break off before its end, as E2B's proxy loses the sandbox."""
        for process in list(self.processes.values()):
            process.lose(self.id)
            process.local.kill()
        self.processes.clear()
        self.watchers.close()
        self.contexts.close()


@dataclass
class E2BSnapshot:
    """A snapshot: a local copy of a sandbox's files that a create may start from."""

    id: str
    local_id: str
    sandbox_id: str
    api_key: str
    name: str | None
    names: list[str]
    created_at: float = field(default_factory=time.time)


class E2BCore(EmulatorCore):
    """`EmulatorCore` that also stops a sandbox's processes when it is killed or expires."""

    def __init__(self, name: str, root: Path, *, isolation: str = "auto") -> None:
        super().__init__(name, root, isolation=isolation)
        self.e2b: dict[str, E2BSandbox] = {}
        self.snapshots: dict[str, E2BSnapshot] = {}

    async def pause(self, sandbox_id: str, *, memory: bool = True) -> bool:
        """Pause a sandbox (False: it is already paused): its processes stop where they
        are, or, without ``memory``, end (only the files are kept). A paused sandbox
        takes no concurrency slot, envd does not answer, and its timeout stops."""
        sandbox, record = self.e2b[sandbox_id], self.records[sandbox_id]
        if record.paused:
            return False
        if not memory:
            sandbox.shutdown()
        await sandbox.local.pause()
        record.paused = True
        sandbox.memory_kept = memory
        self.set_lifetime(sandbox_id, PAUSED_KEPT)
        return True

    async def resume(self, sandbox_id: str, lifetime: float) -> None:
        """Resume a paused sandbox for ``lifetime`` seconds; one paused without its memory
        boots afresh."""
        sandbox, record = self.e2b[sandbox_id], self.records[sandbox_id]
        await self.waking()
        await sandbox.local.thaw()
        if not sandbox.memory_kept:
            sandbox.boot()
        record.paused = False
        self.set_lifetime(sandbox_id, lifetime)

    async def woken(self, sandbox_id: str) -> bool:
        """True when the sandbox runs: a paused one whose lifecycle auto-resumes (and kept
        its memory) is resumed by the request asking, as E2B's proxy does."""
        sandbox, record = self.e2b[sandbox_id], self.records[sandbox_id]
        if record.paused and sandbox.auto_resume and sandbox.memory_kept:
            await self.resume(sandbox_id, sandbox.timeout)
        return not record.paused

    async def kill(self, sandbox_id: str, ended_by: str = "kill") -> bool:
        sandbox = self.e2b.get(sandbox_id)
        if (
            ended_by == "expired"
            and sandbox is not None
            and sandbox.auto_pause
            and self.get(sandbox_id) is not None
        ):
            return await self.pause(sandbox_id, memory=sandbox.auto_pause_memory)
        if sandbox is not None and self.get(sandbox_id) is not None:
            sandbox.shutdown()
        return await super().kill(sandbox_id, ended_by)

    def alive_sandbox(self, sandbox_id: str) -> E2BSandbox | None:
        """The sandbox if it exists and has neither been killed nor expired."""
        return self.e2b.get(sandbox_id) if self.get(sandbox_id) is not None else None
