"""The ``runloop`` provider: devboxes on Runloop through ``runloop-api-client``'s AsyncRunloop.

Each chain entry is one Runloop account (one API key: ``api_key``, else
``RUNLOOP_API_KEY``); its ``AsyncRunloop`` client is created on first use,
with the SDK's retries off (``max_retries=0``: its default of 5 turns a
dead endpoint into half a minute of silence, and the router owns retries).

A create is two steps so a devbox is never lost: ``POST /v1/devboxes``
returns the id at once, bounded by ``request_timeout`` alone (the router
stops waiting at its create timeout, but an answer cut short would lose the
devbox Runloop made; one that never comes is `Unavailable.unanswered`, and
the router looks the devbox up by its lease label); then ``await_running``
long-polls with a ``PollingConfig`` bounded by the create timeout from that
answer. When the devbox does not reach ``running`` in time
(``PollingTimeout``), fails to boot or the wait breaks, the devbox is shut
down before the error is raised.

Runloop has no per-command timeout: `RunloopSandbox.run` starts the command
with ``execute``, long-polls the execution until the caller's timeout and
then kills it (``executions.kill``), returning ``timed_out=True``. Env and
cwd, which the API does not take per command, become a shell prelude.
Binary files go through ``upload_file`` / ``download_file``; the listing is
``find`` run in the devbox, as the API has none, and so are remove, make_dir,
exists, rename and stat (`providers.files.ShellFiles`). A streamed write is
the same multipart ``upload_file`` request the SDK sends, its body built
chunk by chunk and posted through the SDK's client (its ``upload_file``
reads a file part whole); a streamed read is ``download_file`` through
``with_streaming_response``.

Ports go through the devbox's one V2 tunnel (``enable_tunnel``, made on the
first `RunloopSandbox.expose` with ``auth_mode="authenticated"``): the URL
is ``https://{port}-{tunnel_key}.tunnel.{domain}`` as the SDK's
``get_tunnel_url`` builds it, and the tunnel's ``auth_token`` goes in the
``X-Runloop-Tunnel-Authorization`` header. Pause is ``suspend`` (the disk is
kept, running processes are not) and `RunloopProvider.resume` is
``resume``; both wait for the status. A snapshot is a disk snapshot
(``snapshot_disk_async``, then its status is polled); its ``snp_...`` id as
a spec's template creates from it.

A background process (`RunloopSandbox.start`) is an ``execute_async`` with
stdin attached; its id is the execution id, so `RunloopSandbox.attach` finds
it from any replica (``executions.retrieve``) and replays its output from the
start. `RunloopProcess` reads the SSE output streams, kills with
``executions.kill(kill_process_group=True)`` and writes stdin with
``send_std_in``. Runloop has no process list, and its terminal is a raw
websocket on a PTY tunnel whose wire (how the shell's exit is told, the
attach rules) the SDK does not describe, so ``process.list`` and ``pty``
are not declared.

Every SDK call runs inside `sdk_errors`, the one mapping to
``providers.errors``: 401 `AuthError`; 403 `QuotaExceeded` when the message
speaks of a quota or limit, else `AuthError`; 429 `CapacityExceeded` for the
concurrent-devbox cap, else `RateLimited` with ``Retry-After``; 404
`NotFound`; 408, >= 500, connection errors, timeouts and ``PollingTimeout``
`Unavailable`; other 4xx inside a devbox `SandboxError`.
"""

from __future__ import annotations

import asyncio
import builtins
import codecs
import contextlib
import math
import os
import shlex
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from pydantic import Field, model_validator

from providers.account import KeyedOptions, KeyedProvider
from providers.base import (
    CodeContext,
    CodeResult,
    CommandResult,
    FileInfo,
    PortURL,
    ProviderOptions,
    Sandbox,
    SandboxInfo,
    SandboxSpec,
    Snapshot,
    check_port,
)
from providers.capabilities import Capability
from providers.errors import InvalidArgument, NotFound, ProviderError, SandboxError, Unavailable
from providers.files import CHUNK, Chunks, ShellFiles
from providers.kernel.host import refuse_context
from providers.logs import Log
from providers.mapping import ErrorMap, Where, from_status, retry_after, went_out
from providers.processes import ProcessBase
from providers.shell import piped, script

