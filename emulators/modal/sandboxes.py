"""The emulated Modal sandboxes, their tasks and the commands exec'd in them.

A Modal sandbox is a `providers.local.LocalSandbox` (real commands, real
files) plus what Modal keeps around it: the workspace (token id) that owns
it, its app, tags, environment, the tunnels of the ports it declared at
create, its one task (the container: exec'd commands go to the task's
command router), the entrypoint command a create may give (the sandbox's own
process: its stdio are the sandbox's, and its exit ends the sandbox with its
exit code) and, once it has ended, its `GenericResult` (exited, terminated,
or timed out after its lifetime or idle time).

A filesystem snapshot is an image (`KeptImage`): a copy of the sandbox's
directory in the local provider's snapshot store, owned by the workspace,
until it is deleted or its TTL passes; a create from it starts on a copy.
A directory snapshot is a copy of one directory, which ``mount_image``
copies to a mount point (what was there is set aside until the unmount).

Ids have Modal's shapes: ``sb-`` + 22 base62 characters is a V1 sandbox
(the SDK routes such ids to the V1 RPCs), longer ids are V2 sandboxes;
the task ids of V2 sandboxes end in ``V``.

Paths are Modal's: the home is ``/root`` and commands start in the
sandbox's working directory (its ``workdir``, else ``/root``); the rest of
the sandbox's filesystem is `emulators.filesystem.GuestSandbox`'s, its
volumes (`emulators.modal.volumes`) mounted there.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import hmac
import json
import os
import secrets
import shlex
import shutil
import signal
import string
import time
from collections.abc import AsyncIterator, Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from grpclib import GRPCError, Status
from modal_proto import api_pb2

from emulators.filesystem import GUEST_BIN, GuestSandbox, PathRefused
from emulators.harness import EmulatorCore
from providers.errors import ProviderError
from providers.local import LocalProcess

__all__ = [
    "FS_TOOLS",
    "IMAGE_PATH",
    "MODAL_HOME",
    "Container",
    "Exec",
    "KeptImage",
    "ModalCore",
    "ModalSandbox",
    "Tokens",
    "new_id",
]

MODAL_HOME = "/root"
IMAGE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
FS_TOOLS = "/__modal/.bin/modal-sandbox-fs-tools"
_BASE62 = string.digits + string.ascii_uppercase + string.ascii_lowercase
_CHUNK = 64 * 1024
_READ_CHUNK = 1024 * 1024
_ENDINGS = {
    "kill": (api_pb2.GenericResult.GENERIC_STATUS_TERMINATED, "Sandbox terminated"),
    "expired": (api_pb2.GenericResult.GENERIC_STATUS_TIMEOUT, "Sandbox timed out"),
    "idle": (api_pb2.GenericResult.GENERIC_STATUS_IDLE_TIMEOUT, "Sandbox was idle too long"),
}
_FS_TOOLS_SOURCE = (Path(__file__).parent / "fs_tools.py").read_text()
_PTY_SOURCE = (Path(__file__).parent / "pty_relay.py").read_text()
_HOLDER_SECONDS = 5.0
_PROBE_SECONDS = 5.0
_MOUNTED = "/__modal/mounted"  # where a mount sets aside what was at its mount point
_DIRECTORY_SNAPSHOTS = "modal-directory-snapshots"


def new_id(prefix: str, length: int = 22, *, suffix: str = "") -> str:
    body = "".join(secrets.choice(_BASE62) for _ in range(length - len(suffix)))
    return f"{prefix}-{body}{suffix}"


class Tokens:
    """Signed JWTs: the auth tokens of ``AuthTokenGet`` and the command routers'."""

    def __init__(self) -> None:
        self._key = secrets.token_bytes(32)

    def mint(self, ttl: float, **claims: str) -> str:
        header = _b64(json.dumps({"alg": "HS256", "typ": "JWT"}).encode())
        payload = _b64(json.dumps({**claims, "exp": int(time.time() + ttl)}).encode())
        signature = _b64(hmac.new(self._key, f"{header}.{payload}".encode(), "sha256").digest())
        return f"{header}.{payload}.{signature}"

    def claims(self, token: str) -> dict[str, str] | None:
        """The token's claims when it is ours and not expired, else None."""
        try:
            header, payload, signature = token.split(".")
            expected = hmac.new(self._key, f"{header}.{payload}".encode(), hashlib.sha256)
            if not hmac.compare_digest(_b64(expected.digest()), signature):
                return None
            data = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
        except ValueError:
            return None
        if not isinstance(data, dict) or data.get("exp", 0) < time.time():
            return None
        return {k: v for k, v in data.items() if isinstance(v, str)}


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


