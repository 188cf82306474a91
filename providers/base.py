"""The provider protocol every adapter implements, and the values it trades in.

An adapter hides one vendor SDK behind `Provider` (create, connect, list,
kill) and `Sandbox` (run, files, run_code, kill, `.native`). Both are async:
the router runs every provider call on its own event loop and offers the
sync API on top of that (see ``router.engine``), so an adapter is written once.

Adapters raise only the classes of ``providers.errors``; the router decides
from the class alone whether to retry, fail over or give the error to the
caller.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import math
import os
import re
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, ClassVar, Generic, TypeVar

from pydantic import BaseModel, ConfigDict, SecretStr

from providers import discards
from providers.capabilities import Capability
from providers.code import CodeContext, CodeError, RichResult, error_of_output
from providers.errors import (
    ArgumentTypeError,
    AuthError,
    CapacityExceeded,
    InvalidArgument,
    NotFound,
    ProviderError,
    QuotaExceeded,
    RateLimited,
    SandboxError,
    SandboxPathError,
    Unavailable,
    Unsupported,
)
from providers.files import Chunks, FileInfo, file_chunks, pack_dir, unpack_dir
from providers.kernel.host import Interpreter
from providers.processes import (
    OnOutput,
    OutputChunk,
    Process,
    ProcessInfo,
    Terminal,
    deliver,
)

__all__ = [
    "LABEL_ENTRY",
    "LABEL_LEASE",
    "LABEL_ROUTER",
    "LABEL_SESSION",
    "LABEL_WARM",
    "AuthError",
    "CapacityExceeded",
    "CodeContext",
    "CodeError",
    "CodeResult",
    "CommandResult",
    "FileInfo",
    "NotFound",
    "PortURL",
    "Provider",
    "ProviderError",
    "ProviderOptions",
    "QuotaExceeded",
    "RateLimited",
    "RichResult",
    "Sandbox",
    "SandboxError",
    "SandboxInfo",
    "SandboxPathError",
    "SandboxSpec",
    "Snapshot",
    "Unavailable",
]

# Label keys the router puts on every sandbox it creates. Plain lowercase
# identifiers because every provider accepts them as label/metadata/tag keys.
LABEL_ROUTER = "sandbox_router"
LABEL_ENTRY = "sandbox_router_entry"
LABEL_LEASE = "sandbox_router_lease"
LABEL_SESSION = "sandbox_router_session"
LABEL_WARM = "sandbox_router_warm"  # made in advance for the entry's warm pool


@dataclass(frozen=True, slots=True)
class SandboxSpec:
    """What the caller asks for; each adapter maps it onto its SDK's fields.

    Attributes:
        template: the provider's template / snapshot / image / blueprint name;
            ``None`` takes the entry's configured default.
        language: the main language of the sandbox (``python``, ``bash``...).
        env: environment variables set for every command.
        labels: labels/metadata/tags put on the sandbox (the router adds its own).
        lifetime: seconds after which the provider may stop the sandbox.
        idle_timeout: seconds of inactivity after which it may stop it.
        cpu: cores; memory_mb and disk_gb: sizes; gpu: a GPU type, e.g. ``"T4"``.
        workdir: working directory for commands.
        ports: ports to open at create, for a vendor that fixes them then
            (Modal); the others open any port on `Sandbox.expose`.
    """

    template: str | None = None
    language: str | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    labels: Mapping[str, str] = field(default_factory=dict)
    lifetime: float | None = None
    idle_timeout: float | None = None
    cpu: float | None = None
    memory_mb: int | None = None
    disk_gb: int | None = None
    gpu: str | None = None
    workdir: str | None = None
    ports: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        check_env(self.env, "SandboxSpec(env=...)")
        for port in self.ports:
            check_port(port, "SandboxSpec(ports=...)")
        for name in ("template", "language", "gpu", "workdir"):
            check_text(getattr(self, name), "SandboxSpec", name, optional=True)
        for name in ("lifetime", "idle_timeout", "cpu"):
            check_positive(getattr(self, name), "SandboxSpec", name, optional=True)
        for name in ("memory_mb", "disk_gb"):
            check_positive(getattr(self, name), "SandboxSpec", name, optional=True, whole=True)

    def with_labels(self, labels: Mapping[str, str]) -> SandboxSpec:
        """A copy with ``labels`` merged over the existing ones."""
        return replace(self, labels={**self.labels, **labels})


_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def check_env(env: Mapping[str, str], argument: str) -> None:
    """Refuse an env no provider could set, naming ``argument`` but never a value.

    A name is a shell identifier (some vendors export it in a shell, others
    pass it to exec; only identifiers work on all); a value holds no NUL.
    """
    for name, value in env.items():
        if not isinstance(name, str) or not _ENV_NAME.fullmatch(name):
            raise InvalidArgument(
                f"{argument}: {name!r} is not an environment variable name "
                "(letters, digits and _, not starting with a digit)"
            )
        if not isinstance(value, str) or "\x00" in value:
            raise InvalidArgument(f"{argument}: the value of {name!r} contains a NUL byte")


def check_positive(
    value: object,
    call: str,
    name: str,
    *,
    optional: bool = False,
    whole: bool = False,
    zero: bool = False,
) -> None:
    """Refuse anything but a positive finite number (a whole one if ``whole``; None
    if ``optional``; 0 too if ``zero``), naming the argument as ``call(name=value)``."""
    if value is None and optional:
        return
    kind = ("a whole number" if whole else "a number") + (" >= 0" if zero else " > 0")
    if isinstance(value, bool) or not isinstance(value, int if whole else int | float):
        raise ArgumentTypeError(f"{call}({name}={value!r}): expected {kind}")
    if not (value >= 0 if zero else value > 0) or value == math.inf:
        raise InvalidArgument(f"{call}({name}={value!r}): expected {kind}")


def check_text(value: object, call: str, name: str, *, optional: bool = False) -> None:
    """Refuse anything but a non-empty string without NUL (or None if ``optional``)."""
    if value is None and optional:
        return
    if not isinstance(value, str):
        raise ArgumentTypeError(f"{call}({name}={value!r}): expected a string")
    if not value or "\x00" in value:
        shown = "..." if value else "''"
        raise InvalidArgument(f"{call}({name}={shown}): expected a non-empty string without NUL")


def check_port(port: object, argument: str) -> None:
    """Refuse anything but a TCP port number, naming ``argument``."""
    if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
        raise InvalidArgument(f"{argument}: {port!r} is not a port number (1-65535)")


@dataclass(frozen=True, slots=True)
class CommandResult:
    """The outcome of one command. A non-zero exit is a result, not an error."""

    stdout: str
    stderr: str
    exit_code: int
    duration: float
    timed_out: bool = False

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out


@dataclass(frozen=True, slots=True)
class CodeResult(CommandResult):
    """The outcome of `Sandbox.run_code`: output, rich results and the error.

    A cell that raises is a result (``error`` names the exception, with its
    value and traceback), not an exception; so is one past its timeout
    (``timed_out``, its error a ``TimeoutError``).

    Attributes:
        results: what the cell displayed and the value of its last
            expression (``is_main_result``), as `RichResult` (text, PNG...).
        error: the cell's exception, or None.
        stateful: a kernel ran it and keeps its variables for the next call.
        restarted: the kernel was started anew before this cell: what the
            earlier cells of its context defined is gone.
    """

    results: tuple[RichResult, ...] = ()
    error: CodeError | None = None
    stateful: bool = False
    restarted: bool = False

    @property
    def text(self) -> str | None:
        """The text of the last expression's value (``results``' main one), or None."""
        for result in self.results:
            if result.is_main_result:
                return result.text
        return None

    @classmethod
    def of_command(cls, res: CommandResult, timeout: float | None) -> CodeResult:
        """The result of code run as a command: a failure's error is read from stderr."""
        return cls(
            res.stdout,
            res.stderr,
            res.exit_code,
            res.duration,
            res.timed_out,
            (),
            error_of_output(res.stderr, res.exit_code, res.timed_out, timeout),
        )


