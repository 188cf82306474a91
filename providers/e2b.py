"""The ``e2b`` provider: sandboxes on E2B through ``e2b-code-interpreter``'s AsyncSandbox.

Each chain entry is one E2B account (one API key: ``api_key``, else
``E2B_API_KEY``); its SDK params are bound once in an ``E2B`` client,
created on first use. The SDK's own retries are off (``retries=0``): the
router owns retries. Its connect retries (up to three, only of a connection
that was refused before any request was written, so they never repeat a
create) have no switch per client: ``E2B_CONNECTION_RETRIES`` is read once,
process-wide, and is left to the app.

Every SDK call runs inside `sdk_errors`, the one mapping to
``providers.errors``. Notable there: E2B answers 429 both for rate limits
and for its cap on concurrent sandboxes (told apart by the message); the
SDK raises without the response, so a 429's ``Retry-After`` is read from
the response the raising SDK frame still holds (`_answer_headers`), else
from a delay stated in the message; raw
``httpx`` transport errors and ``connectrpc`` errors leak through the SDK on
a slow or dead endpoint and are `Unavailable`. A command that exits non-zero
(the SDK raises ``CommandExitException``) or runs out of its own timeout is a
`CommandResult`, not an error.

Background processes and terminals are envd's own (`E2BProcess`,
`E2BTerminal`): started with ``timeout=0`` (the SDK's default of 60 s would
kill a long-lived one), fed from the SDK handle's callbacks (the async handle
has no iterator), listed, killed and reattached by pid from any replica.
``run_code`` runs in the template's Jupyter kernel, which keeps state, on
the code interpreter templates (``code-interpreter-*``, the SDK's default);
other templates have no kernel, so code runs there through the language's
interpreter, statelessly.
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import math
import re
import shlex
import time
import traceback
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

from providers.account import KeyedOptions, KeyedProvider
from providers.base import (
    CodeResult,
    CommandResult,
    FileInfo,
    PortURL,
    ProviderOptions,
    Sandbox,
    SandboxInfo,
    SandboxSpec,
    Snapshot,
)
from providers.capabilities import AGENT_WORK, FILE_WORK, Capability
from providers.errors import (
    AuthError,
    NotFound,
    ProviderError,
    RateLimited,
    SandboxError,
    Unavailable,
)
from providers.files import Chunks
from providers.logs import Log
from providers.mapping import ErrorMap, Where, from_status, retry_after
from providers.processes import ProcessBase, ProcessInfo, TerminalBase
from providers.shell import piped

if TYPE_CHECKING:
    from e2b_code_interpreter import AsyncSandbox

__all__ = ["API_KEY_ENV", "E2BOptions", "E2BProcess", "E2BProvider", "E2BSandbox", "E2BTerminal"]

log = Log("sandbox_router.e2b")

API_KEY_ENV = "E2B_API_KEY"
_CONCURRENCY_CAP = "maximum number of concurrent"
_QUOTA_WORDS = ("blocked", "quota", "credit", "billing limit")
_STATUS_PREFIX = re.compile(r"^(\d{3})\b")
_RETRY_AFTER = re.compile(r"retry[- ]after[:= ]*(\d+(?:\.\d+)?)", re.IGNORECASE)
_KERNEL_TEMPLATES = "code-interpreter"  # the prefix of the templates that run a Jupyter kernel
_INTERPRETERS = {"python": "python3 -", "bash": "bash -s"}  # where there is no kernel
_RESULT_FORMATS = (
    "text",
    "html",
    "markdown",
    "svg",
    "png",
    "jpeg",
    "pdf",
    "latex",
    "json",
    "javascript",
    "data",
)


def _sdk() -> Any:
    """Import ``e2b_code_interpreter`` (lazily: the adapter imports without it)."""
    import e2b_code_interpreter

    return e2b_code_interpreter


class E2BOptions(KeyedOptions):
    """Options of an ``e2b`` chain entry.

    Attributes:
        api_key: the account's API key; ``E2B_API_KEY`` when unset.
        api_url: the control plane's URL (default ``https://api.<domain>``,
            or ``E2B_API_URL``); for emulators and self-hosted E2B.
        sandbox_url: one URL for every sandbox's envd (default per sandbox,
            or ``E2B_SANDBOX_URL``); for emulators.
        domain: the E2B domain (default ``e2b.app``, or ``E2B_DOMAIN``).
        template: the default template (the SDK's ``code-interpreter-v1``
            when unset); a spec's ``template`` wins. A ``code-interpreter-*``
            template keeps `run_code`'s state in a kernel (the entry declares
            ``run_code.stateful``); on any other, code runs statelessly.
        lifetime: the sandbox timeout in seconds when the spec names none;
            lease heartbeats extend it (`E2BSandbox.keepalive`).
        request_timeout: seconds for each API request.
    """

    api_url: str | None = None
    sandbox_url: str | None = None
    domain: str | None = None
    template: str | None = None
    lifetime: float = 300.0
    request_timeout: float = 30.0


LIFECYCLE = frozenset({Capability.PORT, Capability.PAUSE, Capability.SNAPSHOT})


class E2BProvider(KeyedProvider[Any]):
    """One E2B account.

    Args:
        name: the chain entry's name.
        options: `E2BOptions`.
    """

    kind: ClassVar[str] = "e2b"
    Options: ClassVar[type[ProviderOptions]] = E2BOptions
    capabilities = frozenset(
        {"run_code", *FILE_WORK, Capability.PAUSE, Capability.PORT, Capability.SNAPSHOT}
    )
    api_key_env = API_KEY_ENV

    def __init__(self, name: str = "e2b", options: ProviderOptions | None = None) -> None:
        super().__init__(name, options)
        kernel = {Capability.STATEFUL_CODE} if _has_kernel(self.opts.template) else set()
        self.capabilities = frozenset(
            {
                "run_code",
                *FILE_WORK,
                *AGENT_WORK,
                Capability.PAUSE,
                Capability.PORT,
                Capability.SNAPSHOT,
                *kernel,
            }
        )

    @property
    def opts(self) -> E2BOptions:
        assert isinstance(self.options, E2BOptions)
        return self.options

    def _open_client(self, api_key: str) -> Any:
        """The SDK's ``E2B``: its params bound once (it holds no connections)."""
        params: dict[str, Any] = {
            "api_key": api_key,
            "request_timeout": self.opts.request_timeout,
            "retries": 0,
        }
        for option in ("api_url", "sandbox_url", "domain"):
            if getattr(self.opts, option) is not None:
                params[option] = getattr(self.opts, option)
        return _sdk().E2B(**params)

    def _sandboxes(self) -> type[AsyncSandbox]:
        """The SDK's AsyncSandbox class bound to this entry's account."""
        sandboxes: type[AsyncSandbox] = self._api().AsyncSandbox
        return sandboxes

    async def create(self, spec: SandboxSpec, *, timeout: float) -> E2BSandbox:
        sandboxes = self._sandboxes()
        lifetime = spec.lifetime or self.opts.lifetime
        template = spec.template or self.opts.template or sandboxes.default_template
        with sdk_errors(self.name):
            async with asyncio.timeout(timeout):
                native = await sandboxes.create(
                    template=template,
                    timeout=max(1, math.ceil(lifetime)),
                    metadata=dict(spec.labels),
                    envs=dict(spec.env),
                    request_timeout=min(timeout, self.opts.request_timeout),
                )
        log.debug("sandbox_router.e2b.created", entry=self.name, sandbox_id=native.sandbox_id)
        return E2BSandbox(native, self.name, workdir=spec.workdir, template=template)

    async def connect(self, sandbox_id: str) -> E2BSandbox:
        sandboxes = self._sandboxes()
        with sdk_errors(self.name, sandbox_id):
            native = await sandboxes.connect(sandbox_id)
        return E2BSandbox(native, self.name)

    async def resume(self, sandbox_id: str, *, timeout: float) -> E2BSandbox:
        """``connect`` resumes a paused sandbox (and answers a running one as it is)."""
        return await asyncio.wait_for(self.connect(sandbox_id), timeout)

    async def delete_snapshot(self, snapshot_id: str) -> bool:
        sandboxes = self._sandboxes()
        with sdk_errors(self.name):
            return bool(await sandboxes.delete_snapshot(snapshot_id))

    async def list(self, labels: Mapping[str, str] | None = None) -> builtins.list[SandboxInfo]:
        sandboxes = self._sandboxes()
        query = _sdk().SandboxQuery(metadata=dict(labels)) if labels else None
        found: builtins.list[SandboxInfo] = []
        with sdk_errors(self.name):
            pages = sandboxes.list(query=query)
            while pages.has_next:
                found.extend(
                    SandboxInfo(
                        id=info.sandbox_id,
                        labels=dict(info.metadata),
                        state=str(getattr(info.state, "value", info.state)),
                        created_at=info.started_at.timestamp(),
                    )
                    for info in await pages.next_items()
                )
        return found

    async def kill(self, sandbox_id: str) -> bool:
        sandboxes = self._sandboxes()
        with sdk_errors(self.name, sandbox_id):
            killed: bool = await sandboxes.kill(sandbox_id)
        log.debug("sandbox_router.e2b.killed", entry=self.name, sandbox_id=sandbox_id)
        return killed


