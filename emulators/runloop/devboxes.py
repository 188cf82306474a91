"""The emulated Runloop devboxes and the command executions running in them.

A devbox is a `providers.local.LocalSandbox` (real commands, real files)
plus what Runloop keeps around it: the API key that owns it, its status
(``provisioning`` -> ``running`` -> ``shutdown`` or ``failure``) with the
transitions, its launch parameters and the executions started in it.

Lifetimes are Runloop's: ``keep_alive_time_seconds`` caps a devbox's life
(one hour when unset) and ``after_idle`` shuts it down after that many
seconds without activity (a command, a file operation or a ``keep_alive``
call). Both end up in the harness record's ``expires_at``, so the shared
reaper ends them.

Paths are Runloop's: the user's home is ``/home/user`` and relative paths
start there; the rest of the devbox's filesystem is
`emulators.filesystem.GuestSandbox`'s.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import string
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from emulators.filesystem import GuestSandbox
from emulators.harness import EmulatorCore
from providers.local import LocalProcess

__all__ = [
    "DEFAULT_KEEP_ALIVE",
    "RUNLOOP_HOME",
    "Devbox",
    "Execution",
    "RunloopCore",
    "new_id",
]

RUNLOOP_HOME = "/home/user"
DEFAULT_KEEP_ALIVE = 3600
TERMINAL = frozenset({"shutdown", "failure"})
_ALPHABET = string.ascii_lowercase + string.digits
_OUTPUT_CAP = 10 * 1024 * 1024


def new_id(prefix: str) -> str:
    return prefix + "_" + "".join(secrets.choice(_ALPHABET) for _ in range(24))


def now_ms() -> int:
    return int(time.time() * 1000)


class Changes:
    """Wakes long-polls when the thing they watch changes."""

    def __init__(self) -> None:
        self._event = asyncio.Event()

    def notify(self) -> None:
        self._event.set()
        self._event = asyncio.Event()

    async def wait_for(self, predicate: Callable[[], bool], timeout: float) -> bool:
        """True once ``predicate`` holds; False if ``timeout`` seconds pass first."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while not predicate():
            left = deadline - loop.time()
            if left <= 0:
                return False
            event = self._event
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(event.wait(), left)
        return True


@dataclass
class Execution:
    """One command started in a devbox, its output captured as it comes."""

    id: str
    devbox_id: str
    command_id: str | None
    process: LocalProcess
    stdout: bytearray = field(default_factory=bytearray)
    stderr: bytearray = field(default_factory=bytearray)
    exit_status: int | None = None
    stdin_attached: bool = False
    changes: Changes = field(default_factory=Changes)
    task: asyncio.Task[None] | None = None

    @property
    def status(self) -> str:
        return "completed" if self.exit_status is not None else "running"

    def progressed(self, stream: str, offset: int) -> bool:
        """True once ``stream`` holds more than ``offset`` bytes or the command ended."""
        return len(getattr(self, stream)) > offset or self.exit_status is not None

    async def collect(self, on_done: Callable[[], None]) -> None:
        """Read both streams to the end, then record the exit status."""
        proc = self.process.proc
        assert proc.stdout is not None
        assert proc.stderr is not None
        await asyncio.gather(
            self._read(proc.stdout, self.stdout), self._read(proc.stderr, self.stderr)
        )
        code = await proc.wait()
        self.process.kill()
        self.exit_status = 128 - code if code < 0 else code
        self.changes.notify()
        on_done()

    async def _read(self, stream: asyncio.StreamReader, buf: bytearray) -> None:
        while chunk := await stream.read(65536):
            buf += chunk[: max(_OUTPUT_CAP - len(buf), 0)]
            self.changes.notify()

    async def send_stdin(self, data: bytes | None) -> bool:
        """Write ``data`` to the command's stdin, or close it (None); False when the pipe broke."""
        stdin = self.process.proc.stdin
        assert stdin is not None
        try:
            if data is None:
                stdin.close()
            else:
                stdin.write(data)
                await stdin.drain()
        except (BrokenPipeError, ConnectionResetError):
            return False
        return True

    async def kill(self) -> None:
        self.process.kill()
        if self.task is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await self.task


