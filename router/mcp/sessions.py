"""Each MCP session's sandboxes: opened for it, released when it ends.

An `McpSession` holds the leases its tool calls opened (`Slot`), the
background processes started in them (`Background`), and which sandbox a
call that names none means (the last one opened or resumed; one is opened
for a call that finds none). `McpSessions` finds a call's session by its
`Owner`, the tenant and the MCP session id, so a session reaches only its
own sandboxes, and ends it:

* stdio: the one session (``stdio``) ends with the server, at end of input
  or on a signal (`router.mcp.server`);
* Streamable HTTP: `SessionWatch` sees each request of a session go by and
  ends the session when the client deletes it (``DELETE``) or the SDK no
  longer knows it (404), and `McpSessions.reap` ends one idle past
  ``session_idle_timeout``, a tick after the SDK's own timeout closed it, so
  a sandbox is never released under a session the SDK still serves;
* the server's shutdown ends every session (`McpSessions.close`).

Ending a session releases its leases (killing the sandboxes and everything
they run); a paused one is resumed to be released, so its pause record goes
with it. A sandbox a call was still opening when its session ended is
released as it lands. A server that dies without ending its sessions leaves
orphans the janitor reaps, as any crashed app's.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from providers.base import SandboxSpec
from providers.errors import InvalidArgument, LeaseError, SandboxRouterError
from providers.logs import Log
from providers.processes import OutputChunk
from router.config import McpSettings
from router.core import Router
from router.lease import AsyncLease, AsyncSandboxHandle
from router.mcp.auth import LOCAL_TENANT, TOKEN_SCOPE
from router.processes import AsyncProcess

__all__ = ["STDIO", "Background", "McpSession", "McpSessions", "Owner", "SessionWatch", "Slot"]

log = Log("sandbox_router.mcp")

SESSION_HEADER = "mcp-session-id"


@dataclass(frozen=True, slots=True)
class Owner:
    """Whose sandboxes: a tenant's MCP session. ``token``: the tenant is a bearer
    token's, and the leases the session opens count to it (``tenants`` limits in the
    config, `router.tenants`); the stdio client and a tokenless HTTP server's callers
    (``local``) count to no tenant."""

    tenant: str
    session: str
    token: bool = field(default=False, compare=False)

    @property
    def counted(self) -> str | None:
        """The tenant its leases count to, or None."""
        return self.tenant if self.token else None


STDIO = Owner(LOCAL_TENANT, "stdio")


class Background:
    """A process a tool started: its output kept until read (the last ``limit``
    characters of it), and how it ended."""

    def __init__(self, process: AsyncProcess, command: str, limit: int) -> None:
        self.process = process
        self.command = command
        self.exit_code: int | None = None
        self.error: str | None = None
        self.ended = False
        self.dropped = 0  # characters lost to the limit since the last read
        self._limit = limit
        self._unread: deque[OutputChunk] = deque()
        self._unread_chars = 0
        self._changed = asyncio.Event()
        self._pump = asyncio.ensure_future(self._follow())

    @property
    def id(self) -> str:
        return self.process.id

    async def _follow(self) -> None:
        try:
            async for chunk in self.process.output():
                self._keep(chunk)
            self.exit_code = (await self.process.wait()).exit_code
        except SandboxRouterError as exc:
            self.error = str(exc)
        except Exception as exc:  # an adapter bug: said, not raised into a task nobody awaits
            log.line(
                logging.ERROR,
                "sandbox_router.mcp.output_failed",
                {"process": self.id},
                exc_info=True,
            )
            self.error = f"its output stopped ({type(exc).__name__})"
        finally:
            self.ended = True
            self._changed.set()

    def _keep(self, chunk: OutputChunk) -> None:
        self._unread.append(chunk)
        self._unread_chars += len(chunk.data)
        while self._unread_chars > self._limit:
            oldest = self._unread.popleft()
            over = self._unread_chars - self._limit
            if len(oldest.data) > over:  # keep the tail of a chunk larger than what is over
                self._unread.appendleft(OutputChunk(oldest.stream, oldest.data[over:]))
                self._unread_chars -= over
                self.dropped += over
            else:
                self._unread_chars -= len(oldest.data)
                self.dropped += len(oldest.data)
        self._changed.set()

    async def read(self, wait: float) -> tuple[str, str, int]:
        """Its stdout and stderr since the last read, and the characters dropped meanwhile;
        with nothing new yet, up to ``wait`` seconds for more (or its end)."""
        if not self._unread and not self.ended and wait > 0:
            self._changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), wait)
        chunks, dropped = list(self._unread), self.dropped
        self._unread.clear()
        self._unread_chars = self.dropped = 0
        stdout = "".join(c.data for c in chunks if c.stream == "stdout")
        stderr = "".join(c.data for c in chunks if c.stream == "stderr")
        return stdout, stderr, dropped

    def stop(self) -> None:
        """Stop following it (the sandbox is going; its kill ends the process)."""
        self._pump.cancel()


class Slot:
    """One sandbox of a session: its lease, or while paused the token that resumes it."""

    def __init__(self, lease: AsyncLease, capabilities: frozenset[str]) -> None:
        self.id = lease.sandbox_id
        self.entry = lease.entry
        self.provider = lease.provider
        self.failovers = lease.failovers
        self.capabilities = capabilities
        self.processes: dict[str, Background] = {}
        self._lease: AsyncLease | None = lease
        self._handle: AsyncSandboxHandle | None = lease.sandbox
        self._token: str | None = None  # a bearer secret: never in a repr or a result

    @property
    def paused(self) -> bool:
        return self._lease is None

    def handle(self) -> AsyncSandboxHandle:
        """The running sandbox; `LeaseError` while it is paused."""
        if self._handle is None:
            raise LeaseError(f"sandbox {self.id} is paused: call resume_sandbox first")
        return self._handle

    def __repr__(self) -> str:
        return f"<Slot {self.entry}:{self.id} {'paused' if self.paused else 'running'}>"


class McpSession:
    """The sandboxes of one MCP session."""

    def __init__(self, owner: Owner, router: Router, settings: McpSettings) -> None:
        self.owner = owner
        self.settings = settings
        self.last_active = time.monotonic()
        self.closed = False
        self._router = router
        self._slots: dict[str, Slot] = {}
        self._current: str | None = None
        self._opening = asyncio.Lock()

    @property
    def slots(self) -> list[Slot]:
        return list(self._slots.values())

    @property
    def current(self) -> str | None:
        return self._current

    async def open(
        self, requires: Sequence[str] = (), template: str | None = None, ports: Sequence[int] = ()
    ) -> Slot:
        """A new sandbox for the session (it becomes the current one)."""
        self._check_open()
        spec = SandboxSpec(template=template, ports=tuple(ports)) if template or ports else None
        lease = await self._router.aacquire(
            spec, requires=tuple(requires), tenant=self.owner.counted
        )
        return await self._adopt(Slot(lease, self._router.capabilities(lease.entry)))

    async def sandbox(self, sandbox_id: str | None) -> Slot:
        """The sandbox ``sandbox_id`` names, else the current one, else a new one."""
        if sandbox_id is not None:
            return self.slot(sandbox_id)
        async with self._opening:  # two first calls at once open one sandbox, not two
            if self._current is not None:
                return self._slots[self._current]
            return await self.open()

    def slot(self, sandbox_id: str) -> Slot:
        self._check_open()
        found = self._slots.get(sandbox_id)
        if found is None:
            yours = ", ".join(self._slots) or "none open"
            raise InvalidArgument(
                f"sandbox_id {sandbox_id!r}: no such sandbox in this session (yours: {yours})"
            )
        return found

    def process(self, process_id: str, sandbox_id: str | None) -> tuple[Slot, Background]:
        """The background process ``process_id`` (of ``sandbox_id``, or of whichever has it)."""
        slots = [self.slot(sandbox_id)] if sandbox_id is not None else self.slots
        found = [(s, s.processes[process_id]) for s in slots if process_id in s.processes]
        if not found:
            raise InvalidArgument(
                f"process_id {process_id!r}: no process started by start_process with this id"
                + (f" in sandbox {sandbox_id}" if sandbox_id else " in this session")
            )
        if len(found) > 1:
            raise InvalidArgument(
                f"process_id {process_id!r}: several sandboxes have one; give sandbox_id"
            )
        return found[0]

    async def start(
        self, slot: Slot, command: str, env: dict[str, str] | None, cwd: str | None
    ) -> Background:
        process = await slot.handle().start(command, env=env, cwd=cwd)
        started = Background(process, command, self.settings.max_output_chars)
        slot.processes[started.id] = started
        return started

    async def close_sandbox(self, slot: Slot) -> None:
        """Release ``slot``'s sandbox (killing it and its processes)."""
        self._drop(slot)
        await _dispose(self._router, slot)

    async def pause(self, slot: Slot) -> None:
        """Pause the sandbox: its lease ends (metered so far, slot freed), its files stay."""
        lease = slot._lease
        if lease is None:
            raise LeaseError(f"sandbox {slot.id} is already paused")
        slot._token = await lease.pause()
        slot._lease = slot._handle = None
        for background in slot.processes.values():
            background.stop()
        slot.processes.clear()
        if self._current == slot.id:
            self._current = next((s.id for s in reversed(self.slots) if not s.paused), None)

    async def resume(self, slot: Slot) -> None:
        """Wake a paused sandbox under a new lease (the same sandbox id); it becomes current."""
        token = slot._token
        if token is None:
            raise LeaseError(f"sandbox {slot.id} is not paused")
        lease = await self._router.aresume(token)
        slot._token = None
        slot._lease, slot._handle = lease, lease.sandbox
        if self.closed:  # the session ended while the sandbox woke
            await lease.release()
            raise LeaseError("this MCP session ended; the sandbox was released")
        self._current = slot.id

    async def close(self) -> None:
        """End the session: release every sandbox (a paused one is resumed to be released)."""
        self.closed = True
        slots = self.slots
        self._slots.clear()
        self._current = None
        await asyncio.gather(*(_dispose(self._router, slot) for slot in slots))

    async def _adopt(self, slot: Slot) -> Slot:
        if self.closed:  # the session ended while the sandbox opened
            await _dispose(self._router, slot)
            raise LeaseError("this MCP session ended; the sandbox it was opening was released")
        self._slots[slot.id] = slot
        self._current = slot.id
        return slot

    def _drop(self, slot: Slot) -> None:
        self._slots.pop(slot.id, None)
        if self._current == slot.id:
            self._current = next((s.id for s in reversed(self.slots) if not s.paused), None)

    def _check_open(self) -> None:
        if self.closed:
            raise LeaseError("this MCP session has ended; its sandboxes were released")

    def __repr__(self) -> str:
        return f"<McpSession {self.owner.tenant}/{self.owner.session} sandboxes={len(self._slots)}>"


