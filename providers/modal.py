"""The ``modal`` provider: Modal Sandboxes through the ``modal`` SDK's async API (``.aio``).

Each chain entry is one Modal workspace (one token: ``token_id`` /
``token_secret``, else ``MODAL_TOKEN_ID`` / ``MODAL_TOKEN_SECRET``). Its
client is made on first use for the entry's token and ``server_url`` (else the
SDK's), so several workspaces work side by side in one process, and closed
when its first connect is given up (the SDK's connect task would retry for a
minute, then fail unseen); the app the sandboxes belong to
is looked up (created if missing) once per entry. Sandboxes run a registry
image (``image``, or the spec's ``template``), with the spec's env, tags
(the router's labels), lifetime, idle timeout, workdir, cpu, memory and
GPU; a spec asking for a GPU makes Modal use its V1 sandbox backend, which
the SDK picks by itself.

Ports: Modal opens a sandbox's ports at create only, so the spec's
``ports`` are the create's ``encrypted_ports`` (one TLS tunnel each), and
`ModalSandbox.expose` answers a port's tunnel URL from ``Sandbox.tunnels``
(the V2 create's answer, else ``SandboxGetTunnelsV2``, or
``SandboxGetTunnels`` for a V1 sandbox); a port not declared at create has
no tunnel and is a `SandboxError` naming the fix. Modal's tunnels are
public: the `PortURL` has no headers.

Snapshots: `ModalSandbox.snapshot` is ``Sandbox.snapshot_filesystem`` (the
task command router's ``TaskSnapshotFilesystem``), an Image kept for the
entry's ``snapshot_ttl``; its ``im-...`` id is the `Snapshot` id, and a
spec whose ``template`` is such an id creates from ``Image.from_id`` (an
``ImageFromId`` lookup). Modal has no name for it: the name stays on the
`Snapshot`. `ModalProvider.delete_snapshot` is
``modal.experimental.image_delete`` (``ImageDelete``; NOT_FOUND is False).

Every Modal call runs under a deadline of its own (``asyncio.timeout``):
against a dead endpoint the SDK keeps reconnecting for about a minute, and a
hung create never returns. A create's is the larger of the router's create
timeout and ``request_timeout``: the router stops waiting at its own, but a
``SandboxCreate`` cut short would lose the sandbox Modal made. A create that
fails without an answer after its ``SandboxCreate`` went out (a stream lost,
the deadline) is `Unavailable.unanswered`, and the router looks the sandbox
up by its lease label; the channel's ``SendMessage`` events tell which
creates went out (`_CreatesSent`), so one that failed before (an image
build, a dead endpoint) is refunded at once. The router owns retries: the SDK retries
UNAVAILABLE/INTERNAL answers and dropped streams three times and sleeps on
throttling, with no switch per client (only the process-wide
``MODAL_MAX_THROTTLE_WAIT``, which would change the app's own Modal calls
too). So `_stop_sdk_retries` listens on this entry's control-plane channel
(grpclib's events): an answer the SDK would retry is raised at once, and a
retry the SDK tries after a dropped stream is never sent. One router
attempt is one request on the wire. And since the SDK sends the token on
every request, which hpack's DEBUG log prints, the adapter puts a filter on
that logger (`_RedactTokens`) that masks Modal's credential headers.

Every SDK call runs inside `sdk_errors`, the one mapping to
``providers.errors``: AuthError `AuthError`; ResourceExhaustedError
`RateLimited` when Modal attaches a retry policy or speaks of a rate,
`CapacityExceeded` when it speaks of concurrency or capacity, else
`QuotaExceeded`; ServiceError, InternalError, ConnectionError, grpclib stream
errors and timeouts `Unavailable`; NotFoundError `NotFound`; a filesystem
error (``SandboxFilesystemNotFoundError`` and kin) or an invalid request
`SandboxError`. A command's non-zero exit is a `CommandResult`, and one that
runs out of its timeout (``ExecTimeoutError``, or the SDK's exit code -1) a
result with ``timed_out=True``.

Background processes and terminals are execs the SDK returns at once, their
output read from its streams as it comes (`ModalProcess`, `ModalTerminal`).
Modal has no per-process kill, no process list and no public reattach: the
kill is built as an exec of ``kill`` on the process group `ModalSandbox.start`
recorded (``setsid``, its id in a file under ``/tmp/.sandbox-router``); the
list and the reattach stay undeclared. A terminal is an exec with
``pty=True``: no resize, so its size is set once from inside.
"""

from __future__ import annotations

import asyncio
import builtins
import codecs
import contextlib
import logging
import math
import posixpath
import re
import secrets
import time
from collections.abc import AsyncIterable, AsyncIterator, Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

from pydantic import PositiveInt, SecretStr