if TYPE_CHECKING:
    from runloop_api_client import AsyncRunloop
    from runloop_api_client.lib.polling import PollingConfig
    from runloop_api_client.sdk import AsyncDevbox
    from runloop_api_client.types import DevboxAsyncExecutionDetailView, DevboxView

__all__ = [
    "API_KEY_ENV",
    "BASE_URL_ENV",
    "RunloopOptions",
    "RunloopProcess",
    "RunloopProvider",
    "RunloopSandbox",
]

log = Log("sandbox_router.runloop")

API_KEY_ENV = "RUNLOOP_API_KEY"
BASE_URL_ENV = "RUNLOOP_BASE_URL"
# Statuses of a devbox that still exists (listed one status at a time: the
# account's shut-down devboxes are never paged through).
LIVE_STATUSES = (
    "queued",
    "provisioning",
    "initializing",
    "running",
    "suspending",
    "suspended",
    "resuming",
)
_GONE = frozenset({"shutdown", "failure"})
_ASLEEP = frozenset({"suspending", "suspended"})
TUNNEL_AUTH_HEADER = "X-Runloop-Tunnel-Authorization"
# Capitalized on purpose: the SDK swaps a body sent as "multipart/form-data" for its own
# encoder, which reads a file part whole (and refuses streamed content); media types are
# case-insensitive (RFC 9110, 8.3.1), so the server reads this one the same.
_MULTIPART = "Multipart/form-data"
_EXEC_HOLD_MAX = 25
_QUOTA_WORDS = ("quota", "limit", "usage", "credit", "billing", "plan")
_CONCURRENCY_WORDS = ("concurrent", "at once")
_KILL_TIMEOUT = 10.0
_PAUSE_TIMEOUT = 120.0
# The SDK's own timeout for file transfers; httpx applies it to each read and write of the
# stream (and to the answer after the last chunk), not to the whole transfer.
_TRANSFER_TIMEOUT = 600.0
_SNAPSHOT_TIMEOUT = 600.0
_RESUME_PAUSE = 0.2

ResourceSize = Literal["X_SMALL", "SMALL", "MEDIUM", "LARGE", "X_LARGE", "XX_LARGE"]


def _sdk() -> Any:
    """Import ``runloop_api_client`` (lazily: the adapter imports without it)."""
    import runloop_api_client

    return runloop_api_client


class RunloopOptions(KeyedOptions):
    """Options of a ``runloop`` chain entry.

    Attributes:
        api_key: the account's API key; ``RUNLOOP_API_KEY`` when unset.
        base_url: the API's URL (default ``https://api.runloop.ai``, or
            ``RUNLOOP_BASE_URL``); for emulators.
        blueprint_id, blueprint_name, snapshot_id: what devboxes start from
            (at most one; Runloop's default image when none). A spec's
            ``template`` wins: ``bpt_...`` is a blueprint id, ``snp_...`` a
            snapshot id, anything else a blueprint name.
        keep_alive_time_seconds: the devbox's maximum life when the spec
            names no ``lifetime`` (Runloop's default is one hour).
        idle_time_seconds: shut the devbox down after this long idle when
            the spec names no ``idle_timeout``; lease heartbeats reset it.
        resource_size: Runloop's size class when the spec names no cpu,
            memory or disk.
        request_timeout: seconds for each API request.
        pool_shards: HTTP/2 connections the SDK opens per workload (API
            calls, long-polls, transfers); None keeps the SDK's 8 / 16 / 2.
            Each new one builds a TLS context, ~50 ms of CPU on the event loop.
        python: the interpreter the router's code kernel runs as
            (`RunloopSandbox.run_code`'s python).
    """

    base_url: str | None = None
    blueprint_id: str | None = None
    blueprint_name: str | None = None
    snapshot_id: str | None = None
    keep_alive_time_seconds: int | None = None
    idle_time_seconds: int | None = None
    resource_size: ResourceSize | None = None
    request_timeout: float = 30.0
    pool_shards: int | None = Field(default=None, ge=1)
    python: str = "python3"

    @model_validator(mode="after")
    def _one_source(self) -> RunloopOptions:
        sources = [self.blueprint_id, self.blueprint_name, self.snapshot_id]
        if sum(s is not None for s in sources) > 1:
            raise ValueError("set at most one of blueprint_id, blueprint_name and snapshot_id")
        return self


