"""The ``daytona`` provider: sandboxes on Daytona through the ``daytona`` SDK's AsyncDaytona.

Each chain entry is one Daytona organization (one API key: ``api_key``,
else ``DAYTONA_API_KEY``; the API URL from ``api_url``, else
``DAYTONA_API_URL``). Its ``AsyncDaytona`` client is created on first use
and reused; ``daytona`` itself is imported only then (it is slow to import).
The client keeps a Socket.IO connection on its event loop (how it learns that
a sandbox started), so `DaytonaProvider.aclose` must run on that loop: a loop
closed under a live client waits for the socket's tasks (~25 s). The SDK has
no retry switch (it retries nothing but a refused or dropped connection,
twice, and GETs dropped mid-way), so the router's retry policy is the one.

A create names a snapshot (the entry's ``snapshot``, or Daytona's default)
or an image (``image``; a spec's ``template`` is read as either, per
``template_source``), with the spec's env, labels and language. A spec's
``lifetime`` becomes ``ttlMinutes`` and its ``idle_timeout`` the auto-stop
interval (both in whole minutes, rounded up); sandboxes are deleted when they
stop (``auto_delete_interval`` 0) unless the entry says otherwise. Resources
(cpu, memory, disk) apply to image-based sandboxes: a snapshot fixes its own.

When a create fails after Daytona accepted it, the sandbox is deleted
before the error is raised: the SDK names it on a timeout and in an
``error``-state message (its error reason is then added to ours); otherwise
(a connection lost while waiting, or a cancelled create) the sandboxes
carrying the create's router lease label are found and deleted.

Commands run in shell sessions, the one Daytona API that keeps stdout and
stderr apart: each command in a subshell (env and cwd apply to it only), in
a session of its own while it runs (sessions are pooled per handle), under
the router's timeout, after which its session is dropped (which kills it)
and the output so far is returned with ``timed_out=True``.
`DaytonaSandbox.run_code` uses Daytona's code runner for the sandbox's own
language (stdout and stderr merged, as Daytona gives them), a session for
bash or for python in a sandbox of another language.

Every SDK exception goes through `_to_error`, the one mapping to
``providers.errors``. The SDK hides statuses (a download error keeps it on
an ``aiohttp`` error two levels down; ``code_run`` raises the generated
client's error unwrapped), so it reads the ``__cause__`` chain: 401
`AuthError`; 400 or 403 saying "limit exceeded" or "quota" `QuotaExceeded`
(Daytona's resource limits: 403 before API v0.170, 400 since), other 403
`AuthError`; 429 `RateLimited` with ``Retry-After``; 404, and a 400 "not
found" on create (an unknown snapshot), `NotFound`; 408, 5xx, connection
errors, timeouts and a sandbox that failed to start `Unavailable`; a runner
queue timeout `CapacityExceeded`. Inside a sandbox a client error the daemon
gave is the caller's (`SandboxError`, a missing file included); one the
proxy in front gave is `NotFound` when the API says the sandbox no longer
runs.
"""

from __future__ import annotations

import asyncio
import base64
import builtins
import contextlib
import json
import math
import posixpath
import re
import secrets
import shlex
import time
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta
from email.utils import parsedate_to_datetime
from typing import TYPE_CHECKING, Any, ClassVar, Literal, NamedTuple

import structlog
from pydantic import Field, SecretStr, model_validator

from providers.base import (
    LABEL_LEASE,
    CodeResult,
    CommandResult,
    FileInfo,
    LoopBound,
    Provider,
    ProviderOptions,
    Sandbox,
    SandboxInfo,
    SandboxSpec,
    credential,
    missing_api_key,
)
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

if TYPE_CHECKING:
    from daytona import AsyncDaytona, AsyncSandbox

__all__ = ["API_KEY_ENV", "API_URL_ENV", "DaytonaOptions", "DaytonaProvider", "DaytonaSandbox"]

log = structlog.get_logger("sandbox_router.daytona")

