"""A LangChain Deep Agents backend on a router lease: `RouterSandbox`.

deepagents' ``BaseSandbox`` builds its file tools (ls, read, write, edit,
grep, glob) on ``execute``, ``upload_files`` and ``download_files``, so the
agent's every tool call runs in the sandbox the router chose. What the model
sees is what deepagents' vendor backends (langchain-e2b, -modal,
-daytona, -runloop) give it: stdout then stderr after a newline as one
output, exit code 124 and "Command timed out after N seconds" past a
timeout (30 minutes by default, 0 for none), and per-file errors for
relative paths (``invalid_path``), missing files (``file_not_found``),
directories (``is_directory``) and paths the sandbox refuses
(``permission_denied``). A failure of the provider itself during a command
is an output with exit code 1, as langchain-e2b reports it; a released
lease or closed router raises.

Needs the ``deepagents`` extra: ``pip install "sandbox-router[deepagents]"``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Mapping
from functools import partial
from types import TracebackType

try:
    from deepagents.backends.protocol import (
        ExecuteResponse,
        FileDownloadResponse,
        FileUploadResponse,
    )
    from deepagents.backends.sandbox import BaseSandbox
except ModuleNotFoundError as missing:  # pragma: no cover - the extra's own message
    raise ModuleNotFoundError(
        'router.integrations.deepagents needs deepagents: pip install "sandbox-router[deepagents]"',
        name="deepagents",
    ) from missing

from providers.base import CommandResult, SandboxSpec
from providers.errors import (
    InvalidArgument,
    ProviderError,
    SandboxPathError,
)
from providers.files import FileInfo
from router.core import Router
from router.integrations.leases import Held
from router.lease import AsyncLease, Lease

__all__ = ["DEFAULT_TIMEOUT", "TIMEOUT_EXIT_CODE", "RouterSandbox"]

DEFAULT_TIMEOUT = 30 * 60  # the vendor backends' default for a command
TIMEOUT_EXIT_CODE = 124  # as `timeout(1)`, and the vendor backends


class RouterSandbox(BaseSandbox):
    """A deepagents sandbox backend whose sandbox comes from a `Router`.

    ``with RouterSandbox(router) as backend:`` (or ``async with``) acquires a
    lease on entry and releases it at the end of the block, also when the
    agent's run raised. ``RouterSandbox(lease)`` runs on a lease the app
    already holds, and leaves its release to the app.

    Args:
        source: the `Router` to acquire from, or a held `Lease` / `AsyncLease`.
        spec: what to create (template, env, resources...), as `Router.acquire`.
        requires: capabilities the entry must declare.
        labels: extra labels put on the sandbox.
        session: a sticky session key.
        acquire_timeout: the acquire's overall deadline in seconds.
        timeout: a command's default timeout in seconds (0: none).
    """

    def __init__(
        self,
        source: Router | Lease | AsyncLease,
        spec: SandboxSpec | None = None,
        *,
        requires: Iterable[str] = (),
        labels: Mapping[str, str] | None = None,
        session: str | None = None,
        acquire_timeout: float | None = None,
        timeout: int = DEFAULT_TIMEOUT,
    ) -> None:
        self._default_timeout = _command_timeout(timeout, "RouterSandbox(timeout=...)")
        self._held = Held.of(
            source, "RouterSandbox", spec, requires, labels, session, acquire_timeout
        )

    @property
    def lease(self) -> Lease | AsyncLease:
        """The lease the backend runs on (``lease.entry`` names the chain entry that served)."""
        self._held.sync()  # refuses when nothing is held
        assert self._held.lease is not None
        return self._held.lease

    @property
    def id(self) -> str:
        """The provider's id of the sandbox."""
        return self._held.sync().id

    def execute(self, command: str, *, timeout: int | None = None) -> ExecuteResponse:
        """Run a shell command in the sandbox's home; its output and exit code, never a raise
        for what the command or the provider did."""
        wait = self._timeout(timeout)
        try:
            ran = self._held.sync().run(command, timeout=wait)
        except ProviderError as exc:
            return _provider_failed(exc)
        return _response(ran, wait)

    async def aexecute(
        self,
        command: str,
        *,
        timeout: int | None = None,
    ) -> ExecuteResponse:
        """`execute`, awaited on the router's loop (no thread of deepagents' own)."""
        wait = self._timeout(timeout)
        try:
            ran = await self._held.aio().run(command, timeout=wait)
        except ProviderError as exc:
            return _provider_failed(exc)
        return _response(ran, wait)

    def upload_files(self, files: list[tuple[str, bytes]]) -> list[FileUploadResponse]:
        """Write each file (parent directories made); an error per file, never a raise.

        Each write is preceded by a look at what the path holds, as langchain-e2b does."""
        box = self._held.sync()
        done: list[FileUploadResponse] = []
        for path, content in files:
            error: str | None = _path_error(path)
            if error is None and _is_dir(_info(partial(box.stat, path))):
                error = "is_directory"
            if error is None:
                try:
                    box.write_file(path, content)
                except ProviderError as exc:
                    error = _file_error(exc, _info(partial(box.stat, path)))
            done.append(FileUploadResponse(path=path, error=error))
        return done

    async def aupload_files(self, files: list[tuple[str, bytes]]) -> list[FileUploadResponse]:
        """`upload_files`, awaited."""
        box = self._held.aio()
        done: list[FileUploadResponse] = []
        for path, content in files:
            error: str | None = _path_error(path)
            if error is None and _is_dir(await _ainfo(box.stat(path))):
                error = "is_directory"
            if error is None:
                try:
                    await box.write_file(path, content)
                except ProviderError as exc:
                    error = _file_error(exc, await _ainfo(box.stat(path)))
            done.append(FileUploadResponse(path=path, error=error))
        return done

    def download_files(self, paths: list[str]) -> list[FileDownloadResponse]:
        """Read each file; an error per file, never a raise."""
        box = self._held.sync()
        done: list[FileDownloadResponse] = []
        for path in paths:
            error, content = _path_error(path), None
            if error is None:
                try:
                    content = box.read_file(path)
                except ProviderError as exc:
                    error = _file_error(exc, _info(partial(box.stat, path)), missing=True)
            done.append(FileDownloadResponse(path=path, content=content, error=error))
        return done

    async def adownload_files(self, paths: list[str]) -> list[FileDownloadResponse]:
        """`download_files`, awaited."""
        box = self._held.aio()
        done: list[FileDownloadResponse] = []
        for path in paths:
            error, content = _path_error(path), None
            if error is None:
                try:
                    content = await box.read_file(path)
                except ProviderError as exc:
                    error = _file_error(exc, await _ainfo(box.stat(path)), missing=True)
            done.append(FileDownloadResponse(path=path, content=content, error=error))
        return done

    def __enter__(self) -> RouterSandbox:
        self._held.enter()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._held.exit()

    async def __aenter__(self) -> RouterSandbox:
        await self._held.aenter()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self._held.aexit()

    def __repr__(self) -> str:
        lease = self._held.lease
        return f"<RouterSandbox {lease!r}>" if lease is not None else "<RouterSandbox unentered>"

    def _timeout(self, timeout: int | None) -> float | None:
        """The router's timeout for a command: the default, or None for 0 (no timeout)."""
        if timeout is None:
            return self._default_timeout
        return _command_timeout(timeout, "execute(timeout=...)")