class RunloopProvider(KeyedProvider["AsyncRunloop"]):
    """One Runloop account.

    Args:
        name: the chain entry's name.
        options: `RunloopOptions`.
    """

    kind: ClassVar[str] = "runloop"
    Options: ClassVar[type[ProviderOptions]] = RunloopOptions
    # No process list (the API has none) and no pty: the terminal is a websocket on a
    # tunnel whose wire the SDK does not describe (exit, attach rules), so it is left out.
    capabilities: frozenset[str] = frozenset(
        {
            Capability.RUN_CODE,
            Capability.STATEFUL_CODE,
            Capability.FILES,
            Capability.FILES_MANAGE,
            Capability.FILES_STREAM,
            Capability.STREAM,
            Capability.STDIN,
            Capability.PROCESS,
            Capability.PROCESS_KILL,
            Capability.PROCESS_ATTACH,
            Capability.PORT,
            Capability.PAUSE,
            Capability.SNAPSHOT,
        }
    )
    api_key_env = API_KEY_ENV

    def __init__(self, name: str = "runloop", options: ProviderOptions | None = None) -> None:
        super().__init__(name, options)

    @property
    def opts(self) -> RunloopOptions:
        assert isinstance(self.options, RunloopOptions)
        return self.options

    def _open_client(self, api_key: str) -> AsyncRunloop:
        shards = self.opts.pool_shards
        pools = (
            {}
            if shards is None
            else {f"{pool}_pool_shards": shards for pool in ("api", "background", "transfer")}
        )
        client: AsyncRunloop = _sdk().AsyncRunloop(
            bearer_token=api_key,
            base_url=self.opts.base_url or os.environ.get(BASE_URL_ENV) or None,
            timeout=self.opts.request_timeout,
            max_retries=0,
            **pools,
        )
        return client

    async def _close_client(self, client: AsyncRunloop) -> None:
        await client.close()

    def _create_params(self, spec: SandboxSpec) -> dict[str, Any]:
        opts = self.opts
        params: dict[str, Any] = {
            "metadata": dict(spec.labels),
            "environment_variables": dict(spec.env),
        }
        template = spec.template
        if template is None:
            for source in ("blueprint_id", "blueprint_name", "snapshot_id"):
                if getattr(opts, source) is not None:
                    params[source] = getattr(opts, source)
        elif template.startswith("bpt_"):
            params["blueprint_id"] = template
        elif template.startswith("snp_"):
            params["snapshot_id"] = template
        else:
            params["blueprint_name"] = template
        launch: dict[str, Any] = {}
        lifetime = spec.lifetime or opts.keep_alive_time_seconds
        if lifetime:
            launch["keep_alive_time_seconds"] = max(1, math.ceil(lifetime))
        idle = spec.idle_timeout or opts.idle_time_seconds
        if idle:
            launch["after_idle"] = {
                "idle_time_seconds": max(1, math.ceil(idle)),
                "on_idle": "shutdown",
            }
        if spec.cpu or spec.memory_mb or spec.disk_gb:
            launch["resource_size_request"] = "CUSTOM_SIZE"
            if spec.cpu:
                launch["custom_cpu_cores"] = spec.cpu
            if spec.memory_mb:
                gib = math.ceil(spec.memory_mb / 1024)
                launch["custom_gb_memory"] = gib if gib == 1 else gib + gib % 2
            if spec.disk_gb:
                launch["custom_disk_size"] = spec.disk_gb
        elif opts.resource_size is not None:
            launch["resource_size_request"] = opts.resource_size
        if launch:
            params["launch_parameters"] = launch
        return params

    async def create(self, spec: SandboxSpec, *, timeout: float) -> RunloopSandbox:
        """``POST /v1/devboxes``, bounded by ``request_timeout`` (not by ``timeout``: cut
        short, the answer naming the devbox Runloop made is lost); then the wait for it
        to run, ``timeout`` from that answer."""
        api = self._api()
        devbox_id: str | None = None
        try:
            view = await self._made_or_discarded(
                api.devboxes.create(**self._create_params(spec), timeout=self.opts.request_timeout),
                lambda made: made.id,
                self.kill,
            )
            devbox_id = view.id
            if view.status != "running":
                async with asyncio.timeout(timeout):
                    polling = _polling(timeout)
                    view = await api.devboxes.await_running(view.id, polling_config=polling)
        except asyncio.CancelledError:
            if devbox_id is not None:
                self._discard_later(devbox_id, self.kill)
            raise
        except Exception:
            if devbox_id is not None:
                await self._discard(devbox_id)
            with sdk_errors(self.name, devbox_id):
                raise
        log.debug("sandbox_router.runloop.created", entry=self.name, sandbox_id=view.id)
        return self._sandbox(view.id, workdir=spec.workdir)

    def _sandbox(self, devbox_id: str, *, workdir: str | None = None) -> RunloopSandbox:
        return RunloopSandbox(
            self._api(),
            devbox_id,
            self.name,
            workdir=workdir,
            python=self.opts.python,
            request_timeout=self.opts.request_timeout,
        )

    async def _discard(self, devbox_id: str) -> None:
        """Shut down a devbox whose create failed; a failure here is only logged."""
        try:
            with sdk_errors(self.name, devbox_id):
                async with asyncio.timeout(_KILL_TIMEOUT):
                    await self._api().devboxes.shutdown(devbox_id)
        except ProviderError as err:
            log.warning(
                "sandbox_router.runloop.discard_failed",
                entry=self.name,
                sandbox_id=devbox_id,
                error=str(err),
            )
        else:
            log.debug("sandbox_router.runloop.discarded", entry=self.name, sandbox_id=devbox_id)

    async def connect(self, sandbox_id: str) -> RunloopSandbox:
        with sdk_errors(self.name, sandbox_id):
            view = await self._api().devboxes.retrieve(sandbox_id)
        if view.status in _GONE:
            raise NotFound(
                f"devbox {sandbox_id} is {view.status}", provider=self.name, sandbox_id=sandbox_id
            )
        return self._sandbox(view.id)

    async def list(self, labels: Mapping[str, str] | None = None) -> builtins.list[SandboxInfo]:
        api = self._api()
        wanted = dict(labels or {})

        async def of_status(status: Any) -> builtins.list[SandboxInfo]:
            return [
                SandboxInfo(
                    id=view.id,
                    labels=dict(view.metadata),
                    state="paused" if view.status in _ASLEEP else view.status,
                    created_at=view.create_time_ms / 1000,
                )
                async for view in api.devboxes.list(status=status, limit=100)
                if all(view.metadata.get(k) == v for k, v in wanted.items())
            ]

        with sdk_errors(self.name):
            pages = await asyncio.gather(*(of_status(s) for s in LIVE_STATUSES))
        return sorted((i for page in pages for i in page), key=lambda i: i.created_at or 0.0)

    async def resume(self, sandbox_id: str, *, timeout: float) -> RunloopSandbox:
        """Resume a suspended devbox and wait until it runs (a running one is returned as is)."""
        devboxes = self._api().devboxes
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        with sdk_errors(self.name, sandbox_id):
            async with asyncio.timeout(timeout):
                view = await devboxes.retrieve(sandbox_id)
                if view.status in _GONE:
                    raise NotFound(
                        f"devbox {sandbox_id} is {view.status}",
                        provider=self.name,
                        sandbox_id=sandbox_id,
                    )
                if view.status == "suspending":
                    view = await devboxes.await_suspended(
                        sandbox_id, polling_config=_polling(deadline - loop.time())
                    )
                if view.status == "suspended":
                    view = await devboxes.resume(sandbox_id)
                if view.status != "running":
                    await devboxes.await_running(
                        sandbox_id, polling_config=_polling(deadline - loop.time())
                    )
        log.debug("sandbox_router.runloop.resumed", entry=self.name, sandbox_id=sandbox_id)
        return self._sandbox(sandbox_id)

    async def delete_snapshot(self, snapshot_id: str) -> bool:
        try:
            with sdk_errors(self.name):
                await self._api().devboxes.disk_snapshots.delete(snapshot_id)
        except NotFound:
            return False
        return True

    async def kill(self, sandbox_id: str) -> bool:
        api = self._api()
        try:
            with sdk_errors(self.name, sandbox_id):
                view = await api.devboxes.retrieve(sandbox_id)
                if view.status in _GONE:
                    return False
                await api.devboxes.shutdown(sandbox_id)
        except NotFound:
            return False
        log.debug("sandbox_router.runloop.killed", entry=self.name, sandbox_id=sandbox_id)
        return True