@dataclass(frozen=True, slots=True)
class PortURL:
    """Where the app reaches a port of the sandbox: the URL and the headers to send.

    ``headers`` carries the access token where the vendor wants one (Daytona's
    preview token, E2B's traffic token, Runloop's tunnel auth); it is a
    secret, so the repr names the headers but never shows their values.
    """

    port: int
    url: str
    headers: Mapping[str, str] = field(default_factory=dict)

    def __repr__(self) -> str:
        return f"PortURL(port={self.port}, url={self.url!r}, headers={sorted(self.headers)})"


@dataclass(frozen=True, slots=True)
class Snapshot:
    """A sandbox's filesystem kept by the provider: ``SandboxSpec(template=snapshot.id)``
    on the same entry creates a sandbox from it."""

    id: str
    entry: str
    name: str | None = None


@dataclass(frozen=True, slots=True)
class SandboxInfo:
    """One sandbox as a provider lists it."""

    id: str
    labels: Mapping[str, str]
    state: str = "running"
    created_at: float | None = None


class ProviderOptions(BaseModel):
    """Per-entry options of one provider; each adapter subclasses it.

    Secrets are ``pydantic.SecretStr`` fields so they never show in a repr,
    a log line or an error message.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)


class Sandbox(abc.ABC):
    """A live sandbox: one handle API whatever the provider."""

    id: str
    provider: str

    @abc.abstractmethod
    async def run(
        self,
        cmd: str | Sequence[str],
        *,
        timeout: float | None = 60.0,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
    ) -> CommandResult:
        """Run a shell command (a string) or an argv (a sequence)."""

    @abc.abstractmethod
    async def write_file(self, path: str, data: bytes | str) -> None: ...

    @abc.abstractmethod
    async def read_file(self, path: str) -> bytes: ...

    @abc.abstractmethod
    async def list_files(self, path: str = ".") -> list[FileInfo]: ...

    @abc.abstractmethod
    async def run_code(
        self,
        code: str,
        language: str = "python",
        *,
        timeout: float | None = 60.0,
        context: CodeContext | None = None,
        env: Mapping[str, str] | None = None,
    ) -> CodeResult:
        """Run ``code`` (a cell) and return its output, rich results and error.

        Python runs in a kernel that keeps its variables, imports and working
        directory between calls (the vendor's, or the router's own where it
        has none: `providers.kernel`); ``context`` picks one of its
        independent namespaces (`code_context`). ``env`` is set for this call
        only. Other languages run once per call.
        """

    async def code_context(self, *, cwd: str | None = None) -> CodeContext:
        """A new namespace for ``run_code(context=...)``, independent of the others
        (E2B's ``create_code_context``); its code starts in ``cwd``."""
        return self._kernels().context(cwd)

    async def remove_code_context(self, context: CodeContext) -> None:
        """End a context made by `code_context` (its kernel and its state)."""
        await self._kernels().remove(context)

    _router_kernels: Interpreter | None = None

    @property
    def _kernel_python(self) -> str:
        """The interpreter the router's kernel runs as in this sandbox."""
        return "python3"

    def _kernels(self) -> Interpreter:
        """This handle's router kernels (`providers.kernel`), made on first use."""
        if self._router_kernels is None:
            self._router_kernels = Interpreter(self, self._kernel_python)
        return self._router_kernels

    @abc.abstractmethod
    async def kill(self) -> None:
        """Destroy the sandbox; killing a dead sandbox is not an error."""

    async def start(
        self,
        cmd: str | Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
    ) -> Process:
        """Start a command in the background; its handle streams, waits, kills.

        Its stdin stays open for `Process.write_stdin` where the provider
        declares ``stdin``.
        """
        raise Unsupported(self.provider, Capability.PROCESS)

    async def processes(self) -> list[ProcessInfo]:
        """The background processes of this sandbox (running and recently ended)."""
        raise Unsupported(self.provider, Capability.PROCESS_LIST)

    async def attach(self, process_id: str) -> Process:
        """A handle on a process another handle (any replica) started; NotFound if gone."""
        raise Unsupported(self.provider, Capability.PROCESS_ATTACH)

    async def open_terminal(
        self,
        *,
        rows: int = 24,
        cols: int = 80,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
    ) -> Terminal:
        """An interactive login shell on a PTY of ``rows`` x ``cols``."""
        raise Unsupported(self.provider, Capability.PTY)

    async def run_streaming(
        self,
        cmd: str | Sequence[str],
        *,
        timeout: float | None = 60.0,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        on_stdout: OnOutput | None = None,
        on_stderr: OnOutput | None = None,
        stdin: str | bytes | None = None,
    ) -> CommandResult:
        """`run`, with output handed to the callbacks as it arrives and ``stdin`` fed in.

        Built on `start`, so every provider that starts processes streams;
        one with a native streaming run may override it.
        """
        proc = await self.start(cmd, env=env, cwd=cwd)
        try:
            if stdin is not None:
                await proc.write_stdin(stdin)
                await proc.close_stdin()
            pump = asyncio.ensure_future(_pump(proc, on_stdout, on_stderr))
            result = await proc.wait(timeout)
            await pump
        except BaseException:
            with contextlib.suppress(Exception):
                await proc.kill()
            raise
        return CommandResult(
            result.stdout, result.stderr, result.exit_code, result.duration, result.timed_out
        )

    async def stream(
        self,
        cmd: str | Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
    ) -> AsyncIterator[OutputChunk]:
        """The command's output chunks as they arrive; leaving the loop early kills it."""
        proc = await self.start(cmd, env=env, cwd=cwd)
        try:
            async for chunk in proc.output():
                yield chunk
        finally:
            if not proc.finished:
                with contextlib.suppress(Exception):
                    await proc.kill()

    async def remove(self, path: str) -> None:
        """Remove a file, or a directory with all it holds; SandboxError when it is missing."""
        raise Unsupported(self.provider, Capability.FILES_MANAGE)

    async def make_dir(self, path: str) -> bool:
        """Make a directory and its parents; False when it already existed."""
        raise Unsupported(self.provider, Capability.FILES_MANAGE)

    async def exists(self, path: str) -> bool:
        raise Unsupported(self.provider, Capability.FILES_MANAGE)

    async def rename(self, src: str, dst: str) -> FileInfo:
        """Move ``src`` to ``dst`` (replacing a file there); what ``dst`` is now."""
        raise Unsupported(self.provider, Capability.FILES_MANAGE)

    async def stat(self, path: str) -> FileInfo:
        """What ``path`` is; SandboxError when it is missing."""
        raise Unsupported(self.provider, Capability.FILES_MANAGE)

    def read_stream(self, path: str) -> AsyncIterator[bytes]:
        """A file's content in chunks as it arrives, never whole in memory."""
        raise Unsupported(self.provider, Capability.FILES_STREAM)

    async def write_stream(self, path: str, chunks: Chunks) -> None:
        """Write a file from chunks as they come, never whole in memory (parents are made)."""
        raise Unsupported(self.provider, Capability.FILES_STREAM)

    async def upload_file(self, local: Path, path: str) -> None:
        """Copy a local file into the sandbox, streamed."""
        await self.write_stream(path, file_chunks(local))

    async def download_file(self, path: str, local: Path) -> None:
        """Copy a sandbox file to ``local``, streamed."""
        chunks = self.read_stream(path)
        with local.open("wb") as out:
            async for chunk in chunks:
                await asyncio.to_thread(out.write, chunk)

    async def upload_dir(self, local: Path, path: str) -> None:
        """Copy a local directory's content into ``path`` (made if missing) as one tar stream.

        The archive lands in the sandbox's home and is unpacked there by
        ``tar``, which every vendor's image has.
        """
        archive = f".sandbox-router-{os.urandom(6).hex()}.tar"
        try:
            await self._moved("upload_dir", path, self.write_stream(archive, pack_dir(local)))
            await self._tar("upload_dir", 'mkdir -p -- "$1" && tar -xf "$2" -C "$1"', path, archive)
        finally:
            with contextlib.suppress(ProviderError):
                await self.run(["rm", "-f", "--", archive], timeout=60)

    async def download_dir(self, path: str, local: Path) -> None:
        """Copy a sandbox directory's content into ``local`` (made if missing), streamed."""
        archive = f".sandbox-router-{os.urandom(6).hex()}.tar"
        try:
            await self._tar("download_dir", 'tar -cf "$2" -C "$1" .', path, archive)
            await self._moved("download_dir", path, self._unpack(archive, local))
        finally:
            with contextlib.suppress(ProviderError):
                await self.run(["rm", "-f", "--", archive], timeout=60)

    async def _unpack(self, archive: str, local: Path) -> None:
        """Unpack the sandbox's tar ``archive`` into ``local``, streamed as it is read."""
        await unpack_dir(self.read_stream(archive), local)

    async def _moved(self, op: str, path: str, transfer: Awaitable[None]) -> None:
        """Await a tar transfer; its failure is a SandboxError naming ``path`` and the sandbox."""
        try:
            await transfer
        except (SandboxError, OSError) as exc:
            why = exc.message if isinstance(exc, SandboxError) else exc.strerror or exc
            raise SandboxError(
                f"{op} {path!r}: {why}", provider=self.provider, sandbox_id=self.id
            ) from exc

    async def _tar(self, op: str, script: str, path: str, archive: str) -> None:
        res = await self.run(["sh", "-c", script, "sh", path, archive], timeout=None)
        if not res.ok:
            raise SandboxError(
                f"{op} {path!r}: {res.stderr.strip() or f'exit code {res.exit_code}'}",
                provider=self.provider,
                sandbox_id=self.id,
            )

    async def expose(self, port: int) -> PortURL:
        """A URL the app can reach for ``port`` of the sandbox (a server listening there)."""
        raise Unsupported(self.provider, Capability.PORT)

    async def pause(self) -> None:
        """Pause the sandbox: its files stay, its bill stops; `Provider.resume` wakes it."""
        raise Unsupported(self.provider, Capability.PAUSE)

    async def snapshot(self, name: str | None = None) -> Snapshot:
        """Keep the sandbox's filesystem as a template for creates on this entry."""
        raise Unsupported(self.provider, Capability.SNAPSHOT)

    async def keepalive(self, seconds: float) -> None:  # noqa: B027 - optional hook
        """Ask the provider to keep the sandbox alive ``seconds`` more.

        Called by lease heartbeats. Providers whose sandboxes live until killed
        need not override it.
        """

    async def detach(self) -> None:  # noqa: B027 - optional hook
        """Let go of this handle, leaving the sandbox as it is (running, for whoever
        holds another handle on it). Providers whose handles hold a connection of
        their own close it here.
        """

    @property
    @abc.abstractmethod
    def native(self) -> Any:
        """The SDK's own sandbox object: the escape hatch."""

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.provider}:{self.id}>"