@dataclass
class Devbox:
    """One emulated devbox; ``source`` is the blueprint or snapshot its create named."""

    id: str
    api_key: str
    local: GuestSandbox
    metadata: dict[str, str]
    launch_parameters: dict[str, Any]
    keep_alive: int
    idle_seconds: int | None
    source: dict[str, str] = field(default_factory=dict)
    name: str | None = None
    status: str = "provisioning"
    created_ms: int = field(default_factory=now_ms)
    end_ms: int | None = None
    failure_reason: str | None = None
    shutdown_reason: str | None = None
    last_activity: float = field(default_factory=time.time)
    transitions: list[dict[str, Any]] = field(default_factory=list)
    executions: dict[str, Execution] = field(default_factory=dict)
    by_command_id: dict[str, str] = field(default_factory=dict)
    changes: Changes = field(default_factory=Changes)
    boot: asyncio.Task[None] | None = None

    def __post_init__(self) -> None:
        self.transitions.append({"status": self.status, "transition_time_ms": self.created_ms})

    def set_status(self, status: str, **reasons: str | None) -> None:
        self.status = status
        self.transitions.append({"status": status, "transition_time_ms": now_ms()})
        for key, value in reasons.items():
            setattr(self, key, value)
        if status in TERMINAL:
            self.end_ms = now_ms()
        self.changes.notify()

    @property
    def lifetime_end(self) -> float:
        return self.created_ms / 1000 + self.keep_alive

    @property
    def idle_end(self) -> float | None:
        return None if self.idle_seconds is None else self.last_activity + self.idle_seconds

    def expires_at(self) -> float:
        idle_end = self.idle_end
        return self.lifetime_end if idle_end is None else min(self.lifetime_end, idle_end)

    def view(self) -> dict[str, Any]:
        """The devbox as the API shows it (``DevboxView``)."""
        return {
            "id": self.id,
            "name": self.name,
            "status": self.status,
            "capabilities": [],
            "create_time_ms": self.created_ms,
            "end_time_ms": self.end_ms,
            "launch_parameters": self.launch_parameters,
            "metadata": self.metadata,
            "state_transitions": self.transitions,
            "blueprint_id": self.source.get("blueprint_id"),
            "snapshot_id": self.source.get("snapshot_id"),
            "failure_reason": self.failure_reason,
            "shutdown_reason": self.shutdown_reason,
            "initiator_type": "api",
        }


class RunloopCore(EmulatorCore):
    """`EmulatorCore` that also tracks devbox status, executions and idle time."""

    def __init__(self, name: str, root: Path, *, isolation: str = "auto") -> None:
        super().__init__(name, root, isolation=isolation)
        self.devboxes: dict[str, Devbox] = {}
        self.created_by_request: dict[tuple[str, str], str] = {}

    def add(self, devbox: Devbox) -> None:
        self.devboxes[devbox.id] = devbox
        self.refresh(devbox)

    def refresh(self, devbox: Devbox) -> None:
        """Recompute when the reaper ends ``devbox`` (after activity or a new limit)."""
        record = self.records.get(devbox.id)
        if record is not None and record.alive:
            record.expires_at = devbox.expires_at()

    def touch(self, devbox: Devbox) -> None:
        devbox.last_activity = time.time()
        self.refresh(devbox)

    def owned(self, devbox_id: str, api_key: str) -> Devbox | None:
        devbox = self.devboxes.get(devbox_id)
        return devbox if devbox is not None and devbox.api_key == api_key else None

    async def kill(self, sandbox_id: str, ended_by: str = "kill") -> bool:
        devbox = self.devboxes.get(sandbox_id)
        if devbox is not None and devbox.status not in TERMINAL:
            if devbox.boot is not None:
                devbox.boot.cancel()
            reason = "api_shutdown"
            if ended_by == "expired":
                idle_end = devbox.idle_end
                reason = (
                    "idle"
                    if idle_end is not None and idle_end <= time.time()
                    else "keep_alive_timeout"
                )
            devbox.set_status("shutdown", shutdown_reason=reason)
            for execution in list(devbox.executions.values()):
                execution.process.kill()
        return await super().kill(sandbox_id, ended_by)

    async def fail(self, devbox: Devbox, reason: str) -> None:
        """The devbox failed to boot: it ends in ``failure``, its sandbox is gone."""
        devbox.set_status("failure", failure_reason=reason)
        await super().kill(devbox.id, "failure")