API_KEY_ENV = "DAYTONA_API_KEY"
API_URL_ENV = "DAYTONA_API_URL"
CODE_LANGUAGES = frozenset({"python", "javascript", "typescript"})
_DELETED = frozenset({"destroyed", "destroying"})
_UNUSABLE = _DELETED | {"error", "build_failed"}
_STARTABLE = frozenset({"stopped", "archived"})
_QUOTA_WORDS = ("limit exceeded", "quota")
_ERROR_STATE = re.compile(r"Sandbox (\S+) entered error state")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_KILL_TIMEOUT = 10.0
_EXECUTION_TIMEOUT = "PROCESS_EXECUTION_TIMEOUT"
_DAEMON = "DAYTONA_DAEMON"


class DaytonaOptions(ProviderOptions):
    """Options of a ``daytona`` chain entry.

    Attributes:
        api_key: the organization's API key; ``DAYTONA_API_KEY`` when unset.
        api_url: the API's URL (``DAYTONA_API_URL``, else Daytona's cloud).
        target: the region sandboxes are created in (``DAYTONA_TARGET``, else
            the organization's default).
        snapshot, image: what sandboxes start from when the spec names no
            template (at most one; Daytona's default snapshot when none).
        template_source: whether a spec's ``template`` names a snapshot or an
            image.
        auto_stop_interval: minutes idle before Daytona stops a sandbox, when
            the spec names no ``idle_timeout`` (Daytona's default: 15; 0: never).
        auto_delete_interval: minutes after stopping before Daytona deletes a
            sandbox (0: at once, the default here; negative: never).
        auto_archive_interval: minutes stopped before Daytona archives it.
        request_timeout: seconds for each API request.
        transfer_timeout: seconds for one file upload or download.
    """

    api_key: SecretStr | None = None
    api_url: str | None = None
    target: str | None = None
    snapshot: str | None = None
    image: str | None = None
    template_source: Literal["snapshot", "image"] = "snapshot"
    auto_stop_interval: int | None = Field(default=None, ge=0)
    auto_delete_interval: int | None = 0
    auto_archive_interval: int | None = Field(default=None, ge=0)
    request_timeout: float = Field(default=30.0, gt=0)
    transfer_timeout: float = Field(default=300.0, gt=0)

    @model_validator(mode="after")
    def _one_source(self) -> DaytonaOptions:
        if self.snapshot is not None and self.image is not None:
            raise ValueError("set at most one of snapshot and image")
        return self