async def _dispose(router: Router, slot: Slot) -> None:
    """Release a slot's lease; a paused sandbox is resumed to be released (its pause record
    goes with it), or killed at its provider when it cannot be resumed now."""
    for background in slot.processes.values():
        background.stop()
    lease, token = slot._lease, slot._token
    slot._lease = slot._handle = None
    slot._token = None
    try:
        if lease is None and token is not None:
            try:
                lease = await router.aresume(token)
            except SandboxRouterError as exc:
                log.warning(
                    "sandbox_router.mcp.paused_kill",
                    entry=slot.entry,
                    sandbox=slot.id,
                    reason=type(exc).__name__,
                )
                await router.provider(slot.entry).kill(slot.id)
                return
        if lease is not None:
            await lease.release()
    except SandboxRouterError as exc:  # the janitor reaps what could not be killed
        log.warning(
            "sandbox_router.mcp.release_failed", entry=slot.entry, sandbox=slot.id, reason=str(exc)
        )


class McpSessions:
    """Every live MCP session of the server, by `Owner`."""

    def __init__(self, router: Router, settings: McpSettings) -> None:
        self.router = router
        self.settings = settings
        self._sessions: dict[Owner, McpSession] = {}
        self._ended: dict[Owner, float] = {}  # for calls still running when theirs ended
        self._inflight: dict[Owner, int] = {}
        self._closing = False

    def get(self, owner: Owner) -> McpSession:
        """The session's sandboxes (a new session has none)."""
        found = self._sessions.get(owner)
        if found is not None:
            return found
        if self._closing:
            raise LeaseError("the MCP server is shutting down")
        if owner in self._ended:
            raise LeaseError("this MCP session has ended; its sandboxes were released")
        made = self._sessions[owner] = McpSession(owner, self.router, self.settings)
        return made

    async def end(self, owner: Owner) -> None:
        """End a session: release its sandboxes."""
        session = self._sessions.pop(owner, None)
        if session is None:
            return
        self._ended[owner] = time.monotonic()
        log.info(
            "sandbox_router.mcp.session_ended", tenant=owner.tenant, sandboxes=len(session.slots)
        )
        await session.close()

    async def close(self) -> None:
        """End every session (the server is stopping); no session starts after."""
        self._closing = True
        await asyncio.gather(*(self.end(owner) for owner in list(self._sessions)))

    # -- activity, for the HTTP transport --------------------------------------
    def enter(self, owner: Owner) -> None:
        self._inflight[owner] = self._inflight.get(owner, 0) + 1

    def leave(self, owner: Owner) -> None:
        left = self._inflight.get(owner, 1) - 1
        if left > 0:
            self._inflight[owner] = left
        else:
            self._inflight.pop(owner, None)
        if (session := self._sessions.get(owner)) is not None:
            session.last_active = time.monotonic()

    def idle_tick(self) -> float:
        """How often `reap` runs: a session ends at most a tick after its idle timeout."""
        return max(0.05, min(self.settings.session_idle_timeout / 10, 5.0))

    async def reap(self, now: float | None = None) -> None:
        """End the sessions no request has touched for ``session_idle_timeout`` and a tick
        (the SDK closed them at the timeout itself)."""
        now = time.monotonic() if now is None else now
        limit = self.settings.session_idle_timeout + self.idle_tick()
        idle = [
            owner
            for owner, session in self._sessions.items()
            if owner not in self._inflight and now - session.last_active >= limit
        ]
        await asyncio.gather(*(self.end(owner) for owner in idle))
        forget = now - 2 * limit
        self._ended = {owner: at for owner, at in self._ended.items() if at > forget}

    async def reaper(self) -> None:
        """`reap` every tick, until cancelled."""
        while True:
            await asyncio.sleep(self.idle_tick())
            await self.reap()


