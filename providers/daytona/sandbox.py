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
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import posixpath
import secrets
import time
from collections.abc import AsyncIterator, Mapping, Sequence
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
from providers.daytona.errors import DAEMON, EXECUTION_TIMEOUT, facts, sdk_errors
from providers.daytona.processes import (
    SESSION_PREFIX,
    DaytonaProcess,
    DaytonaTerminal,
    process_id,
    toolbox_errors,
)
from providers.daytona.states import SNAPSHOT_MAKING, SNAPSHOT_READY, state
from providers.errors import NotFound, ProviderError, SandboxError, Unavailable
from providers.files import Chunks, ShellFiles
from providers.logs import Log
from providers.mapping import Where
from providers.processes import ProcessInfo
from providers.shell import piped, script

if TYPE_CHECKING:
    from daytona import AsyncSandbox
    from daytona._async.snapshot import AsyncSnapshotService
    from daytona.common.snapshot import Snapshot as DaytonaSnapshot

__all__ = ["DaytonaSandbox"]

log = Log("sandbox_router.daytona")

SNAPSHOT_PREFIX = "sandbox-router-"  # the names of the snapshots made without one
_SNAPSHOT_POLL = 1.0

# The line before the caller's command in a background process's script: what
# `DaytonaSandbox.processes` shows of it (not the exports, whose values may be secret).
_COMMAND_MARK = "# sandbox-router: the command"