class DaytonaProvider(Provider):
    """One Daytona organization.

    Args:
        name: the chain entry's name.
        options: `DaytonaOptions`.
    """

    kind: ClassVar[str] = "daytona"
    Options: ClassVar[type[ProviderOptions]] = DaytonaOptions
    capabilities = frozenset({"run_code", "files"})

    def __init__(self, name: str = "daytona", options: ProviderOptions | None = None) -> None:
        super().__init__(name, options)
        self._client: LoopBound[AsyncDaytona] = LoopBound()
        self._sweeps: set[asyncio.Task[None]] = set()

    @property
    def opts(self) -> DaytonaOptions:
        assert isinstance(self.options, DaytonaOptions)
        return self.options

    def _api_key(self) -> str | None:
        return credential(self.opts.api_key, API_KEY_ENV)

    def unconfigured_reason(self) -> str | None:
        return missing_api_key(API_KEY_ENV) if self._api_key() is None else None

    def _api(self) -> AsyncDaytona:
        """The entry's SDK client on this event loop (its HTTP session and event socket)."""
        return self._client.get(self._open_client)

    def _open_client(self) -> AsyncDaytona:
        api_key = self._api_key()
        if api_key is None:
            raise AuthError(str(self.unconfigured_reason()), provider=self.name)
        from daytona import AsyncDaytona, DaytonaConfig

        return AsyncDaytona(
            DaytonaConfig(api_key=api_key, api_url=self.opts.api_url, target=self.opts.target)
        )

    def _params(self, spec: SandboxSpec) -> Any:
        from daytona import CreateSandboxFromImageParams, CreateSandboxFromSnapshotParams, Resources

        opts = self.opts
        common: dict[str, Any] = {
            "labels": dict(spec.labels),
            "env_vars": dict(spec.env),
            "auto_delete_interval": opts.auto_delete_interval,
            "auto_archive_interval": opts.auto_archive_interval,
        }
        if spec.language in CODE_LANGUAGES:
            common["language"] = spec.language
        auto_stop = opts.auto_stop_interval
        if spec.idle_timeout:
            auto_stop = max(1, math.ceil(spec.idle_timeout / 60))
        common["auto_stop_interval"] = auto_stop
        if spec.lifetime:
            common["ttl_minutes"] = max(1, math.ceil(spec.lifetime / 60))
        image = opts.image
        snapshot = opts.snapshot
        if spec.template is not None:
            image, snapshot = (
                (spec.template, None) if opts.template_source == "image" else (None, spec.template)
            )
        if image is None:
            return CreateSandboxFromSnapshotParams(snapshot=snapshot, **common)
        resources = None
        if spec.cpu or spec.memory_mb or spec.disk_gb:
            resources = Resources(
                cpu=math.ceil(spec.cpu) if spec.cpu else None,
                memory=math.ceil(spec.memory_mb / 1024) if spec.memory_mb else None,
                disk=spec.disk_gb,
            )
        return CreateSandboxFromImageParams(image=image, resources=resources, **common)

    async def create(self, spec: SandboxSpec, *, timeout: float) -> DaytonaSandbox:
        daytona = self._api()
        params = self._params(spec)
        try:
            async with asyncio.timeout(timeout + 0.5):
                native = await daytona.create(params, timeout=max(timeout, 0.001))
        except asyncio.CancelledError:
            self._sweep_later(spec)
            raise
        except Exception as exc:
            err = _to_error(exc, self.name, _created_id(exc))
            reason = await self._clean_up(err, spec)
            if reason and reason not in err.message:
                err.message = f"{err.message} ({reason})"
            raise err from exc
        log.debug("sandbox_router.daytona.created", entry=self.name, sandbox_id=native.id)
        return self._sandbox(native, workdir=spec.workdir)

    def _sandbox(self, native: AsyncSandbox, *, workdir: str | None = None) -> DaytonaSandbox:
        return DaytonaSandbox(
            native,
            self.name,
            workdir=workdir,
            request_timeout=self.opts.request_timeout,
            transfer_timeout=self.opts.transfer_timeout,
        )

    async def _clean_up(self, err: ProviderError, spec: SandboxSpec) -> str | None:
        """Delete what a failed create left: the sandbox it names, or its lease's.

        Returns:
            Why Daytona says the named sandbox failed, when it says (its event
            carries only the new state, so the SDK's own error has no reason).
        """
        if err.sandbox_id is not None:
            return await self._discard(err.sandbox_id)
        if isinstance(err, Unavailable):
            await self._sweep(spec)
        return None

    async def _discard(self, sandbox_id: str) -> str | None:
        """Delete a sandbox whose create failed (a failure here is only logged); its error."""
        daytona = self._api()
        reason = None
        try:
            async with asyncio.timeout(_KILL_TIMEOUT):
                native = await daytona.get(sandbox_id)
                reason = native.error_reason
                if _state(native.state) not in _DELETED:
                    await daytona.delete(native)
        except Exception as exc:
            err = _to_error(exc, self.name, sandbox_id)
            if not isinstance(err, NotFound):
                log.warning(
                    "sandbox_router.daytona.discard_failed",
                    entry=self.name,
                    sandbox_id=sandbox_id,
                    error=str(err),
                )
                return reason
        log.debug("sandbox_router.daytona.discarded", entry=self.name, sandbox_id=sandbox_id)
        return reason

    async def _sweep(self, spec: SandboxSpec) -> None:
        """Delete the sandboxes of the create's lease (when the router labelled it)."""
        lease = spec.labels.get(LABEL_LEASE)
        if not lease:
            return
        try:
            async with asyncio.timeout(_KILL_TIMEOUT):
                found = await self.list({LABEL_LEASE: lease})
        except (ProviderError, TimeoutError) as exc:
            log.warning(
                "sandbox_router.daytona.sweep_failed", entry=self.name, lease=lease, error=str(exc)
            )
            return
        for info in found:
            await self._discard(info.id)

    def _sweep_later(self, spec: SandboxSpec) -> None:
        """Sweep from a task of its own: the create itself was cancelled."""
        if not spec.labels.get(LABEL_LEASE):
            return
        task = asyncio.get_running_loop().create_task(self._sweep(spec))
        self._sweeps.add(task)
        task.add_done_callback(self._sweeps.discard)

    async def connect(self, sandbox_id: str) -> DaytonaSandbox:
        daytona = self._api()
        try:
            async with asyncio.timeout(self.opts.request_timeout):
                native = await daytona.get(sandbox_id)
            state = _state(native.state)
            if state in _STARTABLE:
                async with asyncio.timeout(self.opts.request_timeout + 1):
                    await native.start(timeout=self.opts.request_timeout)
                state = _state(native.state)
        except Exception as exc:
            raise _to_error(exc, self.name, sandbox_id) from exc
        if state in _UNUSABLE:
            raise NotFound(
                f"sandbox {sandbox_id} is {state}", provider=self.name, sandbox_id=sandbox_id
            )
        return self._sandbox(native)

    async def list(self, labels: Mapping[str, str] | None = None) -> builtins.list[SandboxInfo]:
        from daytona import ListSandboxesQuery

        query = ListSandboxesQuery(labels=dict(labels or {}) or None)
        found = []
        try:
            async with asyncio.timeout(self.opts.request_timeout):
                async for native in self._api().list(query):
                    state = _state(native.state)
                    if state not in _DELETED:
                        found.append(
                            SandboxInfo(
                                id=native.id,
                                labels=dict(native.labels or {}),
                                state=state,
                                created_at=_timestamp(native.created_at),
                            )
                        )
        except Exception as exc:
            raise _to_error(exc, self.name) from exc
        return sorted(found, key=lambda i: i.created_at or 0.0)

    async def kill(self, sandbox_id: str) -> bool:
        daytona = self._api()
        try:
            async with asyncio.timeout(self.opts.request_timeout):
                native = await daytona.get(sandbox_id)
                if _state(native.state) in _DELETED:
                    return False
                await daytona.delete(native)
        except Exception as exc:
            err = _to_error(exc, self.name, sandbox_id)
            if isinstance(err, NotFound):
                return False
            raise err from exc
        log.debug("sandbox_router.daytona.killed", entry=self.name, sandbox_id=sandbox_id)
        return True

    async def aclose(self) -> None:
        if self._sweeps:
            await asyncio.gather(*self._sweeps, return_exceptions=True)
        client = self._client.take()
        if client is not None:
            await client.close()  # type: ignore[no-untyped-call]  # unannotated in the SDK


