"""Commands in a ``local`` sandbox: run, streamed (`LocalProcess`), in the background, in a PTY.

Each command runs with a scrubbed environment carrying the sandbox's
`MARKER`, under its rlimits and in its cgroup (`providers.local.isolation`),
in a new session so a timeout kills the whole process group, and under
bubblewrap when the entry isolates. Background processes and terminals are
recorded in `providers.local.processes`. `LocalCommands` also ends what its
commands started, for the sandbox's kill.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from providers.base import CodeContext, CodeResult, CommandResult
from providers.capabilities import Capability
from providers.errors import NotFound, SandboxError
from providers.kernel.host import refuse_context
from providers.local.directory import LocalDirectory
from providers.local.isolation import (
    COMMAND_PATH,
    HOME,
    MARKER,
    bwrap_command,
    carries,
    cgroup_kill,
    cgroup_remove,
    preexec,
    scratch_dir,
    system_dirs,
)
from providers.local.processes import (
    LocalTerminal,
    RecordedProcess,
    born,
    find_record,
    list_records,
    new_record,
    set_size,
    started,
    sweep,
    wrapped,
)
from providers.processes import ProcessInfo

__all__ = ["LocalCommands", "LocalProcess"]

_SETTLE_SECONDS = 2.0  # how long a softer signal's kill watches for the leader's death
_SETTLE_POLL = 0.01


class LocalProcess:
    """A command started in a local sandbox, for callers that stream its output."""

    def __init__(self, proc: asyncio.subprocess.Process, max_output: int) -> None:
        self.proc = proc
        self.max_output = max_output
        self.started = time.monotonic()
        self._born = born(proc.pid)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def kill(self, sig: int = signal.SIGKILL) -> None:
        """Signal the whole process group (bwrap and everything below it), while its
        leader is not reaped; a softer signal than SIGKILL that the leader dies of
        is followed by SIGKILL to what is left of the group.

        Once reaped, the group's number is free when its last member goes, and
        with pid_max at 32768 a busy host hands it to a newcomer within
        minutes: a late kill (an emulator ending a sandbox whose commands ended
        long ago) would SIGKILL a stranger's command.

        The follow-up is what bwrap's death does anyway (its sandbox dies with
        it), but a signal that reaches bwrap while it sets up ends bwrap before
        its sandbox's init is tied to it, and that init ignores the signal: the
        command would run on unsignalled, holding the output pipes open. Without
        bubblewrap it ends what the leader leaves (a background job ignores SIGINT).
        """
        if self.proc.returncode is not None:
            return
        self.end_group(sig)
        if sig == signal.SIGKILL:
            return
        loop = asyncio.get_running_loop()
        deadline = loop.time() + _SETTLE_SECONDS

        def settle() -> None:
            if self.proc.returncode is not None:
                self.end_group()  # within a poll of the reap
            elif loop.time() < deadline:
                loop.call_later(_SETTLE_POLL, settle)

        loop.call_later(_SETTLE_POLL, settle)

    def end_group(self, sig: int = signal.SIGKILL) -> None:
        """Signal what is left of the group; call it in the loop turn that saw the reap.

        Members still running keep the group's number taken; with none left it
        comes back once the pid counter wraps around, which on a busy host with
        pid_max at 32768 can be the moment of the reap of a long-lived leader. A
        process with the leader's number born at another time leads a newcomer's
        group then, and is left alone; so even before ``returncode`` is set, as the
        child watcher may have reaped the leader already.
        """
        if born(self.proc.pid) not in (None, self._born):
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, sig)

    async def communicate(
        self, stdin: bytes | None, timeout: float | None
    ) -> tuple[bytes, bytes, int, bool]:
        """Feed stdin, collect capped output; kill the group at ``timeout``. The exit code
        is a shell's: 128 + the signal that ended the command (as under bubblewrap)."""
        if self.proc.stdin is not None:
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                if stdin:
                    self.proc.stdin.write(stdin)
                    await self.proc.stdin.drain()
                self.proc.stdin.close()
        assert self.proc.stdout is not None
        assert self.proc.stderr is not None
        readers = asyncio.gather(
            _read_capped(self.proc.stdout, self.max_output),
            _read_capped(self.proc.stderr, self.max_output),
        )
        timed_out = False
        try:
            out, err = await asyncio.wait_for(asyncio.shield(readers), timeout)
        except TimeoutError:
            timed_out = True
            self.kill()
            out, err = await readers
        code = await self.proc.wait()
        self.end_group()  # anything the command left running
        return out, err, code if code >= 0 else 128 - code, timed_out


async def _read_capped(stream: asyncio.StreamReader, limit: int) -> bytes:
    buf = bytearray()
    dropped = 0
    while chunk := await stream.read(65536):
        room = limit - len(buf)
        buf += chunk[: max(room, 0)]
        dropped += max(len(chunk) - max(room, 0), 0)
    if dropped:
        buf += f"\n[sandbox-router: {dropped} bytes of output dropped]".encode()
    return bytes(buf)


