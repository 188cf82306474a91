"""The emulated Daytona sandboxes: their states, lifecycle timers and shell sessions.

A sandbox (`Box`) is a `providers.local.LocalSandbox` (real commands, real
files) plus what Daytona keeps around it: the organization of the API key
that owns it, its state (``creating`` or ``pending_build`` -> ``started``
-> ``stopping`` -> ``stopped``; ``destroying`` -> ``destroyed``; ``error``
or ``build_failed``) and its lifecycle intervals, in minutes as on Daytona:
``autoStopInterval`` stops a sandbox after that long without activity
(toolbox calls and ``last-activity`` count), ``autoDeleteInterval``
destroys it that long after it stopped (0: at once, negative: never) and
``ttlMinutes`` destroys it that long after its creation (or after the
``set_ttl`` that changed it) whatever its state.
An archive (``autoArchiveInterval`` after a stop, or asked for) takes a
stopped sandbox to ``archived``: its files stay, and a start brings it back
through ``restoring``.
`DaytonaCore.minute` says how many seconds an emulated minute lasts, so a
test can watch a sandbox stop.

Sessions are the daemon's: one long-running shell per session
(`ShellSession`) running its commands one after the other, so a ``cd`` or an
``export`` persists; each command's stdout and stderr are cut out of the
shell's streams by markers the session writes after it.

Paths are Daytona's: the user's home and working directory is
``/home/daytona`` and relative paths start there; the rest of the sandbox's
filesystem is `emulators.filesystem.GuestSandbox`'s.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import secrets
import shlex
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from emulators.filesystem import GuestSandbox
from emulators.harness import EmulatorCore
from providers.local import LocalProcess

if TYPE_CHECKING:  # they hold their routes, which import this module
    from emulators.daytona.interpreter import Interpreter
    from emulators.daytona.terminals import Terminal

__all__ = [
    "DAYTONA_HOME",
    "GONE",
    "STDERR_PREFIX",
    "STDOUT_PREFIX",
    "Box",
    "Command",
    "DaytonaCore",
    "ShellSession",
    "iso",
    "metrics",
    "org_of",
]

DAYTONA_HOME = "/home/daytona"
STDOUT_PREFIX = b"\x01\x01\x01"
STDERR_PREFIX = b"\x02\x02\x02"
GONE = frozenset({"destroying", "destroyed"})
_MARK = b"\x1e"
_MARK_END = b"\x1f"
_INPUTS = "/tmp/.daytona-session-input"


def iso(ts: float) -> str:
    """A timestamp as the API writes it (ISO 8601, milliseconds, UTC)."""
    return datetime.fromtimestamp(ts, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def org_of(api_key: str) -> str:
    """The organization an API key belongs to (one per key in the emulator)."""
    return str(uuid.UUID(hashlib.sha256(api_key.encode()).hexdigest()[:32]))


@dataclass
class Command:
    """One command of a session and what it wrote so far."""

    id: str
    command: str
    stdout: bytearray = field(default_factory=bytearray)
    stderr: bytearray = field(default_factory=bytearray)
    output: bytearray = field(default_factory=bytearray)
    exit_code: int | None = None
    echo: bool = True
    done: asyncio.Event = field(default_factory=asyncio.Event)
    ends_seen: set[str] = field(default_factory=set)
    mid_line: set[str] = field(default_factory=set)
    _waiters: list[asyncio.Future[None]] = field(default_factory=list)
    _input: tuple[Path, int] | None = None  # the stdin FIFO and the session's end of it

    def open_input(self, fifo: Path) -> None:
        """Make the command's stdin FIFO and hold it open (read-write: the open never blocks)."""
        fifo.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.mkfifo(fifo, 0o600)
        self._input = fifo, os.open(fifo, os.O_RDWR | os.O_CLOEXEC)

    async def send(self, data: str) -> None:
        """Input to the running command, a newline added when missing (for ``read``).

        Raises:
            OSError: it cannot take input (it reads none, or it ended).
        """
        if self._input is None:
            raise BrokenPipeError("the command reads no input")
        if not data.endswith("\n"):
            data += "\n"
        if self.echo:
            self.add("stdout", data.encode())
        await asyncio.to_thread(os.write, self._input[1], data.encode())

    def close_input(self) -> None:
        if self._input is not None:
            fifo, fd = self._input
            self._input = None
            os.close(fd)
            with contextlib.suppress(OSError):
                fifo.unlink()

    def view(self) -> dict[str, Any]:
        return {"id": self.id, "command": self.command, "exitCode": self.exit_code}

    def logs(self) -> dict[str, str]:
        """The daemon's logs: ``output`` multiplexed with its stream prefixes, as it keeps it."""
        return {
            "output": bytes(self.output).decode("utf-8", "replace"),
            "stdout": bytes(self.stdout).decode("utf-8", "replace"),
            "stderr": bytes(self.stderr).decode("utf-8", "replace"),
        }

    def add(self, stream: str, data: bytes) -> None:
        """Keep ``data`` of ``stream``; ``output`` labels each of its lines, as the daemon's log."""
        getattr(self, stream).extend(data)
        prefix = STDOUT_PREFIX if stream == "stdout" else STDERR_PREFIX
        for line in data.splitlines(keepends=True):
            if stream not in self.mid_line:
                self.output.extend(prefix)
            self.output.extend(line)
            if line.endswith(b"\n"):
                self.mid_line.discard(stream)
            else:
                self.mid_line.add(stream)
        self._wake()

    def end(self, stream: str, exit_code: int | None) -> None:
        self.ends_seen.add(stream)
        if exit_code is not None:
            self.exit_code = exit_code
        if self.ends_seen == {"stdout", "stderr"}:
            self.finish()

    def finish(self) -> None:
        self.close_input()
        self.done.set()
        self._wake()

    def _wake(self) -> None:
        waiters, self._waiters = self._waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    async def follow(self) -> AsyncIterator[bytes]:
        """The log (``output``) from its start, then what is added, until the command ends."""
        sent = 0
        while True:
            if sent < len(self.output):
                chunk = bytes(self.output[sent:])
                sent += len(chunk)
                yield chunk
            elif self.done.is_set():
                return
            else:
                waiter = asyncio.get_running_loop().create_future()
                self._waiters.append(waiter)
                await waiter


