"""Background processes and terminals on Daytona.

A background process is a shell session of its own running one command
(``runAsync``), so its id is ``<session>:<command>`` and any client of the
sandbox can find it again: the daemon keeps each command's log, and its
websocket replays it from the start, then follows it until the command
ends. Daytona has no kill per command, but deleting a session ends its
shell's whole process tree (SIGTERM, then SIGKILL), so with one process per
session that is the process's kill. A finished process's session stays, so
other handles can still read its log and exit code; the sandbox's end takes
it. An async command's stdin is a pipe the daemon never closes (and its
input call adds a newline), so stdin is not offered.

A terminal is one of Daytona's PTY sessions, driven through the SDK's
``AsyncPtyHandle``.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING

from providers.daytona.errors import sdk_errors
from providers.errors import NotFound, ProviderError, SandboxError
from providers.processes import ProcessBase, TerminalBase

if TYPE_CHECKING:
    from daytona import AsyncSandbox
    from daytona._async.process import AsyncProcess
    from daytona.handle.async_pty_handle import AsyncPtyHandle

__all__ = [
    "KILLED",
    "SESSION_PREFIX",
    "DaytonaProcess",
    "DaytonaTerminal",
    "process_id",
    "toolbox_errors",
]

SESSION_PREFIX = "sandbox-router-proc-"
KILLED = 137  # ended by its session's deletion (SIGKILL at the latest)
_POLL_SECONDS = 0.2
_PTY_PREFIX = "sandbox-router-pty-"


def process_id(session: str, command: str) -> str:
    return f"{session}:{command}"


@contextlib.contextmanager
def toolbox_errors(provider: str, sandbox_id: str) -> Iterator[None]:
    """`sdk_errors` in the sandbox, with the daemon's 404 (no such session, command or
    terminal: it ended or was never there) as `NotFound`."""
    try:
        with sdk_errors(provider, sandbox_id, in_sandbox=True):
            yield
    except SandboxError as err:
        if err.status != 404:
            raise
        raise NotFound(
            err.message, provider=provider, status=404, sandbox_id=sandbox_id
        ) from err.__cause__


class DaytonaProcess(ProcessBase):
    """A command of its own session, fed from the daemon's log websocket (from its start)."""

    def __init__(
        self, native: AsyncSandbox, provider: str, session: str, command: str, timeout: float
    ) -> None:
        super().__init__(process_id(session, command), provider)
        self._native = native
        self._session = session
        self._command = command
        self._timeout = timeout
        self._follow = asyncio.ensure_future(self._read())

    @property
    def _process(self) -> AsyncProcess:
        return self._native.process

    def _errors(self) -> contextlib.AbstractContextManager[None]:
        return toolbox_errors(self.provider, self._native.id)

    async def _read(self) -> None:
        try:
            with self._errors():
                await self._process.get_session_command_logs_async(
                    self._session,
                    self._command,
                    lambda text: self._feed("stdout", text),
                    lambda text: self._feed("stderr", text),
                )
                while True:  # the daemon ends the log once the exit code is written
                    async with asyncio.timeout(self._timeout):
                        found = await self._process.get_session_command(
                            self._session, self._command
                        )
                    if found.exit_code is not None:
                        self._finish(found.exit_code)
                        return
                    await asyncio.sleep(_POLL_SECONDS)
        except NotFound:
            self._finish(KILLED)  # its session was deleted
        except ProviderError as err:
            self._fail(err)

    async def kill(self) -> bool:
        if self.finished:
            return False
        try:
            with self._errors():
                async with asyncio.timeout(self._timeout):
                    found = await self._process.get_session_command(self._session, self._command)
                    if found.exit_code is not None:
                        return False
                    await self._process.delete_session(self._session)
        except NotFound:
            return False
        self._finish(KILLED)
        return True


class DaytonaTerminal(TerminalBase):
    """A Daytona PTY session; ``on_data`` of its SDK handle feeds it."""

    def __init__(self, terminal_id: str, provider: str, sandbox_id: str) -> None:
        super().__init__(terminal_id, provider)
        self._sandbox_id = sandbox_id
        self._handle: AsyncPtyHandle | None = None
        self._watch: asyncio.Future[None] | None = None

    @classmethod
    async def open(
        cls,
        native: AsyncSandbox,
        provider: str,
        *,
        rows: int,
        cols: int,
        env: Mapping[str, str] | None,
        cwd: str | None,
    ) -> DaytonaTerminal:
        """A new PTY session running the sandbox's login shell."""
        from daytona import PtySize

        terminal = cls(_PTY_PREFIX + secrets.token_hex(6), provider, native.id)
        with terminal._errors():
            handle = await native.process.create_pty_session(
                terminal.id,
                terminal._feed,
                cwd=cwd,
                envs=dict(env) if env else None,
                pty_size=PtySize(rows=rows, cols=cols),
            )
        terminal._handle = handle
        terminal._watch = asyncio.ensure_future(terminal._exited(handle))
        return terminal

    async def _exited(self, handle: AsyncPtyHandle) -> None:
        result = await handle.wait()
        self._finish(result.exit_code if result.exit_code is not None else -1)
        await handle.disconnect()

    def _errors(self) -> contextlib.AbstractContextManager[None]:
        return toolbox_errors(self.provider, self._sandbox_id)

    async def write(self, data: str | bytes) -> None:
        assert self._handle is not None
        with self._errors():
            await self._handle.send_input(data)

    async def resize(self, rows: int, cols: int) -> None:
        from daytona import PtySize

        assert self._handle is not None
        with self._errors():
            await self._handle.resize(PtySize(rows=rows, cols=cols))

    async def kill(self) -> bool:
        assert self._handle is not None
        if self._exit.done():
            return False
        try:
            with self._errors():
                await self._handle.kill()
        except NotFound:
            return False
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(self._exit), 10)
        return True