class E2BSandbox(Sandbox):
    """A live E2B sandbox; ``native`` is the SDK's ``AsyncSandbox``."""

    def __init__(
        self,
        native: AsyncSandbox,
        provider: str,
        *,
        workdir: str | None = None,
        template: str | None = None,
    ) -> None:
        self._native = native
        self.id = native.sandbox_id
        self.provider = provider
        self._workdir = workdir
        self._template = template  # None: not known yet (a connected sandbox)

    @property
    def native(self) -> AsyncSandbox:
        return self._native

    def _errors(self) -> contextlib.AbstractContextManager[None]:
        return sdk_errors(self.provider, self.id, in_sandbox=True)

    async def run(
        self,
        cmd: str | Sequence[str],
        *,
        timeout: float | None = 60.0,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
    ) -> CommandResult:
        from e2b import CommandExitException, InvalidArgumentException, TimeoutException

        command = cmd if isinstance(cmd, str) else shlex.join(cmd)
        started = time.monotonic()
        with self._errors():
            try:
                handle = await self._native.commands.run(
                    command,
                    background=True,
                    envs=dict(env) if env else None,
                    cwd=cwd or self._workdir,
                    timeout=timeout or 0,
                )
            except InvalidArgumentException as exc:
                if not (cwd or self._workdir):
                    raise
                # envd cannot start in a missing directory: fail as a shell's `cd` would
                return CommandResult("", f"{exc}\n", 1, time.monotonic() - started)
            try:
                done = await handle.wait()
            except CommandExitException as exc:
                elapsed = time.monotonic() - started
                return CommandResult(exc.stdout, exc.stderr, exc.exit_code, elapsed)
            except TimeoutException as exc:
                elapsed = time.monotonic() - started
                if type(exc) is not TimeoutException or not timeout or elapsed < timeout:
                    raise
                with contextlib.suppress(Exception):  # best effort: envd kills it then too
                    await handle.kill()
                return CommandResult(
                    handle.stdout or "", handle.stderr or "", -1, elapsed, timed_out=True
                )
        return CommandResult(done.stdout, done.stderr, done.exit_code, time.monotonic() - started)

    async def write_file(self, path: str, data: bytes | str) -> None:
        with self._errors():
            await self._native.files.write(path, data)

    async def read_file(self, path: str) -> bytes:
        with self._errors():
            return bytes(await self._native.files.read(path, format="bytes"))

    async def list_files(self, path: str = ".") -> list[FileInfo]:
        from e2b import FileType

        with self._errors():
            entries = await self._native.files.list(path)
        return [
            FileInfo(name=e.name, path=e.path, is_dir=e.type == FileType.DIR, size=e.size)
            for e in entries
        ]

    async def remove(self, path: str) -> None:
        """envd's remove takes a missing path as removed already; the contract says
        NotFound, so the path is looked at first."""
        with self._errors():
            await self._native.files.get_info(path)
            await self._native.files.remove(path)

    async def make_dir(self, path: str) -> bool:
        with self._errors():
            return bool(await self._native.files.make_dir(path))

    async def exists(self, path: str) -> bool:
        with self._errors():
            return bool(await self._native.files.exists(path))

    async def rename(self, src: str, dst: str) -> FileInfo:
        with self._errors():
            return _file_info(await self._native.files.rename(src, dst))

    async def stat(self, path: str) -> FileInfo:
        with self._errors():
            return _file_info(await self._native.files.get_info(path))

    async def expose(self, port: int) -> PortURL:
        """E2B's edge serves every port at ``{port}-{id}.{domain}``: no call is made.

        A sandbox whose public traffic is restricted wants its traffic token
        with each request.
        """
        token = self._native.traffic_access_token
        headers = {"E2B-Traffic-Access-Token": token} if token else {}
        return PortURL(port, f"https://{self._native.get_host(port)}", headers)

    async def snapshot(self, name: str | None = None) -> Snapshot:
        """E2B's snapshot is a template (memory and filesystem); it outlives the sandbox."""
        with self._errors():
            made = await self._native.create_snapshot(name)
        return Snapshot(made.snapshot_id, self.provider, name)

    async def pause(self) -> None:
        """A full pause: memory and filesystem kept, the bill stops until `resume`."""
        with self._errors():
            await self._native.pause()

    async def read_stream(self, path: str) -> AsyncIterator[bytes]:
        with self._errors():
            chunks = await self._native.files.read(path, format="stream")
            async for chunk in chunks:
                yield bytes(chunk)

    async def write_stream(self, path: str, chunks: Chunks) -> None:
        """envd takes an iterable as an ``application/octet-stream`` body, sent as it comes."""
        with self._errors():
            await self._native.files.write(path, chunks)

    async def run_code(
        self, code: str, language: str = "python", *, timeout: float | None = 60.0
    ) -> CodeResult:
        if await self._has_kernel():
            return await self._run_in_kernel(code, language, timeout)
        if language not in _INTERPRETERS:
            raise SandboxError(
                f"run_code: language {language!r} is not supported without the code "
                f"interpreter (template {self._template!r}; expected one of "
                f"{sorted(_INTERPRETERS)})",
                provider=self.provider,
                sandbox_id=self.id,
            )
        ran = await self.run(piped(code, _INTERPRETERS[language]), timeout=timeout)
        return CodeResult.of_command(ran, timeout)

    async def _has_kernel(self) -> bool:
        """Whether the sandbox's template runs the code interpreter (asked once when connected)."""
        if self._template is None:
            with self._errors():
                info = await self._native.get_info()
            self._template = info.name or info.template_id
        return _has_kernel(self._template)

    async def _run_in_kernel(self, code: str, language: str, timeout: float | None) -> CodeResult:
        from e2b import TimeoutException

        started = time.monotonic()
        with self._errors():
            try:
                execution = await self._native.run_code(
                    code, language=language, timeout=timeout or 0
                )
            except TimeoutException as exc:
                elapsed = time.monotonic() - started
                if type(exc) is not TimeoutException or not timeout or elapsed < timeout:
                    raise
                return CodeResult(
                    "", "", -1, elapsed, True, (), f"execution timed out after {timeout}s", True
                )
        error = execution.error
        return CodeResult(
            stdout="".join(execution.logs.stdout),
            stderr="".join(execution.logs.stderr),
            exit_code=1 if error else 0,
            duration=time.monotonic() - started,
            results=tuple(_result(r) for r in execution.results),
            error=f"{error.name}: {error.value}" if error else None,
            stateful=True,
        )

    async def start(
        self,
        cmd: str | Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
    ) -> E2BProcess:
        process = E2BProcess(self)
        with self._errors():
            handle = await self._native.commands.run(
                cmd if isinstance(cmd, str) else shlex.join(cmd),
                background=True,
                envs=dict(env) if env else None,
                cwd=cwd or self._workdir,
                stdin=True,
                timeout=0,
                on_stdout=process.on_stdout,
                on_stderr=process.on_stderr,
            )
        process.follow(handle)
        return process

    async def processes(self) -> builtins.list[ProcessInfo]:
        with self._errors():
            found = await self._native.commands.list()
        return [ProcessInfo(str(p.pid), _command_of(p.cmd, p.args)) for p in found]

    async def attach(self, process_id: str) -> E2BProcess:
        from e2b import NotFoundException

        pid = int(process_id) if process_id.isdigit() else 0
        gone = NotFound(
            f"no process {process_id!r} runs in the sandbox",
            provider=self.provider,
            sandbox_id=self.id,
        )
        if not 0 < pid < 2**32:
            raise gone
        process = E2BProcess(self)
        with self._errors():
            try:
                handle = await self._native.commands.connect(
                    pid, timeout=0, on_stdout=process.on_stdout, on_stderr=process.on_stderr
                )
            except NotFoundException:
                raise gone from None
        process.follow(handle)
        return process

    async def open_terminal(
        self,
        *,
        rows: int = 24,
        cols: int = 80,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
    ) -> E2BTerminal:
        from e2b import PtySize

        terminal = E2BTerminal(self)
        with self._errors():
            handle = await self._native.pty.create(
                PtySize(rows=rows, cols=cols),
                on_data=terminal.on_data,
                cwd=cwd or self._workdir,
                envs=dict(env) if env else None,
                timeout=0,
            )
        terminal.follow(handle)
        return terminal

    async def kill(self) -> None:
        with contextlib.suppress(NotFound), self._errors():
            await self._native.kill()

    async def keepalive(self, seconds: float) -> None:
        """Extend the sandbox's E2B timeout to ``seconds`` from now."""
        with self._errors():
            await self._native.set_timeout(max(1, math.ceil(seconds)))