async def _pump(proc: Process, on_stdout: OnOutput | None, on_stderr: OnOutput | None) -> None:
    async for chunk in proc.output():
        await deliver(on_stdout if chunk.stream == "stdout" else on_stderr, chunk.data)


T = TypeVar("T")
S = TypeVar("S")


class LoopBound(Generic[T]):
    """An SDK client for the running event loop.

    An async client's connections belong to the loop that opened them, so a
    provider used from a new loop (another ``asyncio.run``) needs a new one.
    """

    def __init__(self) -> None:
        self._client: T | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def get(self, open_client: Callable[[], T]) -> T:
        """The client of the running loop, opened by ``open_client`` on first use there."""
        loop = asyncio.get_running_loop()
        if self._client is None or self._loop is not loop:
            self._client, self._loop = open_client(), loop
        return self._client

    def take(self) -> T | None:
        """Forget the client; return it if it is the running loop's (for the caller to close)."""
        client, loop = self._client, self._loop
        self._client, self._loop = None, None
        return client if loop is asyncio.get_running_loop() else None


def credential(option: SecretStr | None, env_var: str) -> str | None:
    """A secret from the entry's option when it is set (empty: none), else from ``env_var``.

    An option set in the config wins even when empty, so an entry that names
    its key never quietly borrows another account's key from the environment.
    """
    if option is not None:
        return option.get_secret_value() or None
    return os.environ.get(env_var) or None


