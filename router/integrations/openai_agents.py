"""The OpenAI Agents SDK's sandbox backend on the router (``pip install
"sandbox-router[openai-agents]"``).

    from agents import Runner
    from agents.run import RunConfig
    from agents.sandbox import SandboxRunConfig
    from router.integrations.openai_agents import RouterSandboxClient

    config = RunConfig(sandbox=SandboxRunConfig(client=RouterSandboxClient(router)))
    await Runner.run(agent, "...", run_config=config)  # agent: a SandboxAgent

`create` acquires a lease (the entry the chain picks, failover and quotas included: one
``sessions`` unit per framework session), `delete` releases it. Everything the SDK's session
does goes through the lease's uniform handle, so one backend serves every provider. A run comes
back on another process or replica (`resume`, the serialized state) through a sticky
``session`` (the same sandbox while the router keeps it) or ``pause_on_exit`` (a pause token);
without either, `resume` makes a new sandbox and the SDK hydrates it from its snapshot.
Router errors reach the SDK as its own (`agents.sandbox.errors`), the router's as ``cause``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import shlex
import uuid
from pathlib import Path, PurePath, PurePosixPath
from typing import Literal
from urllib.parse import urlsplit

from pydantic import ConfigDict, Field

try:
    from agents.sandbox.errors import (
        ExecTimeoutError,
        ExecTransportError,
        ExposedPortUnavailableError,
        PtySessionNotFoundError,
        WorkspaceArchiveReadError,
        WorkspaceArchiveWriteError,
        WorkspaceReadNotFoundError,
        WorkspaceStartError,
        WorkspaceWriteTypeError,
    )
except ModuleNotFoundError as missing:  # the conftest and the docs tell this from a bug
    raise ModuleNotFoundError(
        "router.integrations.openai_agents needs the OpenAI Agents SDK: pip install "
        '"sandbox-router[openai-agents]"',
        name=missing.name,
    ) from missing
from agents.sandbox.manifest import Manifest
from agents.sandbox.session import SandboxSession, SandboxSessionState
from agents.sandbox.session.base_sandbox_session import BaseSandboxSession
from agents.sandbox.session.dependencies import Dependencies
from agents.sandbox.session.manager import Instrumentation
from agents.sandbox.session.pty_types import (
    PtyExecUpdate,
    clamp_pty_yield_time_ms,
    resolve_pty_write_yield_time_ms,
)
from agents.sandbox.session.runtime_helpers import (
    RESOLVE_WORKSPACE_PATH_HELPER,
    RuntimeHelperScript,
)
from agents.sandbox.session.sandbox_client import BaseSandboxClient, BaseSandboxClientOptions
from agents.sandbox.session.tar_workspace import shell_tar_exclude_args
from agents.sandbox.snapshot import SnapshotBase, SnapshotSpec, resolve_snapshot
from agents.sandbox.types import ExecResult, ExposedPortEndpoint, User
from agents.sandbox.util.tar_utils import UnsafeTarMemberError, validate_tar_bytes
from agents.sandbox.workspace_paths import coerce_posix_path, posix_path_as_path

from providers.base import SandboxSpec
from providers.errors import (
    LeaseError,
    NotFound,
    SandboxRouterError,
    Unavailable,
)
from router.core import Router
from router.integrations._agents_pty import PtyTable
from router.lease import AsyncLease
from router.processes import AsyncTerminal

__all__ = [
    "RouterSandboxClient",
    "RouterSandboxClientOptions",
    "RouterSandboxSession",
    "RouterSandboxSessionState",
]

BACKEND = "sandbox_router"
UNBOUNDED_EXEC = 24 * 60 * 60.0  # the SDK's ``timeout=None``, as its vendor backends bound it
WORKSPACE_TAR_TIMEOUT = 300.0


class RouterSandboxClientOptions(BaseSandboxClientOptions):
    """What to acquire: `SandboxSpec`'s fields, the capabilities the entry must have, and how a
    run comes back (``session``: a sticky session key; ``pause_on_exit``: pause the sandbox when
    the framework ends its session, its token kept in the session state)."""

    model_config = ConfigDict(hide_input_in_errors=True)  # env values stay out of errors

    type: Literal["sandbox_router"] = "sandbox_router"
    requires: tuple[str, ...] = ()
    template: str | None = None
    language: str | None = None
    env: dict[str, str] = Field(default_factory=dict)
    labels: dict[str, str] = Field(default_factory=dict)
    lifetime: float | None = None
    idle_timeout: float | None = None
    cpu: float | None = None
    memory_mb: int | None = None
    disk_gb: int | None = None
    gpu: str | None = None
    workdir: str | None = None
    ports: tuple[int, ...] = ()
    session: str | None = None
    pause_on_exit: bool = False
    timeout: float | None = None

    def model_post_init(self, context: object, /) -> None:
        self.spec()  # a bad field is refused here (InvalidArgument), not at the acquire

    def spec(self) -> SandboxSpec:
        """The `SandboxSpec` these options carry (its fields, by name)."""
        names = (f.name for f in dataclasses.fields(SandboxSpec))
        return SandboxSpec(**{name: getattr(self, name) for name in names})


class RouterSandboxSessionState(SandboxSessionState):
    """What brings a session back: the options, where it ran, and its pause token."""

    type: Literal["sandbox_router"] = "sandbox_router"
    options: RouterSandboxClientOptions = Field(default_factory=RouterSandboxClientOptions)
    entry: str = ""
    sandbox_id: str = ""
    home: str = "/"
    pause_token: str | None = None


class RouterSandboxSession(BaseSandboxSession):
    """One framework session on one lease."""

    state: RouterSandboxSessionState

    def __init__(
        self, *, state: RouterSandboxSessionState, lease: AsyncLease, capabilities: frozenset[str]
    ) -> None:
        self.state = state
        self._lease = lease
        self._capabilities = capabilities
        self._root_ready = state.workspace_root_ready
        self._ptys = PtyTable()

    @property
    def lease(self) -> AsyncLease:
        """The router's lease: which entry serves (``lease.entry``), its failovers."""
        return self._lease

    # -- commands ------------------------------------------------------------------
    async def _exec_internal(
        self, *command: str | Path, timeout: float | None = None
    ) -> ExecResult:
        argv = [str(part) for part in command]
        cwd = self.state.manifest.root if self._root_ready else None
        try:
            result = await self._lease.sandbox.run(
                argv, timeout=_exec_timeout(timeout), env=await self._env() or None, cwd=cwd
            )
        except SandboxRouterError as exc:
            raise _transport_error(command, exc) from exc
        if result.timed_out:
            raise ExecTimeoutError(command=command, timeout_s=timeout)
        return ExecResult(
            stdout=result.stdout.encode("utf-8", errors="replace"),
            stderr=result.stderr.encode("utf-8", errors="replace"),
            exit_code=result.exit_code,
        )

    async def _shell(self, script: str, timeout: float) -> tuple[int, str]:
        """A shell line of the backend's own (cwd: the sandbox's home), its exit and output."""
        result = await self._lease.sandbox.run(script, timeout=timeout)
        return (-1 if result.timed_out else result.exit_code), result.stdout + result.stderr

    async def _env(self) -> dict[str, str]:
        return dict(await self.state.manifest.environment.resolve())

    async def running(self) -> bool:
        if self._lease.released:
            return False
        try:
            return (await self._lease.sandbox.run("true", timeout=10)).exit_code == 0
        except SandboxRouterError:
            return False

    # -- the workspace ---------------------------------------------------------------
    def _runtime_helpers(self) -> tuple[RuntimeHelperScript, ...]:
        return (RESOLVE_WORKSPACE_PATH_HELPER,)

    async def _ensure_runtime_helper_installed(self, helper: RuntimeHelperScript) -> PurePath:
        """The SDK's helper scripts go under the sandbox's home, not ``/tmp``: a `local`
        sandbox's commands each get a ``/tmp`` of their own (bubblewrap)."""
        home = PurePosixPath(self.state.home) / ".sandbox-router" / "bin"
        moved = dataclasses.replace(helper, install_path=home / helper.install_path.name)
        return await super()._ensure_runtime_helper_installed(moved)

    def _current_runtime_helper_cache_key(self) -> object | None:
        return self._lease.sandbox_id

    async def _validate_path_access(self, path: Path | str, *, for_write: bool = False) -> Path:
        return await self._validate_remote_path_access(path, for_write=for_write)

    async def _prepare_backend_workspace(self) -> None:
        root = self._workspace_root_path()
        try:
            code, output = await self._shell(f"mkdir -p -- {shlex.quote(root.as_posix())}", 60)
        except SandboxRouterError as exc:
            raise WorkspaceStartError(path=root, context=_where(self), cause=exc) from exc
        if code != 0:
            context = {**_where(self), "reason": "workspace_root_nonzero_exit", "output": output}
            raise WorkspaceStartError(path=root, context=context)
        self._root_ready = True

    def _mark_workspace_root_ready_from_probe(self) -> None:
        super()._mark_workspace_root_ready_from_probe()
        self._root_ready = True

    async def read(self, path: Path | str, *, user: str | User | None = None) -> io.IOBase:
        error_path = posix_path_as_path(coerce_posix_path(path))
        if user is not None:
            workspace_path = await self._check_read_with_exec(path, user=user)
        else:
            workspace_path = await self._validate_path_access(path)
        try:
            return io.BytesIO(await self._lease.sandbox.read_file(workspace_path.as_posix()))
        except SandboxRouterError as exc:
            failed = exc
        # A provider's read error does not say which: ask the sandbox whether the file is there.
        with contextlib.suppress(SandboxRouterError):
            if (await self._lease.sandbox.run(["test", "-e", workspace_path.as_posix()])).exit_code:
                raise WorkspaceReadNotFoundError(path=error_path, cause=failed) from failed
        retryable = isinstance(failed, Unavailable)
        raise WorkspaceArchiveReadError(
            path=error_path, context=_where(self), cause=failed, retryable=retryable
        ) from failed

    async def write(
        self, path: Path | str, data: io.IOBase, *, user: str | User | None = None
    ) -> None:
        error_path = posix_path_as_path(coerce_posix_path(path))
        if user is not None:
            await self._check_write_with_exec(path, user=user)
        payload = data.read()
        if isinstance(payload, str):
            payload = payload.encode("utf-8")
        if not isinstance(payload, bytes | bytearray):
            raise WorkspaceWriteTypeError(path=error_path, actual_type=type(payload).__name__)
        workspace_path = await self._validate_path_access(path, for_write=True)
        try:
            await self._lease.sandbox.write_file(workspace_path.as_posix(), bytes(payload))
        except SandboxRouterError as exc:
            raise WorkspaceArchiveWriteError(
                path=workspace_path,
                context=_where(self),
                cause=exc,
                retryable=isinstance(exc, Unavailable),
            ) from exc

    async def persist_workspace(self) -> io.IOBase:
        """The workspace as a tar stream (its ephemeral paths left out), as the SDK's vendor
        backends take it: ``tar`` in the sandbox, the archive read back, then removed."""
        root = self._workspace_root_path()
        name = f".sandbox-router-persist-{self.state.session_id.hex}.tar"  # in the home
        excludes = " ".join(shell_tar_exclude_args(self._persist_workspace_skip_relpaths()))
        script = f"tar {excludes} -C {shlex.quote(root.as_posix())} -cf {name} ."
        try:
            code, output = await self._shell(script, WORKSPACE_TAR_TIMEOUT)
            if code != 0:
                context = {**_where(self), "reason": "tar_failed", "output": output}
                raise WorkspaceArchiveReadError(path=root, context=context, retryable=False)
            return io.BytesIO(await self._lease.sandbox.read_file(name))
        except SandboxRouterError as exc:
            raise WorkspaceArchiveReadError(path=root, context=_where(self), cause=exc) from exc
        finally:
            with contextlib.suppress(SandboxRouterError):
                await self._shell(f"rm -f -- {name}", 30)

    async def hydrate_workspace(self, data: io.IOBase) -> None:
        root = self._workspace_root_path()
        name = f".sandbox-router-hydrate-{self.state.session_id.hex}.tar"
        payload = data.read()
        if isinstance(payload, str):
            payload = payload.encode("utf-8")
        if not isinstance(payload, bytes | bytearray):
            raise WorkspaceWriteTypeError(path=Path(name), actual_type=type(payload).__name__)
        try:
            validate_tar_bytes(bytes(payload), allow_external_symlink_targets=False)
        except UnsafeTarMemberError as exc:
            context: dict[str, object] = {"reason": "unsafe_or_invalid_tar", "member": exc.member}
            raise WorkspaceArchiveWriteError(path=root, context=context, cause=exc) from exc
        quoted = shlex.quote(root.as_posix())
        script = f"mkdir -p -- {quoted} && tar -C {quoted} -xf {name}; s=$?; rm -f {name}; exit $s"
        try:
            await self._lease.sandbox.write_file(name, bytes(payload))
            code, output = await self._shell(script, WORKSPACE_TAR_TIMEOUT)
        except SandboxRouterError as exc:
            raise WorkspaceArchiveWriteError(path=root, context=_where(self), cause=exc) from exc
        if code != 0:
            context = {**_where(self), "reason": "tar_extract_failed", "output": output}
            raise WorkspaceArchiveWriteError(path=root, context=context)

    # -- ports -----------------------------------------------------------------------
    async def _resolve_exposed_port(self, port: int) -> ExposedPortEndpoint:
        def unavailable(detail: str, cause: BaseException | None = None) -> Exception:
            return ExposedPortUnavailableError(
                port=port,
                exposed_ports=self.state.exposed_ports,
                reason="backend_unavailable",
                context={**_where(self), "detail": detail},
                cause=cause,
            )

        try:
            exposed = await self._lease.sandbox.expose(port)
        except SandboxRouterError as exc:
            raise unavailable("expose_failed", exc) from exc
        if exposed.headers:  # a token the SDK's endpoint cannot carry (names only, never values)
            raise unavailable(f"needs request headers: {', '.join(sorted(exposed.headers))}")
        url = urlsplit(exposed.url)
        if url.hostname is None:
            raise unavailable("no host in the exposed URL")
        tls = url.scheme == "https"
        return ExposedPortEndpoint(
            host=url.hostname, port=url.port or (443 if tls else 80), tls=tls, query=url.query
        )

    # -- PTY ---------------------------------------------------------------------------
    def supports_pty(self) -> bool:
        return "pty" in self._capabilities

    async def pty_exec_start(
        self,
        *command: str | Path,
        timeout: float | None = None,
        shell: bool | list[str] = True,
        user: str | User | None = None,
        tty: bool = False,
        yield_time_s: float | None = None,
        max_output_tokens: int | None = None,
    ) -> PtyExecUpdate:
        argv = self._prepare_exec_command(*command, shell=shell, user=user)
        env = await self._env() or None
        cwd = self.state.manifest.root if self._root_ready else None
        sandbox = self._lease.sandbox
        try:
            if tty:  # typed into an interactive shell, which outlives it, as on E2B
                terminal = await sandbox.open_terminal(rows=24, cols=80, env=env, cwd=cwd)
                await terminal.write(shlex.join(argv) + "\n")
                process_id = await self._ptys.add(terminal)
            else:
                process_id = await self._ptys.add(await sandbox.start(argv, env=env, cwd=cwd))
        except SandboxRouterError as exc:
            raise _transport_error(command, exc) from exc
        wait_ms = 10_000 if yield_time_s is None else int(yield_time_s * 1000)
        return await self._ptys.update(
            process_id, clamp_pty_yield_time_ms(wait_ms), max_output_tokens
        )

    async def pty_write_stdin(
        self,
        *,
        session_id: int,
        chars: str,
        yield_time_s: float | None = None,
        max_output_tokens: int | None = None,
    ) -> PtyExecUpdate:
        entry = await self._ptys.get(session_id)
        if entry is None:
            raise PtySessionNotFoundError(session_id=session_id)
        if chars:
            if not isinstance(entry.handle, AsyncTerminal):  # as on the SDK's E2B backend
                raise RuntimeError("stdin is not available for this process")
            try:
                await entry.handle.write(chars)
            except SandboxRouterError as exc:
                raise _transport_error(("write_stdin",), exc) from exc
        wait_ms = 250 if yield_time_s is None else int(yield_time_s * 1000)
        return await self._ptys.update(
            session_id,
            resolve_pty_write_yield_time_ms(yield_time_ms=wait_ms, input_empty=chars == ""),
            max_output_tokens,
        )

    async def pty_terminate_all(self) -> None:
        await self._ptys.close_all()

    # -- the end -----------------------------------------------------------------------
    async def _shutdown_backend(self) -> None:
        """Release the lease (kills the sandbox, or keeps a sticky session's for the router's
        ``session_idle_ttl``); with ``pause_on_exit``, pause it into a token instead, where the
        entry can (else release). Errors are the router's to retry: its kill retries go on."""
        if self._lease.released:
            return
        if self.state.options.pause_on_exit and self.state.options.session is None:
            with contextlib.suppress(SandboxRouterError):  # no pause there: released instead
                self.state.pause_token = await self._lease.pause()
                return
        with contextlib.suppress(SandboxRouterError):
            await self._lease.release()