class DaytonaSandbox(Sandbox):
    """A live Daytona sandbox; ``native`` is the SDK's ``AsyncSandbox``."""

    def __init__(
        self,
        native: AsyncSandbox,
        provider: str,
        *,
        workdir: str | None = None,
        request_timeout: float = 30.0,
        transfer_timeout: float = 300.0,
    ) -> None:
        self._native = native
        self.id = native.id
        self.provider = provider
        self._workdir = workdir
        self._request_timeout = request_timeout
        self._transfer_timeout = transfer_timeout
        self._idle_sessions: list[str] = []
        self._work_dir: str | None = None

    @property
    def native(self) -> AsyncSandbox:
        return self._native

    @property
    def language(self) -> str:
        """The language Daytona's code runner uses in this sandbox."""
        from daytona.common.daytona import CODE_TOOLBOX_LANGUAGE_LABEL

        return (self._native.labels or {}).get(CODE_TOOLBOX_LANGUAGE_LABEL) or "python"

    def _error(self, exc: BaseException) -> ProviderError:
        return _to_error(exc, self.provider, self.id, in_sandbox=True)

    async def _fail(self, exc: BaseException) -> ProviderError:
        """The error of a failed toolbox call (a command or a file).

        A client error the daemon itself gave is the caller's; one from in
        front of it (the proxy) is the caller's only while the sandbox still
        runs, which the API is asked: a sandbox stopped or gone is `NotFound`.
        """
        err = self._error(exc)
        if not isinstance(err, SandboxError) or _facts(exc).source == _DAEMON:
            return err
        try:
            async with asyncio.timeout(self._request_timeout):
                await self._native.refresh_data()
        except Exception as probe:
            if not isinstance(self._error(probe), NotFound):
                return err
        else:
            if _state(self._native.state) == "started":
                return err
        return NotFound(
            f"sandbox {self.id} is not running ({err.message})",
            provider=self.provider,
            status=err.status,
            sandbox_id=self.id,
        )

    async def run(
        self,
        cmd: str | Sequence[str],
        *,
        timeout: float | None = 60.0,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
    ) -> CommandResult:
        command = self._command(cmd, env, cwd or self._workdir)
        started = time.monotonic()
        try:
            session = await self._take_session()
            try:
                response = await self._execute(session, command, timeout)
            except _SessionGone:
                session = await self._take_session(fresh=True)
                response = await self._execute(session, command, timeout)
        except TimeoutError:
            stdout, stderr = await self._abandon(session)
            return CommandResult(stdout, stderr, -1, time.monotonic() - started, timed_out=True)
        except ProviderError:
            raise
        except Exception as exc:
            raise await self._fail(exc) from exc
        self._idle_sessions.append(session)
        exit_code = response.exit_code if response.exit_code is not None else -1
        return CommandResult(
            response.stdout or "", response.stderr or "", exit_code, time.monotonic() - started
        )

    async def _execute(self, session: str, command: str, timeout: float | None) -> Any:
        """One command in the session, within ``timeout`` (TimeoutError when it passes)."""
        from daytona import DaytonaGoneError, DaytonaNotFoundError, SessionExecuteRequest

        request = SessionExecuteRequest(command=command)
        try:
            async with asyncio.timeout(timeout):
                return await self._native.process.execute_session_command(
                    session, request, timeout=math.ceil(timeout) if timeout else None
                )
        except (DaytonaGoneError, DaytonaNotFoundError) as exc:
            if isinstance(exc, DaytonaNotFoundError) and "session" not in exc.message.lower():
                raise
            raise _SessionGone from exc

    async def _take_session(self, *, fresh: bool = False) -> str:
        """An idle shell session of this handle, or a new one.

        A session runs one command at a time, so each command in flight has
        its own; a session goes back to the pool when its command finished.
        """
        if self._idle_sessions and not fresh:
            return self._idle_sessions.pop()
        session = "sandbox-router-" + secrets.token_hex(6)
        try:
            async with asyncio.timeout(self._request_timeout):
                await self._native.process.create_session(session)
        except TimeoutError as exc:
            raise Unavailable(
                "Daytona did not start a shell session in time",
                provider=self.provider,
                sandbox_id=self.id,
            ) from exc
        return session

    async def _abandon(self, session: str) -> tuple[str, str]:
        """Drop the session of a command that timed out (which kills it); its output so far.

        Unavailable when the command never reached the sandbox: then the
        toolbox, not the command, is what did not answer in time.
        """
        process = self._native.process
        try:
            async with asyncio.timeout(self._request_timeout):
                commands = (await process.get_session(session)).commands
                logs = (
                    await process.get_session_command_logs(session, commands[-1].id)
                    if commands
                    else None
                )
                await process.delete_session(session)
        except Exception as exc:
            err = self._error(exc)
            log.warning(
                "sandbox_router.daytona.session_cleanup_failed",
                entry=self.provider,
                sandbox_id=self.id,
                error=str(err),
            )
            raise err from exc
        if logs is None:
            raise Unavailable(
                "the sandbox's toolbox did not take the command in time",
                provider=self.provider,
                sandbox_id=self.id,
            )
        return logs.stdout or "", logs.stderr or ""

    def _command(
        self, cmd: str | Sequence[str], env: Mapping[str, str] | None, cwd: str | None
    ) -> str:
        """The command in a subshell, with its env and cwd, so the session keeps neither."""
        lines = []
        for name, value in (env or {}).items():
            if not _ENV_NAME.fullmatch(name):
                raise SandboxError(
                    f"invalid environment variable name {name!r}",
                    provider=self.provider,
                    sandbox_id=self.id,
                )
            lines.append(f"export {name}={shlex.quote(value)}")
        if cwd:
            lines.append(f"cd -- {shlex.quote(cwd)} || exit 1")
        lines.append(cmd if isinstance(cmd, str) else shlex.join(cmd))
        return "(\n" + "\n".join(lines) + "\n)"

    async def write_file(self, path: str, data: bytes | str) -> None:
        payload = data.encode() if isinstance(data, str) else bytes(data)
        try:
            async with asyncio.timeout(self._transfer_timeout):
                await self._native.fs.upload_file(
                    payload, path, timeout=math.ceil(self._transfer_timeout)
                )
        except Exception as exc:
            raise await self._fail(exc) from exc

    async def read_file(self, path: str) -> bytes:
        try:
            async with asyncio.timeout(self._transfer_timeout):
                data = await self._native.fs.download_file(path, math.ceil(self._transfer_timeout))
        except Exception as exc:
            raise await self._fail(exc) from exc
        return data if isinstance(data, bytes) else bytes(data or b"")

    async def list_files(self, path: str = ".") -> list[FileInfo]:
        try:
            async with asyncio.timeout(self._request_timeout):
                entries = await self._native.fs.list_files(path)
                where = path if posixpath.isabs(path) else await self._absolute(path)
        except Exception as exc:
            raise await self._fail(exc) from exc
        return sorted(
            (
                FileInfo(
                    name=e.name,
                    path=posixpath.join(where, e.name),
                    is_dir=e.is_dir,
                    size=0 if e.is_dir else e.size,
                )
                for e in entries
            ),
            key=lambda f: f.name,
        )

    async def _absolute(self, path: str) -> str:
        """``path`` from the sandbox's working directory (asked once per handle)."""
        if self._work_dir is None:
            self._work_dir = await self._native.get_work_dir()
        return posixpath.normpath(posixpath.join(self._work_dir, path))

    async def run_code(
        self, code: str, language: str = "python", *, timeout: float | None = 60.0
    ) -> CodeResult:
        if language == self.language:
            return await self._code_run(code, timeout)
        if language not in ("python", "bash"):
            raise SandboxError(
                f"run_code: language {language!r} is not supported here "
                f"(expected {self.language!r}, 'python' or 'bash')",
                provider=self.provider,
                sandbox_id=self.id,
            )
        interpreter = "python3 -" if language == "python" else "bash -s"
        encoded = base64.b64encode(code.encode()).decode()
        res = await self.run(f"printf %s {encoded} | base64 -d | {interpreter}", timeout=timeout)
        return CodeResult(
            res.stdout,
            res.stderr,
            res.exit_code,
            res.duration,
            res.timed_out,
            (),
            _code_error(res.stderr, res.exit_code, res.timed_out, timeout),
        )

    async def _code_run(self, code: str, timeout: float | None) -> CodeResult:
        """Daytona's code runner (stdout and stderr merged, as it gives them)."""
        started = time.monotonic()
        slack = self._request_timeout
        try:
            async with asyncio.timeout(timeout + slack if timeout else None):
                response = await self._native.process.code_run(
                    code, timeout=math.ceil(timeout) if timeout else None
                )
        except Exception as exc:
            if _facts(exc).code == _EXECUTION_TIMEOUT:
                elapsed = time.monotonic() - started
                return CodeResult("", "", -1, elapsed, True, (), f"timed out after {timeout}s")
            raise await self._fail(exc) from exc
        output = response.result or ""
        exit_code = response.exit_code if response.exit_code is not None else -1
        charts = tuple(
            chart.model_dump() for chart in (response.artifacts and response.artifacts.charts) or ()
        )
        return CodeResult(
            output,
            "",
            exit_code,
            time.monotonic() - started,
            False,
            charts,
            _code_error(output, exit_code, False, timeout),
        )

    async def kill(self) -> None:
        try:
            async with asyncio.timeout(self._request_timeout):
                await self._native.delete()
        except Exception as exc:
            err = self._error(exc)
            if not isinstance(err, NotFound):
                raise err from exc

    async def keepalive(self, seconds: float) -> None:
        """Reset the sandbox's auto-stop timer (Daytona counts idle time from the last activity)."""
        try:
            async with asyncio.timeout(self._request_timeout):
                await self._native.refresh_activity()
        except Exception as exc:
            raise self._error(exc) from exc


