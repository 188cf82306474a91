"""`DaytonaCommands`: commands in a Daytona sandbox, in its shell sessions.

Shell sessions are the one Daytona API that keeps stdout and stderr apart:
each command runs in a subshell (env and cwd apply to it only), in a session
of its own while it runs (sessions are pooled per handle), under the
router's timeout, after which its session is dropped (which kills it) and
the output so far is returned with ``timed_out=True``. A background process
is a session of its own (`providers.daytona.processes`).
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from providers.base import CommandResult
from providers.daytona.errors import facts
from providers.daytona.handle import DaytonaHandle
from providers.daytona.processes import (
    SESSION_PREFIX,
    DaytonaProcess,
    DaytonaTerminal,
    process_id,
    toolbox_errors,
)
from providers.errors import NotFound, ProviderError, SandboxError, Unavailable
from providers.logs import Log
from providers.mapping import Where
from providers.processes import ProcessInfo
from providers.shell import script

if TYPE_CHECKING:
    from daytona_toolbox_api_client_async.models.session_execute_response import (
        SessionExecuteResponse,
    )

__all__ = ["DaytonaCommands"]

log = Log("sandbox_router.daytona")

# The line before the caller's command in a background process's script: what
# `DaytonaSandbox.processes` shows of it (not the exports, whose values may be secret).
_COMMAND_MARK = "# sandbox-router: the command"


class DaytonaCommands(DaytonaHandle):
    """The commands, background processes and terminals of a Daytona sandbox."""

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


def _shown(command: str) -> str:
    """The caller's command in a background process's script."""
    if command.startswith("(\n") and command.endswith("\n)"):
        command = command[2:-2]
    _, marked, shown = command.rpartition(_COMMAND_MARK + "\n")
    return shown if marked else command


class _SessionGone(Exception):
    """The sandbox no longer has the shell session (it ended or was dropped)."""