from providers.base import (
    LABEL_LEASE,
    CodeContext,
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
    credential,
)
from providers.capabilities import Capability
from providers.errors import (
    AuthError,
    CapacityExceeded,
    NotFound,
    ProviderError,
    QuotaExceeded,
    RateLimited,
    SandboxError,
    Unavailable,
)
from providers.files import Chunks, ShellFiles, file_chunks, unpack_dir
from providers.kernel.host import refuse_context
from providers.logs import Log
from providers.mapping import ErrorMap, Where, went_out
from providers.processes import ProcessBase, TerminalBase

__all__ = ["TOKEN_ID_ENV", "TOKEN_SECRET_ENV", "ModalOptions", "ModalProvider", "ModalSandbox"]

log = Log("sandbox_router.modal")

TOKEN_ID_ENV = "MODAL_TOKEN_ID"
TOKEN_SECRET_ENV = "MODAL_TOKEN_SECRET"
_CAPACITY_WORDS = ("concurren", "capacity", "running sandboxes")
_INTERPRETERS = {"python": ("python3", "-"), "bash": ("bash", "-s")}
_HEADER_LOG = "hpack.hpack"
_SECRET_HEADER = re.compile(
    r"""(['"]?(?:x-modal-token-id|x-modal-token-secret|x-modal-auth-token|authorization)['"]?"""
    r"""\s*[=,:]\s*b?)(['"]).*?\2""",
    re.IGNORECASE,
)
_RAW_BLOCKS = frozenset({"Encoded header block to %s", "Decoding %s"})
_TIMED_OUT = -1
_IMAGE_ID = "im-"  # Modal's Image ids: a template with it names a snapshot (or any built image)
_SNAPSHOT_SECONDS = 55  # the SDK's default wait for a filesystem snapshot
_LOST = -1  # a terminal whose end the sandbox could not report (it was killed)
_PIDS = "/tmp/.sandbox-router"
# A background process: a child of a shell, so never a group leader and setsid never has to
# fork; in a session (and group) of its own it records its id for the kill, then becomes the
# command. The shell waits and reports its end (128 + 9 after the kill), its own stderr
# closed so that it says nothing of the kill.
_SESSION = 'exec 3>&2 2>&-; setsid "$@" 2>&3 3>&-; exit $?'
_GROUP = 'mkdir -p -- "${1%/*}" && echo $$ > "$1" && shift && exec "$@"'
# A terminal: the PTY's size set from inside (Modal sizes it from the caller's tty), the pid
# of its shell (the session leader of the PTY) recorded, then an interactive login shell.
_TERMINAL = 'stty rows "$2" cols "$3" && mkdir -p -- "${1%/*}" && echo $$ > "$1" && exec bash -i -l'
# The kill: wait briefly for a process started just now to record its id, then kill its
# group (or, when it leads none, the process); exit 1 when it is not there.
_KILL = (
    'for _ in $(seq 50); do [ -s "$1" ] && break; sleep 0.1; done; '
    'pg=$(cat -- "$1" 2>/dev/null) && [ -n "$pg" ] || exit 1; rm -f -- "$1"; '
    'kill -KILL -- "-$pg" 2>/dev/null || kill -KILL -- "$pg" 2>/dev/null'
)


def _sdk() -> Any:
    """Import ``modal`` (lazily: the adapter imports without it)."""
    import modal

    return modal