class RunloopSandbox(ShellFiles, Sandbox):
    """A live Runloop devbox; ``native`` is the SDK's ``AsyncDevbox`` for it."""

    def __init__(
        self,
        api: AsyncRunloop,
        devbox_id: str,
        provider: str,
        *,
        workdir: str | None = None,
        python: str = "python3",
        request_timeout: float = 30.0,
    ) -> None:
        self._api = api
        self.id = devbox_id
        self.provider = provider
        self._workdir = workdir
        self._python = python
        self._request_timeout = request_timeout

    @property
    def native(self) -> AsyncDevbox:
        from runloop_api_client.sdk import AsyncDevbox

        return AsyncDevbox(self._api, self.id)

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
        command = script(cmd, env, cwd or self._workdir, Where(self.provider, self.id))
        started = time.monotonic()
        deadline = started + timeout if timeout else None
        with self._errors():
            view = await self._execute(command, deadline)
            timed_out = view.status != "completed"
            if timed_out:
                view = await self._api.devboxes.executions.kill(
                    view.execution_id, devbox_id=self.id, kill_process_group=True
                )
            stdout, stderr = await self._output(view)
        exit_code = view.exit_status if view.exit_status is not None else -1
        return CommandResult(
            stdout, stderr, exit_code, time.monotonic() - started, timed_out=timed_out
        )

    async def _execute(
        self, command: str, deadline: float | None
    ) -> DevboxAsyncExecutionDetailView:
        """Run ``command`` until it completes or ``deadline`` passes (then it is still running)."""
        from runloop_api_client import APIStatusError

        devboxes = self._api.devboxes
        slack = self._request_timeout
        hold = _EXEC_HOLD_MAX if deadline is None else min(_EXEC_HOLD_MAX, max(_left(deadline), 0))
        view = await devboxes.execute(
            self.id,
            command=command,
            optimistic_timeout=math.floor(hold),
            timeout=hold + slack,
        )
        while view.status != "completed":
            left = None if deadline is None else _left(deadline)
            if left is not None and left <= 0:
                break
            hold = _EXEC_HOLD_MAX if left is None else min(_EXEC_HOLD_MAX, max(1, math.ceil(left)))
            try:
                async with asyncio.timeout(left):
                    view = await devboxes.wait_for_command(
                        view.execution_id,
                        devbox_id=self.id,
                        statuses=["completed"],
                        timeout_seconds=hold,
                        timeout=hold + slack,
                    )
            except TimeoutError:
                break
            except APIStatusError as exc:
                if exc.status_code != 408:
                    raise
        return view

    async def start(
        self,
        cmd: str | Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
    ) -> RunloopProcess:
        command = script(cmd, env, cwd or self._workdir, Where(self.provider, self.id))
        with self._errors():
            view = await self._api.devboxes.execute_async(
                self.id, command=command, attach_stdin=True
            )
        return RunloopProcess(self, view.execution_id)

    async def attach(self, process_id: str) -> RunloopProcess:
        """The execution ``process_id`` of this devbox, its output replayed from the start."""
        if not process_id:
            raise NotFound("no execution id given", provider=self.provider, sandbox_id=self.id)
        with self._errors():
            view = await self._api.devboxes.executions.retrieve(process_id, devbox_id=self.id)
        return RunloopProcess(self, view.execution_id)

    async def _output(self, view: DevboxAsyncExecutionDetailView) -> tuple[str, str]:
        """All of stdout and stderr: views carry the last lines, streams the rest."""
        if not (view.stdout_truncated or view.stderr_truncated):
            return view.stdout or "", view.stderr or ""
        from runloop_api_client.sdk.async_execution_result import AsyncExecutionResult

        result = AsyncExecutionResult(self._api, self.id, view)
        return await result.stdout(), await result.stderr()

    async def write_file(self, path: str, data: bytes | str) -> None:
        devboxes = self._api.devboxes
        with self._errors():
            if isinstance(data, str):
                await devboxes.write_file_contents(self.id, file_path=path, contents=data)
            else:
                await devboxes.upload_file(
                    self.id, path=path, file=(os.path.basename(path) or "file", data)
                )

    async def read_file(self, path: str) -> bytes:
        with self._errors():
            response = await self._api.devboxes.download_file(self.id, path=path)
            return await response.read()

    async def read_stream(self, path: str) -> AsyncIterator[bytes]:
        with self._errors():
            async with self._api.devboxes.with_streaming_response.download_file(
                self.id, path=path, timeout=_TRANSFER_TIMEOUT
            ) as response:
                async for chunk in response.iter_bytes(CHUNK):
                    yield chunk

    async def write_stream(self, path: str, chunks: Chunks) -> None:
        """``upload_file``'s multipart request, its file part streamed from ``chunks``."""
        boundary = os.urandom(16).hex()
        with self._errors():
            await self._api.post(
                f"/v1/devboxes/{self.id}/upload_file",
                cast_to=object,
                content=_multipart(boundary, path, chunks),
                options={
                    "headers": {"Content-Type": f"{_MULTIPART}; boundary={boundary}"},
                    "timeout": _TRANSFER_TIMEOUT,
                },
            )

    async def list_files(self, path: str = ".") -> list[FileInfo]:
        listing = await self.run(
            f"cd -- {shlex.quote(path)} && printf '%s\\0' \"$PWD\" && "
            "find . -mindepth 1 -maxdepth 1 -printf '%y\\t%s\\t%P\\0'",
            timeout=60.0,
        )
        if not listing.ok:
            raise SandboxError(
                f"cannot list {path!r}: {listing.stderr.strip() or listing.exit_code}",
                provider=self.provider,
                sandbox_id=self.id,
            )
        where, *entries = listing.stdout.split("\0")
        found = []
        for entry in entries:
            if not entry:
                continue
            kind, size, name = entry.split("\t", 2)
            found.append(
                FileInfo(
                    name=name,
                    path=f"{where.rstrip('/')}/{name}",
                    is_dir=kind == "d",
                    size=int(size) if kind == "f" else 0,
                )
            )
        return sorted(found, key=lambda f: f.name)

    @property
    def _kernel_python(self) -> str:
        return self._python

    async def run_code(
        self,
        code: str,
        language: str = "python",
        *,
        timeout: float | None = 60.0,
        context: CodeContext | None = None,
        env: Mapping[str, str] | None = None,
    ) -> CodeResult:
        """Python in the router's kernel (`providers.kernel`): Runloop has none of its own;
        bash in a new shell each call."""
        if language == "python":
            return await self._kernels().run(code, context=context, timeout=timeout, env=env)
        if language != "bash":
            raise SandboxError(
                f"run_code: language {language!r} is not supported "
                "(expected one of ['bash', 'python'])",
                provider=self.provider,
                sandbox_id=self.id,
            )
        refuse_context(self, context, language)
        res = await self.run(piped(code, "bash -s"), timeout=timeout, env=env)
        return CodeResult.of_command(res, timeout)

    async def expose(self, port: int) -> PortURL:
        """The port through the devbox's tunnel, enabled (authenticated) on first use."""
        check_port(port, "expose")
        devboxes = self._api.devboxes
        with self._errors():
            tunnel = (await devboxes.retrieve(self.id)).tunnel
            if tunnel is None:
                tunnel = await devboxes.enable_tunnel(self.id, auth_mode="authenticated")
        host = self._api.base_url.host
        domain = host[4:] if host.startswith("api.") else host
        token = tunnel.auth_token
        return PortURL(
            port,
            f"https://{port}-{tunnel.tunnel_key}.tunnel.{domain}",
            {TUNNEL_AUTH_HEADER: f"Bearer {token}"} if token else {},
        )

    async def pause(self) -> None:
        """Suspend the devbox (disk kept, processes end) and wait until it is suspended."""
        devboxes = self._api.devboxes
        with self._errors():
            view: DevboxView = await devboxes.suspend(self.id)
            if view.status != "suspended":
                await devboxes.await_suspended(self.id, polling_config=_polling(_PAUSE_TIMEOUT))

    async def snapshot(self, name: str | None = None) -> Snapshot:
        """A disk snapshot; returns once Runloop says it is complete."""
        devboxes = self._api.devboxes
        with self._errors():
            started = await devboxes.snapshot_disk_async(self.id, name=name)
            await devboxes.disk_snapshots.await_completed(
                started.id, polling_config=_polling(_SNAPSHOT_TIMEOUT)
            )
        return Snapshot(started.id, self.provider, name)

    async def kill(self) -> None:
        with contextlib.suppress(NotFound), self._errors():
            await self._api.devboxes.shutdown(self.id)

    async def keepalive(self, seconds: float) -> None:
        """Reset the devbox's idle timer (Runloop cannot extend its keep-alive time)."""
        with self._errors():
            await self._api.devboxes.keep_alive(self.id)