class E2BProcess(ProcessBase):
    """A background command of envd, fed by the SDK handle's callbacks; its id is the pid."""

    def __init__(self, sandbox: E2BSandbox) -> None:
        super().__init__("", sandbox.provider)
        self._sandbox = sandbox
        self._pid = 0
        self._follower: asyncio.Task[None] | None = None

    def on_stdout(self, data: str) -> None:
        self._feed("stdout", data)

    def on_stderr(self, data: str) -> None:
        self._feed("stderr", data)

    def follow(self, handle: Any) -> None:
        """Take the pid of the SDK's handle, and its end when it comes."""
        self._pid = handle.pid
        self.id = str(handle.pid)
        self._follower = asyncio.ensure_future(
            _exit_of(handle, self._sandbox, self._finish, self._fail)
        )

    async def kill(self) -> bool:
        with self._sandbox._errors():
            killed: bool = await self._sandbox.native.commands.kill(self._pid)
        return killed

    async def write_stdin(self, data: str | bytes) -> None:
        with self._sandbox._errors():
            await self._sandbox.native.commands.send_stdin(self._pid, data)

    async def close_stdin(self) -> None:
        with self._sandbox._errors():
            await self._sandbox.native.commands.close_stdin(self._pid)


class E2BTerminal(TerminalBase):
    """An envd PTY (``bash -i -l``), fed by the SDK handle's ``on_data``; its id is the pid."""

    def __init__(self, sandbox: E2BSandbox) -> None:
        super().__init__("", sandbox.provider)
        self._sandbox = sandbox
        self._pid = 0
        self._follower: asyncio.Task[None] | None = None

    def on_data(self, data: bytes) -> None:
        self._feed(bytes(data))

    def follow(self, handle: Any) -> None:
        """Take the pid of the SDK's handle, and its end when it comes."""
        self._pid = handle.pid
        self.id = str(handle.pid)
        self._follower = asyncio.ensure_future(
            _exit_of(handle, self._sandbox, self._finish, self._fail)
        )

    def _fail(self, error: BaseException) -> None:
        if not self._exit.done():
            self._exit.set_exception(error)
            self._queue.put_nowait(None)

    async def write(self, data: str | bytes) -> None:
        with self._sandbox._errors():
            await self._sandbox.native.pty.send_stdin(
                self._pid, data.encode() if isinstance(data, str) else data
            )

    async def resize(self, rows: int, cols: int) -> None:
        from e2b import PtySize

        with self._sandbox._errors():
            await self._sandbox.native.pty.resize(self._pid, PtySize(rows=rows, cols=cols))

    async def kill(self) -> bool:
        with self._sandbox._errors():
            killed: bool = await self._sandbox.native.pty.kill(self._pid)
        return killed