class _RedactTokens(logging.Filter):
    """Masks Modal's credentials in the HTTP/2 header log (``hpack`` at DEBUG).

    The SDK sends the workspace token on every request; hpack logs each
    header it encodes or decodes, and the raw header blocks. A filter on that
    one logger rewrites those lines, so an app logging at DEBUG never prints
    a token while its own log levels stay as it set them.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        if record.msg in _RAW_BLOCKS:
            record.msg, record.args = str(record.msg) % "<header block redacted>", None
            return True
        text = record.getMessage()
        redacted = _SECRET_HEADER.sub(r"\1\2<redacted>\2", text)
        if redacted != text:
            record.msg, record.args = redacted, None
        return True


_REDACT_TOKENS = _RedactTokens()


class _SdkRetryStopped(Exception):
    """An answer Modal's SDK would have retried (or slept on), raised to the router instead.

    Not one of the exceptions the SDK's retry loop catches, so it leaves the
    SDK at once; `_to_error` maps it.
    """

    def __init__(self, status: Any = None, message: str | None = None, details: Any = None):
        super().__init__(message or "the connection to Modal failed")
        self.status = status
        self.details = details


class _CreatesSent:
    """The lease labels of the creates whose ``SandboxCreate`` went out on the channel
    (read from its ``SendMessage`` events): only such a create, left unanswered, may
    have made a sandbox."""

    def __init__(self) -> None:
        self.leases: set[str] = set()

    async def sending(self, event: Any) -> None:
        from modal_proto import api_pb2

        if isinstance(event.message, api_pb2.SandboxCreateRequest | api_pb2.SandboxCreateV2Request):
            for tag in event.message.tags:
                if tag.tag_name == LABEL_LEASE:
                    self.leases.add(tag.tag_value)

    def listen(self, channel: Any) -> None:
        import grpclib.events

        grpclib.events.listen(channel, grpclib.events.SendMessage, self.sending)


async def _stop_sdk_retries(client: Any, server_url: str) -> Any:
    """Make each SDK call on ``client``'s control-plane channel one request on the wire;
    the channel."""
    import grpclib.events
    from grpclib.const import Status

    again = {
        Status.DEADLINE_EXCEEDED,
        Status.UNAVAILABLE,
        Status.CANCELLED,
        Status.INTERNAL,
        Status.UNKNOWN,
    }

    async def answered(event: grpclib.events.RecvTrailingMetadata) -> None:
        policy = _retry_policy(event.status_details)
        throttled = event.status is Status.RESOURCE_EXHAUSTED and policy is not None
        if event.status in again or throttled:
            raise _SdkRetryStopped(event.status, event.status_message, event.status_details)

    async def sending(event: grpclib.events.SendRequest) -> None:
        if event.metadata.get("x-retry-attempt", "0") != "0":
            raise _SdkRetryStopped()

    channel = await client._get_channel.aio(server_url)
    grpclib.events.listen(channel, grpclib.events.RecvTrailingMetadata, answered)
    grpclib.events.listen(channel, grpclib.events.SendRequest, sending)
    return channel


class ModalOptions(ProviderOptions):
    """Options of a ``modal`` chain entry.

    Attributes:
        token_id, token_secret: the workspace's token; ``MODAL_TOKEN_ID`` /
            ``MODAL_TOKEN_SECRET`` when unset.
        server_url: Modal's API URL (default: the SDK's, ``MODAL_SERVER_URL``
            or the profile's); for emulators.
        app_name: the app the sandboxes belong to (created if missing).
        image: the registry image sandboxes run when the spec names no
            ``template``.
        workdir: the working directory of commands when the spec names none;
            relative file paths and ``cwd`` start there.
        secrets: names of Modal Secrets injected into every sandbox.
        lifetime: the sandbox ``timeout`` in seconds when the spec names no
            ``lifetime`` (Modal fixes it at create; at most 24 h).
        request_timeout: seconds for each call that is not a command; a create
            takes the router's create timeout when that is longer.
        snapshot_ttl: seconds Modal keeps a snapshot's Image (the SDK's
            default, 30 days, so a snapshot never deleted does not stay
            forever); None keeps it until `ModalProvider.delete_snapshot`.
    """

    token_id: SecretStr | None = None
    token_secret: SecretStr | None = None
    server_url: str | None = None
    app_name: str = "sandbox-router"
    image: str = "python:3.12-slim"
    workdir: str = "/root"
    secrets: tuple[str, ...] = ()
    lifetime: float = 3600.0
    request_timeout: float = 30.0
    snapshot_ttl: PositiveInt | None = 30 * 24 * 3600


class ModalProvider(Provider):
    """One Modal workspace.

    Args:
        name: the chain entry's name.
        options: `ModalOptions`.
    """

    kind: ClassVar[str] = "modal"
    Options: ClassVar[type[ProviderOptions]] = ModalOptions
    capabilities = frozenset(
        {
            Capability.RUN_CODE,
            Capability.STATEFUL_CODE,
            Capability.FILES,
            Capability.GPU,
            Capability.STREAM,
            Capability.STDIN,
            Capability.PROCESS,
            Capability.PROCESS_KILL,
            Capability.PTY,
            Capability.FILES_MANAGE,
            Capability.FILES_STREAM,
            Capability.PORT,
            Capability.SNAPSHOT,
        }
    )

    def __init__(self, name: str = "modal", options: ProviderOptions | None = None) -> None:
        super().__init__(name, options)
        self._client: Any = None
        self._app: Any = None
        self._images: dict[str, Any] = {}
        self._sent = _CreatesSent()

    @property
    def opts(self) -> ModalOptions:
        assert isinstance(self.options, ModalOptions)
        return self.options

    def _credentials(self) -> tuple[str, str] | None:
        token_id = credential(self.opts.token_id, TOKEN_ID_ENV)
        token_secret = credential(self.opts.token_secret, TOKEN_SECRET_ENV)
        return (token_id, token_secret) if token_id and token_secret else None

    def unconfigured_reason(self) -> str | None:
        if self._credentials() is None:
            return (
                f"no Modal token: set {TOKEN_ID_ENV} and {TOKEN_SECRET_ENV} "
                "or the entry's token_id and token_secret options"
            )
        return None

    async def _native_client(self) -> Any:
        """This entry's SDK client, opened on first use and reused."""
        if self._client is None:
            opened = await self._open_client()
            if self._adopt(opened) is not opened:  # a concurrent first call won the race
                await self._close_client(opened)
        return self._client

    def _adopt(self, client: Any) -> Any:
        if self._client is None:
            self._client = client
        return self._client

    async def _open_client(self) -> Any:
        credentials = self._credentials()
        if credentials is None:
            raise AuthError(str(self.unconfigured_reason()), provider=self.name)
        logging.getLogger(_HEADER_LOG).addFilter(_REDACT_TOKENS)
        modal = _sdk()
        from modal_proto import api_pb2

        server_url = self.opts.server_url or modal.config.config["server_url"]
        client = modal.Client(server_url, api_pb2.CLIENT_TYPE_CLIENT, credentials)
        try:
            await client.__aenter__()
            self._sent.listen(await _stop_sdk_retries(client, server_url))
        except BaseException:
            await self._close_client(client)
            raise
        return client

    async def _close_client(self, client: Any) -> None:
        """Close a client, within the request timeout: this cancels its connect task, which
        otherwise retries on the SDK's loop for a minute after its caller gave up."""
        try:
            await asyncio.wait_for(client.close.aio(), self._timeout)
        except Exception as exc:
            log.debug("sandbox_router.modal.close_failed", entry=self.name, error=repr(exc))

    async def _native_app(self, client: Any) -> Any:
        if self._app is None:
            self._app = await _sdk().App.lookup.aio(
                self.opts.app_name, create_if_missing=True, client=client
            )
        return self._app

    def _image(self, template: str, client: Any) -> Any:
        """The Image a create runs: a built one by id (a snapshot), else a registry tag.

        An id is looked up afresh each time, so a create from a deleted
        snapshot is Modal's NotFound rather than a cached handle's.
        """
        if template.startswith(_IMAGE_ID):
            return _sdk().Image.from_id(template, client=client)
        if template not in self._images:
            self._images[template] = _sdk().Image.from_registry(template)
        return self._images[template]

    async def create(self, spec: SandboxSpec, *, timeout: float) -> ModalSandbox:
        workdir = spec.workdir or self.opts.workdir
        lease = spec.labels.get(LABEL_LEASE)
        try:
            native = await self._made_or_discarded(
                self._create(spec, workdir, max(timeout, self._timeout)),
                lambda made: made.object_id,
                self.kill,
            )
        except Unavailable as err:
            err.unanswered = err.unanswered and (lease is None or lease in self._sent.leases)
            raise
        finally:
            self._sent.leases.discard(lease or "")
        log.debug("sandbox_router.modal.created", entry=self.name, sandbox_id=native.object_id)
        return self._sandbox(native, workdir)

    async def _create(self, spec: SandboxSpec, workdir: str, timeout: float) -> Any:
        """``Sandbox.create``: the SDK's sandbox, within ``timeout``."""
        modal = _sdk()
        with sdk_errors(self.name):
            async with asyncio.timeout(timeout):
                client = await self._native_client()
                return await modal.Sandbox.create.aio(
                    app=await self._native_app(client),
                    image=self._image(spec.template or self.opts.image, client),
                    env=dict(spec.env) or None,
                    secrets=[modal.Secret.from_name(name) for name in self.opts.secrets],
                    tags=dict(spec.labels) or None,
                    timeout=max(1, math.ceil(spec.lifetime or self.opts.lifetime)),
                    idle_timeout=math.ceil(spec.idle_timeout) if spec.idle_timeout else None,
                    workdir=workdir,
                    cpu=spec.cpu,
                    memory=spec.memory_mb,
                    gpu=spec.gpu,
                    encrypted_ports=spec.ports,
                    client=client,
                )

    def _sandbox(self, native: Any, workdir: str) -> ModalSandbox:
        return ModalSandbox(
            native,
            self.name,
            workdir=workdir,
            request_timeout=self._timeout,
            snapshot_ttl=self.opts.snapshot_ttl,
        )

    @property
    def _timeout(self) -> float:
        return self.opts.request_timeout

    async def connect(self, sandbox_id: str) -> ModalSandbox:
        with sdk_errors(self.name, sandbox_id):
            async with asyncio.timeout(self._timeout):
                client = await self._native_client()
                native = await _sdk().Sandbox.from_id.aio(sandbox_id, client=client)
        if native.returncode is not None:
            raise NotFound(
                f"Modal sandbox has finished (exit code {native.returncode})",
                provider=self.name,
                sandbox_id=sandbox_id,
            )
        return self._sandbox(native, self.opts.workdir)

    async def list(self, labels: Mapping[str, str] | None = None) -> builtins.list[SandboxInfo]:
        found: builtins.list[SandboxInfo] = []
        with sdk_errors(self.name):
            async with asyncio.timeout(self._timeout):
                client = await self._native_client()
                app = await self._native_app(client)
                async for native in _sdk().Sandbox.list.aio(
                    app_id=app.app_id, tags=dict(labels) if labels else None, client=client
                ):
                    tags = await native.get_tags.aio()
                    found.append(SandboxInfo(id=native.object_id, labels=tags))
        return found

    async def kill(self, sandbox_id: str) -> bool:
        try:
            with sdk_errors(self.name, sandbox_id):
                async with asyncio.timeout(self._timeout):
                    client = await self._native_client()
                    native = await _sdk().Sandbox.from_id.aio(sandbox_id, client=client)
                    if native.returncode is not None:
                        return False
                    await native.terminate.aio()
        except NotFound:
            return False
        await _detach(native)
        log.debug("sandbox_router.modal.killed", entry=self.name, sandbox_id=sandbox_id)
        return True

    async def delete_snapshot(self, snapshot_id: str) -> bool:
        """Delete a snapshot's Image (``modal.experimental.image_delete``, Modal's only caller
        of ``ImageDelete``); False for an id that names no Image of this workspace."""
        if not snapshot_id.startswith(_IMAGE_ID):
            return False
        import modal.experimental

        try:
            with sdk_errors(self.name):
                async with asyncio.timeout(self._timeout):
                    client = await self._native_client()
                    await modal.experimental.image_delete.aio(snapshot_id, client=client)
        except NotFound:
            return False
        log.debug("sandbox_router.modal.snapshot_deleted", entry=self.name, image_id=snapshot_id)
        return True

    async def aclose(self) -> None:
        await super().aclose()
        client, self._client = self._client, None
        self._app = None
        self._images.clear()
        if client is not None:
            await self._close_client(client)