class RunloopProcess(ProcessBase):
    """A Runloop execution (the id is its execution id), fed from its two SSE streams.

    The streams give the output from byte 0, so a handle that `attach` made
    sees what the command printed before. The handle reads them itself rather
    than through the SDK's exec callbacks, which log and swallow errors: a
    stream that ends while the command still runs is reopened from its last
    chunk's offset (as the SDK's reconnecting stream does after a timeout),
    and once both end, the execution's view gives the exit status.

    Stdin is Runloop's ``send_std_in``, which takes text: bytes are decoded
    as UTF-8 across writes, so a character split between two writes arrives whole.
    """

    def __init__(self, sandbox: RunloopSandbox, execution_id: str) -> None:
        super().__init__(execution_id, sandbox.provider)
        self._sandbox = sandbox
        self._executions = sandbox._api.devboxes.executions
        self._decoder = codecs.getincrementaldecoder("utf-8")()
        self._reader = asyncio.ensure_future(self._read())  # held: the loop keeps tasks weakly

    async def _read(self) -> None:
        try:
            view = await self._until_completed()
        except* Exception as failed:
            self._fail(failed.exceptions[0])
        else:
            self._finish(view.exit_status if view.exit_status is not None else -1)

    async def _until_completed(self) -> DevboxAsyncExecutionDetailView:
        offsets = {"stdout": 0, "stderr": 0}
        while True:
            async with asyncio.TaskGroup() as streams:
                streams.create_task(self._follow("stdout", offsets))
                streams.create_task(self._follow("stderr", offsets))
            with self._sandbox._errors():
                view = await self._executions.retrieve(self.id, devbox_id=self._sandbox.id)
            if view.status == "completed":
                return view
            await asyncio.sleep(_RESUME_PAUSE)

    async def _follow(self, stream: Literal["stdout", "stderr"], offsets: dict[str, int]) -> None:
        executions = self._executions
        tail = (
            executions.stream_stdout_updates
            if stream == "stdout"
            else executions.stream_stderr_updates
        )
        with self._sandbox._errors():
            updates = await tail(self.id, devbox_id=self._sandbox.id, offset=str(offsets[stream]))
            async with updates:
                async for chunk in updates:
                    offsets[stream] = (
                        chunk.offset
                        if chunk.offset is not None
                        else offsets[stream] + len(chunk.output.encode())
                    )
                    self._feed(stream, chunk.output)

    async def kill(self) -> bool:
        if self.finished:
            return False
        with self._sandbox._errors():
            view = await self._executions.retrieve(self.id, devbox_id=self._sandbox.id)
            if view.status == "completed":
                return False
            await self._executions.kill(
                self.id, devbox_id=self._sandbox.id, kill_process_group=True
            )
        return True

    async def write_stdin(self, data: str | bytes) -> None:
        if isinstance(data, bytes):
            data = self._decode(data, final=False)
        if data:
            await self._send(text=data)

    async def close_stdin(self) -> None:
        rest = self._decode(b"", final=True)
        if rest:
            await self._send(text=rest)
        await self._send(signal="EOF")

    def _decode(self, data: bytes, *, final: bool) -> str:
        try:
            return self._decoder.decode(data, final)
        except UnicodeDecodeError as exc:
            raise InvalidArgument(
                f"write_stdin: Runloop's stdin takes text, and these bytes are not UTF-8 "
                f"({exc.reason})"
            ) from None

    async def _send(self, **what: Any) -> None:
        with self._sandbox._errors():
            sent = await self._executions.send_std_in(self.id, devbox_id=self._sandbox.id, **what)
        if not sent.success:
            raise SandboxError(
                f"stdin of execution {self.id} was not delivered",
                provider=self.provider,
                sandbox_id=self._sandbox.id,
            )