class _SessionGone(Exception):
    """The sandbox no longer has the shell session (it ended or was dropped)."""


def _state(state: Any) -> str:
    return str(getattr(state, "value", state) or "unknown")


def _timestamp(value: str | None) -> float | None:
    if not value:
        return None
    with contextlib.suppress(ValueError):
        return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    return None


def _code_error(output: str, exit_code: int, timed_out: bool, timeout: float | None) -> str | None:
    if timed_out:
        return f"timed out after {timeout}s"
    if exit_code == 0:
        return None
    lines = [ln for ln in output.splitlines() if ln.strip()]
    return lines[-1] if lines else f"exit code {exit_code}"


def _chain(exc: BaseException) -> builtins.list[BaseException]:
    """``exc`` and what caused it, outermost first."""
    found: builtins.list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and all(current is not seen for seen in found):
        found.append(current)
        current = current.__cause__ or current.__context__
    return found


def _created_id(exc: BaseException) -> str | None:
    """The sandbox a failed create left behind, when the SDK says which."""
    for link in _chain(exc):
        sandbox_id = getattr(link, "sandbox_id", None)
        if isinstance(sandbox_id, str) and sandbox_id:
            return sandbox_id
        found = _ERROR_STATE.search(str(link))
        if found:
            return found.group(1)
    return None


