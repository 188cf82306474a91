"""Processes of ``local`` sandboxes: background processes any process can attach to,
terminals, and the sweeps that kill processes by what they carry.

A background process is recorded beside the sandbox's metadata, outside the
tree its commands may write (``<root>/<id>.procs/<n>/``), so any process on
the host can list it, follow it and wait for it, not only the one that
started it (another replica attaches by id). A small bash wrapper runs the
command: ``setsid`` gives the command a process group of its own, its
stdout and stderr go to the files ``out`` and ``err`` there, ``pids`` names
the wrapper and the command once it runs, and ``exit`` gets its status when
it ends. The wrapper is not in the command's group, so it outlives a kill of
the command and still writes the status (137). Every handle, the starter's
included, follows those files from offset 0 (polling, every few ms while
output flows or after its stdin was written, at most every 50 ms when
idle), so all handles see the same
output, and a command outlives the process that started it. Its stdin is a
pipe from the starter to the wrapper: only the starting handle writes it.

A per-process kill signals the command's process group: with bubblewrap
that is bwrap and its pid 1, and the command's pid namespace dies with them.
The wrapper and the command carry the sandbox's marker and cgroup, so the
sandbox's kill ends them as it ends every command.

A terminal is a PTY whose slave is the controlling terminal of an
interactive bash (bubblewrap binds it in as ``/dev/console``, so
``/dev/tty`` works inside); the shell leads a session of its own, and a
kill ends that whole session, its jobs (each in a group of its own) too.
"""

from __future__ import annotations

import asyncio
import codecs
import contextlib
import fcntl
import logging
import os
import select
import signal
import struct
import termios
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Literal

from providers.base import Sandbox
from providers.errors import SandboxError
from providers.local.isolation import REAP_SECONDS
from providers.processes import ProcessBase, ProcessInfo, TerminalBase

__all__ = [
    "LocalTerminal",
    "RecordedProcess",
    "born",
    "find_record",
    "list_records",
    "new_record",
    "resume_all",
    "set_size",
    "started",
    "stop_all",
    "sweep",
    "wrapped",
]

_log = logging.getLogger(__name__)

_POLL_FIRST = 0.002
_POLL_MAX = 0.05
_READ_MAX = 1 << 20
_KILLED = 128 + signal.SIGKILL

# $1: the record; then the command's argv, run by setsid (no fork: the job is not a
# group leader) in a session and process group of its own; without job control
# `wait` returns at its end only, and the explicit `<&0` keeps its stdin.
_WRAPPER = """
record=$1; shift
setsid "$@" <&0 >"$record/out" 2>"$record/err" &
job=$!
echo "$$ $job" >"$record/pids"
wait "$job"
echo $? >"$record/exit"
"""


def wrapped(record: Path, argv: list[str]) -> list[str]:
    """``argv`` run by the wrapper that records it in ``record``."""
    return ["/bin/bash", "-c", _WRAPPER, "sandbox-router-process", str(record), *argv]


def new_record(procs: Path, command: str) -> tuple[str, Path]:
    """A fresh record (the next number: ids are stable and unique per sandbox)."""
    number = 1 + max((int(e) for e in os.listdir(procs) if e.isdigit()), default=0)
    while True:
        try:
            (procs / str(number)).mkdir(mode=0o700)
            break
        except FileExistsError:  # another process took it meanwhile
            number += 1
    record = procs / str(number)
    (record / "command").write_text(command)
    return str(number), record


def find_record(procs: Path, process_id: str) -> Path | None:
    record = procs / process_id
    if process_id.isdigit() and (record / "command").is_file():
        return record
    return None