async def _exit_of(
    handle: Any,
    sandbox: E2BSandbox,
    finish: Callable[[int], None],
    fail: Callable[[BaseException], None],
) -> None:
    """Wait for an SDK command handle's end: its exit code (a non-zero one is raised), or why
    the stream broke."""
    from e2b import CommandExitException

    try:
        with sandbox._errors():
            try:
                done = await handle.wait()
            except CommandExitException as exc:
                finish(exc.exit_code)
                return
        finish(done.exit_code)
    except ProviderError as exc:
        fail(exc)


def _command_of(cmd: str, args: Sequence[str]) -> str:
    """The command line of a listed process: the shell command of the SDK's ``bash -l -c``."""
    if cmd == "/bin/bash" and len(args) == 3 and list(args[:2]) == ["-l", "-c"]:
        return args[2]
    return shlex.join([cmd, *args])


def _has_kernel(template: str | None) -> bool:
    """Whether a template runs the code interpreter (None: the SDK's default, which does)."""
    return template is None or template.startswith(_KERNEL_TEMPLATES)


def _result(result: Any) -> dict[str, Any]:
    """A code interpreter result as plain data: its formats and whether it is the main one."""
    data = {f: getattr(result, f) for f in _RESULT_FORMATS if getattr(result, f, None) is not None}
    data["is_main_result"] = bool(getattr(result, "is_main_result", False))
    return data


