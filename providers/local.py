"""The ``local`` provider: sandboxes on this host.

Each sandbox is a private directory under the provider's root with its
metadata beside it (``<id>.json``, outside the writable tree so a command
cannot rewrite its own labels). Commands run with a scrubbed environment,
resource limits (CPU seconds, address space, file size, processes) and in a
new session so a timeout kills the whole process group. When ``bwrap`` is on
PATH the command runs inside bubblewrap: new pid/net/ipc/uts namespaces (the
host's network instead with the ``network`` option), the system directories
read-only and the sandbox directory as the only writable home,
``/home/sandbox``. bubblewrap's own ``--new-session`` is left out: the
session started here already has no controlling terminal, and bwrap would
move its pid 1 out of the process group, where a kill that lands during
bwrap's setup (before its pid 1 sets its parent-death signal) cannot reach
it and the command runs on.

Killing a sandbox ends every process it started, from this process or from
another one (the janitor reaps by id): commands still running, their
background children, and children that left the process group by a double
fork or ``setsid``. A process group cannot do that, so the kill finds them
by what every one of them inherits:

* a cgroup v2 of the sandbox's own (``sandbox-router.<id>.<root hash>``
  beside this process's cgroup), when this process may create one and move
  processes into it. The first command makes it, each command joins it
  before exec, and the kill writes ``cgroup.kill``: the kernel ends every
  member, forks in flight included, whatever it did to its environment.
  Its path is in the metadata, so any process can kill it.
* otherwise the environment variable ``SANDBOX_ROUTER_SANDBOX`` naming the
  sandbox (id and a hash of the root), which the kill looks for in
  ``/proc/<pid>/environ`` of every process, killing what carries it and
  scanning again until a scan finds none (a process may fork meanwhile). A
  hit is signalled through a pidfd opened before its environment is read
  again, so a reused pid is never signalled. That scan costs a few ms per
  kill on a host of a few hundred processes, and runs in a thread, only
  for a sandbox that ever ran a command (``<id>.procs`` beside its
  metadata says so).
* with bubblewrap, the command's pid namespace (``--unshare-pid``, and
  ``--die-with-parent`` on its pid 1): killing bwrap or its pid 1 ends
  every process in the namespace, even one that cleared its environment.

Without bubblewrap or a writable cgroup a command that clears its
environment (``env -i``) and leaves the process group outlives the kill:
only isolation can stop a command that wants to escape. The kill first
renames the sandbox directory away (atomically, so a command starting
concurrently sees the sandbox dead after its spawn and ends itself), then
ends the processes, then removes the tree no process writes into any more.

Background processes (recorded so that any process can list, follow and
attach to them) and terminals (PTYs) are in ``providers.local_processes``;
their processes are the sandbox's like any other, and die with it.

A pause stops every process where it is by the same means the kill finds
them (the cgroup's freezer, else SIGSTOP to what carries the marker) and
leaves ``<id>.paused`` beside the metadata, so every process on the host
lists it paused and may resume it. A snapshot is a copy of the directory in
``<root>/.snapshots/``, taken with the sandbox paused so that it is
consistent. The file calls work on the directory itself, on a worker
thread: they need no command, so they work on a paused sandbox too. A
command running meanwhile may swap a directory for a symlink at any moment,
so each call walks its path by descriptor (`providers.local_paths`) and
never follows a link out; a directory is moved (`upload_dir`,
`download_dir`) by ``tar`` inside the sandbox, except while it is paused.

The same machinery backs every emulator in ``emulators/``, so an emulated
cloud sandbox runs real commands too.
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import errno
import fcntl
import functools
import hashlib
import json
import logging
import os
import posixpath
import re
import resource
import secrets
import shlex
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import termios
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, BinaryIO, ClassVar, Literal, TypeVar

from providers.base import (
    CodeResult,
    CommandResult,
    FileInfo,
    PortURL,
    Provider,
    ProviderOptions,
    Sandbox,
    SandboxInfo,
    SandboxSpec,
    Snapshot,
    check_port,
)
from providers.capabilities import AGENT_WORK, FILE_WORK, Capability
from providers.errors import ConfigError, NotFound, SandboxError, SandboxPathError, Unsupported
from providers.files import CHUNK, Chunks, pack_dir, unpack_dir
from providers.local_paths import Escape, Located, Tree
from providers.local_processes import (
    LocalTerminal,
    RecordedProcess,
    find_record,
    list_records,
    new_record,
    resume_all,
    set_size,
    started,
    stop_all,
    sweep,
    wrapped,
)
from providers.processes import ProcessInfo

__all__ = ["LocalOptions", "LocalProvider", "LocalSandbox", "bwrap_available"]

_log = logging.getLogger(__name__)

HOME = "/home/sandbox"
MARKER = "SANDBOX_ROUTER_SANDBOX"
_REAP_SECONDS = 5.0  # a process stuck in the kernel (state D) may take this long to die
_SETTLE_SECONDS = 2.0  # how long a softer signal's kill watches for the leader's death
_SETTLE_POLL = 0.01
_SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc")
_PATH = "/usr/local/bin:/usr/bin:/bin"
_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,127}")
_SNAPSHOT = re.compile(r"local-snap-[0-9a-f]{16}")
T = TypeVar("T")
_SNAPSHOTS = ".snapshots"  # under the root; a dot name, so never taken for a sandbox

_CAPABILITIES = (
    frozenset({Capability.RUN_CODE, Capability.PAUSE, Capability.SNAPSHOT}) | FILE_WORK | AGENT_WORK
)


def bwrap_available() -> bool:
    return shutil.which("bwrap") is not None


def bwrap_command() -> str:
    """bubblewrap by its host path: a command's env (a sandbox's PATH) must not decide
    whether the launcher itself is found."""
    return shutil.which("bwrap") or "bwrap"


def _default_root() -> Path:
    return Path(tempfile.gettempdir()) / f"sandbox-router-{os.getuid()}" / "local"


class LocalOptions(ProviderOptions):
    """Options of the ``local`` provider.

    Attributes:
        root: where sandbox directories live (default: a per-user temp dir).
        isolation: ``auto`` uses bubblewrap when present, ``bwrap`` requires
            it, ``none`` runs commands as plain child processes.
        cpu_seconds, memory_mb, file_size_mb, max_processes: rlimits applied
            to every command.
        max_output_bytes: stdout and stderr are each cut at this size.
        python: interpreter for ``run_code(language="python")``.
        cgroup: give each sandbox a cgroup v2 of its own when this process
            may make one, so a kill ends its every process whatever they
            did to their environment; ``False`` leaves that to the
            environment marker and, with bwrap, the pid namespace.
        network: with bwrap, share the host's network (``--share-net``):
            a server in the sandbox is reachable on 127.0.0.1, so the entry
            declares ``port``, and the sandbox reaches everything this host
            does (its loopback services included). ``False`` gives it an
            empty network namespace of its own. Without bwrap commands
            always share the host's network.
    """

    root: Path | None = None
    isolation: Literal["auto", "bwrap", "none"] = "auto"
    cpu_seconds: int = 600
    memory_mb: int = 2048
    file_size_mb: int = 512
    max_processes: int = 512
    max_output_bytes: int = 10 * 1024 * 1024
    python: str = "python3"
    cgroup: bool = True
    network: bool = False


class LocalProvider(Provider):
    """Sandboxes on this host: always configured, the chain's last resort.

    ``capabilities`` on the class is what every entry has; an entry whose
    sandboxes share the host's network (no bwrap, or ``network: true``) adds
    ``port``.
    """

    kind: ClassVar[str] = "local"
    Options: ClassVar[type[ProviderOptions]] = LocalOptions
    capabilities: frozenset[str] = _CAPABILITIES

    def __init__(self, name: str = "local", options: ProviderOptions | None = None) -> None:
        super().__init__(name, options)
        opts = self.opts
        self.root = (opts.root or _default_root()).resolve()
        self.use_bwrap = _resolve_isolation(opts.isolation, name)
        self.cgroup_base = _cgroup_base() if opts.cgroup else None
        self._root_hash = hashlib.sha256(str(self.root).encode()).hexdigest()[:12]
        self.share_net = opts.network or not self.use_bwrap
        if self.share_net:
            self.capabilities = _CAPABILITIES | {Capability.PORT}

    def marker(self, sandbox_id: str) -> str:
        """The value of ``SANDBOX_ROUTER_SANDBOX`` in the sandbox's processes: unique per root."""
        return f"{sandbox_id}.{self._root_hash}"

    @property
    def opts(self) -> LocalOptions:
        assert isinstance(self.options, LocalOptions)
        return self.options

    async def create(
        self, spec: SandboxSpec, *, timeout: float = 60.0, sandbox_id: str | None = None
    ) -> LocalSandbox:
        """Create a sandbox directory; ``sandbox_id`` lets an emulator mint vendor-shaped ids.

        A ``template`` naming a snapshot (`LocalSandbox.snapshot`) starts from
        a copy of it; any other template is ignored (there are no images here).

        Raises:
            NotFound: the snapshot ``template`` names is gone.
        """
        sandbox_id = sandbox_id or "local-" + secrets.token_hex(8)
        if not _ID.fullmatch(sandbox_id):
            raise ValueError(f"invalid local sandbox id {sandbox_id!r}")
        copied = spec.template is not None and spec.template.startswith("local-snap-")
        if copied:
            assert spec.template is not None
            await asyncio.to_thread(self._copy_snapshot, spec.template, sandbox_id)
        meta = {
            "id": sandbox_id,
            "labels": dict(spec.labels),
            "env": dict(spec.env),
            "created_at": time.time(),
            "language": spec.language,
            "cgroup": os.path.join(self.cgroup_base, "sandbox-router." + self.marker(sandbox_id))
            if self.cgroup_base
            else None,
        }
        # A mkdir and a small file: cheaper inline than a hop to a worker thread.
        self._write_meta(sandbox_id, meta, made=copied)
        return LocalSandbox(self, sandbox_id, meta)

    def _snapshot_dir(self, snapshot_id: str) -> Path:
        return self.root / _SNAPSHOTS / snapshot_id

    def _copy_snapshot(self, snapshot_id: str, sandbox_id: str) -> None:
        source = self._snapshot_dir(snapshot_id)
        if not _SNAPSHOT.fullmatch(snapshot_id) or not source.is_dir():
            raise NotFound(f"no local snapshot {snapshot_id!r}", provider=self.name)
        target = self.root / sandbox_id
        try:
            _copy_tree(source, target)
        except BaseException:
            shutil.rmtree(target, ignore_errors=True)
            raise
        os.chmod(target, 0o700)

    def _write_meta(self, sandbox_id: str, meta: dict[str, Any], *, made: bool = False) -> None:
        root = str(self.root)
        try:
            if not made:
                os.mkdir(os.path.join(root, sandbox_id), mode=0o700)
        except FileNotFoundError:  # the first sandbox under this root
            os.makedirs(os.path.join(root, sandbox_id), mode=0o700)
        tmp = os.path.join(root, f".{sandbox_id}.json.tmp")
        with open(tmp, "w") as f:
            f.write(json.dumps(meta))
        os.replace(tmp, os.path.join(root, f"{sandbox_id}.json"))

    def _read_meta(self, sandbox_id: str) -> dict[str, Any]:
        if not _ID.fullmatch(sandbox_id):
            raise NotFound(f"no local sandbox {sandbox_id!r}", provider=self.name)
        try:
            meta: dict[str, Any] = json.loads((self.root / f"{sandbox_id}.json").read_text())
        except FileNotFoundError:
            raise NotFound(
                f"no local sandbox {sandbox_id!r}", provider=self.name, sandbox_id=sandbox_id
            ) from None
        return meta

    async def connect(self, sandbox_id: str) -> LocalSandbox:
        meta = await asyncio.to_thread(self._read_meta, sandbox_id)
        sandbox = LocalSandbox(self, sandbox_id, meta)
        sandbox._check_alive()
        return sandbox

    async def list(self, labels: Mapping[str, str] | None = None) -> list[SandboxInfo]:
        return await asyncio.to_thread(self._list, dict(labels or {}))

    def _list(self, labels: dict[str, str]) -> builtins.list[SandboxInfo]:
        found = []
        for meta_path in sorted(self.root.glob("[!.]*.json")) if self.root.exists() else []:
            try:
                meta = json.loads(meta_path.read_text())
            except (OSError, ValueError):
                continue
            if all(meta["labels"].get(k) == v for k, v in labels.items()):
                paused = os.path.exists(self.root / f"{meta['id']}.paused")
                state = "paused" if paused else "running"
                found.append(SandboxInfo(meta["id"], meta["labels"], state, meta["created_at"]))
        return found

    async def kill(self, sandbox_id: str) -> bool:
        """Kill by id (the janitor's reap, maybe in another process than the creator's).

        The metadata is enough: it names the cgroup, and a kill that stopped
        halfway (its directory gone, the metadata left) is finished.
        """
        try:
            meta = self._read_meta(sandbox_id)
        except NotFound:
            return False
        await LocalSandbox(self, sandbox_id, meta).kill()
        return True

    async def resume(self, sandbox_id: str, *, timeout: float) -> LocalSandbox:
        """Thaw a paused sandbox's processes (at once: nothing to load), on the same id."""
        sandbox = await self.connect(sandbox_id)
        await sandbox.thaw()
        return sandbox

    async def delete_snapshot(self, snapshot_id: str) -> bool:
        if not _SNAPSHOT.fullmatch(snapshot_id):
            return False
        doomed = self.root / _SNAPSHOTS / f".{snapshot_id}.{secrets.token_hex(4)}.dead"
        try:
            os.rename(self._snapshot_dir(snapshot_id), doomed)
        except FileNotFoundError:
            return False
        await asyncio.to_thread(shutil.rmtree, doomed, ignore_errors=True)
        return True