def _line(path: Path) -> str | None:
    """A file's one line once it is complete (the writer's newline ends it)."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    return text[:-1] if text.endswith("\n") else None


def _status(record: Path) -> int | None:
    written = _line(record / "exit")
    return int(written) if written else None


def _pids(record: Path) -> tuple[int, int] | None:
    """The wrapper's pid and the command's (its process group), once it runs."""
    written = _line(record / "pids")
    if not written:
        return None
    wrapper, job = written.split()
    return int(wrapper), int(job)


def _wrapper_alive(record: Path) -> bool:
    """Whether the wrapper of ``record`` still runs (its command line names the record,
    so a reused pid does not pass; a zombie's command line is empty)."""
    if not record.is_dir():
        return False
    pids = _pids(record)
    if pids is None:
        return True  # starting: the starter waits for the pids before it returns
    try:
        with open(f"/proc/{pids[0]}/cmdline", "rb") as f:
            return f"\0{record}\0".encode() in f.read()
    except OSError:
        return False


async def started(record: Path, wrapper: asyncio.subprocess.Process) -> bool:
    """Wait until the wrapper runs the command; False when it ended before."""
    delay = _POLL_FIRST
    deadline = time.monotonic() + 10.0
    while _pids(record) is None:
        if wrapper.returncode is not None or time.monotonic() > deadline:
            return False
        await asyncio.sleep(delay)
        delay = min(delay * 2, _POLL_MAX)
    return True


def list_records(procs: Path) -> list[ProcessInfo]:
    """Every background process a sandbox started, in order; an ended one with its status."""
    found = []
    numbers = sorted(int(e) for e in os.listdir(procs) if e.isdigit()) if procs.is_dir() else []
    for number in numbers:
        record = procs / str(number)
        try:
            command = (record / "command").read_text()
        except FileNotFoundError:  # being made, or the sandbox is being killed
            continue
        code = _status(record)
        running = code is None and _wrapper_alive(record)
        found.append(ProcessInfo(str(number), command, running, code))
    return found


class _Tail:
    """A file another process appends to, read from offset 0 as it grows."""

    def __init__(self, stream: Literal["stdout", "stderr"], path: Path) -> None:
        self.stream: Literal["stdout", "stderr"] = stream
        self.path = path
        self.file: IO[bytes] | None = None
        self.decoder = codecs.getincrementaldecoder("utf-8")("replace")

    def read(self) -> str:
        """What was appended since the last read (a split UTF-8 character waits for its end)."""
        if self.file is None:
            try:
                self.file = open(self.path, "rb")  # noqa: SIM115 - kept open while it grows
            except FileNotFoundError:  # the wrapper has not made it yet
                return ""
        return self.decoder.decode(self.file.read(_READ_MAX))

    def rest(self) -> str:
        """Everything left, once its writer is done."""
        parts = [self.read()]
        while self.file is not None and (data := self.file.read(_READ_MAX)):
            parts.append(self.decoder.decode(data))
        parts.append(self.decoder.decode(b"", final=True))
        self.close()
        return "".join(parts)

    def close(self) -> None:
        if self.file is not None:
            self.file.close()
            self.file = None


class RecordedProcess(ProcessBase):
    """A background process of a local sandbox, followed through its record.

    ``wrapper`` is the starter's child (its stdin is the command's); an
    attached handle has none.
    """

    def __init__(
        self,
        sandbox: Sandbox,
        process_id: str,
        record: Path,
        wrapper: asyncio.subprocess.Process | None = None,
    ) -> None:
        super().__init__(process_id, sandbox.provider)
        self._sandbox = sandbox
        self._record = record
        self._wrapper = wrapper
        self._nudged = asyncio.Event()  # input was written: an answer may follow soon
        self._follower = asyncio.ensure_future(self._follow())

    def _alive(self) -> bool:
        if self._wrapper is not None:
            return self._wrapper.returncode is None
        return _wrapper_alive(self._record)

    async def _follow(self) -> None:
        tails = [_Tail("stdout", self._record / "out"), _Tail("stderr", self._record / "err")]
        delay = _POLL_FIRST
        try:
            while True:
                code = _status(self._record)
                flowed = False
                for tail in tails:
                    if text := tail.read():
                        self._feed(tail.stream, text)
                        flowed = True
                if code is None and not flowed and not self._alive():
                    # Written just before the wrapper ended, or the wrapper was killed
                    # with its command (the sandbox's kill): a SIGKILL's status.
                    code = _status(self._record)
                    code = _KILLED if code is None else code
                if code is not None:
                    for tail in tails:
                        self._feed(tail.stream, tail.rest())
                    self._finish(code)
                    return
                delay = _POLL_FIRST if flowed else min(delay * 2, _POLL_MAX)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._nudged.wait(), delay)
                if self._nudged.is_set():
                    self._nudged.clear()
                    delay = _POLL_FIRST
        except OSError as exc:
            self._fail(self._error(f"cannot follow process {self.id}: {exc.strerror}"))
        finally:
            for tail in tails:
                tail.close()

    def _error(self, message: str) -> SandboxError:
        return SandboxError(message, provider=self.provider, sandbox_id=self._sandbox.id)

    async def kill(self) -> bool:
        """SIGKILL the command's process group; False once it has ended."""
        pids = _pids(self._record)
        if _status(self._record) is not None or pids is None or not self._alive():
            return False
        # The wrapper has not reaped the command yet (no status), so its pid,
        # the group's id, is not free for another process to take.
        try:
            os.killpg(pids[1], signal.SIGKILL)
        except ProcessLookupError:
            return False
        return True

    def _stdin(self) -> asyncio.StreamWriter:
        if self._wrapper is None or self._wrapper.stdin is None:
            raise self._error(
                f"process {self.id} was started by another handle: only that one writes its stdin"
            )
        return self._wrapper.stdin

    async def write_stdin(self, data: str | bytes) -> None:
        """Feed the command; its follower polls fast again, as an answer often follows."""
        stdin = self._stdin()
        try:
            stdin.write(data.encode() if isinstance(data, str) else data)
            await stdin.drain()
        except (BrokenPipeError, ConnectionResetError) as exc:
            raise self._error(f"process {self.id} has ended") from exc
        self._nudged.set()

    async def close_stdin(self) -> None:
        stdin = self._stdin()
        stdin.close()
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            await stdin.wait_closed()


