"""The emulated Runloop devboxes and the command executions running in them.

A devbox is a `providers.local.LocalSandbox` (real commands, real files)
plus what Runloop keeps around it: the API key that owns it, its status
(``provisioning`` -> ``running`` -> ``shutdown`` or ``failure``) with the
transitions, its launch parameters, the executions started in it and its
tunnel.

Suspending a devbox (``suspend``) ends every execution in it, as on Runloop
(the disk is kept, not the memory), and a suspended devbox does not count
toward the account's concurrency cap (waking it is refused at the cap). A
disk snapshot (`DiskSnapshot`) is a copy of the devbox's directory, kept by
the core until it is deleted; a devbox created from it starts with that copy
as its filesystem, as one created from a built blueprint starts with a copy
of the blueprint's disk (`emulators.runloop.blueprints`).

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
import os
import secrets
import shutil
import string
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from emulators.filesystem import GuestSandbox
from emulators.harness import EmulatorCore
from providers.local import LocalProcess

if TYPE_CHECKING:
    from emulators.runloop.blueprints import Blueprint
    from emulators.runloop.objects import StoredObject

__all__ = [
    "DEFAULT_KEEP_ALIVE",
    "RUNLOOP_HOME",
    "Devbox",
    "DiskSnapshot",
    "Execution",
    "RunloopCore",
    "new_id",
]

RUNLOOP_HOME = "/home/user"
DEFAULT_KEEP_ALIVE = 3600
TERMINAL = frozenset({"shutdown", "failure"})
ASLEEP = frozenset({"suspending", "suspended"})
_ALPHABET = string.ascii_lowercase + string.digits
_OUTPUT_CAP = 10 * 1024 * 1024
_LOG_LINE_CAP = 10_000


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
    command: str = ""
    source: str = "exec"
    started_ms: int = field(default_factory=now_ms)
    log: list[dict[str, Any]] = field(default_factory=list)
    changes: Changes = field(default_factory=Changes)
    task: asyncio.Task[None] | None = None

    def __post_init__(self) -> None:
        self.log.append(self._entry("info", cmd=self.command, timestamp_ms=self.started_ms))

    def _entry(self, level: str, **fields: Any) -> dict[str, Any]:
        """A ``DevboxLogsListView`` log line (with ``shell_name``, which older SDKs read)."""
        return {
            "level": level,
            "source": self.source,
            "timestamp_ms": now_ms(),
            "cmd_id": self.id,
            "shell_name": None,
        } | fields

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
            self._read(proc.stdout, self.stdout, "info"),
            self._read(proc.stderr, self.stderr, "error"),
        )
        code = await proc.wait()
        self.process.end_group()
        self.exit_status = 128 - code if code < 0 else code
        self.log.append(self._entry("info", cmd=self.command, exit_code=self.exit_status))
        self.changes.notify()
        on_done()

    async def _read(self, stream: asyncio.StreamReader, buf: bytearray, level: str) -> None:
        """Keep the stream's bytes (to the cap) and log each of its lines at ``level``."""
        logged = 0
        while chunk := await stream.read(65536):
            buf += chunk[: max(_OUTPUT_CAP - len(buf), 0)]
            end = buf.rfind(b"\n") + 1
            if end > logged:
                self._log_lines(buf[logged:end], level)
                logged = end
            self.changes.notify()
        if len(buf) > logged:
            self._log_lines(buf[logged:], level)

    def _log_lines(self, data: bytearray, level: str) -> None:
        """Log lines past `_LOG_LINE_CAP` are dropped: the output itself stays whole."""
        for line in data.decode("utf-8", "replace").splitlines():
            if len(self.log) >= _LOG_LINE_CAP:
                return
            self.log.append(self._entry(level, message=line))

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
class Tunnel:
    """A devbox's V2 tunnel: ``{port}-{key}.tunnel.{domain}`` reaches its ports."""

    key: str
    auth_mode: str
    auth_token: str | None
    http_keep_alive: bool
    wake_on_http: bool
    created_ms: int = field(default_factory=now_ms)

    def view(self) -> dict[str, Any]:
        """``TunnelView``."""
        return {
            "tunnel_key": self.key,
            "auth_mode": self.auth_mode,
            "auth_token": self.auth_token,
            "http_keep_alive": self.http_keep_alive,
            "wake_on_http": self.wake_on_http,
            "create_time_ms": self.created_ms,
        }