def _retry_after(headers: Mapping[str, Any]) -> float | None:
    """Seconds from a ``Retry-After`` header (seconds or an HTTP date)."""
    value = next((v for k, v in headers.items() if str(k).lower() == "retry-after"), None)
    if value is None:
        return None
    try:
        return max(float(value), 0.0)
    except (TypeError, ValueError):
        pass
    with contextlib.suppress(TypeError, ValueError):
        when = parsedate_to_datetime(str(value))
        return max((when - datetime.now(UTC)).total_seconds(), 0.0)
    return None


class _Facts(NamedTuple):
    """What the exception chain of one SDK error says."""

    message: str
    status: int | None
    source: str | None
    code: str | None
    headers: Mapping[str, Any]
    connection: bool


def _body(link: BaseException) -> dict[str, Any]:
    """The JSON error body a generated client's ``ApiException`` carries, if any."""
    body = getattr(link, "body", None)
    if isinstance(body, bytes | str):
        with contextlib.suppress(ValueError):
            parsed = json.loads(body)
            if isinstance(parsed, dict):
                return parsed
    return {}


def _facts(exc: BaseException) -> _Facts:
    """Message, status, error source and code, headers and "connection failed", down the chain.

    The SDK wraps the generated clients' errors (which hold the HTTP facts)
    in its own, and some calls (``code_run``, ``refresh_activity``) raise
    them unwrapped, so the first link that knows a fact gives it.
    """
    import aiohttp
    from daytona import DaytonaConnectionError, DaytonaError

    message: str | None = None
    status: int | None = None
    source: str | None = None
    code: str | None = None
    headers: Mapping[str, Any] = {}
    connection = False
    for link in _chain(exc):
        body = _body(link)
        if message is None:
            if isinstance(link, DaytonaError):
                message = link.message
            elif isinstance(body.get("message"), str):
                message = body["message"]
        for value in (getattr(link, "status_code", None), getattr(link, "status", None)):
            if status is None and isinstance(value, int) and not isinstance(value, bool):
                status = value
        for value in (getattr(link, "source", None), body.get("source")):
            if source is None and isinstance(value, str):
                source = value
        for value in (link.code if isinstance(link, DaytonaError) else None, body.get("code")):
            if code is None and isinstance(value, str):
                code = value
        link_headers = getattr(link, "headers", None)
        if not headers and isinstance(link_headers, Mapping) and link_headers:
            headers = link_headers
        if isinstance(link, DaytonaConnectionError | aiohttp.ClientConnectionError | OSError):
            connection = True
    text = message or str(exc) or type(exc).__name__
    return _Facts(text, status, source, code, headers, connection)


