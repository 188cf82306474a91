"""Leases: what `Router.acquire` returns, in a sync and an async flavour.

A lease holds one live sandbox and its slot in the fleet's ledger. Leaving
the ``with`` / ``async with`` block (or calling ``release``) kills the
sandbox, meters its seconds and frees the slot; until then a heartbeat on
the router's loop keeps the lease (and the provider's sandbox) alive.
Both flavours delegate to the same async handle on the router's loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import warnings
import weakref
from collections.abc import (
    AsyncIterator,
    Callable,
    Coroutine,
    Generator,
    Iterator,
    Mapping,
    Sequence,
)
from dataclasses import dataclass, field
from datetime import UTC, datetime
from types import TracebackType
from typing import TYPE_CHECKING, Any, TypeVar

from policies.quota import Renewal, ShortOf
from providers.base import (
    CodeContext,
    CodeResult,
    CommandResult,
    FileInfo,
    Sandbox,
    SandboxSpec,
    check_env,
    check_positive,
    check_text,
)
from providers.errors import ArgumentTypeError, InvalidArgument, LeaseError
from providers.processes import (
    OnOutput,
    OnTerminalData,
    OutputChunk,
    Process,
    ProcessInfo,
    Terminal,
    deliver,
)
from router.files import AsyncFiles, SyncFiles
from router.portal import blocking, iterate, on_caller_loop, relay
from router.processes import (
    AsyncProcess,
    AsyncTerminal,
    SyncProcess,
    SyncTerminal,
    check_data,
    check_size,
)
from router.spans import CommandSpan, Spans
from router.state.base import TenantRef

if TYPE_CHECKING:
    from router.engine import Engine

__all__ = ["AsyncLease", "AsyncSandboxHandle", "Held", "Lease", "PendingLease", "SyncSandbox"]

T = TypeVar("T")


@dataclass(slots=True)
class Held:
    """The router's record of one granted lease (shared by both flavours)."""

    lease_id: str
    entry: str
    provider: str
    sandbox: Sandbox
    acquired_at: float
    attempts: int
    failovers: list[str] = field(default_factory=list)
    released: bool = False
    store_kind: str = "shared"
    session: str | None = None
    holder: str = ""  # the claim under which it holds its session (one holder at a time)
    resumed: bool = False
    counted: bool = True  # made a sandbox (False: a reconnect or a warm claim: no fee)
    budget_ends: float | None = None  # its usd cover ends then: the budget could not renew it
    budget_short: ShortOf | None = None  # whose budget could not: its pool's or its tenant's
    committing: asyncio.Future[Renewal | None] | None = None  # the commit, posted
    binding: asyncio.Future[bool] | None = None  # its session's bind, once started
    spec: SandboxSpec | None = None  # what the acquire asked for: its cost is priced on it
    tenant: TenantRef | None = None  # the tenant it is counted to (`policies.tenants`)