def _resolve_isolation(isolation: str, name: str) -> bool:
    if isolation == "none":
        return False
    if bwrap_available():
        return True
    if isolation == "bwrap":
        raise ConfigError(f"entry {name!r}: isolation 'bwrap' requested but bwrap is not on PATH")
    _warn_no_bwrap()
    return False


@functools.cache
def _warn_no_bwrap() -> None:
    """Said once per process (every provider would otherwise repeat it), through the
    standard ``logging`` module: the app's handlers if it set any, else one plain line."""
    _log.warning(
        "bubblewrap (bwrap) is not on PATH: local sandboxes run without namespace "
        "isolation, with rlimits and a private directory only"
    )


class LocalProcess:
    """A command started in a local sandbox, for callers that stream its output."""

    def __init__(self, proc: asyncio.subprocess.Process, max_output: int) -> None:
        self.proc = proc
        self.max_output = max_output
        self.started = time.monotonic()

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
        comes back only after the pid counter wraps around, not within a turn.
        """
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, sig)

    async def communicate(
        self, stdin: bytes | None, timeout: float | None
    ) -> tuple[bytes, bytes, int, bool]:
        """Feed stdin, collect capped output; kill the group at ``timeout``."""
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
        return out, err, code, timed_out


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


class LocalSandbox(Sandbox):
    """A private directory and the commands run in it."""

    def __init__(self, provider: LocalProvider, sandbox_id: str, meta: dict[str, Any]) -> None:
        self._provider = provider
        self.id = sandbox_id
        self.provider = provider.name
        self.meta = meta
        self.dir = provider.root / sandbox_id
        self._cgroup: str | None = meta.get("cgroup")
        self._tracked = False

    @property
    def _procs(self) -> str:
        """Made by the first command (the kill looks for processes then only); holds the
        records of background processes (`providers.local_processes`)."""
        return os.path.join(self._provider.root, f"{self.id}.procs")

    @property
    def native(self) -> Path:
        return self.dir

    @property
    def labels(self) -> dict[str, str]:
        return dict(self.meta["labels"])

    @property
    def _paused(self) -> str:
        """Beside the metadata while the sandbox is paused: any process on the host sees it."""
        return os.path.join(self._provider.root, f"{self.id}.paused")

    def _check_alive(self) -> None:
        if not self.dir.is_dir():
            raise NotFound(
                f"local sandbox {self.id} was killed", provider=self.provider, sandbox_id=self.id
            )

    @property
    def paused(self) -> bool:
        return os.path.exists(self._paused)

    def _check_running(self) -> None:
        """Before a command starts: alive, and not paused (its command would hang frozen)."""
        self._check_alive()
        if self.paused:
            raise SandboxError(
                f"local sandbox {self.id} is paused: resume it to run commands",
                provider=self.provider,
                sandbox_id=self.id,
            )

    @property
    def _tree(self) -> Tree:
        return Tree(str(self.dir), HOME)

    def _inner(self, path: str) -> str:
        """``path`` from the sandbox's directory: a relative path, or one under
        /home/sandbox (or the directory's host path); anything else is refused."""
        if "\x00" in path:
            raise SandboxPathError(
                "path contains a NUL byte", provider=self.provider, sandbox_id=self.id
            )
        for base in (HOME, str(self.dir)):
            if path == base or path.startswith(base + "/"):
                return path[len(base) :].lstrip("/") or "."
        if os.path.isabs(path):
            raise SandboxPathError(
                f"path {path!r} is outside the sandbox (use a relative path or {HOME}/...)",
                provider=self.provider,
                sandbox_id=self.id,
            )
        return path

    def resolve(self, path: str) -> Path:
        """The host path of a sandbox path (relative, or under /home/sandbox), its
        symlinks resolved inside the sandbox (`Tree.locate`).

        For a command's ``cwd`` only: the file calls act on what they locate
        themselves. A path through a missing directory is kept as written:
        the command then fails to start in it, as it would under bwrap.
        """
        inner = self._inner(path)
        try:
            with self._tree.locate(inner, follow=True) as found:
                return self.dir.joinpath(*found.parts)
        except Escape:
            raise self._escape(path) from None
        except OSError:
            return self.dir / posixpath.normpath(inner)

    def _escape(self, path: str) -> SandboxPathError:
        return SandboxPathError(
            f"path {path!r} escapes the sandbox directory",
            provider=self.provider,
            sandbox_id=self.id,
        )

    def _argv(self, argv: Sequence[str], cwd: str | None) -> tuple[list[str], str]:
        """The command line (under bwrap when isolated) and the host directory to start in.

        ``cwd`` is a sandbox path, or ``/tmp`` and below: the command's own
        ``/tmp`` with bubblewrap, the host's (its ``TMPDIR``) without. A
        missing one fails the command, as it does under bwrap (a result, not
        an exception).
        """
        scratch = _scratch(cwd)
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
        for d in _system_dirs():
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
            "PATH": _PATH + ":" + os.path.dirname(sys.executable),
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
    ) -> asyncio.subprocess.Process:
        """Start ``argv`` (``name`` in errors) in a new session, in the sandbox's cgroup,
        under its limits; ``tty``: its stdin is a terminal to make the controlling one."""
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
                preexec_fn=_preexec(opts, self._cgroup, tty=tty),
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
        """Start a recorded background process (`providers.local_processes`)."""
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

    async def run_code(
        self, code: str, language: str = "python", *, timeout: float | None = 60.0
    ) -> CodeResult:
        interpreters = {"python": [self._provider.opts.python, "-"], "bash": ["/bin/bash", "-s"]}
        if language not in interpreters:
            raise SandboxError(
                f"run_code: language {language!r} is not supported "
                f"(expected one of {sorted(interpreters)})",
                provider=self.provider,
                sandbox_id=self.id,
            )
        ran = await self.run(interpreters[language], timeout=timeout, stdin=code.encode())
        return CodeResult.of_command(ran, timeout)  # stateless: a new interpreter each time

    async def _at(
        self, path: str, op: Callable[[Located], T], *, follow: bool, make_parents: bool = False
    ) -> T:
        """Run ``op`` on a worker thread on what ``path`` locates (see `providers.local_paths`)."""
        self._check_alive()
        inner = self._inner(path)

        def call() -> T:
            with self._tree.locate(inner, follow=follow, make_parents=make_parents) as found:
                return op(found)

        return await asyncio.to_thread(self._fs, call, path)

    def _fs(self, op: Callable[[], T], path: str) -> T:
        try:
            return op()
        except Escape:
            raise self._escape(path) from None
        except FileNotFoundError as exc:
            raise self._error(f"no such file or directory: {path!r}") from exc
        except OSError as exc:
            raise self._error(f"{path!r}: {exc.strerror}") from exc

    def _error(self, message: str) -> SandboxError:
        return SandboxError(message, provider=self.provider, sandbox_id=self.id)

    async def write_file(self, path: str, data: bytes | str) -> None:
        payload = data.encode() if isinstance(data, str) else data

        def write(found: Located) -> None:
            with os.fdopen(found.open(os.O_WRONLY | os.O_CREAT | os.O_TRUNC), "wb") as out:
                out.write(payload)

        await self._at(path, write, follow=True, make_parents=True)

    async def read_file(self, path: str) -> bytes:
        def read(found: Located) -> bytes:
            with _open_regular(found) as handle:
                return handle.read()

        return await self._at(path, read, follow=True)

    async def list_files(self, path: str = ".") -> list[FileInfo]:
        def listing(found: Located) -> list[FileInfo]:
            fd = found.open(os.O_RDONLY | os.O_DIRECTORY)
            try:
                with os.scandir(fd) as entries:
                    return [
                        FileInfo(
                            name=entry.name,
                            path=_home_path((*found.parts, entry.name)),
                            is_dir=entry.is_dir(follow_symlinks=False),
                            size=(
                                entry.stat(follow_symlinks=False).st_size
                                if entry.is_file(follow_symlinks=False)
                                else 0
                            ),
                        )
                        for entry in sorted(entries, key=lambda e: e.name)
                    ]
            finally:
                os.close(fd)

        return await self._at(path, listing, follow=True)

    def _info(self, found: Located) -> FileInfo:
        st = found.lstat()
        return FileInfo(
            name=found.name or posixpath.basename(HOME),
            path=_home_path(found.parts),
            is_dir=stat.S_ISDIR(st.st_mode),
            size=st.st_size,
            mode=stat.S_IMODE(st.st_mode),
            modified=st.st_mtime,
        )

    async def remove(self, path: str) -> None:
        def remove(found: Located) -> None:
            if not found.name:
                raise self._error(f"remove {path!r}: the sandbox's home cannot be removed")
            if stat.S_ISDIR(found.lstat().st_mode):
                shutil.rmtree(found.name, dir_fd=found.parent)
            else:
                os.unlink(found.name, dir_fd=found.parent)

        await self._at(path, remove, follow=False)

    async def make_dir(self, path: str) -> bool:
        def make(found: Located) -> bool:
            if not found.name:
                return False
            try:
                os.mkdir(found.name, dir_fd=found.parent)
            except FileExistsError:
                if stat.S_ISDIR(found.lstat().st_mode):
                    return False
                raise
            return True

        return await self._at(path, make, follow=True, make_parents=True)

    async def exists(self, path: str) -> bool:
        self._check_alive()
        inner = self._inner(path)

        def there() -> bool:
            try:
                with self._tree.locate(inner, follow=False) as found:
                    found.lstat()
            except (FileNotFoundError, NotADirectoryError):
                return False
            return True

        return await asyncio.to_thread(self._fs, there, path)

    async def rename(self, src: str, dst: str) -> FileInfo:
        self._check_alive()
        source, target = self._inner(src), self._inner(dst)

        def move() -> FileInfo:
            with (
                self._tree.locate(source, follow=False) as old,
                self._tree.locate(target, follow=False) as new,
            ):
                if not (old.name and new.name):
                    raise self._error(f"rename {src!r} {dst!r}: the sandbox's home cannot be moved")
                old.lstat()
                os.replace(old.name, new.name, src_dir_fd=old.parent, dst_dir_fd=new.parent)
                return self._info(new)

        return await asyncio.to_thread(self._fs, move, src)

    async def stat(self, path: str) -> FileInfo:
        return await self._at(path, self._info, follow=False)

    async def read_stream(self, path: str) -> AsyncIterator[bytes]:
        """The file in `CHUNK` pieces, each read on a worker thread."""
        handle = await self._at(path, _open_regular, follow=True)
        try:
            read = functools.partial(handle.read, CHUNK)
            while chunk := await asyncio.to_thread(self._fs, read, path):
                yield chunk
        finally:
            handle.close()

    async def write_stream(self, path: str, chunks: Chunks) -> None:
        """Write ``chunks`` into the file as they come, each write on a worker thread."""

        def open_target(found: Located) -> BinaryIO:
            return os.fdopen(found.open(os.O_WRONLY | os.O_CREAT | os.O_TRUNC), "wb")

        handle = await self._at(path, open_target, follow=True, make_parents=True)
        try:
            async for chunk in chunks:
                await asyncio.to_thread(self._fs, functools.partial(handle.write, chunk), path)
        finally:
            handle.close()

    async def upload_dir(self, local: Path, path: str) -> None:
        """Unpack a tar stream of ``local`` into the sandbox: on the host straight into
        a paused sandbox's directory, else by ``tar`` in the sandbox (`_walks_host`)."""
        if not self._walks_host():
            await super().upload_dir(local, path)
            return
        target = self.resolve(path)
        await self._moved("upload_dir", path, unpack_dir(pack_dir(local), target))

    async def download_dir(self, path: str, local: Path) -> None:
        """Pack the sandbox's directory as a tar stream and unpack it into ``local``: on
        the host for a paused sandbox, else by ``tar`` in the sandbox (`_walks_host`)."""
        if not self._walks_host():
            await super().download_dir(path, local)
            return
        source = self.resolve(path)
        if not await asyncio.to_thread(source.is_dir):
            raise self._error(f"download_dir {path!r}: no such directory")
        await self._moved("download_dir", path, unpack_dir(pack_dir(source), local))

    def _walks_host(self) -> bool:
        """Whether a tree may be walked by path on the host: only while the sandbox is
        paused, when no command can swap a directory on the way for a symlink (tar
        walks by name; `Tree` guards single paths only)."""
        self._check_alive()
        return self.paused

    async def expose(self, port: int) -> PortURL:
        """The sandbox shares this host's network: its port is this host's loopback one."""
        if Capability.PORT not in self._provider.capabilities:
            raise Unsupported(self.provider, Capability.PORT)
        check_port(port, "expose(port)")
        self._check_alive()
        return PortURL(port, f"http://127.0.0.1:{port}", {})

    async def pause(self) -> None:
        """Stop every process of the sandbox where it is; the files stay as they are.

        The paused mark goes first, so a command starting meanwhile is
        refused (or, past that check, stopped with the rest). A cgroup is
        frozen (``cgroup.freeze``); without one the marked processes get
        SIGSTOP until a scan finds them all stopped (a stopped process
        cannot fork).
        """
        self._check_alive()
        os.close(os.open(self._paused, os.O_WRONLY | os.O_CREAT, 0o600))
        cgroup = self.meta.get("cgroup")
        if cgroup and await _cgroup_freeze(cgroup, True):
            return
        if self._ran_commands():
            await asyncio.to_thread(stop_all, self._carrier())

    async def thaw(self) -> None:
        """Continue what `pause` stopped (nothing when it is not paused)."""
        self._check_alive()
        if not self.paused:
            return
        cgroup = self.meta.get("cgroup")
        if not (cgroup and await _cgroup_freeze(cgroup, False)) and self._ran_commands():
            await asyncio.to_thread(resume_all, self._carrier())
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self._paused)

    async def snapshot(self, name: str | None = None) -> Snapshot:
        """Copy the sandbox's directory into the root's snapshot store (a later
        ``SandboxSpec(template=snapshot.id)`` on this entry starts from a copy), with
        its processes paused for the copy."""
        self._check_alive()
        snapshot_id = "local-snap-" + secrets.token_hex(8)
        store = self._provider.root / _SNAPSHOTS
        partial = store / f".{snapshot_id}.part"
        running = not self.paused

        def copy() -> None:
            store.mkdir(exist_ok=True)
            try:
                _copy_tree(self.dir, partial)
                os.rename(partial, store / snapshot_id)
            except BaseException:
                shutil.rmtree(partial, ignore_errors=True)
                raise

        if running:  # frozen: a consistent copy, and no command swaps a path during it
            await self.pause()
        try:
            await asyncio.to_thread(copy)
        except (OSError, shutil.Error) as exc:
            raise self._error(f"snapshot: cannot copy the sandbox: {exc}") from exc
        finally:
            if running:
                await self.thaw()
        return Snapshot(snapshot_id, self.provider, name)

    def _carrier(self) -> Callable[[int], bool]:
        """Whether a pid carries this sandbox's environment marker."""
        marker = f"\0{MARKER}={self._provider.marker(self.id)}\0".encode()
        return functools.partial(_carries, marker=marker)

    async def kill(self) -> None:
        """End the sandbox: see the module docstring for the order and why.

        An empty directory goes with one rmdir; one with files is renamed
        away first and removed by a thread once its processes are dead.
        """
        doomed = None
        try:
            os.rmdir(self.dir)
        except FileNotFoundError:
            pass
        except OSError:
            doomed = os.path.join(self._provider.root, f".{self.id}.{secrets.token_hex(4)}.dead")
            try:
                os.rename(self.dir, doomed)
            except FileNotFoundError:
                doomed = None
        if self._ran_commands():
            await self._end_processes()
        if doomed is not None:
            await asyncio.to_thread(shutil.rmtree, doomed, ignore_errors=True)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self._paused)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join(self._provider.root, f"{self.id}.json"))

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
        if cgroup and _cgroup_kill(cgroup):
            await _cgroup_remove(cgroup)
        else:
            await asyncio.to_thread(sweep, self._carrier())
        await asyncio.to_thread(shutil.rmtree, self._procs, ignore_errors=True)

    @property
    def alive(self) -> bool:
        return self.dir.is_dir()


