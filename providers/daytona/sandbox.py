"""`DaytonaSandbox`: commands, files and code in a live Daytona sandbox.

Commands run in shell sessions, the one Daytona API that keeps stdout and
stderr apart: each command in a subshell (env and cwd apply to it only), in
a session of its own while it runs (sessions are pooled per handle), under
the router's timeout, after which its session is dropped (which kills it)
and the output so far is returned with ``timed_out=True``.
`DaytonaSandbox.run_code` runs python in Daytona's stateful interpreter
(variables stay for the next call), the sandbox's other language in its
code runner (stdout and stderr merged, as Daytona gives them) and bash in a
session. Background processes and terminals are in
`providers.daytona.processes`. `DaytonaSandbox.snapshot` keeps the sandbox's
filesystem as a Daytona snapshot, a template for creates on the entry.

Files go through the toolbox's bulk routes, as the SDK sends them: an upload
is a multipart body streamed as its chunks come (chunked encoding), a
download a multipart answer read a chunk at a time, so neither is ever whole
in memory. The toolbox's URL is the sandbox's ``toolboxProxyUrl`` (asked of
the API when the sandbox came without one) and its id.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import posixpath
import secrets
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from providers.base import (
    CodeResult,
    CommandResult,
    FileInfo,
    PortURL,
    Sandbox,
    Snapshot,
    failure,
)
from providers.daytona.errors import DAEMON, EXECUTION_TIMEOUT, StreamBroken, facts, sdk_errors
from providers.daytona.processes import (
    SESSION_PREFIX,
    DaytonaProcess,
    DaytonaTerminal,
    follow,
    process_id,
    toolbox_errors,
)
from providers.daytona.states import FAILED, SNAPSHOT_MAKING, SNAPSHOT_READY, failed, state
from providers.errors import NotFound, ProviderError, SandboxError, Unavailable
from providers.files import CHUNK, Chunks, ShellFiles
from providers.logs import Log
from providers.mapping import Where
from providers.processes import ProcessInfo
from providers.shell import piped, script

if TYPE_CHECKING:
    import aiohttp
    from daytona import AsyncSandbox
    from daytona_api_client_async.models.sandbox import Sandbox as SandboxDto
    from daytona_api_client_async.models.snapshot_dto import SnapshotDto
    from daytona_toolbox_api_client_async.models.session_execute_response import (
        SessionExecuteResponse,
    )

    from providers.daytona.client import DaytonaClient, Toolbox

__all__ = ["LANGUAGE_LABEL", "SNAPSHOT_PREFIX", "DaytonaSandbox"]

log = Log("sandbox_router.daytona")

SNAPSHOT_PREFIX = "sandbox-router-"  # the names of the snapshots made without one
LANGUAGE_LABEL = "code-toolbox-language"  # the language of Daytona's code runner in a sandbox
_SNAPSHOT_POLL = 1.0
_STATE_POLL = 0.05  # between the GETs of a sandbox stopping or snapshotting, at first
_STATE_POLL_MOST = 1.0
_INTERPRETER_TIMED_OUT = 4008  # the interpreter's close code when the code ran out of time

# The line before the caller's command in a background process's script: what
# `DaytonaSandbox.processes` shows of it (not the exports, whose values may be secret).
_COMMAND_MARK = "# sandbox-router: the command"


class DaytonaSandbox(ShellFiles, Sandbox):
    """A live Daytona sandbox, reached through the organization's `DaytonaClient`.

    ``native`` is the SDK's ``AsyncSandbox`` over the same connection, built on
    first use: the ``daytona`` package (~40 MB) is imported then, by its callers only.
    ``files.manage`` goes through the shell (`ShellFiles`), one exec each, so it
    needs no toolbox route beyond the ones every other call uses.
    """

    def __init__(
        self,
        dto: SandboxDto,
        provider: str,
        client: DaytonaClient,
        *,
        workdir: str | None = None,
        request_timeout: float = 30.0,
        transfer_timeout: float = 300.0,
        snapshot_timeout: float = 600.0,
    ) -> None:
        self._dto = dto
        self.id = dto.id
        self.provider = provider
        self._client = client
        self._workdir = workdir
        self._request_timeout = request_timeout
        self._transfer_timeout = transfer_timeout
        self._snapshot_timeout = snapshot_timeout
        self._idle_sessions: list[str] = []
        self._work_dir: str | None = None
        self._toolbox_client: Toolbox | None = None
        self._native: AsyncSandbox | None = None

    @property
    def native(self) -> AsyncSandbox:
        """The SDK's ``AsyncSandbox`` of this sandbox, on the adapter's connection (its
        state polled, not pushed: it has no Socket.IO client)."""
        if self._native is None:
            from daytona import AsyncSandbox
            from daytona.internal.event_subscription_manager import (
                AsyncEventSubscriptionManager,
            )

            self._native = AsyncSandbox(
                self._dto,
                self._client.toolbox,
                self._client.sandboxes,
                self.language,
                AsyncEventSubscriptionManager(None),
            )
        return self._native

    @property
    def language(self) -> str:
        """The language Daytona's code runner uses in this sandbox."""
        return (self._dto.labels or {}).get(LANGUAGE_LABEL) or "python"

    def _errors(self) -> contextlib.AbstractContextManager[None]:
        return sdk_errors(self.provider, self.id, in_sandbox=True)

    async def _tools(self) -> Toolbox:
        """The sandbox's toolbox client; its URL asked of the API once when the
        sandbox came without one."""
        if self._toolbox_client is None:
            url = self._dto.toolbox_proxy_url
            if not url:
                async with asyncio.timeout(self._request_timeout):
                    found = await self._client.sandboxes.get_toolbox_proxy_url(self.id)
                url = self._dto.toolbox_proxy_url = found.url
            self._toolbox_client = self._client.toolbox_of(self._dto, url)
        return self._toolbox_client

    @contextlib.asynccontextmanager
    async def _toolbox(self) -> AsyncIterator[None]:
        """Map the errors of toolbox calls (commands and files).

        A client error the daemon itself gave is the caller's; one from in
        front of it (the proxy) is the caller's only while the sandbox still
        runs, which the API is asked: a sandbox stopped or gone is `NotFound`.
        """
        try:
            with self._errors():
                yield
        except SandboxError as err:
            cause = err.__cause__
            if cause is None or facts(cause).source == DAEMON or not await self._gone():
                raise
            raise NotFound(
                f"sandbox {self.id} is not running ({err.message})",
                provider=self.provider,
                status=err.status,
                sandbox_id=self.id,
            ) from cause

    async def _gone(self) -> bool:
        """Whether the API says the sandbox no longer runs."""
        try:
            with self._errors():
                async with asyncio.timeout(self._request_timeout):
                    self._dto = await self._client.sandboxes.get_sandbox(self.id)
        except NotFound:
            return True
        except ProviderError:
            return False
        return state(self._dto.state) != "started"

    async def run(
        self,
        cmd: str | Sequence[str],
        *,
        timeout: float | None = 60.0,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
    ) -> CommandResult:
        lines = script(cmd, env, cwd or self._workdir, Where(self.provider, self.id))
        command = f"(\n{lines}\n)"
        started = time.monotonic()
        async with self._toolbox():
            session = await self._take_session()
            try:
                response = await self._execute(session, command, timeout)
            except _SessionGone:
                session = await self._take_session(fresh=True)
                response = await self._execute(session, command, timeout)
        if response is None:
            stdout, stderr = await self._abandon(session)
            return CommandResult(stdout, stderr, -1, time.monotonic() - started, timed_out=True)
        self._idle_sessions.append(session)
        exit_code = response.exit_code if response.exit_code is not None else -1
        return CommandResult(
            response.stdout or "", response.stderr or "", exit_code, time.monotonic() - started
        )

    async def _execute(
        self, session: str, command: str, timeout: float | None
    ) -> SessionExecuteResponse | None:
        """One command in the session; None when ``timeout`` passes first."""
        from daytona_toolbox_api_client_async.exceptions import ApiException
        from daytona_toolbox_api_client_async.models.session_execute_request import (
            SessionExecuteRequest,
        )

        process = (await self._tools()).process
        try:
            async with asyncio.timeout(timeout):
                return await process.session_execute_command(
                    session, SessionExecuteRequest(command=command)
                )
        except TimeoutError:
            return None
        except ApiException as exc:
            gone = exc.status == 410 or (
                exc.status == 404 and "session" in facts(exc).message.lower()
            )
            if not gone:
                raise
            raise _SessionGone from exc

    async def _take_session(self, *, fresh: bool = False) -> str:
        """An idle shell session of this handle, or a new one.

        A session runs one command at a time, so each command in flight has
        its own; a session goes back to the pool when its command finished.
        """
        from daytona_toolbox_api_client_async.models.create_session_request import (
            CreateSessionRequest,
        )

        if self._idle_sessions and not fresh:
            return self._idle_sessions.pop()
        session = "sandbox-router-" + secrets.token_hex(6)
        try:
            async with asyncio.timeout(self._request_timeout):
                process = (await self._tools()).process
                await process.create_session(CreateSessionRequest(session_id=session))
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
        try:
            with self._errors():
                async with asyncio.timeout(self._request_timeout):
                    process = (await self._tools()).process
                    commands = (await process.get_session(session)).commands
                    logs = (
                        await process.get_session_command_logs(session, commands[-1].id)
                        if commands
                        else None
                    )
                    await process.delete_session(session)
        except ProviderError as err:
            log.warning(
                "sandbox_router.daytona.session_cleanup_failed",
                entry=self.provider,
                sandbox_id=self.id,
                error=str(err),
            )
            raise
        if logs is None:
            raise Unavailable(
                "the sandbox's toolbox did not take the command in time",
                provider=self.provider,
                sandbox_id=self.id,
            )
        return logs.stdout or "", logs.stderr or ""

    async def start(
        self,
        cmd: str | Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
    ) -> DaytonaProcess:
        from daytona_toolbox_api_client_async.models.create_session_request import (
            CreateSessionRequest,
        )
        from daytona_toolbox_api_client_async.models.session_execute_request import (
            SessionExecuteRequest,
        )

        lines = script(cmd, env, cwd or self._workdir, Where(self.provider, self.id))
        prelude, _, command = lines.rpartition("\n")
        text = f"(\n{prelude}\n{_COMMAND_MARK}\n{command}\n)" if prelude else f"(\n{command}\n)"
        session = SESSION_PREFIX + secrets.token_hex(6)
        async with self._toolbox():
            toolbox = await self._tools()
            process = toolbox.process
            async with asyncio.timeout(self._request_timeout):
                await process.create_session(CreateSessionRequest(session_id=session))
            try:
                async with asyncio.timeout(self._request_timeout):
                    started = await process.session_execute_command(
                        session, SessionExecuteRequest(command=text, run_async=True)
                    )
            except BaseException:
                with contextlib.suppress(Exception):
                    await process.delete_session(session)
                raise
        if not started.cmd_id:
            raise SandboxError(
                "Daytona started the command without an id",
                provider=self.provider,
                sandbox_id=self.id,
            )
        return DaytonaProcess(
            toolbox, self.provider, self.id, session, started.cmd_id, self._request_timeout
        )

    async def processes(self) -> list[ProcessInfo]:
        async with self._toolbox():
            async with asyncio.timeout(self._request_timeout):
                sessions = await (await self._tools()).process.list_sessions()
        return [
            ProcessInfo(
                process_id(session.session_id, command.id),
                _shown(command.command),
                command.exit_code is None,
                command.exit_code,
            )
            for session in sessions
            if session.session_id.startswith(SESSION_PREFIX)
            for command in session.commands
        ]

    async def attach(self, process_id: str) -> DaytonaProcess:
        session, _, command = process_id.partition(":")
        if not (session.startswith(SESSION_PREFIX) and command):
            raise NotFound(
                f"no process {process_id!r} (ids look like {SESSION_PREFIX}...:<command id>)",
                provider=self.provider,
                sandbox_id=self.id,
            )
        async with self._toolbox():
            with toolbox_errors(self.provider, self.id):
                async with asyncio.timeout(self._request_timeout):
                    toolbox = await self._tools()
                    await toolbox.process.get_session_command(session, command)
        return DaytonaProcess(
            toolbox, self.provider, self.id, session, command, self._request_timeout
        )

    async def open_terminal(
        self,
        *,
        rows: int = 24,
        cols: int = 80,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
    ) -> DaytonaTerminal:
        async with self._toolbox():
            return await DaytonaTerminal.open(
                await self._tools(),
                self.provider,
                self.id,
                rows=rows,
                cols=cols,
                env=env,
                cwd=cwd or self._workdir,
                timeout=self._request_timeout,
            )

    def _timeout(self) -> aiohttp.ClientTimeout:
        """A transfer's: no wall-clock cap (a large file takes what it takes), but
        ``transfer_timeout`` without a byte from Daytona."""
        import aiohttp

        return aiohttp.ClientTimeout(
            total=None, sock_connect=30.0, sock_read=self._transfer_timeout
        )

    async def _upload(self, path: str, chunks: Chunks) -> None:
        """``chunks`` to ``path``: the bulk upload's multipart body, sent as they come."""
        boundary = "sandbox-router-" + secrets.token_hex(12)
        name = posixpath.basename(path).translate(_UNQUOTED) or "upload"
        head = (
            f"--{boundary}\r\n"
            'Content-Disposition: form-data; name="files[0].path"\r\n\r\n'
            f"{path}\r\n"
            f"--{boundary}\r\n"
            f'Content-Disposition: form-data; name="files[0].file"; filename="{name}"\r\n'
            "Content-Type: application/octet-stream\r\n\r\n"
        ).encode()

        async def body() -> AsyncIterator[bytes]:
            yield head
            async for chunk in chunks:
                if chunk:
                    yield bytes(chunk)
            yield f"\r\n--{boundary}--\r\n".encode()

        toolbox = await self._tools()
        headers = {
            **toolbox.default_headers,
            "Content-Type": f"multipart/form-data; boundary={boundary}",
        }
        async with toolbox.session.post(
            toolbox.url("/files/bulk-upload"), data=body(), headers=headers, timeout=self._timeout()
        ) as response:
            await _raise_for_status(response)

    async def _download(self, path: str) -> AsyncIterator[bytes]:
        """``path``'s bytes as they come: the bulk download's ``file`` part, or its
        ``error`` part (the daemon's error body) raised as the error answer it is."""
        import aiohttp
        from daytona_toolbox_api_client_async.exceptions import ApiException

        toolbox = await self._tools()
        headers = {**toolbox.default_headers, "Content-Type": "application/json"}
        async with toolbox.session.post(
            toolbox.url("/files/bulk-download"),
            data=json.dumps({"paths": [path]}),
            headers=headers,
            timeout=self._timeout(),
        ) as response:
            await _raise_for_status(response)
            reader = aiohttp.MultipartReader(response.headers, response.content)
            while (part := await reader.next()) is not None:
                if not isinstance(part, aiohttp.BodyPartReader):
                    continue
                if part.name == "error":
                    error = await part.read()
                    status = _json(error).get("statusCode")
                    raise ApiException(
                        status=status if isinstance(status, int) else 500,
                        reason="file download failed",
                        body=error.decode(errors="replace"),
                    )
                if part.name == "file":
                    while chunk := await part.read_chunk(CHUNK):
                        yield chunk
                    return
        raise StreamBroken(f"Daytona's download of {path} carried no file")

    async def write_file(self, path: str, data: bytes | str) -> None:
        payload = data.encode() if isinstance(data, str) else bytes(data)

        async def chunks() -> AsyncIterator[bytes]:
            yield payload

        async with self._toolbox():
            async with asyncio.timeout(self._transfer_timeout):
                await self._upload(path, chunks())

    async def read_file(self, path: str) -> bytes:
        async with self._toolbox():
            async with asyncio.timeout(self._transfer_timeout):
                return b"".join([chunk async for chunk in self._download(path)])

    async def read_stream(self, path: str) -> AsyncIterator[bytes]:
        async with self._toolbox():
            async for chunk in self._download(path):
                yield chunk

    async def write_stream(self, path: str, chunks: Chunks) -> None:
        """The toolbox's bulk upload, its body sent as the chunks come (chunked encoding)."""
        async with self._toolbox():
            parent = posixpath.dirname(path)
            if parent:
                await self.make_dir(parent)
            await self._upload(path, chunks)

    async def expose(self, port: int) -> PortURL:
        """The port's preview link; a private sandbox's wants its token in a header."""
        with self._errors():
            async with asyncio.timeout(self._request_timeout):
                link = await self._client.sandboxes.get_port_preview_url(self.id, port)
        return PortURL(port, link.url, {"X-Daytona-Preview-Token": link.token})

    async def pause(self) -> None:
        """Daytona's ``stop``: the filesystem stays, processes end, and a stopped sandbox
        bills its disk only; `DaytonaProvider.resume` starts it again on the same id.

        The router creates sandboxes that Daytona deletes once stopped (auto-delete 0,
        so a lost one costs nothing), so a pause first keeps it (-1: never deleted);
        the paused sandbox is then the router's to kill (the janitor, ``pause_ttl``).
        """
        sandboxes = self._client.sandboxes
        with self._errors():
            async with asyncio.timeout(self._transfer_timeout):
                await sandboxes.set_auto_delete_interval(self.id, -1)
                async with asyncio.timeout(math.ceil(self._request_timeout)):
                    await sandboxes.stop_sandbox(self.id)
                    await self._until(lambda now: now in ("stopped", "destroyed"), gone_ok=True)

    async def _until(self, reached: Callable[[str], bool], *, gone_ok: bool = False) -> None:
        """Poll the sandbox until its state is ``reached``; `Unavailable` if it fails
        (``error``, ``build_failed``) first. A sandbox the API no longer knows has
        reached it when ``gone_ok``. A stop takes seconds, a snapshot minutes: the
        polls thin out from 50 ms to one a second."""
        every = _STATE_POLL
        while True:
            try:
                self._dto = await self._client.sandboxes.get_sandbox(self.id)
            except Exception as exc:
                if gone_ok and getattr(exc, "status", None) == 404:
                    return
                raise
            now = state(self._dto.state)
            if now in FAILED:
                raise failed(self._dto, self.provider)
            if reached(now):
                return
            await asyncio.sleep(every)
            every = min(every * 1.5, _STATE_POLL_MOST)

    async def snapshot(self, name: str | None = None) -> Snapshot:
        """Daytona's snapshot of the sandbox: its filesystem (not its processes or memory)
        committed and pushed to the organization's registry; its id is the template.

        The sandbox is ``snapshotting`` meanwhile, and is waited for to leave that
        state. Daytona writes the snapshot, ``active``, before
        the sandbox leaves it, and when the copy fails or the name is taken it writes
        none and says nothing. So a name of the caller's is checked first (an existing
        one would else pass for the new snapshot), and a snapshot missing afterwards is
        `Unavailable`. Without ``name`` a unique one is made (names are unique per
        organization) and returned as the snapshot's ``name``.
        """
        from daytona_api_client_async.models.create_sandbox_snapshot import (
            CreateSandboxSnapshot,
        )

        if name is not None and not name.strip():
            raise SandboxError(
                "snapshot: a Daytona snapshot's name must not be blank",
                provider=self.provider,
                sandbox_id=self.id,
            )
        made = name if name is not None else SNAPSHOT_PREFIX + secrets.token_hex(8)
        with self._errors():
            async with asyncio.timeout(self._snapshot_timeout + self._request_timeout):
                if name is not None and await self._find_snapshot(name) is not None:
                    raise SandboxError(
                        f"snapshot: the organization already has a snapshot named {name!r}",
                        provider=self.provider,
                        sandbox_id=self.id,
                    )
                async with asyncio.timeout(self._snapshot_timeout):
                    self._dto = await self._client.sandboxes.create_sandbox_snapshot(
                        self.id, CreateSandboxSnapshot(name=made)
                    )
                    if state(self._dto.state) == "snapshotting":
                        await self._until(lambda now: now != "snapshotting")
                found = await self._find_snapshot(made)
                while found is not None and state(found.state) in SNAPSHOT_MAKING:
                    await asyncio.sleep(_SNAPSHOT_POLL)
                    found = await self._find_snapshot(made)
        if found is None or state(found.state) != SNAPSHOT_READY:
            why = "none was made" if found is None else f"it is {state(found.state)}"
            reason = f": {found.error_reason}" if found is not None and found.error_reason else ""
            raise Unavailable(
                f"snapshot {made!r} of the sandbox failed ({why}{reason})",
                provider=self.provider,
                sandbox_id=self.id,
            )
        return Snapshot(found.id, self.provider, made)

    async def _find_snapshot(self, name: str) -> SnapshotDto | None:
        """The organization's snapshot of this name, None when it has none."""
        try:
            with self._errors():
                async with asyncio.timeout(self._request_timeout):
                    return await self._client.snapshots.get_snapshot(name)
        except NotFound:
            return None

    async def list_files(self, path: str = ".") -> list[FileInfo]:
        async with self._toolbox():
            async with asyncio.timeout(self._request_timeout):
                entries = await (await self._tools()).files.list_files(path=path)
                where = path if posixpath.isabs(path) else await self._absolute(path)
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
            found = await (await self._tools()).info.get_work_dir()
            self._work_dir = found.dir or "/"
        return posixpath.normpath(posixpath.join(self._work_dir, path))

    async def run_code(
        self, code: str, language: str = "python", *, timeout: float | None = 60.0
    ) -> CodeResult:
        if language == "python":
            return await self._interpret(code, timeout)
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
        res = await self.run(piped(code, interpreter), timeout=timeout)
        return CodeResult.of_command(res, timeout)

    async def _interpret(self, code: str, timeout: float | None) -> CodeResult:
        """Python in Daytona's interpreter, whose default context keeps its variables.

        A websocket: the code goes up as JSON, its output comes back a chunk per
        message (``stdout``, ``stderr`` or ``error``), and the close ends the run
        (with code 4008 when the code ran out of time).
        """
        started = time.monotonic()
        out: list[str] = []
        err: list[str] = []
        error: str | None = None
        async with self._toolbox():
            toolbox = await self._tools()
            async with (
                asyncio.timeout(timeout + self._request_timeout if timeout else None),
                await toolbox.websocket("/process/interpreter/execute") as ws,
            ):
                await ws.send_str(
                    json.dumps({"code": code, "timeout": math.ceil(timeout) if timeout else 0})
                )
                try:
                    async for data in follow(ws):
                        chunk = _json(data)
                        kind, text = chunk.get("type"), str(chunk.get("text", ""))
                        if kind == "stdout":
                            out.append(text)
                        elif kind == "stderr":
                            err.append(text)
                        elif kind == "error":
                            error = f"{chunk.get('name', '')}: {chunk.get('value', '')}"
                except StreamBroken:
                    if ws.close_code != _INTERPRETER_TIMED_OUT:
                        raise
                    elapsed = time.monotonic() - started
                    failed = f"timed out after {timeout}s"
                    return CodeResult(
                        "".join(out), "".join(err), -1, elapsed, True, (), failed, True
                    )
        return CodeResult(
            "".join(out),
            "".join(err),
            1 if error else 0,
            time.monotonic() - started,
            False,
            (),
            error,
            True,
        )

    async def _code_run(self, code: str, timeout: float | None) -> CodeResult:
        """Daytona's code runner (stdout and stderr merged, as it gives them)."""
        from daytona_toolbox_api_client_async.models.code_run_request import CodeRunRequest

        started = time.monotonic()
        slack = self._request_timeout
        request = CodeRunRequest(
            code=code, language=self.language, timeout=math.ceil(timeout) if timeout else None
        )
        async with self._toolbox():
            try:
                async with asyncio.timeout(timeout + slack if timeout else None):
                    response = await (await self._tools()).process.code_run(request)
            except Exception as exc:
                if facts(exc).code != EXECUTION_TIMEOUT:
                    raise
                elapsed = time.monotonic() - started
                return CodeResult("", "", -1, elapsed, True, (), f"timed out after {timeout}s")
        output = response.result or ""
        exit_code = response.exit_code
        if exit_code is None:
            exit_code = response.additional_properties.get("code")
        exit_code = exit_code if isinstance(exit_code, int) else -1
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
            failure(output, exit_code, False, timeout),
        )

    async def kill(self) -> None:
        with contextlib.suppress(NotFound), self._errors():
            async with asyncio.timeout(self._request_timeout):
                await self._client.sandboxes.delete_sandbox(self.id)

    async def keepalive(self, seconds: float) -> None:
        """Reset the sandbox's auto-stop timer (Daytona counts idle time from the last activity)."""
        with self._errors():
            async with asyncio.timeout(self._request_timeout):
                await self._client.sandboxes.update_last_activity(self.id)


_UNQUOTED = str.maketrans({'"': "_", "\\": "_", "\r": "_", "\n": "_"})


async def _raise_for_status(response: aiohttp.ClientResponse) -> None:
    """An error answer to a transfer, raised as the generated client raises one."""
    if response.status < 400:
        return
    from daytona_toolbox_api_client_async.exceptions import ApiException

    error = ApiException(
        status=response.status, reason=response.reason, body=await response.text(errors="replace")
    )
    error.headers = response.headers
    raise error


def _json(data: bytes | str) -> dict[str, Any]:
    """A JSON object, or nothing when ``data`` is not one."""
    with contextlib.suppress(ValueError):
        parsed = json.loads(data)
        if isinstance(parsed, dict):
            return parsed
    return {}


def _shown(command: str) -> str:
    """The caller's command in a background process's script."""
    if command.startswith("(\n") and command.endswith("\n)"):
        command = command[2:-2]
    _, marked, shown = command.rpartition(_COMMAND_MARK + "\n")
    return shown if marked else command


class _SessionGone(Exception):
    """The sandbox no longer has the shell session (it ended or was dropped)."""