class RouterSandboxClient(BaseSandboxClient[RouterSandboxClientOptions]):
    """The Agents SDK's sandbox client on a `Router`: each session a lease from its chain."""

    backend_id = BACKEND
    supports_default_options = True

    def __init__(
        self,
        router: Router,
        *,
        instrumentation: Instrumentation | None = None,
        dependencies: Dependencies | None = None,
    ) -> None:
        self._router = router
        self._instrumentation = instrumentation or Instrumentation()
        self._dependencies = dependencies

    async def create(
        self,
        *,
        snapshot: SnapshotSpec | SnapshotBase | None = None,
        manifest: Manifest | None = None,
        options: RouterSandboxClientOptions | None = None,
    ) -> SandboxSession:
        options = options or RouterSandboxClientOptions()
        if manifest is not None:
            self._validate_manifest_for_create(manifest)
        lease = await self._acquire(options)
        try:
            home = await _home(lease)
        except BaseException:
            await lease.release()
            raise
        session_id = uuid.uuid4()
        state = RouterSandboxSessionState(
            session_id=session_id,
            manifest=_rooted(manifest, home),
            snapshot=resolve_snapshot(snapshot, str(session_id)),
            exposed_ports=options.ports,
            options=options,
            entry=lease.entry,
            sandbox_id=lease.sandbox_id,
            home=home,
        )
        return self._session(state, lease)

    async def delete(self, session: SandboxSession) -> SandboxSession:
        inner = session._inner
        if not isinstance(inner, RouterSandboxSession):
            raise TypeError("RouterSandboxClient.delete expects a RouterSandboxSession")
        await inner.shutdown()
        return session

    async def resume(self, state: SandboxSessionState) -> SandboxSession:
        """The same sandbox when its sticky session or pause token still holds it (any
        replica), else a new one that the SDK hydrates from ``state.snapshot``."""
        if not isinstance(state, RouterSandboxSessionState):
            raise TypeError("RouterSandboxClient.resume expects a RouterSandboxSessionState")
        state.assert_path_grants_rebound()
        lease: AsyncLease | None = None
        if state.pause_token is not None:
            try:
                lease = await self._router.aresume(state.pause_token, timeout=state.options.timeout)
            except (LeaseError, NotFound):  # expired, resumed elsewhere, or gone at the provider
                lease = None
            except SandboxRouterError as exc:
                raise _start_error(state.manifest.root, exc) from exc
            state.pause_token = None
        preserved = lease is not None
        if lease is None:
            lease = await self._acquire(state.options)
            preserved = lease.resumed
        state.entry, state.sandbox_id = lease.entry, lease.sandbox_id
        if not preserved:
            state.workspace_root_ready = False
        session = self._session(state, lease)
        inner = session._inner
        assert isinstance(inner, RouterSandboxSession)
        inner._set_start_state_preserved(preserved, system=preserved)
        return session

    def deserialize_session_state(self, payload: dict[str, object]) -> SandboxSessionState:
        return self._deserialize_session_state_payload(payload, RouterSandboxSessionState)

    def _session(self, state: RouterSandboxSessionState, lease: AsyncLease) -> SandboxSession:
        inner = RouterSandboxSession(
            state=state, lease=lease, capabilities=self._router.capabilities(lease.entry)
        )
        return self._wrap_session(inner, instrumentation=self._instrumentation)

    async def _acquire(self, options: RouterSandboxClientOptions) -> AsyncLease:
        try:
            return await self._router.aacquire(
                options.spec(),
                requires=options.requires,
                session=options.session,
                timeout=options.timeout,
            )
        except SandboxRouterError as exc:
            raise _start_error(Manifest().root, exc) from exc