def _open_regular(found: Located) -> BinaryIO:
    """Open a regular file for reading; non-blocking first, so a FIFO a command made
    is refused rather than waited on."""
    fd = found.open(os.O_RDONLY | os.O_NONBLOCK)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise IsADirectoryError(errno.EISDIR, "not a regular file")
    os.set_blocking(fd, True)
    return os.fdopen(fd, "rb")


def _home_path(parts: Sequence[str]) -> str:
    return posixpath.join(HOME, *parts)


def _copy_tree(source: Path, target: Path) -> None:
    """Copy a sandbox's tree: symlinks as links, FIFOs, sockets and devices left out
    (a FIFO would block the copy; a socket's server is gone with its process)."""

    def specials(directory: str, names: list[str]) -> set[str]:
        kinds = (stat.S_ISREG, stat.S_ISDIR, stat.S_ISLNK)
        return {
            n
            for n in names
            if not any(k(os.lstat(os.path.join(directory, n)).st_mode) for k in kinds)
        }

    shutil.copytree(source, target, symlinks=True, ignore=specials)


async def _cgroup_freeze(cgroup: str, frozen: bool) -> bool:
    """Freeze or thaw ``cgroup`` and wait until the kernel says it is done; False when
    there is no such cgroup (no command ran, or it could not be made)."""
    try:
        fd = os.open(os.path.join(cgroup, "cgroup.freeze"), os.O_WRONLY)
    except OSError:
        return False
    try:
        os.write(fd, b"1" if frozen else b"0")
    except OSError:
        return False
    finally:
        os.close(fd)
    want = f"frozen {int(frozen)}"
    deadline = time.monotonic() + _REAP_SECONDS
    delay = 0.0005
    while time.monotonic() < deadline:
        if _cgroup_event(cgroup, want):
            return True
        await asyncio.sleep(delay)
        delay = min(delay * 2, 0.05)
    _log.warning("cgroup %s not %s after %ss", cgroup, want, _REAP_SECONDS)
    return True