class Container(GuestSandbox):
    """A guest sandbox whose commands share one PID namespace, as a Modal container's do,
    and find ``python`` on their PATH (``image_path``, the image's, else a usual one), as in
    every Modal image; its volumes are the guest's mounts, those of ``read_only`` read-only.

    Under bubblewrap each command would get a PID namespace of its own, so one
    exec could not signal another (the router's kill of a background process
    is an exec of ``kill``). So the first command starts a holder, a
    ``sleep`` in a namespace of its own whose bubblewrap init reaps orphans as
    a container's init does, and every command joins its user and PID
    namespaces (``bwrap --userns --pidns``). Killing the sandbox kills the
    holder with the rest, and the namespace with it. Without bubblewrap the
    commands share the host's PID namespace anyway (their own mount namespaces
    keep no PID namespace: `emulators.confinement`).

    A joining command is not ``--die-with-parent``: bubblewrap enters the
    PID namespace through an intermediate process that exits once it forked
    the command, and the command sets its parent-death signal without
    waiting for that exit, so an intermediate that exited late (the machine
    loaded) killed it (exit 137, no output). The namespace's end and the
    kill of its process group end it instead.
    """

    def __init__(
        self, guest: GuestSandbox, image_path: str | None = None, read_only: Collection[str] = ()
    ) -> None:
        super().__init__(
            guest,
            guest.home,
            confinement=guest.confinement,
            dirs=guest.dirs,
            mounts=guest.mounts,
            read_only=read_only,
        )
        self.image_path = image_path or IMAGE_PATH
        self._init: int | None = None
        self._holding = asyncio.Lock()

    async def spawn(
        self,
        cmd: str | Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
    ) -> LocalProcess:
        """Start ``cmd``; unless the create or the exec sets a PATH, it is the image's
        with `GUEST_BIN` last (its ``python``, which every Modal image has); Python's
        output is buffered unless they set ``PYTHONUNBUFFERED``."""
        if self.confinement == "bwrap":
            await self._hold()
        defaults = {
            "PATH": f"{self.image_path}:{self.inside(GUEST_BIN)}",
            "PYTHONUNBUFFERED": "",  # the local provider's "1": a container's Python buffers
        }
        own = {**self.meta.get("env", {}), **(env or {})}
        env = {**{k: v for k, v in defaults.items() if k not in own}, **(env or {})}
        return await super().spawn(cmd, env=env, cwd=cwd)

    async def _hold(self) -> None:
        async with self._holding:
            if self._init is None:
                holder = await super().spawn([shutil.which("sleep") or "sleep", "infinity"])
                self._init = await _child_of(holder.pid)

    def _bwrap(self, cwd: str) -> list[str]:
        alone = super()._bwrap(cwd)
        bwrap = alone[0]
        assert alone[1] == "--unshare-all"
        if self._init is None:
            return alone
        shared = ["--userns", "3", "--pidns", "4", "--unshare-ipc", "--unshare-net"]
        shared += ["--unshare-uts", "--unshare-cgroup-try"]
        shared += [arg for arg in alone[2:] if arg != "--die-with-parent"]
        join = 'exec 3<"$1/user" 4<"$1/pid" && shift && exec "$@"'
        return ["/bin/sh", "-c", join, "join", f"/proc/{self._init}/ns", bwrap, *shared]