class ShellSession:
    """A long-running shell; the commands submitted to it run one after the other.

    After each command the session has the shell print a marker on stdout
    (with the exit code) and one on stderr; what comes before a marker on
    a stream belongs to the command being run.

    A command run asynchronously reads its stdin from a FIFO of its own in
    the sandbox's ``/tmp`` that the session holds open, so `Command.send`
    reaches it and it sees EOF only when it ends; a synchronous one reads
    ``/dev/null``, as on Daytona.
    """

    def __init__(self, session_id: str, process: LocalProcess, sandbox: GuestSandbox) -> None:
        self.id = session_id
        self.process = process
        self._sandbox = sandbox
        self.commands: dict[str, Command] = {}
        self.ended = False
        self._token = secrets.token_hex(8)
        self._queue: dict[str, list[Command]] = {"stdout": [], "stderr": []}
        proc = process.proc
        assert proc.stdout is not None
        assert proc.stderr is not None
        self._readers = asyncio.gather(
            self._read("stdout", proc.stdout), self._read("stderr", proc.stderr)
        )
        self._watch = asyncio.get_running_loop().create_task(self._wait_for_exit())

    def view(self) -> dict[str, Any]:
        return {"sessionId": self.id, "commands": [c.view() for c in self.commands.values()]}

    def submit(self, command: str, *, interactive: bool = False, echo: bool = True) -> Command:
        """Queue ``command``; its ``done`` is set once it ran (or the shell ended).

        ``interactive``: its stdin stays open for `Command.send` (``echo``: input
        also goes to its stdout log) until it ends.
        """
        cmd = Command(str(uuid.uuid4()), command, echo=echo)
        stdin_path = "/dev/null"
        if interactive:
            stdin_path = self._sandbox.inside(f"{_INPUTS}/{cmd.id}")
            cmd.open_input(self._sandbox.host(_INPUTS, write=True) / cmd.id)
        self.commands[cmd.id] = cmd
        self._queue["stdout"].append(cmd)
        self._queue["stderr"].append(cmd)
        mark = _MARK.decode() + self._token
        stdin = self.process.proc.stdin
        assert stdin is not None
        stdin.write(
            f"{{\n{self._sandbox.rewrite(command)}\n}} < {shlex.quote(stdin_path)}\n"
            f"printf '{mark} {cmd.id} %s\\037' \"$?\"\n"
            f"printf '{mark} {cmd.id} -\\037' >&2\n".encode()
        )
        return cmd

    async def _read(self, stream: str, reader: asyncio.StreamReader) -> None:
        mark = _MARK + self._token.encode() + b" "
        buf = b""
        while chunk := await reader.read(65536):
            buf += chunk
            while True:
                start = buf.find(mark)
                if start == -1:
                    partial = buf.rfind(_MARK)
                    cut = partial if partial != -1 and mark.startswith(buf[partial:]) else len(buf)
                    self._attribute(stream, buf[:cut])
                    buf = buf[cut:]
                    break
                end = buf.find(_MARK_END, start)
                if end == -1:
                    self._attribute(stream, buf[:start])
                    buf = buf[start:]
                    break
                self._attribute(stream, buf[:start])
                cmd_id, _, code = buf[start + len(mark) : end].decode().partition(" ")
                self._finish(stream, cmd_id, int(code) if code.lstrip("-").isdigit() else None)
                buf = buf[end + 1 :]
        self._attribute(stream, buf)

    def _attribute(self, stream: str, data: bytes) -> None:
        queue = self._queue[stream]
        if queue:
            queue[0].add(stream, data)

    def _finish(self, stream: str, cmd_id: str, exit_code: int | None) -> None:
        queue = self._queue[stream]
        if queue and queue[0].id == cmd_id:
            queue.pop(0).end(stream, exit_code)

    async def _wait_for_exit(self) -> None:
        await self._readers
        status = await self.process.proc.wait()
        self.ended = True
        for cmd in self.commands.values():
            if not cmd.done.is_set():
                cmd.exit_code = 128 - status if status < 0 else status
                cmd.finish()

    async def close(self) -> None:
        """End the shell and everything it started."""
        self.process.kill()
        with contextlib.suppress(asyncio.CancelledError):
            await self._watch