class AsyncSandboxHandle(AsyncFiles):
    """The sandbox handle for async code: each call is awaited on the router's loop.

    This is where a method of the sandbox API is written; `SyncSandbox`
    derives its sync twin with one `blocking` line. Commands and file transfers
    are wrapped in the router's ``spans`` (`router.spans`).
    """

    def __init__(
        self, sandbox: Sandbox, engine: Engine, alive: Callable[[], None], spans: Spans
    ) -> None:
        super().__init__(engine, alive)
        self._sandbox = sandbox
        self._spans = spans

    @property
    def id(self) -> str:
        return self._sandbox.id

    @property
    def native(self) -> Any:
        """The vendor SDK's own sandbox object: the escape hatch (no failover there)."""
        return self._sandbox.native

    async def run(
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
        """Run a shell command (a string) or an argv (a sequence); a non-zero exit is a result.

        ``on_stdout`` / ``on_stderr`` (plain or async) get the output as it
        arrives, and ``stdin`` is fed to the command: both need the entry's
        ``stream`` (and ``stdin``) capability.
        """
        _check_run(cmd, env, cwd, "run", timeout)
        span = CommandSpan("run", self._sandbox.provider, self._sandbox.id, cmd)
        with self._spans(span):
            if on_stdout is None and on_stderr is None and stdin is None:
                result = await self._run(self._sandbox.run(cmd, timeout=timeout, env=env, cwd=cwd))
            else:
                result = await self._run(
                    self._sandbox.run_streaming(
                        cmd,
                        timeout=timeout,
                        env=env,
                        cwd=cwd,
                        on_stdout=on_caller_loop(self._engine, on_stdout),
                        on_stderr=on_caller_loop(self._engine, on_stderr),
                        stdin=stdin,
                    )
                )
            span.exit_code, span.timed_out = result.exit_code, result.timed_out
        return result

    def stream(
        self,
        cmd: str | Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
    ) -> AsyncIterator[OutputChunk]:
        """The command's output chunks as they arrive; leaving the loop early kills it."""
        self._alive()
        _check_run(cmd, env, cwd, "stream")
        chunks = self._sandbox.stream(cmd, env=env, cwd=cwd)
        return relay(self._engine, *self._followed("stream", cmd, chunks))

    async def start(
        self,
        cmd: str | Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        on_stdout: OnOutput | None = None,
        on_stderr: OnOutput | None = None,
    ) -> AsyncProcess:
        """Start a command in the background: wait, kill, stdin and its output on the handle.

        With ``on_stdout`` / ``on_stderr`` the output goes to them instead
        of `AsyncProcess.output`.
        """
        _check_run(cmd, env, cwd, "start")
        span = CommandSpan("start", self._sandbox.provider, self._sandbox.id, cmd)
        with self._spans(span):
            process = await self._run(self._sandbox.start(cmd, env=env, cwd=cwd))
            span.process_id = process.id
        if on_stdout is not None or on_stderr is not None:
            pump = _pump(
                process,
                on_caller_loop(self._engine, on_stdout),
                on_caller_loop(self._engine, on_stderr),
            )
            self._engine.submit(pump)
        return AsyncProcess(process, self._engine, self._alive, self._spans, self._sandbox)

    async def processes(self) -> list[ProcessInfo]:
        """The sandbox's background processes (capability ``process.list``)."""
        return await self._run(self._sandbox.processes())

    async def attach(self, process_id: str) -> AsyncProcess:
        """A handle on a process started elsewhere (another handle, process or replica)."""
        check_text(process_id, "attach", "process_id")
        process = await self._run(self._sandbox.attach(process_id))
        return AsyncProcess(process, self._engine, self._alive, self._spans, self._sandbox)

    async def open_terminal(
        self,
        *,
        rows: int = 24,
        cols: int = 80,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        on_data: OnTerminalData | None = None,
    ) -> AsyncTerminal:
        """An interactive shell on a PTY; its output goes to ``on_data``, else to `output`."""
        check_size(rows, cols, "open_terminal")
        check_env(env or {}, "open_terminal(env=...)")
        terminal = await self._run(
            self._sandbox.open_terminal(rows=rows, cols=cols, env=env, cwd=cwd)
        )
        if on_data is not None:
            self._engine.submit(_pump_terminal(terminal, on_caller_loop(self._engine, on_data)))
        return AsyncTerminal(terminal, self._engine, self._alive)

    async def write_file(self, path: str, data: bytes | str) -> None:
        """Write ``data`` to ``path`` (relative to the sandbox's home), making parent dirs."""
        _check_path_type(path, "write_file(path)")
        data = check_data(data, "write_file(data)")
        size = len(data) if isinstance(data, bytes) else None  # a str's bytes are the SDK's
        with self._spans(self._transfer("write_file", path, size)):
            await self._run(self._sandbox.write_file(path, data))

    async def read_file(self, path: str) -> bytes:
        span = self._transfer("read_file", _check_path_type(path, "read_file(path)"))
        with self._spans(span):
            data = await self._run(self._sandbox.read_file(path))
            span.size = len(data)
        return data

    async def list_files(self, path: str = ".") -> list[FileInfo]:
        return await self._run(self._sandbox.list_files(_check_path_type(path, "list_files(path)")))

    async def run_code(
        self,
        code: str,
        language: str = "python",
        *,
        timeout: float | None = 60.0,
        context: CodeContext | None = None,
        env: Mapping[str, str] | None = None,
    ) -> CodeResult:
        """Run ``code`` in ``language``; the cell's error is in the result, not raised.

        Python runs in a kernel that keeps variables, imports and the working
        directory between calls on every entry that declares
        ``run_code.stateful``; ``context`` (`code_context`) picks an
        independent namespace, ``env`` is set for this call only. The result
        carries the last expression's value and what the cell displayed
        (``results``: text, PNG of matplotlib figures...).
        """
        if not isinstance(code, str):
            raise ArgumentTypeError(f"run_code(code): a string, not {type(code).__name__}")
        check_text(language, "run_code", "language")
        check_positive(timeout, "run_code", "timeout", optional=True)
        if context is not None:
            if not isinstance(context, CodeContext):
                raise ArgumentTypeError(
                    f"run_code(context=...): a CodeContext, not {type(context).__name__}"
                )
            if context.language != language:
                raise InvalidArgument(
                    f"run_code(context=...): the context runs {context.language}, not {language!r}"
                )
        if env is not None:
            check_env(env, "run_code(env=...)")
        with self._spans(CommandSpan("run_code", self._sandbox.provider, self._sandbox.id, code)):
            return await self._run(
                self._sandbox.run_code(code, language, timeout=timeout, context=context, env=env)
            )

    async def code_context(self, *, cwd: str | None = None) -> CodeContext:
        """A new Python namespace for ``run_code(context=...)``, independent of the default
        one and of every other (E2B's ``create_code_context``); its code starts in ``cwd``."""
        check_text(cwd, "code_context", "cwd", optional=True)
        return await self._run(self._sandbox.code_context(cwd=cwd))

    async def remove_code_context(self, context: CodeContext) -> None:
        """End a context made by `code_context`, its kernel and its state."""
        if not isinstance(context, CodeContext):
            raise ArgumentTypeError(
                f"remove_code_context(context): a CodeContext, not {type(context).__name__}"
            )
        await self._run(self._sandbox.remove_code_context(context))

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self._sandbox!r}>"