async def _child_of(pid: int) -> int:
    """The host pid of ``pid``'s child (the holder's bubblewrap init), once its user
    namespace maps ids.

    bubblewrap writes the maps just after it clones the init, so the init can
    exist without them; a command joining then fails ("bwrap: Can't send pid:
    Invalid argument": its unmapped ids cannot pass bwrap's socket), which a
    loaded machine made happen to a sandbox's first command now and then.
    """
    deadline = time.monotonic() + _HOLDER_SECONDS
    while time.monotonic() < deadline:
        child = next((p for p in _pids() if _parent(p) == pid), None)
        if child is not None and _maps_ids(child):
            return child
        await asyncio.sleep(0.01)
    raise OSError(f"the PID namespace holder (pid {pid}) started no init")


def _maps_ids(pid: int) -> bool:
    try:
        return all(Path(f"/proc/{pid}/{ids}").read_text().strip() for ids in ("uid_map", "gid_map"))
    except OSError:
        return False


def _pids() -> list[int]:
    return [int(entry) for entry in os.listdir("/proc") if entry.isdigit()]


def _parent(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


class OutputLog:
    """One output stream of an exec, by absolute offset, as the command router serves it.

    Nothing is dropped unread: a 1 GiB ``cat`` comes through whole (a cap here
    once cut every stream at 10 MiB without a word). What a reader has taken
    is kept `KEEP` bytes back, for a reader that reconnects and asks again
    from its last offset, and freed past that.
    """

    KEEP = 8 * 1024 * 1024

    def __init__(self) -> None:
        self._data = bytearray()
        self.base = 0  # the offset of the first byte still kept
        self._taken = 0

    def __len__(self) -> int:
        return self.base + len(self._data)

    def append(self, data: bytes) -> None:
        self._data += data

    def read(self, offset: int, size: int) -> bytes:
        if offset < self.base:
            raise ValueError(f"output offset {offset} is no longer kept (kept from {self.base})")
        start = offset - self.base
        return bytes(self._data[start : start + size])

    def took(self, offset: int) -> None:
        """A reader has taken the output up to ``offset``."""
        self._taken = max(self._taken, offset)
        drop = self._taken - self.KEEP - self.base
        if drop > 0:
            del self._data[:drop]
            self.base += drop


@dataclass
class Exec:
    """One command exec'd through the command router, with its output."""

    id: str
    op: str
    process: LocalProcess
    stdout: OutputLog = field(default_factory=OutputLog)
    stderr: OutputLog = field(default_factory=OutputLog)
    code: int | None = None
    signal: int | None = None
    stdin_written: int = 0
    stdin_closed: bool = False
    changed: asyncio.Condition = field(default_factory=asyncio.Condition)
    pump: asyncio.Task[None] | None = None

    @property
    def done(self) -> bool:
        return self.code is not None or self.signal is not None

    def output(self, fd: int) -> OutputLog:
        return self.stdout if fd == 1 else self.stderr

    async def until(self, ready: Callable[[], bool]) -> None:
        """Until ``ready()`` holds (checked at each new output and at the exit)."""
        async with self.changed:
            await self.changed.wait_for(ready)

    async def output_from(self, fd: int, offset: int) -> AsyncIterator[tuple[bytes, int]]:
        """The chunks of output ``fd`` from ``offset``, each with its offset, until the
        command has exited and all was given."""
        output = self.output(fd)
        while True:

            def ready(at: int = offset) -> bool:
                return len(output) > at or self.done

            await self.until(ready)
            while offset < len(output):
                chunk = output.read(offset, _READ_CHUNK)
                yield chunk, offset
                offset += len(chunk)
                output.took(offset)
            if self.done and offset >= len(output):
                return

    async def write_stdin(self, offset: int, data: bytes, eof: bool) -> None:
        """Write ``data`` at ``offset`` of the stdin stream (bytes already written are skipped)."""
        stdin = self.process.proc.stdin
        if offset > self.stdin_written:
            raise ValueError(
                f"stdin offset {offset} is past the {self.stdin_written} bytes written so far"
            )
        fresh = data[self.stdin_written - offset :]
        if fresh and not self.stdin_closed and stdin is not None:
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                stdin.write(fresh)
                await stdin.drain()
        self.stdin_written = max(self.stdin_written, offset + len(data))
        if eof and not self.stdin_closed:
            self.stdin_closed = True
            if stdin is not None:
                stdin.close()

    async def run(self, timeout: float | None) -> None:
        """Collect output until the command exits; kill its process group at ``timeout``."""
        proc = self.process.proc
        assert proc.stdout is not None
        assert proc.stderr is not None
        readers = asyncio.gather(
            self._read(proc.stdout, self.stdout), self._read(proc.stderr, self.stderr)
        )
        try:
            await asyncio.wait_for(asyncio.shield(readers), timeout)
        except TimeoutError:
            self.process.kill()
            await readers
        returncode = await proc.wait()
        self.process.end_group()
        if returncode < 0:
            self.signal = -returncode
        else:
            self.code = returncode
        await self._notify()

    async def _read(self, stream: asyncio.StreamReader, into: OutputLog) -> None:
        while chunk := await stream.read(_CHUNK):
            into.append(chunk)
            await self._notify()

    async def _notify(self) -> None:
        async with self.changed:
            self.changed.notify_all()

    def stop(self) -> None:
        self.process.kill(signal.SIGKILL)


@dataclass
class ModalSandbox:
    """One emulated Modal sandbox and its task."""

    id: str
    task_id: str
    v2: bool
    app_id: str
    owner: str
    tags: dict[str, str]
    definition: api_pb2.Sandbox
    local: GuestSandbox
    created_at: float = field(default_factory=time.time)
    last_active: float = field(default_factory=time.monotonic)
    result: api_pb2.GenericResult | None = None
    ended: asyncio.Event = field(default_factory=asyncio.Event)
    execs: dict[str, Exec] = field(default_factory=dict)
    tunnels: dict[int, str] = field(default_factory=dict)  # declared port -> tunnel host
    entrypoint: Exec | None = None  # the create's command, whose output outlives the sandbox
    tcp_tunnels: dict[int, tuple[str, int]] = field(default_factory=dict)  # port -> address
    ready_at: float | None = None  # when the readiness probe first passed
    mounts: dict[str, Path | None] = field(default_factory=dict)  # mount point -> hidden below
    stdin_index: int = 0  # the last V1 SandboxStdinWrite index applied
    image_workdir: str | None = None  # the image's WORKDIR, the default of a create's workdir
    _listeners: list[asyncio.Server] = field(default_factory=list)

    @property
    def workdir(self) -> str:
        return self.definition.workdir or self.image_workdir or MODAL_HOME

    @property
    def running(self) -> bool:
        return self.result is None

    def touch(self) -> None:
        self.last_active = time.monotonic()

    def idle_for(self, now: float) -> float:
        if any(not e.done for e in self.execs.values()):
            return 0.0
        return now - self.last_active

    def argv(
        self,
        command: Sequence[str],
        workdir: str,
        python: str,
        pty: api_pb2.PTYInfo | None = None,
    ) -> list[str]:
        """``command`` as the sandbox runs it: from ``workdir``, fs-tools included.

        The fs-tools command is `emulators.modal.fs_tools`, run by the
        sandbox's Python; it reads its JSON request, with its path as the
        sandbox's processes see it, and the read-only directories (the system's
        and the read-only volumes') from argv.
        With ``pty`` the command runs on a terminal of that size
        (`emulators.modal.pty_relay`).
        """
        if command and command[0] == FS_TOOLS:
            request = self._fs_request(command[1] if len(command) > 1 else "", workdir)
            readonly = json.dumps([*self.local.system_dirs, *sorted(self.local.read_only)])
            command = [python, "-c", _FS_TOOLS_SOURCE, request, readonly]
        elif pty is not None:
            size = [str(pty.winsz_rows), str(pty.winsz_cols)]
            command = [python, "-c", _PTY_SOURCE, *size, *command]
        prelude = f"cd -- {shlex.quote(self.local.inside(workdir))} || exit 126"
        return ["/bin/bash", "-c", prelude + '; exec "$@"', "modal-exec", *command]

    def _fs_request(self, raw: str, workdir: str) -> str:
        with contextlib.suppress(ValueError, AttributeError, TypeError):
            ((name, args),) = json.loads(raw).items()
            if isinstance(args, dict) and isinstance(args.get("path"), str):
                path = self.local.inside(args["path"], workdir)
                return json.dumps({name: {**args, "path": path}})
        return raw

    def end(
        self,
        status: api_pb2.GenericResult.GenericStatus.ValueType,
        message: str,
        exitcode: int | None = None,
    ) -> None:
        """Mark the sandbox finished and stop its commands (the local sandbox is killed apart,
        and `ended` set after)."""
        if self.result is not None:
            return
        if exitcode is None:
            terminated = status == api_pb2.GenericResult.GENERIC_STATUS_TERMINATED
            exitcode = 137 if terminated else 0
        self.result = api_pb2.GenericResult(status=status, exception=message, exitcode=exitcode)
        for execution in self.execs.values():
            execution.stop()
        self.execs.clear()
        if self.entrypoint is not None and not self.entrypoint.done:
            self.entrypoint.stop()
        for listener in self._listeners:
            listener.close()

    async def mount(self, path: str, tree: Path | None) -> None:
        """Put a copy of ``tree`` (None: an empty directory) at ``path``, what was there
        set aside until `unmount`."""
        point = self.local.absolute(path)
        if point == "/":
            raise GRPCError(Status.INVALID_ARGUMENT, "cannot mount an image at /")
        if point in self.mounts:
            await self.unmount(point)
        target = self.host_path(point)
        aside: Path | None = None
        if target.exists() or target.is_symlink():
            aside = self.local.root / _MOUNTED.lstrip("/") / secrets.token_hex(8)
            aside.parent.mkdir(parents=True, exist_ok=True)
            os.rename(target, aside)
        self.mounts[point] = aside
        if tree is None:
            target.mkdir(parents=True)
        else:
            await asyncio.to_thread(shutil.copytree, tree, target, symlinks=True)

    async def unmount(self, path: str) -> None:
        point = self.local.absolute(path)
        if point not in self.mounts:
            raise GRPCError(Status.NOT_FOUND, f"no image is mounted at {point}")
        aside = self.mounts.pop(point)
        target = self.host_path(point)
        await asyncio.to_thread(shutil.rmtree, target, ignore_errors=True)
        if aside is not None:
            os.rename(aside, target)

    def host_path(self, path: str) -> Path:
        """The host path of sandbox path ``path``, to write; INVALID_ARGUMENT where refused."""
        try:
            return self.local.host(path, write=True)
        except PathRefused as exc:
            raise GRPCError(Status.INVALID_ARGUMENT, str(exc)) from None

    async def open_tcp_tunnel(self, port: int, host: str) -> None:
        """An unencrypted port's raw TCP tunnel: a listener on ``host`` piping each connection
        to ``port`` in the sandbox, until the sandbox ends."""

        async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            try:
                upstream = await asyncio.open_connection("127.0.0.1", port)
            except OSError:
                writer.close()
                return
            self.touch()
            await asyncio.gather(
                _copy(reader, upstream[1]), _copy(upstream[0], writer), return_exceptions=True
            )

        listener = await asyncio.start_server(pipe, host, 0)
        self._listeners.append(listener)
        self.tcp_tunnels[port] = (host, listener.sockets[0].getsockname()[1])

    async def probe(self, python: str) -> bool:
        """One try of the create's readiness probe: a TCP connect, or an exec exiting 0."""
        probe = self.definition.readiness_probe
        if probe.HasField("tcp_port"):
            try:
                _, writer = await asyncio.wait_for(
                    asyncio.open_connection("127.0.0.1", probe.tcp_port), _PROBE_SECONDS
                )
            except (OSError, TimeoutError):
                return False
            writer.close()
            return True
        process = await self.local.spawn(self.argv(probe.exec_command.argv, self.workdir, python))
        try:
            return await asyncio.wait_for(process.proc.wait(), _PROBE_SECONDS) == 0
        except TimeoutError:
            process.kill(signal.SIGKILL)
            return False
        finally:
            process.end_group()

    def info(self) -> api_pb2.SandboxInfo:
        task = api_pb2.TaskInfo(
            id=self.task_id,
            started_at=self.created_at,
            sandbox_id=self.id,
            enqueued_at=self.created_at,
        )
        if self.result is not None:
            task.result.CopyFrom(self.result)
        return api_pb2.SandboxInfo(
            id=self.id,
            created_at=self.created_at,
            task_info=task,
            app_id=self.app_id,
            tags=[api_pb2.SandboxTag(tag_name=k, tag_value=v) for k, v in self.tags.items()],
            image_id=self.definition.image_id,
            timeout_secs=self.definition.timeout_secs,
            idle_timeout_secs=self.definition.idle_timeout_secs,
            metadata=self.metadata(),
        )

    def metadata(self) -> api_pb2.SandboxHandleMetadata:
        metadata = api_pb2.SandboxHandleMetadata(app_id=self.app_id)
        if self.result is not None:
            metadata.result.CopyFrom(self.result)
        return metadata

    def tunnel_data(self) -> list[api_pb2.TunnelData]:
        """The tunnels as Modal describes them: TLS on port 443 of each tunnel's host."""
        data = []
        for port, host in self.tunnels.items():
            tcp_host, tcp_port = self.tcp_tunnels.get(port, ("", 0))
            data.append(
                api_pb2.TunnelData(
                    host=host,
                    port=443,
                    container_port=port,
                    unencrypted_host=tcp_host,
                    unencrypted_port=tcp_port,
                )
            )
        return data


async def _copy(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while chunk := await reader.read(_CHUNK):
            writer.write(chunk)
            await writer.drain()
    finally:
        writer.close()


@dataclass
class KeptImage:
    """A filesystem snapshot: an image whose files are a copy the local provider keeps; or
    a directory snapshot, a copy of one directory, which is only mounted."""

    copy: str  # the id of the copy in the local provider's snapshot store ("": a directory)
    owner: str
    expires_at: float | None  # time.time(); None: kept until deleted
    directory: Path | None = None  # a directory snapshot's copy

    def live(self, now: float) -> bool:
        return self.expires_at is None or now < self.expires_at


class ModalCore(EmulatorCore):
    """`EmulatorCore` that also knows apps, images, secrets and Modal's sandbox states."""

    def __init__(self, name: str, root: Path, *, isolation: str = "auto") -> None:
        super().__init__(name, root, isolation=isolation)
        self.root = root
        self.modal: dict[str, ModalSandbox] = {}
        self.tasks: dict[str, ModalSandbox] = {}
        self.apps: dict[tuple[str, str], str] = {}
        self.secrets: dict[str, dict[str, str]] = {}
        self.named_secrets: dict[str, str] = {}
        self.tokens = Tokens()
        self.tunnel_hosts: dict[str, tuple[ModalSandbox, int]] = {}
        self.connect_hosts: dict[str, tuple[ModalSandbox, int]] = {}  # connect token URLs
        self.kept: dict[str, KeptImage] = {}

    def add(self, sandbox: ModalSandbox) -> None:
        self.modal[sandbox.id] = sandbox
        self.tasks[sandbox.task_id] = sandbox
        for port, host in sandbox.tunnels.items():
            self.tunnel_hosts[host] = (sandbox, port)

    async def snapshot(self, sandbox: ModalSandbox, ttl: float | None) -> str:
        """Copy ``sandbox``'s filesystem into a new image its workspace owns; the image id."""
        try:
            copy = await sandbox.local.snapshot()
        except ProviderError as exc:
            raise GRPCError(Status.INTERNAL, f"Filesystem snapshot failed: {exc.message}") from None
        image_id = new_id("im")
        expires_at = time.time() + ttl if ttl is not None else None
        self.kept[image_id] = KeptImage(copy.id, sandbox.owner, expires_at)
        return image_id

    async def snapshot_directory(self, sandbox: ModalSandbox, path: str, ttl: float | None) -> str:
        """Copy one directory of ``sandbox`` into a new image its workspace owns; the image id."""
        source = sandbox.host_path(path)
        if not source.is_dir():
            raise GRPCError(Status.NOT_FOUND, f"no directory {sandbox.local.absolute(path)}")
        image_id = new_id("im")
        target = self.root / _DIRECTORY_SNAPSHOTS / image_id
        await asyncio.to_thread(shutil.copytree, source, target, symlinks=True)
        expires_at = time.time() + ttl if ttl is not None else None
        self.kept[image_id] = KeptImage("", sandbox.owner, expires_at, directory=target)
        return image_id

    def tree(self, kept: KeptImage) -> Path:
        """The files of a kept image: the directory's copy, or the whole snapshot's."""
        return kept.directory or self.local._snapshot_dir(kept.copy)

    async def _drop(self, kept: KeptImage) -> None:
        if kept.directory is not None:
            await asyncio.to_thread(shutil.rmtree, kept.directory, ignore_errors=True)
        else:
            await self.local.delete_snapshot(kept.copy)

    def image(self, image_id: str, workspace: str) -> KeptImage | None:
        """The snapshot image ``image_id`` when ``workspace`` owns it and its TTL has not passed."""
        kept = self.kept.get(image_id)
        if kept is None or kept.owner != workspace or not kept.live(time.time()):
            return None
        return kept

    async def delete_image(self, image_id: str, workspace: str) -> bool:
        """Delete a snapshot image and its copy; False when the workspace has no such image."""
        if self.image(image_id, workspace) is None:
            return False
        await self._drop(self.kept.pop(image_id))
        return True

    async def start_entrypoint(self, sandbox: ModalSandbox) -> None:
        """Run the create's ``entrypoint_args`` as the sandbox's process (on a terminal
        with ``pty_info``); the sandbox ends when it exits, with its exit code."""
        definition = sandbox.definition
        pty = definition.pty_info if definition.HasField("pty_info") else None
        python = self.local.opts.python
        argv = sandbox.argv(definition.entrypoint_args, sandbox.workdir, python, pty)
        process = await sandbox.local.spawn(argv)
        sandbox.entrypoint = Exec("entrypoint", "", process)
        sandbox.entrypoint.pump = asyncio.create_task(self._exit_with(sandbox, sandbox.entrypoint))

    async def _exit_with(self, sandbox: ModalSandbox, entrypoint: Exec) -> None:
        await entrypoint.run(None)
        if not sandbox.running:
            return
        code = entrypoint.code if entrypoint.code is not None else 128 + (entrypoint.signal or 0)
        status = api_pb2.GenericResult.GENERIC_STATUS_SUCCESS
        if code != 0:
            status = api_pb2.GenericResult.GENERIC_STATUS_FAILURE
        sandbox.end(status, "", code)
        await self.kill(sandbox.id, "exited")

    async def kill(self, sandbox_id: str, ended_by: str = "kill") -> bool:
        sandbox = self.modal.get(sandbox_id)
        if sandbox is not None:
            status, message = _ENDINGS.get(ended_by, _ENDINGS["kill"])
            sandbox.end(status, message)
        try:
            return await super().kill(sandbox_id, ended_by)
        finally:
            if sandbox is not None:
                sandbox.ended.set()  # a wait returns once the sandbox is gone

    async def expire(self) -> None:
        await super().expire()
        now = time.monotonic()
        for sandbox in list(self.modal.values()):
            idle = sandbox.definition.idle_timeout_secs
            if sandbox.running and idle and sandbox.idle_for(now) >= idle:
                await self.kill(sandbox.id, "idle")
        wall = time.time()
        for image_id, kept in list(self.kept.items()):
            if not kept.live(wall):
                del self.kept[image_id]
                await self._drop(kept)