class SessionWatch:
    """ASGI middleware: each request of an HTTP session counted while in flight, and the
    session ended when the client deletes it or the SDK answers that it knows it no more."""

    def __init__(self, app: ASGIApp, sessions: McpSessions) -> None:
        self._app = app
        self._sessions = sessions

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        session_id = _header(scope, SESSION_HEADER) if scope["type"] == "http" else None
        if session_id is None:
            await self._app(scope, receive, send)
            return
        owner = owner_of(scope, session_id)
        status: int | None = None

        async def watched(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        self._sessions.enter(owner)
        try:
            await self._app(scope, receive, watched)
        finally:
            self._sessions.leave(owner)
        deleted = scope["method"] == "DELETE" and status is not None and status < 300
        if deleted or status == 404:
            await self._sessions.end(owner)


def owner_of(scope: Scope, session_id: str) -> Owner:
    """The session under the tenant `router.mcp.auth.BearerGate` put on the request."""
    user = scope.get("user")
    if not isinstance(user, AuthenticatedUser):
        return Owner(LOCAL_TENANT, session_id)
    token = user.access_token
    return Owner(token.client_id, session_id, token=TOKEN_SCOPE in token.scopes)


def _header(scope: Scope, name: str) -> str | None:
    wanted = name.encode()
    for key, value in scope["headers"]:
        if key == wanted:
            return str(value.decode("latin-1"))
    return None