async def _pump(process: Process, on_stdout: OnOutput | None, on_stderr: OnOutput | None) -> None:
    async for chunk in process.output():
        await deliver(on_stdout if chunk.stream == "stdout" else on_stderr, chunk.data)


async def _pump_terminal(terminal: Terminal, on_data: OnTerminalData | None) -> None:
    async for data in terminal.output():
        await deliver(on_data, data)


def _check_path_type(path: object, argument: str) -> str:
    """A path of the wrong type is refused here; what it names (a NUL, an escape) is the
    provider's to judge, as a `SandboxPathError` naming the sandbox."""
    if not isinstance(path, str):
        raise ArgumentTypeError(f"{argument}: a string, not {type(path).__name__}")
    return path


def _check_run(
    cmd: str | Sequence[str],
    env: Mapping[str, str] | None,
    cwd: str | None,
    call: str = "run",
    timeout: float | None = None,
) -> None:
    """Refuse what no provider could run, the same everywhere, before any SDK sees it."""
    if isinstance(cmd, str):
        if "\x00" in cmd:
            raise InvalidArgument(f"{call}(cmd=...): contains a NUL byte")
    elif not isinstance(cmd, Sequence):
        raise ArgumentTypeError(
            f"{call}(cmd=...): a string or a sequence of strings, not {type(cmd).__name__}"
        )
    elif not cmd:
        raise InvalidArgument(f"{call}(cmd=...): an empty argv")
    else:
        for index, arg in enumerate(cmd):
            if not isinstance(arg, str):
                raise ArgumentTypeError(
                    f"{call}(cmd=...): argument {index} is a {type(arg).__name__}, not a string"
                )
            if "\x00" in arg:
                raise InvalidArgument(f"{call}(cmd=...): argument {index} contains a NUL byte")
    check_env(env or {}, f"{call}(env=...)")
    if cwd is not None and not isinstance(cwd, str):
        raise ArgumentTypeError(f"{call}(cwd=...): a string, not {type(cwd).__name__}")
    if cwd is not None and "\x00" in cwd:
        raise InvalidArgument(f"{call}(cwd=...): contains a NUL byte")
    check_positive(timeout, call, "timeout", optional=True)