def _cgroup_event(cgroup: str, line: str) -> bool:
    """Whether ``cgroup.events`` says ``line`` (or the cgroup is gone: a kill ended it)."""
    try:
        with open(os.path.join(cgroup, "cgroup.events")) as f:
            return line in f.read().splitlines()
    except OSError:
        return True


def _shell(cmd: str | Sequence[str]) -> list[str]:
    return ["/bin/bash", "-c", cmd] if isinstance(cmd, str) else list(cmd)


def _scratch(cwd: str | None) -> str | None:
    """``cwd`` normalized when it is ``/tmp`` or below, else None."""
    if cwd is None or not cwd.startswith("/"):
        return None
    path = posixpath.normpath(cwd)
    return path if path == "/tmp" or path.startswith("/tmp/") else None


def _system_dirs() -> list[str]:
    dirs = [d for d in _SYSTEM_DIRS if os.path.exists(d)]
    prefix = sys.base_prefix
    if not any(prefix == d or prefix.startswith(d + "/") for d in dirs):
        dirs.append(prefix)
    return dirs


def _preexec(opts: LocalOptions, cgroup: str | None, *, tty: bool = False) -> Any:
    """A preexec_fn: in the child before exec, join the sandbox's cgroup, apply the
    rlimits and, for a terminal, make its stdin (after the setsid) the controlling one.

    A failed join raises (the start fails): a command outside the cgroup
    would outlive the kill.
    """
    procs = os.path.join(cgroup, "cgroup.procs") if cgroup else None
    limits = [
        (resource.RLIMIT_CPU, opts.cpu_seconds),
        (resource.RLIMIT_AS, opts.memory_mb * 1024 * 1024),
        (resource.RLIMIT_FSIZE, opts.file_size_mb * 1024 * 1024),
        (resource.RLIMIT_NPROC, opts.max_processes),
    ]

    def apply() -> None:
        if procs is not None:
            fd = os.open(procs, os.O_WRONLY)
            try:
                os.write(fd, b"0")
            finally:
                os.close(fd)
        for which, value in limits:
            with contextlib.suppress(ValueError, OSError):
                resource.setrlimit(which, (value, value))
        if tty:
            fcntl.ioctl(0, termios.TIOCSCTTY, 0)

    return apply