class LocalCommands(LocalDirectory):
    """The commands of `providers.local.sandbox.LocalSandbox`, and the end of their processes."""

    def _argv(self, argv: Sequence[str], cwd: str | None) -> tuple[list[str], str]:
        """The command line (under bwrap when isolated) and the host directory to start in.

        ``cwd`` is a sandbox path, or ``/tmp`` and below: the command's own
        ``/tmp`` with bubblewrap, the host's (its ``TMPDIR``) without. A
        missing one fails the command, as it does under bwrap (a result, not
        an exception).
        """
        scratch = scratch_dir(cwd)
        if not self._provider.use_bwrap:
            workdir = scratch or str(self.resolve(cwd) if cwd else self.dir)
            if os.path.isdir(workdir):
                return list(argv), workdir
            return ["/bin/sh", "-c", 'cd -- "$0" && exec "$@"', workdir, *argv], str(self.dir)
        if scratch is None:
            inside = self.resolve(cwd) if cwd else self.dir
            relative = inside.relative_to(self.dir)
            scratch = HOME if relative == Path() else f"{HOME}/{relative}"
        cmd = [bwrap_command(), "--unshare-all", "--die-with-parent"]
        if self._provider.share_net:
            cmd.append("--share-net")
        for d in system_dirs():
            cmd += ["--ro-bind", d, d]
        cmd += [
            "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp",
            "--bind", str(self.dir), HOME, "--chdir", scratch,
            "--hostname", "sandbox", "--",
        ]  # fmt: skip
        return cmd + list(argv), str(self.dir)

    def _env(self, env: Mapping[str, str] | None) -> dict[str, str]:
        home = HOME if self._provider.use_bwrap else str(self.dir)
        base = {
            "PATH": COMMAND_PATH + ":" + os.path.dirname(sys.executable),
            "HOME": home,
            "TMPDIR": "/tmp",
            "LANG": "C.UTF-8",
            "LC_ALL": "C.UTF-8",
            "PYTHONUNBUFFERED": "1",
        }
        marker = {MARKER: self._provider.marker(self.id)}
        return {**base, **self.meta.get("env", {}), **(env or {}), **marker}

    def _track(self) -> None:
        """Before the first command: mark the sandbox as running commands, make its cgroup."""
        if self._tracked:
            return
        if self._cgroup is not None:
            try:
                os.mkdir(self._cgroup)
            except FileExistsError:
                pass
            except OSError:
                self._cgroup = None
            if self._cgroup is not None and not os.path.exists(self._cgroup + "/cgroup.kill"):
                os.rmdir(self._cgroup)  # a kernel before 5.14: the marker has to do
                self._cgroup = None
        with contextlib.suppress(FileExistsError):
            os.mkdir(self._procs, mode=0o700)
        self._tracked = True

    async def spawn(
        self,
        cmd: str | Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
    ) -> LocalProcess:
        """Start a command and return it running (stdin, stdout, stderr piped)."""
        self._check_running()
        self._track()
        argv = _shell(cmd)
        full, workdir = self._argv(argv, cwd)
        pipe = asyncio.subprocess.PIPE
        proc = await self._exec(full, workdir, env, argv[0], stdio=(pipe, pipe, pipe))
        return LocalProcess(proc, self._provider.opts.max_output_bytes)

    async def _exec(
        self,
        argv: list[str],
        workdir: str,
        env: Mapping[str, str] | None,
        name: str,
        *,
        stdio: tuple[int, int, int],
        tty: bool = False,
        enter: Callable[[], None] | None = None,
    ) -> asyncio.subprocess.Process:
        """Start ``argv`` (``name`` in errors) in a new session, in the sandbox's cgroup,
        under its limits; ``tty``: its stdin is a terminal to make the controlling one;
        ``enter``: run in the child last before exec."""
        opts = self._provider.opts
        try:
            proc = await asyncio.create_subprocess_exec(
                *argv,
                stdin=stdio[0],
                stdout=stdio[1],
                stderr=stdio[2],
                cwd=workdir,
                env=self._env(env),
                start_new_session=True,
                preexec_fn=preexec(opts, self._cgroup, tty=tty, enter=enter),
            )
        except (OSError, subprocess.SubprocessError) as exc:
            if not self.alive:  # a kill moved the directory (or removed the cgroup) first
                await self._end_processes()
                self._check_alive()
            if isinstance(exc, subprocess.SubprocessError):
                raise SandboxError(
                    f"cannot move the command into cgroup {self._cgroup}: "
                    "set the entry's option cgroup: false",
                    provider=self.provider,
                    sandbox_id=self.id,
                ) from exc
            if not isinstance(exc, (FileNotFoundError, NotADirectoryError, PermissionError)):
                raise
            raise SandboxError(
                f"cannot start {name!r}: {exc}", provider=self.provider, sandbox_id=self.id
            ) from exc
        if not self.alive:  # killed meanwhile, maybe before this command ran: end it here
            await self._end_processes()
        return proc

    async def start(
        self,
        cmd: str | Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
    ) -> RecordedProcess:
        """Start a recorded background process (`providers.local.processes`)."""
        self._check_running()
        self._track()
        argv = _shell(cmd)
        full, workdir = self._argv(argv, cwd)
        command = cmd if isinstance(cmd, str) else shlex.join(cmd)
        process_id, record = new_record(Path(self._procs), command)
        try:
            pipe, devnull = asyncio.subprocess.PIPE, asyncio.subprocess.DEVNULL
            wrapper = await self._exec(
                wrapped(record, full), workdir, env, argv[0], stdio=(pipe, devnull, devnull)
            )
            if not await started(record, wrapper):
                self._check_alive()
                raise SandboxError(
                    f"process {process_id} ended before its command started",
                    provider=self.provider,
                    sandbox_id=self.id,
                )
        except BaseException:
            shutil.rmtree(record, ignore_errors=True)
            raise
        return RecordedProcess(self, process_id, record, wrapper)

    async def processes(self) -> list[ProcessInfo]:
        self._check_alive()
        return list_records(Path(self._procs))

    async def attach(self, process_id: str) -> RecordedProcess:
        """A handle on a process any handle started, its output from the start."""
        self._check_alive()
        record = find_record(Path(self._procs), process_id)
        if record is None:
            raise NotFound(
                f"no process {process_id!r} in local sandbox {self.id}",
                provider=self.provider,
                sandbox_id=self.id,
            )
        return RecordedProcess(self, process_id, record)

    async def open_terminal(
        self,
        *,
        rows: int = 24,
        cols: int = 80,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
    ) -> LocalTerminal:
        """An interactive bash on a new PTY (``bash -i``: the sandbox's ``~/.bashrc``)."""
        self._check_running()
        self._track()
        full, workdir = self._argv(["/bin/bash", "-i"], cwd)
        master, slave = os.openpty()
        try:
            set_size(master, rows, cols)
            shell = await self._exec(
                full,
                workdir,
                {"TERM": "xterm-256color", "SHELL": "/bin/bash", **(env or {})},
                "/bin/bash",
                stdio=(slave, slave, slave),
                tty=True,
            )
        except BaseException:
            os.close(master)
            raise
        finally:
            os.close(slave)
        return LocalTerminal(shell, master, self.provider)

    async def run(
        self,
        cmd: str | Sequence[str],
        *,
        timeout: float | None = 60.0,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        stdin: bytes | None = None,
    ) -> CommandResult:
        started = time.monotonic()
        proc = await self.spawn(cmd, env=env, cwd=cwd)
        out, err, code, timed_out = await proc.communicate(stdin, timeout)
        return CommandResult(
            stdout=out.decode("utf-8", "replace"),
            stderr=err.decode("utf-8", "replace"),
            exit_code=code,
            duration=time.monotonic() - started,
            timed_out=timed_out,
        )

    @property
    def _kernel_python(self) -> str:
        return self._provider.opts.python

    async def run_code(
        self,
        code: str,
        language: str = "python",
        *,
        timeout: float | None = 60.0,
        context: CodeContext | None = None,
        env: Mapping[str, str] | None = None,
    ) -> CodeResult:
        """Python in the router's kernel (`providers.kernel`) where the entry starts
        processes; bash, and Python where it does not, in a new interpreter each call."""
        if language == "python" and Capability.PROCESS in self._provider.capabilities:
            return await self._kernels().run(code, context=context, timeout=timeout, env=env)
        interpreters = {"python": [self._provider.opts.python, "-"], "bash": ["/bin/bash", "-s"]}
        if language not in interpreters:
            raise SandboxError(
                f"run_code: language {language!r} is not supported "
                f"(expected one of {sorted(interpreters)})",
                provider=self.provider,
                sandbox_id=self.id,
            )
        refuse_context(self, context, language)
        ran = await self.run(interpreters[language], timeout=timeout, env=env, stdin=code.encode())
        return CodeResult.of_command(ran, timeout)

    def _carrier(self) -> Callable[[int], bool]:
        """Whether a pid carries this sandbox's environment marker."""
        marker = f"\0{MARKER}={self._provider.marker(self.id)}\0".encode()
        return functools.partial(carries, marker=marker)

    def _ran_commands(self) -> bool:
        """Whether commands ran: this handle started some, or ``<id>.procs`` or the cgroup
        says another did (a stat or two, inline like the rest of a kill)."""
        cgroup = self.meta.get("cgroup")
        return (
            self._tracked
            or os.path.exists(self._procs)
            or (cgroup is not None and os.path.isdir(cgroup))
        )

    async def _end_processes(self) -> None:
        """Kill every process of the sandbox, wait until they are gone, forget the cgroup."""
        cgroup = self.meta.get("cgroup")
        if cgroup and cgroup_kill(cgroup):
            await cgroup_remove(cgroup)
        else:
            await asyncio.to_thread(sweep, self._carrier())
        await asyncio.to_thread(shutil.rmtree, self._procs, ignore_errors=True)


def _shell(cmd: str | Sequence[str]) -> list[str]:
    return ["/bin/bash", "-c", cmd] if isinstance(cmd, str) else list(cmd)