class DaytonaSandbox(ShellFiles, Sandbox):
    """A live Daytona sandbox; ``native`` is the SDK's ``AsyncSandbox``.

    ``files.manage`` goes through the shell (`ShellFiles`), one exec each, so it
    needs no toolbox route beyond the ones every other call uses.
    """

    def __init__(
        self,
        native: AsyncSandbox,
        provider: str,
        snapshots: AsyncSnapshotService,
        *,
        workdir: str | None = None,
        request_timeout: float = 30.0,
        transfer_timeout: float = 300.0,
        snapshot_timeout: float = 600.0,
    ) -> None:
        self._native = native
        self.id = native.id
        self.provider = provider
        self._snapshots = snapshots
        self._workdir = workdir
        self._request_timeout = request_timeout
        self._transfer_timeout = transfer_timeout
        self._snapshot_timeout = snapshot_timeout
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

    def _errors(self) -> contextlib.AbstractContextManager[None]:
        return sdk_errors(self.provider, self.id, in_sandbox=True)

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
                    await self._native.refresh_data()
        except NotFound:
            return True
        except ProviderError:
            return False
        return state(self._native.state) != "started"

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

    async def _execute(self, session: str, command: str, timeout: float | None) -> Any:
        """One command in the session; None when ``timeout`` passes first."""
        from daytona import DaytonaGoneError, DaytonaNotFoundError, SessionExecuteRequest

        request = SessionExecuteRequest(command=command)
        try:
            async with asyncio.timeout(timeout):
                return await self._native.process.execute_session_command(
                    session, request, timeout=math.ceil(timeout) if timeout else None
                )
        except TimeoutError:
            return None
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
            with self._errors():
                async with asyncio.timeout(self._request_timeout):
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
        from daytona import SessionExecuteRequest

        lines = script(cmd, env, cwd or self._workdir, Where(self.provider, self.id))
        prelude, _, command = lines.rpartition("\n")
        text = f"(\n{prelude}\n{_COMMAND_MARK}\n{command}\n)" if prelude else f"(\n{command}\n)"
        session = SESSION_PREFIX + secrets.token_hex(6)
        process = self._native.process
        async with self._toolbox():
            async with asyncio.timeout(self._request_timeout):
                await process.create_session(session)
            try:
                async with asyncio.timeout(self._request_timeout):
                    started = await process.execute_session_command(
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
            self._native, self.provider, session, started.cmd_id, self._request_timeout
        )

    async def processes(self) -> list[ProcessInfo]:
        async with self._toolbox():
            async with asyncio.timeout(self._request_timeout):
                sessions = await self._native.process.list_sessions()
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
                    await self._native.process.get_session_command(session, command)
        return DaytonaProcess(self._native, self.provider, session, command, self._request_timeout)

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
                self._native, self.provider, rows=rows, cols=cols, env=env, cwd=cwd or self._workdir
            )

    async def write_file(self, path: str, data: bytes | str) -> None:
        payload = data.encode() if isinstance(data, str) else bytes(data)
        async with self._toolbox():
            async with asyncio.timeout(self._transfer_timeout):
                await self._native.fs.upload_file(
                    payload, path, timeout=math.ceil(self._transfer_timeout)
                )

    async def read_file(self, path: str) -> bytes:
        async with self._toolbox():
            async with asyncio.timeout(self._transfer_timeout):
                data = await self._native.fs.download_file(path, math.ceil(self._transfer_timeout))
        return data if isinstance(data, bytes) else bytes(data or b"")

    async def read_stream(self, path: str) -> AsyncIterator[bytes]:
        async with self._toolbox():
            chunks = await self._native.fs.download_file_stream(
                path, timeout=math.ceil(self._transfer_timeout)
            )
            async for chunk in chunks:
                yield bytes(chunk)

    async def write_stream(self, path: str, chunks: Chunks) -> None:
        """The toolbox's bulk upload, its body sent as the chunks come (chunked encoding)."""
        async with self._toolbox():
            parent = posixpath.dirname(path)
            if parent:
                await self.make_dir(parent)
            await self._native.fs.upload_file_stream(
                chunks, path, timeout=math.ceil(self._transfer_timeout)
            )

    async def expose(self, port: int) -> PortURL:
        """The port's preview link; a private sandbox's wants its token in a header."""
        with self._errors():
            async with asyncio.timeout(self._request_timeout):
                link = await self._native.get_preview_link(port)
        return PortURL(port, link.url, {"X-Daytona-Preview-Token": link.token})

    async def pause(self) -> None:
        """Daytona's ``stop``: the filesystem stays, processes end, and a stopped sandbox
        bills its disk only; `DaytonaProvider.resume` starts it again on the same id.

        The router creates sandboxes that Daytona deletes once stopped (auto-delete 0,
        so a lost one costs nothing), so a pause first keeps it (-1: never deleted);
        the paused sandbox is then the router's to kill (the janitor, ``pause_ttl``).
        """
        with self._errors():
            async with asyncio.timeout(self._transfer_timeout):
                await self._native.set_auto_delete_interval(-1)
                await self._native.stop(timeout=math.ceil(self._request_timeout))

    async def snapshot(self, name: str | None = None) -> Snapshot:
        """Daytona's snapshot of the sandbox: its filesystem (not its processes or memory)
        committed and pushed to the organization's registry; its id is the template.

        The sandbox is ``snapshotting`` meanwhile and the SDK waits for it to leave
        that state. Daytona writes the snapshot, ``active``, before
        the sandbox leaves it, and when the copy fails or the name is taken it writes
        none and says nothing. So a name of the caller's is checked first (an existing
        one would else pass for the new snapshot), and a snapshot missing afterwards is
        `Unavailable`. Without ``name`` a unique one is made (names are unique per
        organization) and returned as the snapshot's ``name``.
        """
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
                await self._native.create_snapshot(made, timeout=math.ceil(self._snapshot_timeout))
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

    async def _find_snapshot(self, name: str) -> DaytonaSnapshot | None:
        """The organization's snapshot of this name, None when it has none."""
        try:
            with self._errors():
                async with asyncio.timeout(self._request_timeout):
                    return await self._snapshots.get(name)
        except NotFound:
            return None

    async def list_files(self, path: str = ".") -> list[FileInfo]:
        async with self._toolbox():
            async with asyncio.timeout(self._request_timeout):
                entries = await self._native.fs.list_files(path)
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
            self._work_dir = await self._native.get_work_dir()
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
        """Python in Daytona's interpreter, whose default context keeps its variables."""
        from daytona import DaytonaTimeoutError

        started = time.monotonic()
        out: list[str] = []
        err: list[str] = []
        async with self._toolbox():
            try:
                async with asyncio.timeout(timeout + self._request_timeout if timeout else None):
                    ran = await self._native.code_interpreter.run_code(
                        code,
                        on_stdout=lambda message: out.append(message.output),
                        on_stderr=lambda message: err.append(message.output),
                        timeout=math.ceil(timeout) if timeout else 0,
                    )
            except DaytonaTimeoutError:
                elapsed = time.monotonic() - started
                error = f"timed out after {timeout}s"
                return CodeResult("".join(out), "".join(err), -1, elapsed, True, (), error, True)
        failed = f"{ran.error.name}: {ran.error.value}" if ran.error else None
        return CodeResult(
            ran.stdout,
            ran.stderr,
            1 if ran.error else 0,
            time.monotonic() - started,
            False,
            (),
            failed,
            True,
        )

    async def _code_run(self, code: str, timeout: float | None) -> CodeResult:
        """Daytona's code runner (stdout and stderr merged, as it gives them)."""
        started = time.monotonic()
        slack = self._request_timeout
        async with self._toolbox():
            try:
                async with asyncio.timeout(timeout + slack if timeout else None):
                    response = await self._native.process.code_run(
                        code, timeout=math.ceil(timeout) if timeout else None
                    )
            except Exception as exc:
                if facts(exc).code != EXECUTION_TIMEOUT:
                    raise
                elapsed = time.monotonic() - started
                return CodeResult("", "", -1, elapsed, True, (), f"timed out after {timeout}s")
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
            failure(output, exit_code, False, timeout),
        )

    async def kill(self) -> None:
        with contextlib.suppress(NotFound), self._errors():
            async with asyncio.timeout(self._request_timeout):
                await self._native.delete()

    async def keepalive(self, seconds: float) -> None:
        """Reset the sandbox's auto-stop timer (Daytona counts idle time from the last activity)."""
        with self._errors():
            async with asyncio.timeout(self._request_timeout):
                await self._native.refresh_activity()


def _shown(command: str) -> str:
    """The caller's command in a background process's script."""
    if command.startswith("(\n") and command.endswith("\n)"):
        command = command[2:-2]
    _, marked, shown = command.rpartition(_COMMAND_MARK + "\n")
    return shown if marked else command


class _SessionGone(Exception):
    """The sandbox no longer has the shell session (it ended or was dropped)."""