@functools.cache
def _cgroup_base() -> str | None:
    """This process's cgroup v2 directory, if it may make children and move processes in."""
    try:
        with open("/proc/self/cgroup") as f:
            path = next((ln[3:] for ln in f.read().splitlines() if ln.startswith("0::/")), None)
        with open("/proc/self/mountinfo") as f:
            mounts = [ln.split() for ln in f]
    except OSError:
        return None
    for fields in mounts:
        if path is None or "-" not in fields or fields[fields.index("-") + 1] != "cgroup2":
            continue
        root, mountpoint = fields[3], fields[4]
        if path != root and not path.startswith(root.rstrip("/") + "/"):
            continue
        base = os.path.normpath(mountpoint + "/" + path[len(root) :])
        if os.access(base, os.W_OK) and os.access(base + "/cgroup.procs", os.W_OK):
            return base
    return None


def _cgroup_kill(cgroup: str) -> bool:
    """SIGKILL every member of ``cgroup`` (the kernel does, forks in flight included)."""
    try:
        fd = os.open(os.path.join(cgroup, "cgroup.kill"), os.O_WRONLY)
    except OSError:  # never made (no command ran, or no cgroup here), or not ours
        return False
    try:
        os.write(fd, b"1")
    except OSError:
        return False
    finally:
        os.close(fd)
    return True


async def _cgroup_remove(cgroup: str) -> None:
    """Remove ``cgroup`` once its killed members have exited (EBUSY until then)."""
    deadline = time.monotonic() + _REAP_SECONDS
    delay = 0.0005
    while True:
        try:
            os.rmdir(cgroup)
            return
        except FileNotFoundError:
            return
        except OSError as exc:
            if exc.errno != errno.EBUSY or time.monotonic() > deadline:
                _log.warning("cannot remove cgroup %s: %s", cgroup, exc.strerror)
                return
        await asyncio.sleep(delay)
        delay = min(delay * 2, 0.05)


def _carries(pid: int, marker: bytes) -> bool:
    """Whether ``pid`` is alive with ``marker`` in its environment (a zombie has none)."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return marker in b"\0" + f.read()
    except OSError:
        return False