def _left(deadline: float) -> float:
    return deadline - time.monotonic()


def _polling(seconds: float) -> PollingConfig:
    """Poll about once a second for at most ``seconds``."""
    from runloop_api_client.lib.polling import PollingConfig

    left = max(seconds, 0.001)
    return PollingConfig(
        interval_seconds=1.0, max_attempts=math.ceil(left) + 1, timeout_seconds=left
    )


async def _multipart(boundary: str, path: str, chunks: Chunks) -> AsyncIterator[bytes]:
    """``path`` and ``file`` as multipart/form-data, the file's bytes as they come."""
    head = (
        f"--{boundary}\r\n"
        'Content-Disposition: form-data; name="path"\r\n\r\n'
        f"{path}\r\n"
        f"--{boundary}\r\n"
        'Content-Disposition: form-data; name="file"; filename="'
        f'{os.path.basename(path).replace(chr(34), "") or "file"}"\r\n'
        "Content-Type: application/octet-stream\r\n\r\n"
    )
    yield head.encode()
    async for chunk in chunks:
        yield chunk
    yield f"\r\n--{boundary}--\r\n".encode()


def _message(exc: BaseException) -> str:
    body = getattr(exc, "body", None)
    if isinstance(body, dict) and isinstance(body.get("message"), str):
        return str(body["message"])
    return str(exc) or type(exc).__name__