class ModalSandbox(ShellFiles, Sandbox):
    """A live Modal sandbox; ``native`` is the SDK's ``modal.Sandbox``.

    Relative paths (files and ``cwd``) start at the sandbox's working directory.
    ``files.manage`` goes through the shell (`ShellFiles`: Modal has no rename or
    exists), and streams through an exec's binary stdin and stdout: the SDK's
    ``read_bytes`` holds a file whole (and caps its size). A local file moves
    by the SDK's ``copy_from_local``/``copy_to_local``, which want a local path
    and have one there.
    """

    def __init__(
        self,
        native: Any,
        provider: str,
        *,
        workdir: str,
        request_timeout: float,
        snapshot_ttl: int | None,
    ) -> None:
        self._native = native
        self.id: str = native.object_id
        self.provider = provider
        self._workdir = workdir
        self._timeout = request_timeout
        self._snapshot_ttl = snapshot_ttl
        self._killed = False

    @property
    def native(self) -> Any:
        return self._native

    def _errors(self) -> contextlib.AbstractContextManager[None]:
        return sdk_errors(self.provider, self.id, in_sandbox=True)

    def _path(self, path: str) -> str:
        return posixpath.normpath(posixpath.join(self._workdir, path))

    def _deadline(self, timeout: float | None) -> float | None:
        """A command's own timeout plus time for the round trips; None runs it unbounded."""
        return timeout + self._timeout if timeout else None

    async def run(
        self,
        cmd: str | Sequence[str],
        *,
        timeout: float | None = 60.0,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
    ) -> CommandResult:
        argv = ("bash", "-c", cmd) if isinstance(cmd, str) else tuple(cmd)
        return await self._exec(argv, timeout=timeout, env=env, cwd=cwd)

    async def _exec(
        self,
        argv: Sequence[str],
        *,
        timeout: float | None,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        stdin: bytes | None = None,
    ) -> CommandResult:
        from modal.exception import ExecTimeoutError

        started = time.monotonic()
        with self._errors():
            try:
                async with asyncio.timeout(self._deadline(timeout)):
                    process = await self._native.exec.aio(
                        *argv,
                        timeout=math.ceil(timeout) if timeout else None,
                        workdir=self._path(cwd or "."),
                        env=dict(env) if env else None,
                        text=False,
                    )
                    if stdin is not None:
                        process.stdin.write(stdin)
                        process.stdin.write_eof()
                        await process.stdin.drain.aio()
                    out, err, code = await asyncio.gather(
                        process.stdout.read.aio(), process.stderr.read.aio(), process.wait.aio()
                    )
            except ExecTimeoutError:
                elapsed = time.monotonic() - started
                return CommandResult("", "", _TIMED_OUT, elapsed, timed_out=True)
        elapsed = time.monotonic() - started
        timed_out = code == _TIMED_OUT or bool(timeout and code == 137 and elapsed >= timeout)
        return CommandResult(
            stdout=out.decode("utf-8", "replace"),
            stderr=err.decode("utf-8", "replace"),
            exit_code=_TIMED_OUT if timed_out else code,
            duration=elapsed,
            timed_out=timed_out,
        )

    async def start(
        self,
        cmd: str | Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
    ) -> ModalProcess:
        """Start ``cmd`` in a process group of its own, recorded for `ModalProcess.kill`.

        Modal has no per-process kill: the kill is an exec of ``kill`` on that group.
        """
        argv = ("bash", "-c", cmd) if isinstance(cmd, str) else tuple(cmd)
        process_id = secrets.token_hex(8)
        group = ("bash", "-c", _GROUP, "sandbox-router", _pidfile(process_id))
        wrapped = ("bash", "-c", _SESSION, "sandbox-router", *group)
        native = await self._spawn((*wrapped, *argv), env=env, cwd=cwd, pty=False)
        return ModalProcess(self, process_id, native)

    async def open_terminal(
        self,
        *,
        rows: int = 24,
        cols: int = 80,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
    ) -> ModalTerminal:
        """A login shell on Modal's exec PTY (``pty=True``); its size is set once, from inside.

        Modal offers no resize and no reattach for it; the kill is an exec of ``kill``.
        """
        terminal_id = secrets.token_hex(8)
        argv = (
            "bash",
            "-c",
            _TERMINAL,
            "sandbox-router",
            _pidfile(terminal_id),
            str(rows),
            str(cols),
        )
        shell_env = {"TERM": "xterm-256color", **(env or {})}
        native = await self._spawn(argv, env=shell_env, cwd=cwd, pty=True)
        return ModalTerminal(self, terminal_id, native)

    async def _spawn(
        self, argv: Sequence[str], *, env: Mapping[str, str] | None, cwd: str | None, pty: bool
    ) -> Any:
        """An SDK ``ContainerProcess`` running ``argv``, returned as soon as it started."""
        with self._errors():
            async with asyncio.timeout(self._timeout):
                return await self._native.exec.aio(
                    *argv,
                    workdir=self._path(cwd or "."),
                    env=dict(env) if env else None,
                    text=False,
                    pty=pty,
                )

    async def _kill_recorded(self, process_id: str) -> bool:
        """Kill what `start` or `open_terminal` recorded as ``process_id``; False if it is gone."""
        killer = ("bash", "-c", _KILL, "sandbox-router", _pidfile(process_id))
        return (await self._exec(killer, timeout=self._timeout)).exit_code == 0

    async def write_file(self, path: str, data: bytes | str) -> None:
        payload = data.encode() if isinstance(data, str) else data
        with self._errors():
            async with asyncio.timeout(self._timeout):
                await self._native.filesystem.write_bytes.aio(payload, self._path(path))

    async def read_file(self, path: str) -> bytes:
        with self._errors():
            async with asyncio.timeout(self._timeout):
                data: bytes = await self._native.filesystem.read_bytes.aio(self._path(path))
        return data

    async def read_stream(self, path: str) -> AsyncIterator[bytes]:
        with self._errors():
            async with asyncio.timeout(self._timeout):
                process = await self._native.exec.aio("cat", "--", self._path(path), text=False)
            async for chunk in process.stdout:
                yield bytes(chunk)
            code, err = await asyncio.gather(process.wait.aio(), process.stderr.read.aio())
        if code != 0:
            raise SandboxError(
                f"read_stream {path!r}: {_why(err, code)}",
                provider=self.provider,
                sandbox_id=self.id,
            )

    async def write_stream(self, path: str, chunks: Chunks) -> None:
        """``cat`` into the file, fed each chunk as it comes (parents made)."""
        script = 'mkdir -p -- "$(dirname -- "$1")" && exec cat > "$1"'
        with self._errors():
            async with asyncio.timeout(self._timeout):
                process = await self._native.exec.aio(
                    "sh", "-c", script, "sh", self._path(path), text=False
                )
            async for chunk in chunks:
                process.stdin.write(chunk)
                await process.stdin.drain.aio()
            process.stdin.write_eof()
            await process.stdin.drain.aio()
            code, err = await asyncio.gather(process.wait.aio(), process.stderr.read.aio())
        if code != 0:
            raise SandboxError(
                f"write_stream {path!r}: {_why(err, code)}",
                provider=self.provider,
                sandbox_id=self.id,
            )

    async def upload_file(self, local: Path, path: str) -> None:
        """The SDK's ``copy_from_local`` (its file tool, parents made): twice the
        throughput of `write_stream`'s exec stdin on the emulator."""
        with self._errors():
            await self._native.filesystem.copy_from_local.aio(local, self._path(path))

    async def download_file(self, path: str, local: Path) -> None:
        """The SDK's ``copy_to_local``, which writes each chunk as it comes.

        `read_stream` hands chunks to a consumer that writes them on a thread;
        behind it the stream's 64 MiB gRPC window (the SDK's) fills with the
        file: 77 MB more peak RSS for a 1 GiB download.
        """
        with self._errors():
            await self._native.filesystem.copy_to_local.aio(self._path(path), local)

    async def _unpack(self, archive: str, local: Path) -> None:
        """Copy the archive to a file beside ``local`` (`download_file`), then unpack it.

        Unpacking many small files is slower than the stream, and the SDK's
        64 MiB gRPC window would hold what it has not taken yet (+35 MB peak
        RSS for 20,000 files); on disk it costs the archive's size a while.
        """
        await asyncio.to_thread(local.mkdir, parents=True, exist_ok=True)
        copy = local.parent / f".{local.name}.sandbox-router-{secrets.token_hex(6)}.tar"
        try:
            await self.download_file(archive, copy)
            await unpack_dir(file_chunks(copy), local)
        finally:
            await asyncio.to_thread(copy.unlink, missing_ok=True)

    async def list_files(self, path: str = ".") -> list[FileInfo]:
        with self._errors():
            async with asyncio.timeout(self._timeout):
                entries = await self._native.filesystem.list_files.aio(self._path(path))
        return [FileInfo(name=e.name, path=e.path, is_dir=e.is_dir(), size=e.size) for e in entries]

    async def run_code(
        self,
        code: str,
        language: str = "python",
        *,
        timeout: float | None = 60.0,
        context: CodeContext | None = None,
        env: Mapping[str, str] | None = None,
    ) -> CodeResult:
        """Python in the router's kernel (`providers.kernel`): Modal has none of its own;
        bash in a new shell each call."""
        if language == "python":
            return await self._kernels().run(code, context=context, timeout=timeout, env=env)
        if language not in _INTERPRETERS:
            raise SandboxError(
                f"run_code: language {language!r} is not supported "
                f"(expected one of {sorted(_INTERPRETERS)})",
                provider=self.provider,
                sandbox_id=self.id,
            )
        refuse_context(self, context, language)
        res = await self._exec(
            _INTERPRETERS[language], timeout=timeout, env=env, stdin=code.encode()
        )
        return CodeResult.of_command(res, timeout)

    async def expose(self, port: int) -> PortURL:
        """The TLS tunnel Modal opened for ``port`` at create (``Sandbox.tunnels``)."""
        with self._errors():
            async with asyncio.timeout(self._timeout):
                tunnels = await self._native.tunnels.aio(timeout=math.ceil(self._timeout))
        tunnel = tunnels.get(port)
        if tunnel is None:
            opened = ", ".join(map(str, sorted(tunnels))) or "none"
            raise SandboxError(
                f"expose({port}): Modal opens a sandbox's ports only at create, and port {port} "
                f"was not among them (opened: {opened}); create with SandboxSpec(ports=({port},))",
                provider=self.provider,
                sandbox_id=self.id,
            )
        return PortURL(port, tunnel.url)

    async def snapshot(self, name: str | None = None) -> Snapshot:
        """``snapshot_filesystem``: an Image of the sandbox's files (not its processes),
        kept for the entry's ``snapshot_ttl``; ``name`` stays on the `Snapshot` only."""
        with self._errors():
            async with asyncio.timeout(_SNAPSHOT_SECONDS + self._timeout):
                image = await self._native.snapshot_filesystem.aio(
                    timeout=_SNAPSHOT_SECONDS, ttl=self._snapshot_ttl
                )
        return Snapshot(image.object_id, self.provider, name)

    async def detach(self) -> None:
        await _detach(self._native)

    async def kill(self) -> None:
        """Terminate the sandbox, then release this handle's connection to it."""
        if self._killed:
            return
        with contextlib.suppress(NotFound), self._errors():
            async with asyncio.timeout(self._timeout):
                await self._native.terminate.aio()
        self._killed = True
        await _detach(self._native)


