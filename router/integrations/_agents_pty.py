"""The OpenAI Agents SDK's PTY sessions (``exec_command`` / ``write_stdin``) on router handles.

A command the model leaves running keeps a small integer id the model writes to; its output is
gathered in the background and handed back in slices bounded by the SDK's yield time and token
budget (`collect_pty_output`, the SDK's own, as its E2B backend does). ``tty`` runs the command
typed into an interactive shell on a terminal (``pty``), else as a background process
(``process``): its stdin is closed to the model, as on the SDK's E2B backend.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from dataclasses import dataclass, field

from agents.sandbox.session.pty_output import collect_pty_output
from agents.sandbox.session.pty_types import (
    PTY_PROCESSES_MAX,
    PtyExecUpdate,
    allocate_pty_process_id,
    process_id_to_prune_from_meta,
)

from providers.errors import SandboxRouterError
from router.processes import AsyncProcess, AsyncTerminal

__all__ = ["PtyTable"]


@dataclass(eq=False)
class _Pty:
    handle: AsyncProcess | AsyncTerminal
    chunks: deque[bytes] = field(default_factory=deque)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    notify: asyncio.Event = field(default_factory=asyncio.Event)
    closed: asyncio.Event = field(default_factory=asyncio.Event)
    exit_code: int | None = None
    last_used: float = field(default_factory=time.monotonic)
    pump: asyncio.Task[None] | None = None

    async def _append(self, data: bytes) -> None:
        async with self.lock:
            self.chunks.append(data)
        self.notify.set()

    async def run_pump(self) -> None:
        """Gather the output until it ends, then its exit code (-1 when the handle failed)."""
        code = -1
        try:
            if isinstance(self.handle, AsyncTerminal):
                async for data in self.handle.output():
                    await self._append(data)
                code = await self.handle.wait()
            else:
                async for chunk in self.handle.output():
                    await self._append(chunk.data.encode("utf-8", errors="replace"))
                code = (await self.handle.wait()).exit_code
        except SandboxRouterError:
            pass
        self.exit_code = code
        async with self.lock:  # behind an append still running
            pass
        self.closed.set()
        self.notify.set()

    async def kill(self) -> None:
        if not self.closed.is_set():
            with contextlib.suppress(SandboxRouterError):
                await self.handle.kill()
        if self.pump is not None:
            self.pump.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.pump


class PtyTable:
    """A session's live PTY commands by the id the model sees."""

    def __init__(self) -> None:
        self._entries: dict[int, _Pty] = {}
        self._lock = asyncio.Lock()

    async def add(self, handle: AsyncProcess | AsyncTerminal) -> int:
        entry = _Pty(handle)
        entry.pump = asyncio.create_task(entry.run_pump())
        async with self._lock:
            process_id = allocate_pty_process_id(set(self._entries))
            self._entries[process_id] = entry
            pruned = self._prune()
        if pruned is not None:
            await pruned.kill()
        return process_id

    def _prune(self) -> _Pty | None:
        if len(self._entries) <= PTY_PROCESSES_MAX:
            return None
        meta = [(pid, e.last_used, e.closed.is_set()) for pid, e in self._entries.items()]
        oldest = process_id_to_prune_from_meta(meta)
        return None if oldest is None else self._entries.pop(oldest, None)

    async def get(self, process_id: int) -> _Pty | None:
        async with self._lock:
            return self._entries.get(process_id)

    async def update(
        self, process_id: int, yield_time_ms: int, max_output_tokens: int | None
    ) -> PtyExecUpdate:
        """The output gathered until the yield time passes or the command ends."""
        entry = self._entries[process_id]
        output, tokens, closed = await collect_pty_output(
            output_chunks=entry.chunks,
            output_lock=entry.lock,
            output_notify=entry.notify,
            is_done=entry.closed.is_set,
            yield_time_ms=yield_time_ms,
            max_output_tokens=max_output_tokens,
        )
        entry.last_used = time.monotonic()
        if not closed:
            return PtyExecUpdate(process_id, output, None, tokens)
        async with self._lock:
            self._entries.pop(process_id, None)
        await entry.kill()
        return PtyExecUpdate(None, output, entry.exit_code, tokens)

    async def close_all(self) -> None:
        async with self._lock:
            entries = list(self._entries.values())
            self._entries.clear()
        for entry in entries:
            await entry.kill()