async def _home(lease: AsyncLease) -> str:
    """The directory the sandbox's commands start in (each provider has its own)."""
    try:
        result = await lease.sandbox.run("pwd", timeout=30)
    except SandboxRouterError as exc:
        raise _start_error(Manifest().root, exc) from exc
    home = result.stdout.strip()
    if result.exit_code != 0 or not home.startswith("/"):
        raise WorkspaceStartError(
            path=Path(Manifest().root),
            context={"backend": BACKEND, "entry": lease.entry, "reason": "no_home"},
        )
    return home


def _rooted(manifest: Manifest | None, home: str) -> Manifest:
    """The manifest, its root under the sandbox's home unless the caller set one: the SDK's
    default (``/workspace``) is outside what most providers let a sandbox write."""
    if manifest is not None and "root" in manifest.model_fields_set:
        return manifest
    root = f"{home.rstrip('/')}/workspace"
    if manifest is None:
        return Manifest(root=root)
    return manifest.model_copy(update={"root": root})


def _exec_timeout(timeout: float | None) -> float:
    if timeout is None:
        return UNBOUNDED_EXEC
    return max(timeout, 0.001)


def _where(session: RouterSandboxSession) -> dict[str, object]:
    return {"backend": BACKEND, "entry": session.lease.entry}


def _transport_error(command: tuple[str | Path, ...], exc: SandboxRouterError) -> Exception:
    return ExecTransportError(
        command=command,
        context={"backend": BACKEND, "error": type(exc).__name__},
        cause=exc,
        message=f"exec transport error: {exc}",
        retryable=isinstance(exc, Unavailable),
    )


def _start_error(root: str, exc: SandboxRouterError) -> Exception:
    """What the SDK raises when a session cannot start; the router's error (which entries were
    tried, and why) is its message and ``cause``."""
    return WorkspaceStartError(
        path=Path(root),
        context={"backend": BACKEND, "error": type(exc).__name__},
        cause=exc,
        message=f"failed to start session: {exc}",
    )