def _to_error(
    exc: BaseException,
    provider: str,
    sandbox_id: str | None = None,
    *,
    in_sandbox: bool = False,
) -> ProviderError:
    """The one mapping of Daytona SDK exceptions to router errors.

    Args:
        exc: what the SDK raised.
        provider: the chain entry's name.
        sandbox_id: the sandbox concerned, when there is one.
        in_sandbox: the call was an operation inside a live sandbox (a command
            or a file), where a client error is the caller's (`SandboxError`)
            rather than the account's.
    """
    from daytona import DaytonaQueueTimeoutError, DaytonaTimeoutError

    facts = _facts(exc)
    message = facts.message
    where: dict[str, Any] = {"provider": provider, "sandbox_id": sandbox_id}
    if isinstance(exc, TimeoutError):
        return Unavailable("Daytona did not answer in time", **where)
    if isinstance(exc, DaytonaQueueTimeoutError):
        return CapacityExceeded(message, **where)
    if facts.status is not None:
        return _by_status(facts, where, in_sandbox=in_sandbox)
    if isinstance(exc, DaytonaTimeoutError) or facts.connection:
        return Unavailable(message, **where)
    if _ERROR_STATE.search(message) or "build_failed" in message:
        return Unavailable(message, **where)
    if in_sandbox:
        return SandboxError(message, **where)
    return ProviderError(f"{type(exc).__name__}: {message}", **where)