def _command_timeout(timeout: object, where: str) -> float | None:
    if isinstance(timeout, bool) or not isinstance(timeout, int | float):
        raise InvalidArgument(f"{where}: a number of seconds, not {type(timeout).__name__}")
    if timeout < 0:
        raise InvalidArgument(f"{where}: must be non-negative, got {timeout}")
    return float(timeout) or None


def _response(ran: CommandResult, timeout: float | None) -> ExecuteResponse:
    output = ran.stdout
    if ran.stderr:
        output += "\n" + ran.stderr if output else ran.stderr
    if ran.timed_out:
        note = f"Command timed out after {timeout:g} seconds"
        return ExecuteResponse(f"{note}\n{output}" if output else note, TIMEOUT_EXIT_CODE)
    return ExecuteResponse(output=output, exit_code=ran.exit_code, truncated=False)


def _provider_failed(exc: ProviderError) -> ExecuteResponse:
    return ExecuteResponse(f"Error executing command ({type(exc).__name__}): {exc}", exit_code=1)


def _path_error(path: str) -> str | None:
    """deepagents' file calls take absolute paths; the vendor backends refuse others."""
    return None if path.startswith("/") and "\x00" not in path else "invalid_path"


def _file_error(exc: ProviderError, info: FileInfo | None, *, missing: bool = False) -> str:
    """The `FileOperationError` for a failed read or write, from what is at the path now."""
    if isinstance(exc, SandboxPathError):
        return "permission_denied"
    if info is not None and info.is_dir:
        return "is_directory"
    if info is None and missing:
        return "file_not_found"
    if "ermission denied" in str(exc):
        return "permission_denied"
    return "file_not_found" if info is None else f"{type(exc).__name__}: {exc}"


def _is_dir(info: FileInfo | None) -> bool:
    """A write over a directory is refused before it is sent, as langchain-e2b refuses it:
    some vendors would put the file inside the directory instead."""
    return info is not None and info.is_dir


def _info(stat: Callable[[], FileInfo]) -> FileInfo | None:
    """What `stat` finds at a path whose read or write failed; None when nothing is there
    (or the entry cannot say: `Unsupported` is a `ProviderError` too)."""
    try:
        return stat()
    except ProviderError:
        return None


async def _ainfo(stat: Awaitable[FileInfo]) -> FileInfo | None:
    try:
        return await stat
    except ProviderError:
        return None