class SyncSandbox(SyncFiles["AsyncSandboxHandle"]):
    """The sandbox handle for sync code: `AsyncSandboxHandle`'s methods, waited for.

    Callbacks (``on_stdout``...) run on the router's thread.
    """

    def __init__(
        self, sandbox: Sandbox, engine: Engine, alive: Callable[[], None], spans: Spans
    ) -> None:
        super().__init__(engine, alive)
        self._async = AsyncSandboxHandle(sandbox, engine, alive, spans)

    @property
    def id(self) -> str:
        return self._async.id

    @property
    def native(self) -> Any:
        """The vendor SDK's own sandbox object: the escape hatch (no failover there)."""
        return self._async.native

    run = blocking(AsyncSandboxHandle.run)
    write_file = blocking(AsyncSandboxHandle.write_file)
    read_file = blocking(AsyncSandboxHandle.read_file)
    list_files = blocking(AsyncSandboxHandle.list_files)
    run_code = blocking(AsyncSandboxHandle.run_code)
    code_context = blocking(AsyncSandboxHandle.code_context)
    remove_code_context = blocking(AsyncSandboxHandle.remove_code_context)
    processes = blocking(AsyncSandboxHandle.processes)

    def stream(
        self,
        cmd: str | Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
    ) -> Iterator[OutputChunk]:
        """The command's output chunks as they arrive; leaving the loop early kills it."""
        self._alive()
        _check_run(cmd, env, cwd, "stream")
        chunks = self._async._sandbox.stream(cmd, env=env, cwd=cwd)
        return iterate(self._engine, *self._async._followed("stream", cmd, chunks))

    def start(
        self,
        cmd: str | Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        on_stdout: OnOutput | None = None,
        on_stderr: OnOutput | None = None,
    ) -> SyncProcess:
        """`AsyncSandboxHandle.start`, waited for."""
        started = self._call(
            self._async.start(cmd, env=env, cwd=cwd, on_stdout=on_stdout, on_stderr=on_stderr)
        )
        return SyncProcess(started, self._engine, self._alive)

    def attach(self, process_id: str) -> SyncProcess:
        """`AsyncSandboxHandle.attach`, waited for."""
        return SyncProcess(self._call(self._async.attach(process_id)), self._engine, self._alive)

    def open_terminal(
        self,
        *,
        rows: int = 24,
        cols: int = 80,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        on_data: OnTerminalData | None = None,
    ) -> SyncTerminal:
        """`AsyncSandboxHandle.open_terminal`, waited for."""
        opened = self._call(
            self._async.open_terminal(rows=rows, cols=cols, env=env, cwd=cwd, on_data=on_data)
        )
        return SyncTerminal(opened, self._engine, self._alive)

    def __repr__(self) -> str:
        return f"<SyncSandbox {self._async._sandbox!r}>"


class _LeaseBase:
    def __init__(
        self,
        held: Held,
        engine: Engine,
        release: Callable[[Held], Coroutine[Any, Any, None]],
        pause: Callable[[Held], Coroutine[Any, Any, str]],
        spans: Spans,
    ) -> None:
        self._held = held
        self._engine = engine
        self._release_fn = release
        self._pause_fn = pause
        self._spans = spans
        self._dropped = weakref.finalize(self, _release_dropped, held, engine, release)
        self._dropped.atexit = False  # at exit the engine's thread is going too; the janitor reaps

    @property
    def id(self) -> str:
        return self._held.lease_id

    @property
    def entry(self) -> str:
        """The chain entry that served this lease."""
        return self._held.entry

    @property
    def provider(self) -> str:
        return self._held.provider

    @property
    def sandbox_id(self) -> str:
        return self._held.sandbox.id

    @property
    def attempts(self) -> int:
        return self._held.attempts

    @property
    def failovers(self) -> list[str]:
        """Entries tried and failed before this one, in order."""
        return list(self._held.failovers)

    @property
    def session(self) -> str | None:
        return self._held.session

    @property
    def resumed(self) -> bool:
        """True when a sticky session got its existing sandbox back, or a pause token its
        paused one (`Router.resume`)."""
        return self._held.resumed

    @property
    def released(self) -> bool:
        return self._held.released

    @property
    def budget_exhausted(self) -> datetime | None:
        """When the lease's ``usd`` cover ends, once a budget (its pool's or its tenant's:
        `budget_short`) could not renew it (a `BudgetExhausted` event said so); None
        while the budgets cover it. With ``on_budget_end: kill`` the router releases the
        lease then."""
        ends = self._held.budget_ends
        return None if ends is None else datetime.fromtimestamp(ends, UTC)

    @property
    def budget_short(self) -> ShortOf | None:
        """Whose ``usd`` budget could not renew the lease's cover: ``"pool"`` or
        ``"tenant"`` (its tenant's, `acquire(tenant=...)`); None while both cover it."""
        return self._held.budget_short

    @property
    def sync_sandbox(self) -> SyncSandbox:
        """A sync handle on the sandbox, whichever flavour the lease is (`sandbox` is the
        lease's own flavour): for code called both ways on one lease, as an agent framework
        calls its backend (deepagents' ``invoke`` and ``ainvoke``)."""
        return SyncSandbox(self._held.sandbox, self._engine, self._check, self._spans)

    @property
    def async_sandbox(self) -> AsyncSandboxHandle:
        """An async handle on the sandbox, whichever flavour the lease is (see
        `sync_sandbox`)."""
        return AsyncSandboxHandle(self._held.sandbox, self._engine, self._check, self._spans)

    def _check(self) -> None:
        if self._held.released:
            raise LeaseError(f"lease {self.id} on {self.entry} was already released")

    def __repr__(self) -> str:
        state = "released" if self._held.released else "live"
        name = type(self).__name__
        return f"<{name} {self.id} entry={self.entry} sandbox={self.sandbox_id} {state}>"