@dataclass
class DiskSnapshot:
    """A devbox's disk kept in ``path`` (a copy of its root); ``status`` as the async API says."""

    id: str
    api_key: str
    source_devbox_id: str
    path: Path
    name: str | None
    metadata: dict[str, str]
    commit_message: str | None
    source_blueprint_id: str | None
    status: str = "in_progress"
    error_message: str | None = None
    size_bytes: int | None = None
    created_ms: int = field(default_factory=now_ms)
    done: asyncio.Event = field(default_factory=asyncio.Event)
    copy: asyncio.Task[None] | None = None

    def view(self) -> dict[str, Any]:
        """``DevboxSnapshotView``."""
        return {
            "id": self.id,
            "create_time_ms": self.created_ms,
            "metadata": self.metadata,
            "source_devbox_id": self.source_devbox_id,
            "commit_message": self.commit_message,
            "name": self.name,
            "size_bytes": self.size_bytes,
            "source_blueprint_id": self.source_blueprint_id,
        }

    def status_view(self) -> dict[str, Any]:
        """``DevboxSnapshotAsyncStatusView``."""
        return {
            "status": self.status,
            "error_message": self.error_message,
            "snapshot": self.view() if self.status == "complete" else None,
        }


_SIZES: dict[str, tuple[float, float, float]] = {
    "X_SMALL": (0.5, 1, 4),
    "SMALL": (1, 2, 4),
    "MEDIUM": (2, 4, 8),
    "LARGE": (2, 8, 16),
    "X_LARGE": (4, 16, 16),
    "XX_LARGE": (8, 32, 16),
}


def _resources(params: dict[str, Any]) -> tuple[float, float, float]:
    """vCPUs, GiB of memory and GiB of disk of a launch: Runloop's sizes (SMALL unless set)."""
    size = params.get("resource_size_request") or "SMALL"
    if size != "CUSTOM_SIZE":
        return _SIZES[size]

    def pick(key: str, fallback: float) -> float:
        value = params.get(key)
        return float(value) if isinstance(value, int | float) and value > 0 else fallback

    cpu, memory, disk = _SIZES["SMALL"]
    return (
        pick("custom_cpu_cores", cpu),
        pick("custom_gb_memory", memory),
        pick("custom_disk_size", disk),
    )


def _top_level_links(root: str) -> Callable[[str, list[str]], list[str]]:
    """copytree's ignore: the root's symlinks (the host's ``/bin -> usr/bin``) every devbox has."""

    def ignore(directory: str, names: list[str]) -> list[str]:
        if directory != root:
            return []
        return [n for n in names if os.path.islink(os.path.join(directory, n))]

    return ignore


def copy_disk(source: Path, target: Path) -> int:
    """Copy a devbox's root to ``target`` (merged into what is there); the bytes copied."""
    shutil.copytree(
        source, target, symlinks=True, dirs_exist_ok=True, ignore=_top_level_links(str(source))
    )
    return sum(
        entry.stat(follow_symlinks=False).st_size for entry in target.rglob("*") if entry.is_file()
    )


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
    blueprint_id: str | None = None  # the source's, or the blueprint its name picked
    workdir: str | None = None  # where its commands start (the blueprint's WORKDIR; else home)
    name: str | None = None
    entrypoint: str | None = None
    status: str = "provisioning"
    created_ms: int = field(default_factory=now_ms)
    end_ms: int | None = None
    failure_reason: str | None = None
    shutdown_reason: str | None = None
    last_activity: float = field(default_factory=time.time)
    transitions: list[dict[str, Any]] = field(default_factory=list)
    executions: dict[str, Execution] = field(default_factory=dict)
    setup: list[Execution] = field(default_factory=list)
    by_command_id: dict[str, str] = field(default_factory=dict)
    changes: Changes = field(default_factory=Changes)
    boot: asyncio.Task[None] | None = None
    tunnel: Tunnel | None = None

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

    def expires_at(self) -> float | None:
        """When the reaper ends the devbox: never while it sleeps (suspended)."""
        if self.status in ASLEEP:
            return None
        idle_end = self.idle_end
        return self.lifetime_end if idle_end is None else min(self.lifetime_end, idle_end)

    def usage(self) -> dict[str, Any]:
        """``DevboxResourceUsageView``: the size's vCPU and memory billed over the time not
        suspended, its disk over all the time since the create."""
        end = self.end_ms if self.end_ms is not None else now_ms()
        marks = [(t["status"], t["transition_time_ms"]) for t in self.transitions]
        asleep_ms = sum(
            min(until, end) - since
            for (status, since), (_, until) in zip(marks, [*marks[1:], ("", end)], strict=True)
            if status == "suspended" and since < end
        )
        elapsed = (end - self.created_ms) // 1000
        active = max(end - self.created_ms - asleep_ms, 0) // 1000
        cpu, memory, disk = _resources(self.launch_parameters)
        return {
            "id": self.id,
            "status": self.status,
            "start_time_ms": self.created_ms,
            "end_time_ms": self.end_ms,
            "total_elapsed_seconds": elapsed,
            "total_active_seconds": active,
            "vcpu_seconds": int(active * cpu),
            "memory_gb_seconds": int(active * memory),
            "disk_gb_seconds": int(elapsed * disk),
        }

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
            "blueprint_id": self.blueprint_id,
            "snapshot_id": self.source.get("snapshot_id"),
            "failure_reason": self.failure_reason,
            "shutdown_reason": self.shutdown_reason,
            "initiator_type": "api",
            "tunnel": self.tunnel.view() if self.tunnel is not None else None,
        }