def _by_status(facts: _Facts, where: dict[str, Any], *, in_sandbox: bool) -> ProviderError:
    status, message, headers = facts.status, facts.message, facts.headers
    assert status is not None
    lowered = message.lower()
    from_daemon = in_sandbox and facts.source == _DAEMON
    if status == 401:
        return AuthError(message, status=status, **where)
    if status in (400, 403) and any(word in lowered for word in _QUOTA_WORDS):
        retry = _retry_after(headers)
        reset_at = datetime.now(UTC) + timedelta(seconds=retry) if retry else None
        quota = QuotaExceeded(message, reset_at=reset_at, provider=where["provider"], status=status)
        quota.sandbox_id = where["sandbox_id"]
        return quota
    if status == 429:
        limited = RateLimited(
            message, retry_after=_retry_after(headers), provider=where["provider"], status=status
        )
        limited.sandbox_id = where["sandbox_id"]
        return limited
    if status == 403 and not from_daemon:
        return AuthError(message, status=status, **where)
    if (status == 404 and not from_daemon) or (
        status == 400 and not in_sandbox and "not found" in lowered
    ):
        return NotFound(message, status=status, **where)
    if status in (408, 504) or status >= 500:
        return Unavailable(message, status=status, **where)
    if in_sandbox:
        return SandboxError(message, status=status, **where)
    return ProviderError(message, status=status, **where)