@dataclass
class Box:
    """One emulated sandbox, with the fields the API shows."""

    id: str
    name: str
    api_key: str
    local: GuestSandbox
    labels: dict[str, str]
    env: dict[str, str]
    snapshot: str | None
    target: str
    auto_stop: int
    auto_delete: int
    auto_archive: int
    ttl: int
    cpu: int
    gpu: int
    memory: int
    disk: int
    public: bool = False
    network_block_all: bool = False
    network_allow_list: str | None = None  # recorded, not enforced (the host's network)
    domain_allow_list: str | None = None
    build_info: dict[str, Any] | None = None
    volumes: list[dict[str, str]] = field(default_factory=list)  # SandboxVolume, mounted
    state: str = "creating"
    desired_state: str = "started"
    error: str | None = None
    created: float = field(default_factory=time.time)
    updated: float = field(default_factory=time.time)
    last_activity: float = field(default_factory=time.time)
    stopped_at: float | None = None
    sessions: dict[str, ShellSession] = field(default_factory=dict)
    terminals: dict[str, Terminal] = field(default_factory=dict)
    interpreter: Interpreter | None = None
    contexts: dict[str, Interpreter] = field(default_factory=dict)  # those made by a create
    boot: asyncio.Task[None] | None = None
    from_pool: str | None = None  # the warm pool whose sandbox served the create
    signing_key: str = field(default_factory=lambda: secrets.token_urlsafe(32))  # file URLs
    ttl_from: float | None = None  # when the TTL was set (None: it counts from the create)

    @property
    def organization_id(self) -> str:
        return org_of(self.api_key)

    def shell(self, command: str, cwd: str | None) -> str:
        """A script running ``command`` in ``cwd`` (default: the home).

        The script starts by entering ``cwd``, so a missing directory is the
        script's error, as on Daytona.

        Raises:
            PathRefused: ``cwd`` is not a path of the sandbox.
        """
        return f"cd -- {shlex.quote(self.local.inside(cwd or DAYTONA_HOME))} || exit 1\n{command}"

    def dto(self, toolbox_url: str, *, listed: bool = False) -> dict[str, Any]:
        """The sandbox as the API shows it: ``Sandbox``, or ``SandboxListItem`` when listed."""
        ttl_end = (self.ttl_from or self.created) + self.ttl * 60 if self.ttl > 0 else None
        view: dict[str, Any] = {
            "id": self.id,
            "organizationId": self.organization_id,
            "name": self.name,
            "target": self.target,
            "runnerId": "emulated-runner",
            "sandboxClass": "container",
            "state": self.state,
            "desiredState": self.desired_state,
            "snapshot": self.snapshot,
            "user": "daytona",
            "errorReason": self.error,
            "recoverable": False if self.error else None,
            "public": self.public,
            "networkBlockAll": self.network_block_all,
            "networkAllowList": self.network_allow_list,
            "domainAllowList": self.domain_allow_list,
            "cpu": self.cpu,
            "gpu": self.gpu,
            "memory": self.memory,
            "disk": self.disk,
            "labels": self.labels,
            "backupState": "None",
            "autoStopInterval": self.auto_stop,
            "autoPauseInterval": 0,
            "autoArchiveInterval": self.auto_archive,
            "autoDeleteInterval": self.auto_delete,
            "autoDestroyAt": iso(ttl_end) if ttl_end else None,
            "createdAt": iso(self.created),
            "updatedAt": iso(self.updated),
            "lastActivityAt": iso(self.last_activity),
            "daemonVersion": "0.226.1-emulated",
            "toolboxProxyUrl": toolbox_url,
        }
        if listed:
            return view
        view.update(env=self.env, kvm=False, volumes=self.volumes, buildInfo=None)
        if self.build_info is not None:
            view["buildInfo"] = {
                **self.build_info,
                "createdAt": iso(self.created),
                "updatedAt": iso(self.created),
            }
        return view


