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
`CommandResult`, not an error; that timeout counts from envd's start event, so
a start that is slow to come (a loaded machine) does not eat it.

Background processes and terminals are envd's own (`E2BProcess`,
`E2BTerminal`): started with ``timeout=0`` (the SDK's default of 60 s would
kill a long-lived one), fed from the SDK handle's callbacks (the async handle
has no iterator), listed, killed and reattached by pid from any replica.
``run_code`` runs in the template's Jupyter kernel, which keeps state, on
the code interpreter templates (``code-interpreter-*``, the SDK's default),
its request sent over the adapter's own pool (`providers.e2b_execute`);
other templates have no kernel, so Python runs there in the router's own
(`providers.kernel`, an envd process), and bash once per call.
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

from providers import e2b_commands
from providers.account import KeyedOptions, KeyedProvider
from providers.base import (
    CodeContext,
    CodeError,
    CodeResult,
    CommandResult,
    FileInfo,
    LoopBound,
    PortURL,
    ProviderOptions,
    RichResult,
    Sandbox,
    SandboxInfo,
    SandboxSpec,
    Snapshot,
)
from providers.capabilities import AGENT_WORK, FILE_WORK, Capability
from providers.e2b_execute import execute, open_session
from providers.errors import (
    AuthError,
    NotFound,
    ProviderError,
    RateLimited,
    SandboxError,
    Unavailable,
)
from providers.files import Chunks
from providers.kernel.host import refuse_context
from providers.logs import Log
from providers.mapping import ErrorMap, Where, causes, from_status, retry_after, went_out
from providers.processes import ProcessBase, ProcessInfo, TerminalBase
from providers.shell import piped

if TYPE_CHECKING:
    import aiohttp
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
            template keeps `run_code`'s state in E2B's kernel, any other in
            the router's (`providers.kernel`).
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
        self.capabilities = frozenset(
            {
                "run_code",
                Capability.STATEFUL_CODE,
                *FILE_WORK,
                *AGENT_WORK,
                Capability.PAUSE,
                Capability.PORT,
                Capability.SNAPSHOT,
            }
        )
        self._sessions: LoopBound[aiohttp.ClientSession] = LoopBound()

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

    def _session(self) -> aiohttp.ClientSession:
        """The running loop's pool for the code interpreters' requests (`e2b_execute`)."""
        return self._sessions.get(lambda: open_session(self.opts.request_timeout))

    async def aclose(self) -> None:
        await super().aclose()
        session = self._sessions.take()
        if session is not None:
            await session.close()

    def _sandboxes(self) -> type[AsyncSandbox]:
        """The SDK's AsyncSandbox class bound to this entry's account."""
        sandboxes: type[AsyncSandbox] = self._api().AsyncSandbox
        return sandboxes

    async def create(self, spec: SandboxSpec, *, timeout: float) -> E2BSandbox:
        """One request, which answers once the sandbox runs: bounded by ``request_timeout``,
        not by ``timeout`` (cut short, the answer naming the sandbox E2B made is lost)."""
        sandboxes = self._sandboxes()
        lifetime = spec.lifetime or self.opts.lifetime
        template = spec.template or self.opts.template or sandboxes.default_template
        request_timeout = self.opts.request_timeout

        async def ask() -> AsyncSandbox:
            with sdk_errors(self.name):
                async with asyncio.timeout(request_timeout):  # the SDK's may take twice as long
                    return await sandboxes.create(
                        template=template,
                        timeout=max(1, math.ceil(lifetime)),
                        metadata=dict(spec.labels),
                        envs=dict(spec.env),
                        request_timeout=request_timeout,
                    )

        native = await self._made_or_discarded(ask(), lambda made: made.sandbox_id, self.kill)
        log.debug("sandbox_router.e2b.created", entry=self.name, sandbox_id=native.sandbox_id)
        return E2BSandbox(native, self.name, self._session, workdir=spec.workdir, template=template)

    async def connect(self, sandbox_id: str) -> E2BSandbox:
        sandboxes = self._sandboxes()
        with sdk_errors(self.name, sandbox_id):
            native = await sandboxes.connect(sandbox_id)
        return E2BSandbox(native, self.name, self._session)

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
        session: Callable[[], aiohttp.ClientSession],
        *,
        workdir: str | None = None,
        template: str | None = None,
    ) -> None:
        self._native = native
        self._session = session  # the provider's pool on the running loop
        self.id = native.sandbox_id
        self.provider = provider
        self._workdir = workdir
        self._template = template  # None: not known yet (a connected sandbox)
        self._counts: dict[str, int] = {}  # the kernel's last execution count per context

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
        from e2b import InvalidArgumentException

        command = cmd if isinstance(cmd, str) else shlex.join(cmd)
        started = time.monotonic()
        with self._errors():
            try:
                running = await e2b_commands.start(
                    self._session(),
                    self._native,
                    command,
                    dict(env) if env else None,
                    cwd or self._workdir,
                    self._native.connection_config.get_request_timeout(None),
                )
            except InvalidArgumentException as exc:
                if not (cwd or self._workdir):
                    raise
                # envd cannot start in a missing directory: fail as a shell's `cd` would
                return CommandResult("", f"{exc}\n", 1, time.monotonic() - started)
            deadline = asyncio.timeout(timeout or None)
            try:
                async with deadline:
                    code, error = await running.wait()
            except TimeoutError:
                if not deadline.expired():
                    raise
                with contextlib.suppress(Exception):  # best effort: envd kills it then too
                    await self._native.commands.kill(running.pid)
                elapsed = time.monotonic() - started
                return CommandResult(running.stdout, running.stderr, -1, elapsed, timed_out=True)
            finally:
                running.close()
        elapsed = time.monotonic() - started
        return CommandResult(running.stdout, running.stderr, _exit_code(code, error), elapsed)

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
        self,
        code: str,
        language: str = "python",
        *,
        timeout: float | None = 60.0,
        context: CodeContext | None = None,
        env: Mapping[str, str] | None = None,
    ) -> CodeResult:
        """The template's Jupyter kernel where it has one; elsewhere Python in the router's
        kernel (`providers.kernel`) and bash in a new shell each call."""
        if await self._has_kernel():
            return await self._run_in_kernel(code, language, timeout, context, env)
        if language == "python":
            return await self._kernels().run(code, context=context, timeout=timeout, env=env)
        if language not in _INTERPRETERS:
            raise SandboxError(
                f"run_code: language {language!r} is not supported without the code "
                f"interpreter (template {self._template!r}; expected one of "
                f"{sorted(_INTERPRETERS)})",
                provider=self.provider,
                sandbox_id=self.id,
            )
        refuse_context(self, context, language)
        ran = await self.run(piped(code, _INTERPRETERS[language]), timeout=timeout, env=env)
        return CodeResult.of_command(ran, timeout)

    async def code_context(self, *, cwd: str | None = None) -> CodeContext:
        """A context of the template's kernel (a Jupyter kernel of its own), else the router's."""
        if not await self._has_kernel():
            return await super().code_context(cwd=cwd)
        with self._errors():
            made = await self._native.create_code_context(cwd=cwd, language="python")
        return CodeContext(made.id, made.language, made.cwd)

    async def remove_code_context(self, context: CodeContext) -> None:
        if not await self._has_kernel():
            return await super().remove_code_context(context)
        with self._errors():
            await self._native.remove_code_context(context.id)
        self._counts.pop(context.id, None)
        return None

    async def _has_kernel(self) -> bool:
        """Whether the sandbox's template runs the code interpreter (asked once when connected)."""
        if self._template is None:
            with self._errors():
                info = await self._native.get_info()
            self._template = info.name or info.template_id
        return _has_kernel(self._template)

    async def _run_in_kernel(
        self,
        code: str,
        language: str,
        timeout: float | None,
        context: CodeContext | None,
        env: Mapping[str, str] | None,
    ) -> CodeResult:
        """The code interpreter's ``run_code`` (`e2b_execute`); a kernel restart shows as its
        execution count going back (a new kernel counts from 1), which the result says."""
        from e2b import NotFoundException

        started = time.monotonic()
        where = {"language": language} if context is None else {"context_id": context.id}
        deadline = asyncio.timeout(timeout or None)
        with self._errors():
            try:
                async with deadline:
                    execution = await execute(
                        self._session(), self._native, code, where, dict(env) if env else None
                    )
            except NotFoundException as exc:
                if context is None or context.id not in str(exc):
                    raise
                raise SandboxError(
                    f"no code context {context.id!r} in the sandbox's kernel (removed?): {exc}",
                    provider=self.provider,
                    sandbox_id=self.id,
                ) from None
            except TimeoutError:
                if not deadline.expired():
                    raise
                error = CodeError("TimeoutError", f"execution timed out after {timeout}s")
                return CodeResult("", "", -1, time.monotonic() - started, True, (), error, True)
        key = context.id if context is not None else language
        count, last = execution.execution_count, self._counts.get(key)
        if count is not None:
            self._counts[key] = count
        failed = execution.error
        return CodeResult(
            stdout="".join(execution.logs.stdout),
            stderr="".join(execution.logs.stderr),
            exit_code=1 if failed else 0,
            duration=time.monotonic() - started,
            results=tuple(_result(r) for r in execution.results),
            error=CodeError(failed.name, failed.value, failed.traceback) if failed else None,
            stateful=True,
            restarted=count is not None and last is not None and count <= last,
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
                finish(_exit_code(exc.exit_code, exc.error))
                return
        finish(done.exit_code)
    except ProviderError as exc:
        fail(exc)


# Go's names of the Linux signals (syscall.Signal.String), numbered from 1.
_GO_SIGNALS = (
    "hangup", "interrupt", "quit", "illegal instruction", "trace/breakpoint trap",
    "aborted", "bus error", "floating point exception", "killed", "user defined signal 1",
    "segmentation fault", "user defined signal 2", "broken pipe", "alarm clock",
    "terminated", "stack fault", "child exited", "continued", "stopped (signal)", "stopped",
    "stopped (tty input)", "stopped (tty output)", "urgent I/O condition",
    "CPU time limit exceeded", "file size limit exceeded", "virtual timer expired",
    "profiling timer expired", "window changed", "I/O possible", "power failure",
    "bad system call",
)  # fmt: skip
_SIGNALLED = re.compile(r"signal: (?:signal (\d+)|(.+?))(?: \(core dumped\))?")


def _exit_code(code: int, error: str | None) -> int:
    """A command's exit code as a shell reports it: 128 + the signal that ended it.

    envd is Go: a command a signal ended has ``ProcessState.ExitCode()``, -1,
    and ``cmd.Wait()``'s error names the signal (``signal: killed``). Every
    other provider's shell says 137 there, so the router does too.
    """
    signalled = _SIGNALLED.fullmatch(error or "") if code < 0 else None
    if signalled is None:
        return code
    number, name = signalled.groups()
    if number is not None:
        return 128 + int(number)
    return 128 + 1 + _GO_SIGNALS.index(name) if name in _GO_SIGNALS else code


def _command_of(cmd: str, args: Sequence[str]) -> str:
    """The command line of a listed process: the shell command of the SDK's ``bash -l -c``."""
    if cmd == "/bin/bash" and len(args) == 3 and list(args[:2]) == ["-l", "-c"]:
        return args[2]
    return shlex.join([cmd, *args])


def _has_kernel(template: str | None) -> bool:
    """Whether a template runs the code interpreter (None: the SDK's default, which does)."""
    return template is None or template.startswith(_KERNEL_TEMPLATES)


def _result(result: Any) -> RichResult:
    """A code interpreter result (its images base64 text) as a `RichResult`."""
    formats = {f: getattr(result, f, None) for f in _RESULT_FORMATS}
    chart = getattr(result, "chart", None)
    if chart is not None:
        formats["chart"] = chart.to_dict() if hasattr(chart, "to_dict") else chart
    formats.update(getattr(result, "extra", None) or {})
    return RichResult.of_formats(formats, is_main_result=bool(result.is_main_result))


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
    import aiohttp
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
        return where.error(
            Unavailable, message, status=status, unanswered=status is None and _went_out(exc)
        )
    if isinstance(exc, e2b.NotFoundException):
        return where.error(SandboxError if where.in_sandbox else NotFound, message, status=404)
    in_sandbox_only = e2b.InvalidArgumentException | e2b.NotEnoughSpaceException
    if isinstance(exc, in_sandbox_only) and where.in_sandbox:
        return where.error(SandboxError, message, status=status)
    if isinstance(exc, ConnectError):
        return _connect_error(exc, message, where)
    if isinstance(exc, TimeoutError) and not str(exc):
        return where.error(Unavailable, "E2B did not answer in time", unanswered=_went_out(exc))
    if isinstance(
        exc,
        aiohttp.ClientError
        | httpx.TransportError
        | pyqwest.ReadError
        | pyqwest.WriteError
        | pyqwest.RemoteProtocolError
        | OSError,
    ):
        message = f"{type(exc).__name__}: {message}"
        return where.error(Unavailable, message, unanswered=_went_out(exc))
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


def _went_out(exc: BaseException) -> bool:
    """The failed request may have reached E2B: its transport (pyqwest) raises the builtin
    ``ConnectionError`` itself, no subclass, only before a request is written (the SDK's
    connect retries rely on it), and httpx's and aiohttp's connect errors say the same."""
    import aiohttp
    import httpx

    if any(type(link) is ConnectionError for link in causes(exc)):
        return False
    return went_out(
        exc,
        httpx.ConnectError,
        httpx.ConnectTimeout,
        aiohttp.ClientConnectorError,
        aiohttp.ConnectionTimeoutError,
    )


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