def set_size(fd: int, rows: int, cols: int) -> None:
    """Set a PTY's size (on the master: the kernel sends the shell SIGWINCH)."""
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))


class LocalTerminal(TerminalBase):
    """An interactive shell on a PTY: its master is read as it turns readable."""

    def __init__(self, shell: asyncio.subprocess.Process, master: int, provider: str) -> None:
        super().__init__(str(shell.pid), provider)
        self._shell = shell
        self._master = master
        self._loop = asyncio.get_running_loop()
        os.set_blocking(master, False)
        self._loop.add_reader(master, self._readable)
        self._ended = asyncio.ensure_future(self._end())

    def _readable(self) -> None:
        try:
            data = os.read(self._master, 65536)
        except BlockingIOError:
            return
        except OSError:  # EIO: every holder of the slave closed it
            data = b""
        if data:
            self._feed(data)
        else:
            self._loop.remove_reader(self._master)

    async def _end(self) -> None:
        code = await self._shell.wait()
        self._loop.remove_reader(self._master)
        for _ in range(16):  # what the shell printed last; a job it left may print on
            try:
                data = os.read(self._master, 65536)
            except OSError:
                break
            if not data:
                break
            self._feed(data)
        os.close(self._master)
        self._master = -1
        self._finish(code if code >= 0 else 128 - code)

    def _fd(self) -> int:
        if self._master < 0:
            raise SandboxError(f"terminal {self.id} has exited", provider=self.provider)
        return self._master

    async def write(self, data: str | bytes) -> None:
        view = memoryview(data.encode() if isinstance(data, str) else data)
        while view:
            try:
                view = view[os.write(self._fd(), view) :]
            except BlockingIOError:
                writable = self._loop.create_future()
                self._loop.add_writer(self._master, writable.set_result, None)
                try:
                    await writable
                finally:
                    self._loop.remove_writer(self._master)
            except OSError as exc:
                message = f"terminal {self.id}: {exc.strerror}"
                raise SandboxError(message, provider=self.provider) from exc

    async def resize(self, rows: int, cols: int) -> None:
        set_size(self._fd(), rows, cols)

    async def kill(self) -> bool:
        """End the shell's whole session; False once it has exited."""
        if self._shell.returncode is not None or self._master < 0:
            return False
        sid = self._shell.pid
        await asyncio.to_thread(sweep, lambda pid: _session(pid) == sid)
        await asyncio.shield(self._ended)
        return True