class ModalProcess(ProcessBase):
    """A background exec; its output is read from the SDK's streams as it arrives."""

    def __init__(self, sandbox: ModalSandbox, process_id: str, native: Any) -> None:
        super().__init__(process_id, sandbox.provider)
        self._sandbox = sandbox
        self._native = native
        self._pump = asyncio.ensure_future(self._run())

    async def _run(self) -> None:
        try:
            with self._sandbox._errors():
                await asyncio.gather(
                    _decoded(self._native.stdout, lambda text: self._feed("stdout", text)),
                    _decoded(self._native.stderr, lambda text: self._feed("stderr", text)),
                )
                code: int = await self._native.wait.aio()
        except ProviderError as exc:
            self._fail(exc)
        else:
            self._finish(code)

    async def write_stdin(self, data: str | bytes) -> None:
        with self._sandbox._errors():
            self._native.stdin.write(data.encode() if isinstance(data, str) else data)
            await self._native.stdin.drain.aio()

    async def close_stdin(self) -> None:
        with self._sandbox._errors():
            self._native.stdin.write_eof()
            await self._native.stdin.drain.aio()

    async def kill(self) -> bool:
        return not self.finished and await _kill(self._sandbox, self.id, self._native)


class ModalTerminal(TerminalBase):
    """A shell on an exec PTY: Modal merges its output into stdout."""

    def __init__(self, sandbox: ModalSandbox, terminal_id: str, native: Any) -> None:
        super().__init__(terminal_id, sandbox.provider)
        self._sandbox = sandbox
        self._native = native
        self._pump = asyncio.ensure_future(self._run())

    async def _run(self) -> None:
        code = _LOST
        with contextlib.suppress(ProviderError), self._sandbox._errors():
            async for data in self._native.stdout:
                self._feed(data)
            code = await self._native.wait.aio()
        self._finish(code)

    async def write(self, data: str | bytes) -> None:
        with self._sandbox._errors():
            self._native.stdin.write(data.encode() if isinstance(data, str) else data)
            await self._native.stdin.drain.aio()

    async def kill(self) -> bool:
        return not self._exit.done() and await _kill(self._sandbox, self.id, self._native)