def _status_of(exc: BaseException) -> int | None:
    status = getattr(exc, "status_code", None)
    if isinstance(status, int):
        return status
    match = _STATUS_PREFIX.match(str(exc))
    return int(match.group(1)) if match else None


def _answer_headers(exc: BaseException, status: int) -> Mapping[str, Any]:
    """The headers of the HTTP answer an SDK error was made from, when a frame still holds it.

    The SDK builds its exception from the response (``handle_api_exception``)
    and keeps only the status and message; the response stays a local of
    the frame that raised, which the traceback keeps.
    """
    for frame, _ in reversed(list(traceback.walk_tb(exc.__traceback__))):
        for value in frame.f_locals.values():
            headers = getattr(value, "headers", None)
            if getattr(value, "status_code", None) == status and isinstance(headers, Mapping):
                return headers
    return {}


def _to_error(exc: Exception, where: Where) -> ProviderError:
    """The one mapping of E2B SDK (and leaked transport) exceptions to router errors."""
    import httpx
    import pyqwest
    from connectrpc.errors import ConnectError
    from e2b import exceptions as e2b

    message = str(exc) or type(exc).__name__
    status = _status_of(exc)
    lowered = message.lower()

    if isinstance(exc, e2b.AuthenticationException):
        status = 401
    elif isinstance(exc, e2b.ServiceBusyException):
        status = 503
    elif isinstance(exc, e2b.RateLimitException):
        status = 429
    if status in (401, 429, 503):
        stated = _RETRY_AFTER.search(message)
        return from_status(
            status,
            message,
            where,
            retry_after=retry_after(_answer_headers(exc, status))
            or (float(stated.group(1)) if stated else None),
            capacity=status == 429 and _CONCURRENCY_CAP in lowered,
        )
    if isinstance(exc, e2b.SandboxNotFoundException | e2b.SandboxNotRunningException):
        return where.error(NotFound, message, status=status or 404)
    if isinstance(exc, e2b.TimeoutException):
        return where.error(Unavailable, message, status=status)
    if isinstance(exc, e2b.NotFoundException):
        return where.error(SandboxError if where.in_sandbox else NotFound, message, status=404)
    in_sandbox_only = e2b.InvalidArgumentException | e2b.NotEnoughSpaceException
    if isinstance(exc, in_sandbox_only) and where.in_sandbox:
        return where.error(SandboxError, message, status=status)
    if isinstance(exc, ConnectError):
        return _connect_error(exc, message, where)
    if isinstance(exc, TimeoutError) and not str(exc):
        return where.error(Unavailable, "E2B did not answer in time")
    if isinstance(
        exc,
        httpx.TransportError
        | pyqwest.ReadError
        | pyqwest.WriteError
        | pyqwest.RemoteProtocolError
        | OSError,
    ):
        return where.error(Unavailable, f"{type(exc).__name__}: {message}")
    if isinstance(exc, e2b.SandboxException) and status is not None:
        return from_status(
            status,
            message,
            where,
            quota=status == 403 and any(word in lowered for word in _QUOTA_WORDS),
            callers=where.in_sandbox,
        )
    if isinstance(exc, e2b.SandboxException) and where.in_sandbox:
        return where.error(SandboxError, message)
    return where.error(ProviderError, f"{type(exc).__name__}: {message}", status=status)


def _connect_error(exc: Any, message: str, where: Where) -> ProviderError:
    """An envd RPC error the SDK passed through unmapped (a dropped connection)."""
    from connectrpc.code import Code

    transient = {
        Code.UNAVAILABLE,
        Code.UNKNOWN,
        Code.INTERNAL,
        Code.DEADLINE_EXCEEDED,
        Code.CANCELED,
        Code.DATA_LOSS,
    }
    if exc.code in transient:
        return where.error(Unavailable, message)
    if exc.code is Code.UNAUTHENTICATED:
        return where.error(AuthError, message, status=401)
    if exc.code is Code.RESOURCE_EXHAUSTED:
        return where.error(RateLimited, message, status=429)
    if where.in_sandbox:
        return where.error(SandboxError, message)
    return where.error(ProviderError, message)


def _file_info(entry: Any) -> FileInfo:
    """The SDK's ``EntryInfo`` as ours."""
    from e2b import FileType

    return FileInfo(
        name=entry.name,
        path=entry.path,
        is_dir=entry.type == FileType.DIR,
        size=entry.size,
        mode=entry.mode,
        modified=entry.modified_time.timestamp(),
    )


sdk_errors = ErrorMap(_to_error)