def _session(pid: int) -> int | None:
    """The session of a live ``pid`` (None for a zombie: it is dead already)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return None
    state, _, _, session = stat[stat.rindex(")") + 2 :].split()[:4]
    return None if state in "ZX" else int(session)


def sweep(belongs: Callable[[int], bool]) -> None:
    """SIGKILL every process that ``belongs`` until a scan finds none.

    After each round it waits for the killed processes to exit (their pidfds
    turn readable) rather than scanning again at once: a scan of /proc is the
    cost, and the next one only has to find what forked meanwhile.
    """
    me = os.getpid()
    deadline = time.monotonic() + REAP_SECONDS
    while found := [p for p in _all_pids() if p != me and belongs(p)]:
        if time.monotonic() > deadline:
            _log.warning("processes %s outlived their kill", found)
            return
        killed = [fd for pid in found if (fd := _signal_if(pid, belongs)) is not None]
        try:
            exits = select.poll()
            for pidfd in killed:
                exits.register(pidfd, select.POLLIN)
            waiting = len(killed)
            while waiting and (left := deadline - time.monotonic()) > 0:
                for pidfd, _ in exits.poll(left * 1000):
                    exits.unregister(pidfd)
                    waiting -= 1
        finally:
            for pidfd in killed:
                os.close(pidfd)


def stop_all(belongs: Callable[[int], bool]) -> None:
    """SIGSTOP every process that ``belongs`` until a scan finds them all stopped.

    A stopped process cannot fork, so the set closes: what a running one
    forked meanwhile is found by the next scan.
    """
    me = os.getpid()
    deadline = time.monotonic() + REAP_SECONDS
    delay = 0.0005
    while running := [p for p in _all_pids() if p != me and _state(p) not in "TtZX" and belongs(p)]:
        if time.monotonic() > deadline:
            _log.warning("processes %s did not stop", running)
            return
        for pid in running:
            if (pidfd := _signal_if(pid, belongs, signal.SIGSTOP)) is not None:
                os.close(pidfd)
        time.sleep(delay)  # the stop lands asynchronously: let it before the next scan
        delay = min(delay * 2, _POLL_MAX)


def resume_all(belongs: Callable[[int], bool]) -> None:
    """SIGCONT every process that ``belongs`` (what `stop_all` stopped)."""
    me = os.getpid()
    for pid in _all_pids():
        if pid != me and (pidfd := _signal_if(pid, belongs, signal.SIGCONT)) is not None:
            os.close(pidfd)


def born(pid: int) -> int | None:
    """When the process ``pid`` started, in clock ticks since boot (None when there is
    none): a number drawn anew is told from the process that held it before."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return None
    return int(stat[stat.rindex(")") + 2 :].split()[19])


def _state(pid: int) -> str:
    """The state letter of ``pid`` (``X`` when it is gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return "X"
    return stat[stat.rindex(")") + 2]


def _signal_if(pid: int, belongs: Callable[[int], bool], sig: int = signal.SIGKILL) -> int | None:
    """Send ``sig`` to ``pid`` if it ``belongs``; its pidfd (to wait on) if it was sent.

    The pidfd is opened first and pins the pid, so what is checked after it
    is that very process, never a newcomer's with a reused pid.
    """
    try:
        pidfd = os.pidfd_open(pid)
    except OSError:  # gone already
        return None
    try:
        if belongs(pid):
            signal.pidfd_send_signal(pidfd, sig)
            return pidfd
    except ProcessLookupError:
        pass
    os.close(pidfd)
    return None


def _all_pids() -> list[int]:
    return [int(entry) for entry in os.listdir("/proc") if entry.isdigit()]
