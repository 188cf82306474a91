"""envd's process service: commands and terminals in a sandbox, and the streams watching them.

``/process.Process/*`` (Connect, JSON), as the e2b SDK calls it:

* ``Start`` runs ``{cmd, args, envs, cwd}`` (the SDK sends ``/bin/bash -l -c CMD``, or
  ``/bin/bash -i -l`` with ``pty.size`` for a terminal) in the local sandbox and streams
  start{pid}, data{stdout|stderr|pty} (base64) and end{exitCode, exited, status, error}, with a
  keepalive event every ``Keepalive-Ping-Interval`` seconds of silence.
* ``Connect`` streams the same events of a running process to another client, from the
  moment it connects (this SDK's ``ConnectRequest`` asks for no backlog).
* ``List``, ``SendSignal``, ``SendInput`` (stdin or pty), ``CloseStdin``, ``Update`` (pty size).

As in envd, a process outlives the streams that watch it: a client going away only stops
listening; the Start call's deadline (``Connect-Timeout-Ms``; none: no limit) kills the
process, a Connect call's deadline only ends that stream. An ended process leaves the list
before its end event goes out.

A terminal is a real pty: the sandbox runs `RELAY`, a small Python program that opens a
pty of the requested size, starts the shell on it as a session leader and copies bytes
between the pty and its own pipes; typed input and size changes reach it as frames on its
stdin (`frame`), so a resize lands as a real ``TIOCSWINSZ`` (and SIGWINCH).
"""

from __future__ import annotations

import asyncio
import base64
import signal
import struct
from dataclasses import dataclass, field

from aiohttp import web

from emulators.e2b.connect import (
    Message,
    RpcError,
    Send,
    StreamHandler,
    UnaryHandler,
    deadline_of,
)
from emulators.e2b.sandboxes import E2BSandbox
from providers.errors import SandboxError
from providers.local import LocalProcess

__all__ = ["RELAY", "ProcessService", "RunningProcess", "frame", "keepalive_of"]

_SIGNALS = {"SIGNAL_SIGKILL": signal.SIGKILL, "SIGNAL_SIGTERM": signal.SIGTERM}
# How Go names a Linux signal (syscall.Signal.String), which envd's end event quotes.
_GO_SIGNALS = {
    "SIGHUP": "hangup",
    "SIGINT": "interrupt",
    "SIGQUIT": "quit",
    "SIGILL": "illegal instruction",
    "SIGTRAP": "trace/breakpoint trap",
    "SIGABRT": "aborted",
    "SIGBUS": "bus error",
    "SIGFPE": "floating point exception",
    "SIGKILL": "killed",
    "SIGUSR1": "user defined signal 1",
    "SIGSEGV": "segmentation fault",
    "SIGUSR2": "user defined signal 2",
    "SIGPIPE": "broken pipe",
    "SIGALRM": "alarm clock",
    "SIGTERM": "terminated",
    "SIGSTKFLT": "stack fault",
    "SIGCHLD": "child exited",
    "SIGCONT": "continued",
    "SIGSTOP": "stopped (signal)",
    "SIGTSTP": "stopped",
    "SIGTTIN": "stopped (tty input)",
    "SIGTTOU": "stopped (tty output)",
    "SIGURG": "urgent I/O condition",
    "SIGXCPU": "CPU time limit exceeded",
    "SIGXFSZ": "file size limit exceeded",
    "SIGVTALRM": "virtual timer expired",
    "SIGPROF": "profiling timer expired",
    "SIGWINCH": "window changed",
    "SIGIO": "I/O possible",
    "SIGPWR": "power failure",
    "SIGSYS": "bad system call",
}
_CHUNK = 32 * 1024
_KEEPALIVE_HEADER = "Keepalive-Ping-Interval"

# argv: rows cols cmd args... . No path literal in it: without bubblewrap the
# emulator rewrites a command's sandbox paths, its own argv included.
RELAY = r"""
import fcntl, os, select, signal, struct, sys, termios


def size(fd, rows, cols):
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))


def write_all(fd, data):
    while data:
        data = data[os.write(fd, data):]


master, slave = os.openpty()
size(slave, int(sys.argv[1]), int(sys.argv[2]))
pid = os.fork()
if pid == 0:
    os.setsid()
    fcntl.ioctl(slave, termios.TIOCSCTTY, 0)
    for fd in (0, 1, 2):
        os.dup2(slave, fd)
    os.closerange(3, 1024)
    os.execvp(sys.argv[3], sys.argv[3:])
os.close(slave)
pending, sources = b"", [master, 0]
while True:
    ready = select.select(sources, [], [])[0]
    if master in ready:
        try:
            data = os.read(master, 65536)
        except OSError:
            data = b""
        if not data:
            break
        write_all(1, data)
    if 0 in ready:
        chunk = os.read(0, 65536)
        if not chunk:
            sources = [master]
        pending += chunk
        while len(pending) >= 5 and len(pending) >= 5 + struct.unpack(">I", pending[1:5])[0]:
            end = 5 + struct.unpack(">I", pending[1:5])[0]
            kind, body, pending = pending[:1], pending[5:end], pending[end:]
            if kind == b"d":
                write_all(master, body)
            else:
                size(master, *struct.unpack(">HH", body))
status = os.waitpid(pid, 0)[1]
if os.WIFSIGNALED(status):
    signal.signal(os.WTERMSIG(status), signal.SIG_DFL)
    os.kill(os.getpid(), os.WTERMSIG(status))
sys.exit(os.waitstatus_to_exitcode(status))
"""