async def _kill(sandbox: ModalSandbox, process_id: str, native: Any) -> bool:
    """Kill a running exec by what it recorded; False when it has ended."""
    with sandbox._errors():
        async with asyncio.timeout(sandbox._timeout):
            if await native.poll.aio() is not None:
                return False
    return await sandbox._kill_recorded(process_id)


async def _decoded(reader: AsyncIterable[bytes], feed: Any) -> None:
    """Hand ``reader``'s bytes to ``feed`` as text, a character split across chunks kept whole."""
    decoder = codecs.getincrementaldecoder("utf-8")("replace")
    async for data in reader:
        feed(decoder.decode(data))
    feed(decoder.decode(b"", final=True))


def _pidfile(process_id: str) -> str:
    return f"{_PIDS}/{process_id}"


async def _detach(native: Any) -> None:
    """Close a handle's command-router connection now rather than when it idles out."""
    try:
        await native.detach.aio()
    except Exception as exc:
        log.debug(
            "sandbox_router.modal.detach_failed", sandbox_id=native.object_id, error=repr(exc)
        )


def _retry_policy(details: Any) -> float | None:
    """The delay of the ``RPCRetryPolicy`` detail Modal attached to an answer, if any."""
    for detail in details or ():
        seconds = getattr(detail, "retry_after_secs", None)
        if isinstance(seconds, int | float):
            return float(seconds)
    return None