def metrics(box: Box) -> dict[str, Any]:
    """A usage sample as the daemon reports it (``SystemMetrics``): the sandbox's sizes,
    and the bytes of its own files as disk used (CPU and memory use are not measured: 0)."""
    used = 0
    for directory, dirs, files in os.walk(box.local.root):
        for name in [*dirs, *files]:
            with contextlib.suppress(OSError):
                used += os.lstat(os.path.join(directory, name)).st_size
    now = time.time()
    disk_total = box.disk << 30
    return {
        "cpuCount": box.cpu,
        "cpuUsedPct": 0.0,
        "memTotal": box.memory << 30,
        "memUsed": 0,
        "memCache": 0,
        "diskTotal": disk_total,
        "diskUsed": min(used, disk_total),
        "diskFree": max(disk_total - used, 0),
        "timestamp": iso(now),
        "timestampUnix": int(now),
    }


StateListener = Callable[[Box, str, str], None]


class DaytonaCore(EmulatorCore):
    """`EmulatorCore` that also tracks sandbox states, lifecycle timers and sessions.

    Args:
        minute: seconds an emulated minute lasts (Daytona's intervals are minutes).

    Attributes:
        on_state: called with (sandbox, old state, new state) on every change.
    """

    def __init__(
        self, name: str, root: Path, *, isolation: str = "auto", minute: float = 60.0
    ) -> None:
        super().__init__(name, root, isolation=isolation)
        self.boxes: dict[str, Box] = {}
        self.minute = minute
        self.on_state: StateListener | None = None

    def add(self, box: Box) -> None:
        self.boxes[box.id] = box

    def find(self, id_or_name: str, api_key: str) -> Box | None:
        """The key's organization's sandbox with this id or name, unless destroyed."""
        org = org_of(api_key)
        box = self.boxes.get(id_or_name)
        if box is None or box.organization_id != org:
            box = next(
                (
                    b
                    for b in self.boxes.values()
                    if b.name == id_or_name and b.organization_id == org
                ),
                None,
            )
        return None if box is None or box.state == "destroyed" else box

    def set_state(self, box: Box, state: str, **fields: Any) -> None:
        old = box.state
        box.state = state
        box.updated = time.time()
        for key, value in fields.items():
            setattr(box, key, value)
        if old != state and self.on_state is not None:
            self.on_state(box, old, state)

    def touch(self, box: Box) -> None:
        box.last_activity = time.time()

    async def close_sessions(self, box: Box) -> None:
        """End the sandbox's processes: shell sessions, terminals and interpreter contexts."""
        sessions, box.sessions = list(box.sessions.values()), {}
        for session in sessions:
            await session.close()
        terminals, box.terminals = list(box.terminals.values()), {}
        for terminal in terminals:
            await terminal.kill()
        interpreters = [box.interpreter, *box.contexts.values()]
        box.interpreter = None
        box.contexts.clear()
        for interpreter in interpreters:
            if interpreter is not None:
                await interpreter.close()

    async def start(self, box: Box) -> None:
        """Start a stopped or archived sandbox (its files kept, its processes gone)."""
        if box.state in ("stopped", "archived"):
            passing = "starting" if box.state == "stopped" else "restoring"
            self.set_state(box, passing, desired_state="started")
            await self.waking()
            box.last_activity = time.time()
            self.set_state(box, "started", stopped_at=None)

    async def stop(self, box: Box) -> None:
        """Stop a started sandbox: its sessions end, its files stay."""
        if box.state == "started":
            self.set_state(box, "stopping", desired_state="stopped")
            await self.close_sessions(box)
            self.set_state(box, "stopped", stopped_at=time.time())

    def archive(self, box: Box) -> None:
        """Archive a stopped sandbox: ``archiving``, then ``archived``, its files kept."""
        if box.state == "stopped":
            self.set_state(box, "archiving", desired_state="archived")
            self.set_state(box, "archived")

    async def kill(self, sandbox_id: str, ended_by: str = "kill") -> bool:
        box = self.boxes.get(sandbox_id)
        if box is None or box.state in GONE:
            return await super().kill(sandbox_id, ended_by)
        if box.boot is not None:
            box.boot.cancel()
        self.set_state(box, "destroying", desired_state="destroyed")
        await self.close_sessions(box)
        killed = await super().kill(sandbox_id, ended_by)
        self.set_state(box, "destroyed")
        return killed

    async def expire(self) -> None:
        now = time.time()
        for box in list(self.boxes.values()):
            if box.state in GONE:
                continue
            if box.ttl > 0 and (box.ttl_from or box.created) + box.ttl * self.minute <= now:
                await self.kill(box.id, "expired")
            elif (
                box.state == "started"
                and box.auto_stop > 0
                and box.last_activity + box.auto_stop * self.minute <= now
            ):
                await self.stop(box)
                if box.auto_delete == 0:
                    await self.kill(box.id, "expired")
            elif (
                box.state in ("stopped", "archived")
                and box.stopped_at is not None
                and box.auto_delete > 0
                and box.stopped_at + box.auto_delete * self.minute <= now
            ):
                await self.kill(box.id, "expired")
            elif (
                box.state == "stopped"
                and box.stopped_at is not None
                and box.auto_archive > 0
                and box.stopped_at + box.auto_archive * self.minute <= now
            ):
                self.archive(box)
        await super().expire()