def frame(kind: bytes, body: bytes) -> bytes:
    """One frame for `RELAY`'s stdin: ``d`` input bytes, ``r`` a size (rows, cols)."""
    return kind + struct.pack(">I", len(body)) + body


def _end_event(code: int) -> Message:
    """envd's end event for a command's wait status, as Go's ``os/exec`` reports it: an
    exit code, or -1 when a signal ended it (``ProcessState.ExitCode``); the status's text,
    and the same text as the error unless the command exited 0 (``cmd.Wait``'s error)."""
    if code >= 0:
        status = f"exit status {code}"
        end: Message = {"exitCode": code, "exited": True, "status": status}
    else:
        sig = signal.Signals(-code)
        status = f"signal: {_GO_SIGNALS.get(sig.name, f'signal {-code}')}"
        end = {"exitCode": -1, "exited": False, "status": status}
    if code != 0:
        end["error"] = status
    return end


@dataclass(eq=False)
class RunningProcess:
    """A command (or a terminal's relay) started through envd, and who listens to it."""

    pid: int
    local: LocalProcess
    config: Message
    tag: str | None = None
    pty: bool = False
    end: Message | None = None
    listeners: set[asyncio.Queue[Message]] = field(default_factory=set)
    tasks: set[asyncio.Future[None]] = field(default_factory=set)

    def listen(self) -> asyncio.Queue[Message]:
        """A queue of this process's events from now on (its end, if it has ended)."""
        queue: asyncio.Queue[Message] = asyncio.Queue()
        if self.end is not None:
            queue.put_nowait({"end": self.end})
        else:
            self.listeners.add(queue)
        return queue

    def lose(self, sandbox_id: str) -> None:
        """Break every stream watching this process off (its sandbox is going away)."""
        self.publish({"lost": sandbox_id})
        self.listeners.clear()

    def publish(self, event: Message) -> None:
        for queue in self.listeners:
            queue.put_nowait(event)

    async def write(self, data: bytes) -> None:
        stdin = self.local.proc.stdin
        if stdin is None or stdin.is_closing():
            raise RpcError("failed_precondition", "the process's stdin is closed")
        stdin.write(data)
        await stdin.drain()


def keepalive_of(request: web.Request) -> float | None:
    """Seconds of silence after which a stream sends a keepalive (None: never)."""
    raw = request.headers.get(_KEEPALIVE_HEADER, "")
    return float(raw) if raw.isdigit() and int(raw) > 0 else None