def _to_error(exc: Exception, where: Where) -> ProviderError:
    """The one mapping of Runloop SDK exceptions to router errors."""
    import httpx
    from runloop_api_client import APIConnectionError, APIStatusError, RunloopError
    from runloop_api_client.lib.polling import PollingTimeout

    message = _message(exc)
    if isinstance(exc, PollingTimeout):
        return where.error(Unavailable, f"devbox did not reach running in time: {exc.args[0]}")
    if isinstance(exc, TimeoutError):
        return where.error(Unavailable, "Runloop did not answer in time", unanswered=True)
    if isinstance(exc, APIConnectionError):
        sent = went_out(exc, httpx.ConnectError, httpx.ConnectTimeout)
        return where.error(Unavailable, f"{type(exc).__name__}: {message}", unanswered=sent)
    if isinstance(exc, APIStatusError):
        lowered = message.lower()
        return from_status(
            exc.status_code,
            message,
            where,
            retry_after=retry_after(exc.response.headers),
            quota=exc.status_code == 403 and any(word in lowered for word in _QUOTA_WORDS),
            capacity=exc.status_code == 429 and any(word in lowered for word in _CONCURRENCY_WORDS),
        )
    if isinstance(exc, RunloopError) and "terminal state" in message:
        return where.error(Unavailable, message)
    if isinstance(exc, ValueError) and where.in_sandbox:
        return where.error(SandboxError, message)
    return where.error(ProviderError, f"{type(exc).__name__}: {message}")


sdk_errors = ErrorMap(_to_error)