class RunloopCore(EmulatorCore):
    """`EmulatorCore` that also tracks devbox status, executions and idle time."""

    def __init__(self, name: str, root: Path, *, isolation: str = "auto") -> None:
        super().__init__(name, root, isolation=isolation)
        self.devboxes: dict[str, Devbox] = {}
        self.created_by_request: dict[tuple[str, str], str] = {}
        self.snapshots: dict[str, DiskSnapshot] = {}
        self.snapshot_root = root / ".disk-snapshots"
        self.blueprints: dict[str, Blueprint] = {}
        self.blueprints_by_request: dict[tuple[str, str], str] = {}
        self.blueprint_root = root / ".blueprints"
        self.objects: dict[str, StoredObject] = {}
        self.objects_by_request: dict[tuple[str, str], str] = {}
        self.object_root = root / ".objects"

    def object_for(self, api_key: str, object_id: str) -> StoredObject | None:
        """The key's storage object ``object_id`` (``DELETED`` once its lifetime passed)."""
        found = self.objects.get(object_id)
        if found is None or found.api_key != api_key:
            return None
        found.expire()
        return found

    def blueprint_for(
        self, api_key: str, blueprint_id: str | None, name: str | None
    ) -> Blueprint | None:
        """The key's blueprint ``blueprint_id``, or the newest named ``name`` not deleted (the
        newest built one if any is)."""
        if blueprint_id is not None:
            found = self.blueprints.get(blueprint_id)
            return found if found is not None and found.api_key == api_key else None
        named = [
            bp
            for bp in reversed(self.blueprints.values())
            if bp.api_key == api_key and bp.name == name and bp.state == "created"
        ]
        built = [bp for bp in named if bp.status == "build_complete"]
        return next(iter(built or named), None)

    def live_count(self, api_key: str | None) -> int:
        """Live devboxes but the suspended ones: Runloop's cap counts running devboxes."""
        asleep = sum(
            1
            for d in self.devboxes.values()
            if d.status in ASLEEP
            and d.id in self.sandboxes
            and (api_key is None or d.api_key == api_key)
        )
        return super().live_count(api_key) - asleep

    def wake_refused(self, devbox: Devbox) -> int | None:
        """The concurrency cap waking ``devbox`` would break (it counts again), or None."""
        with self._lock:
            quota = self._quota_for(devbox.api_key)
            if quota is None or quota.max_concurrent is None:
                return None
            keyed = devbox.api_key if devbox.api_key in self.quotas else None
            return quota.max_concurrent if self.live_count(keyed) >= quota.max_concurrent else None

    def by_tunnel(self, key: str) -> Devbox | None:
        return next(
            (d for d in self.devboxes.values() if d.tunnel is not None and d.tunnel.key == key),
            None,
        )

    async def suspend(self, devbox: Devbox) -> None:
        """Stop every process, entrypoint too (memory is not kept), and sleep; the disk stays."""
        devbox.set_status("suspending")
        for execution in [*devbox.setup, *devbox.executions.values()]:
            await execution.kill()
        devbox.set_status("suspended")
        self.refresh(devbox)

    async def snapshot(self, snap: DiskSnapshot, devbox: Devbox) -> None:
        """Copy the devbox's root into the snapshot, off the loop."""
        try:
            snap.size_bytes = await asyncio.to_thread(copy_disk, devbox.local.root, snap.path)
        except OSError as exc:
            snap.status, snap.error_message = "error", f"copying the disk failed: {exc.strerror}"
        else:
            snap.status = "complete"
        snap.done.set()

    async def delete_snapshot(self, snap: DiskSnapshot) -> None:
        """Drop its disk; the snapshot stays known, ``deleted``, as Runloop's status shows it."""
        snap.status = "deleted"
        await asyncio.to_thread(shutil.rmtree, snap.path, True)

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
            reason = "entrypoint_exit" if ended_by == "entrypoint_exit" else "api_shutdown"
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