class ProcessService:
    """The process service of every sandbox of one emulator.

    Args:
        python: the interpreter that runs `RELAY` in a sandbox.
    """

    def __init__(self, python: str) -> None:
        self.python = python

    def streams(self, sandbox: E2BSandbox, request: web.Request) -> dict[str, StreamHandler]:
        deadline = deadline_of(request)
        keepalive = keepalive_of(request)
        return {
            "process.Process/Start": lambda m, send: self.start(
                sandbox, m, send, deadline, keepalive
            ),
            "process.Process/Connect": lambda m, send: self.connect(sandbox, m, send, keepalive),
        }

    def unaries(self, sandbox: E2BSandbox) -> dict[str, UnaryHandler]:
        return {
            "process.Process/SendSignal": lambda m: self.send_signal(sandbox, m),
            "process.Process/List": lambda m: self.list_processes(sandbox, m),
            "process.Process/SendInput": lambda m: self.send_input(sandbox, m),
            "process.Process/CloseStdin": lambda m: self.close_stdin(sandbox, m),
            "process.Process/Update": lambda m: self.update(sandbox, m),
        }

    async def start(
        self,
        sandbox: E2BSandbox,
        message: Message,
        send: Send,
        deadline: float | None,
        keepalive: float | None,
    ) -> None:
        config = message.get("process") or {}
        argv = [config.get("cmd") or "/bin/bash", *config.get("args", [])]
        pty = message.get("pty")
        if pty is not None:
            size = pty.get("size") or {}
            rows, cols = int(size.get("rows") or 24), int(size.get("cols") or 80)
            argv = [self.python, "-c", RELAY, str(rows), str(cols), *argv]
        try:
            local = await sandbox.local.spawn(
                argv, env=config.get("envs") or {}, cwd=config.get("cwd") or None
            )
        except SandboxError as exc:
            raise RpcError("invalid_argument", str(exc)) from None
        process = RunningProcess(
            sandbox.next_pid(), local, config, message.get("tag"), pty=pty is not None
        )
        sandbox.processes[process.pid] = process
        events = process.listen()
        if pty is None and not message.get("stdin") and local.proc.stdin is not None:
            local.proc.stdin.close()
        task = asyncio.ensure_future(self._pump(sandbox, process, deadline))
        process.tasks.add(task)
        task.add_done_callback(process.tasks.discard)
        await self._forward(process, events, send, keepalive)

    async def connect(
        self, sandbox: E2BSandbox, message: Message, send: Send, keepalive: float | None
    ) -> None:
        process = self._process(sandbox, message)
        await self._forward(process, process.listen(), send, keepalive)

    async def _forward(
        self,
        process: RunningProcess,
        events: asyncio.Queue[Message],
        send: Send,
        keepalive: float | None,
    ) -> None:
        """Send start, then the process's events until its end; stop listening on the way out."""
        try:
            await send({"event": {"start": {"pid": process.pid}}})
            while True:
                try:
                    event = await asyncio.wait_for(events.get(), keepalive)
                except TimeoutError:
                    await send({"event": {"keepalive": {}}})
                    continue
                if "lost" in event:
                    raise RpcError(
                        "unavailable",
                        f"the connection to sandbox {event['lost']} ended before the stream"
                        " completed",
                    )
                await send({"event": event})
                if "end" in event:
                    return
        finally:
            process.listeners.discard(events)

    async def _pump(
        self, sandbox: E2BSandbox, process: RunningProcess, deadline: float | None
    ) -> None:
        """Publish the output, then the end; kill the process at the Start call's deadline."""
        proc = process.local.proc
        timer = (
            asyncio.get_running_loop().call_later(deadline, process.local.kill)
            if deadline
            else None
        )

        async def pump(name: str, stream: asyncio.StreamReader | None) -> None:
            while stream is not None and (chunk := await stream.read(_CHUNK)):
                process.publish({"data": {name: base64.b64encode(chunk).decode()}})

        try:
            await asyncio.gather(
                pump("pty" if process.pty else "stdout", proc.stdout),
                pump("pty" if process.pty else "stderr", proc.stderr),
            )
            code = await proc.wait()
        finally:
            if timer is not None:
                timer.cancel()
            process.local.end_group()  # what the command left running
            sandbox.processes.pop(process.pid, None)
        process.end = _end_event(code)
        process.publish({"end": process.end})
        process.listeners.clear()

    def _process(self, sandbox: E2BSandbox, message: Message) -> RunningProcess:
        selector = message.get("process") or {}
        for process in sandbox.processes.values():
            if process.pid == selector.get("pid") or (
                process.tag is not None and process.tag == selector.get("tag")
            ):
                return process
        raise RpcError("not_found", f"process {selector} not found")

    async def send_signal(self, sandbox: E2BSandbox, message: Message) -> Message:
        process = self._process(sandbox, message)
        process.local.kill(_SIGNALS.get(str(message.get("signal")), signal.SIGKILL))
        return {}

    async def list_processes(self, sandbox: E2BSandbox, message: Message) -> Message:
        return {
            "processes": [
                {"config": p.config, "pid": p.pid, **({"tag": p.tag} if p.tag else {})}
                for p in sandbox.processes.values()
            ]
        }

    async def send_input(self, sandbox: E2BSandbox, message: Message) -> Message:
        process = self._process(sandbox, message)
        given = message.get("input") or {}
        if "pty" in given and not process.pty:
            raise RpcError("failed_precondition", f"process {process.pid} has no pty")
        data = base64.b64decode(given.get("pty") or given.get("stdin") or "")
        if data:
            await process.write(frame(b"d", data) if process.pty else data)
        return {}

    async def close_stdin(self, sandbox: E2BSandbox, message: Message) -> Message:
        stdin = self._process(sandbox, message).local.proc.stdin
        if stdin is not None:
            stdin.close()
        return {}

    async def update(self, sandbox: E2BSandbox, message: Message) -> Message:
        process = self._process(sandbox, message)
        size = (message.get("pty") or {}).get("size")
        if size is None:
            return {}
        if not process.pty:
            raise RpcError("failed_precondition", f"process {process.pid} has no pty")
        rows, cols = int(size.get("rows") or 0), int(size.get("cols") or 0)
        if not (0 < rows < 65536 and 0 < cols < 65536):
            raise RpcError("invalid_argument", f"invalid pty size {rows}x{cols}")
        await process.write(frame(b"r", struct.pack(">HH", rows, cols)))
        return {}