def _to_error(exc: Exception, where: Where) -> ProviderError:
    """The one mapping of Modal SDK (and grpclib) exceptions to router errors."""
    from grpclib.const import Status
    from grpclib.exceptions import GRPCError, StreamTerminatedError
    from modal import exception as mx

    message = str(exc) or type(exc).__name__
    if isinstance(exc, _SdkRetryStopped):
        if exc.status is Status.RESOURCE_EXHAUSTED:
            return _exhausted(message, _retry_policy(exc.details), where)
        what = exc.status.name if exc.status is not None else "ConnectionError"
        return where.error(Unavailable, f"{what}: {message}", unanswered=exc.status is None)
    if isinstance(exc, mx.AuthError):
        return where.error(AuthError, message, status=401)
    if isinstance(exc, mx.PermissionDeniedError):
        return where.error(AuthError, message, status=403)
    if isinstance(exc, mx.ResourceExhaustedError):
        return _exhausted(message, _retry_policy(getattr(exc, "_grpc_details", None)), where)
    if isinstance(exc, mx.SandboxFilesystemNotFoundError):
        return where.error(SandboxError, f"no such file or directory: {message}", status=404)
    if isinstance(exc, mx.SandboxFilesystemError):
        return where.error(SandboxError, message)
    if isinstance(exc, mx.NotFoundError):
        return where.error(NotFound, message, status=404)
    if isinstance(exc, mx.ConflictError) and where.in_sandbox and "finished" in message:
        return where.error(NotFound, f"Modal sandbox has finished: {message}", status=409)
    if isinstance(exc, mx.ClientClosed) and where.in_sandbox:
        return where.error(NotFound, f"this handle on the Modal sandbox was killed: {message}")
    if isinstance(exc, mx.InvalidError):
        return where.error(SandboxError, message, status=400)
    if isinstance(exc, mx.ImageBuildError):
        return where.error(NotFound, f"image build failed: {message}")
    if isinstance(exc, mx.ServiceError | mx.InternalError | GRPCError):  # an answer
        return where.error(Unavailable, f"{type(exc).__name__}: {message}")
    lost = mx.ConnectionError | mx.TimeoutError | StreamTerminatedError | OSError | ConnectionError
    if isinstance(exc, lost):
        message = f"{type(exc).__name__}: {message}"
        return where.error(Unavailable, message, unanswered=went_out(exc))
    if isinstance(exc, mx.Error):
        return where.error(ProviderError, f"{type(exc).__name__}: {message}")
    if isinstance(exc, TimeoutError):
        return where.error(Unavailable, "Modal did not answer in time", unanswered=True)
    return where.error(ProviderError, f"{type(exc).__name__}: {message}")


def _exhausted(message: str, retry_after: float | None, where: Where) -> ProviderError:
    """RESOURCE_EXHAUSTED: throttling, the concurrency cap or the workspace's quota."""
    lowered = message.lower()
    if retry_after is not None or "rate limit" in lowered:
        return where.error(RateLimited, message, status=429, retry_after=retry_after)
    if any(word in lowered for word in _CAPACITY_WORDS):
        return where.error(CapacityExceeded, message, status=429)
    return where.error(QuotaExceeded, message, status=429)


sdk_errors = ErrorMap(_to_error)


def _why(stderr: bytes, code: int) -> str:
    """What a failed file command said, else how it ended (a signal says nothing)."""
    return stderr.decode("utf-8", "replace").strip() or f"exit code {code}"