def missing_api_key(env_var: str) -> str:
    """The `Provider.unconfigured_reason` of an entry with no API key."""
    return f"no API key: set {env_var} or the entry's api_key option"


class Provider(abc.ABC):
    """One chain entry's provider: a configured account of one vendor.

    Args:
        name: the chain entry's name (unique in a config; used in errors,
            logs and metric labels).
        options: the validated ``Options`` of this provider.
    """

    kind: ClassVar[str]
    Options: ClassVar[type[ProviderOptions]] = ProviderOptions
    capabilities: frozenset[str] = frozenset({"run_code"})

    def __init__(self, name: str, options: ProviderOptions | None = None) -> None:
        self.name = name
        self.options = options if options is not None else self.Options()
        self._cleanups: set[asyncio.Task[object]] = set()

    def _in_background(self, cleanup: Coroutine[Any, Any, object]) -> None:
        """Run ``cleanup`` as a task of its own, awaited by `aclose`."""
        task: asyncio.Task[object] = asyncio.get_running_loop().create_task(cleanup)
        self._cleanups.add(task)
        task.add_done_callback(self._cleanups.discard)

    async def _made_or_discarded(
        self,
        making: Coroutine[Any, Any, S],
        ident: Callable[[S], str],
        discard: Callable[[str], Awaitable[object]],
    ) -> S:
        """Await a create's request; cancelled meanwhile, the request runs on (to its own
        timeout) and what it made (``ident`` names it) is discarded, its id being only in
        that answer. A `providers.discards.CreateReport` the caller set is told."""
        request = asyncio.ensure_future(making)
        try:
            made = await asyncio.shield(request)
        except asyncio.CancelledError:
            self._in_background(discards.when_made(request, ident, discard))
            raise
        discards.answered(ident(made))
        return made

    def _discard_later(self, sandbox_id: str, discard: Callable[[str], Awaitable[object]]) -> None:
        """Discard in the background a sandbox a cancelled create made after its answer
        (while it waited for the sandbox to run)."""
        self._in_background(discards.later(sandbox_id, discard))

    def configured(self) -> bool:
        """True when the credentials this provider needs are present."""
        return self.unconfigured_reason() is None

    def unconfigured_reason(self) -> str | None:
        """Why the entry cannot be used (e.g. which env var is missing), or None."""
        return None

    @abc.abstractmethod
    async def create(self, spec: SandboxSpec, *, timeout: float) -> Sandbox:
        """Create a sandbox and wait until it runs, for ``timeout`` seconds from the
        vendor's answer.

        The vendor's create request itself runs to the vendor's own request
        timeout, not to ``timeout``: its answer is the only place the sandbox's
        id appears, and the router follows a create it stopped waiting for
        (counted and killed when it lands). A create that fails without an
        answer after its request went out raises `Unavailable` with
        ``unanswered``: the router then looks the sandbox up by its lease label.
        """

    @abc.abstractmethod
    async def connect(self, sandbox_id: str) -> Sandbox:
        """A handle on an existing sandbox; NotFound when it is gone."""

    @abc.abstractmethod
    async def list(self, labels: Mapping[str, str] | None = None) -> list[SandboxInfo]:
        """Sandboxes of this account carrying all of ``labels``."""

    @abc.abstractmethod
    async def kill(self, sandbox_id: str) -> bool:
        """Destroy a sandbox by id; False when it did not exist."""

    async def resume(self, sandbox_id: str, *, timeout: float) -> Sandbox:
        """A running handle on a sandbox `Sandbox.pause` paused, on the same id.

        NotFound when it is gone. Resuming a running sandbox is not an error.
        """
        raise Unsupported(self.name, Capability.PAUSE)

    async def delete_snapshot(self, snapshot_id: str) -> bool:
        """Delete a snapshot `Sandbox.snapshot` made; False when it did not exist."""
        raise Unsupported(self.name, Capability.SNAPSHOT)

    async def keep_warm(self, template: str | None, size: int) -> int:
        """Have the vendor keep ``size`` sandboxes of ``template`` (None: the entry's
        default) ready, so that a create of it is served at once; 0 ends the pool.

        Idempotent: it sets the vendor's pool to ``size`` whatever it was. Returns
        how many the vendor holds ready now.
        """
        raise Unsupported(self.name, Capability.WARM_SERVER)

    async def aclose(self) -> None:
        """Release SDK clients; called when the router closes. Waits for the cleanups in
        the background (a cancelled create's discard) first."""
        if self._cleanups:
            await asyncio.gather(*self._cleanups, return_exceptions=True)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} entry={self.name!r}>"