def _release_dropped(
    held: Held, engine: Engine, release: Callable[[Held], Coroutine[Any, Any, None]]
) -> None:
    """Release a lease its owner dropped unreleased (and every handle on its sandbox): its
    heartbeats would otherwise keep it, and the sandbox it pays for, alive for as long as
    the router runs. Said with a ResourceWarning, as an unclosed file is."""
    if held.released or engine.closed:
        return
    warnings.warn(
        f"lease {held.lease_id} on {held.entry} was never released; released on garbage "
        "collection (use it as a context manager, or call release())",
        ResourceWarning,
        stacklevel=2,
    )
    with contextlib.suppress(RuntimeError):  # the app's loop (an adopted one) is closed
        # in a context of its own: whatever span the collecting thread is in is not its
        contextvars.Context().run(engine.submit, release(held))


class Lease(_LeaseBase):
    """A live sandbox for sync code; ``with router.acquire() as lease:``."""

    @classmethod
    def of(cls, lease: AsyncLease) -> Lease:
        """The sync flavour of ``lease``, which hands its sandbox over (so dropping
        ``lease`` releases nothing): how `Router.acquire` derives from `Router.aacquire`."""
        lease._dropped.detach()
        return cls(lease._held, lease._engine, lease._release_fn, lease._pause_fn, lease._spans)

    @property
    def sandbox(self) -> SyncSandbox:
        return self.sync_sandbox

    def release(self) -> None:
        """Kill the sandbox, meter its time, free the slot (idempotent)."""
        self._engine.run(self._release_fn(self._held))

    def pause(self) -> str:
        """End the lease with its sandbox paused, not killed (metered so far, slot freed);
        the secret token `Router.resume` wakes it with, from any replica, for ``pause_ttl``.
        `Unsupported` (the lease stays live) where the entry cannot pause."""
        return self._engine.run(self._pause_fn(self._held))

    def __enter__(self) -> Lease:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()


class AsyncLease(_LeaseBase):
    """A live sandbox for async code; ``async with router.aacquire() as lease:``."""

    @property
    def sandbox(self) -> AsyncSandboxHandle:
        return self.async_sandbox

    async def release(self) -> None:
        """Kill the sandbox, meter its time, free the slot (idempotent)."""
        await self._engine.arun(self._release_fn(self._held))

    async def pause(self) -> str:
        """`Lease.pause`, awaited."""
        return await self._engine.arun(self._pause_fn(self._held))

    async def __aenter__(self) -> AsyncLease:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.release()


class PendingLease:
    """What `Router.aacquire` and `Router.aresume` return: a lease on its way.

    Await it for the `AsyncLease` (``lease = await router.aacquire()``), or
    enter it (``async with router.aacquire() as lease:``) to have the lease
    released when the block ends, as aiohttp's ``session.get()`` is both.
    Nothing starts until it is awaited or entered, as with a coroutine.
    """

    __slots__ = ("_coming", "_lease")
    _lease: AsyncLease  # once entered

    def __init__(self, coming: Coroutine[Any, Any, AsyncLease]) -> None:
        self._coming = coming

    def __await__(self) -> Generator[Any, None, AsyncLease]:
        return self._coming.__await__()

    async def __aenter__(self) -> AsyncLease:
        self._lease = await self._coming
        return self._lease

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self._lease.__aexit__(exc_type, exc, tb)
