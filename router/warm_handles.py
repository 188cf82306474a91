"""Handles to warm sandboxes, connected by this replica ahead of its claims.

A warm claim otherwise waits for the vendor's connect (`Provider.connect`):
an API round trip, a few milliseconds against the emulators here and tens
of milliseconds to a vendor's cloud, which is most of a warm hit. So each
replica connects ahead, in the background, to the running warm sandboxes
its acquires may claim, and keeps the one it made itself; a claim that
finds a fresh handle takes it and connects nothing. `policies.warm.reach`
decides which to connect and which to let go; a handle older than
`policies.warm.REACH_FRESH` is not trusted (the connect is what proves the
sandbox still answers), so the claim connects as before.

The cost: one vendor connect per running warm sandbox per replica, again
every ``REACH_FRESH / 2`` seconds while it waits; none for a paused one
(a connect would resume it, and the vendor bill it).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterable, Mapping

from policies.warm import WarmRecord, fresh, reach
from providers.base import Sandbox
from providers.errors import ProviderError
from router.entries import Entry

__all__ = ["WarmHandles"]

_PARALLEL = 8  # connects in flight per pass


class WarmHandles:
    """This replica's handles on warm sandboxes, per entry: sandbox id -> (handle, reached)."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        self._held: dict[str, dict[str, tuple[Sandbox, float]]] = {}
        self._letting_go: set[asyncio.Task[None]] = set()

    def keep(self, entry: str, sandbox: Sandbox) -> None:
        """Hold the handle of a warm sandbox this replica made (reached at its create)."""
        self._held.setdefault(entry, {})[sandbox.id] = (sandbox, self._clock())

    def take(self, entry: str, sandbox_id: str) -> Sandbox | None:
        """The handle of a claimed warm sandbox, when one fresh enough is held."""
        held = self._held.get(entry, {}).pop(sandbox_id, None)
        if held is None:
            return None
        sandbox, reached = held
        if fresh(reached, self._clock()):
            return sandbox
        self._let_go([sandbox])
        return None

    def drop(self, entry: str, sandbox_id: str) -> None:
        """Let go of the handle of a warm sandbox that was killed."""
        held = self._held.get(entry, {}).pop(sandbox_id, None)
        if held is not None:
            self._let_go([held[0]])

    async def reach(self, entry: Entry, records: Mapping[str, WarmRecord]) -> None:
        """Connect to ``entry``'s claimable running warm sandboxes this replica holds
        no fresh handle for, and let go of the handles no claim can use now.

        A sandbox that does not answer is left to the claim, which connects,
        and on failure kills it and goes on (`router.warm.WarmPools.claim`).
        """
        held = self._held.setdefault(entry.name, {})
        due, gone = reach(records, {sid: at for sid, (_, at) in held.items()}, self._clock())
        self._let_go([held.pop(sid)[0] for sid in gone])
        gate = asyncio.Semaphore(_PARALLEL)

        async def one(sandbox_id: str) -> None:
            async with gate:
                with contextlib.suppress(ProviderError):
                    sandbox = await entry.provider.connect(sandbox_id)
                    current = self._held.get(entry.name)
                    if current is None:  # the entry's handles were let go meanwhile
                        self._let_go([sandbox])
                        return
                    old = current.get(sandbox_id)
                    current[sandbox_id] = (sandbox, self._clock())
                    if old is not None:
                        self._let_go([old[0]])

        await asyncio.gather(*(one(sid) for sid in due))

    def retain(self, entries: Iterable[str]) -> None:
        """Let go of every handle of an entry not named (its pool dropped or paused)."""
        kept = set(entries)
        for name in [name for name in self._held if name not in kept]:
            self._let_go([sandbox for sandbox, _ in self._held.pop(name).values()])

    async def close(self) -> None:
        """Let go of every handle and wait for the letting go."""
        self.retain(())
        if self._letting_go:
            await asyncio.gather(*self._letting_go, return_exceptions=True)

    def _let_go(self, sandboxes: list[Sandbox]) -> None:
        for sandbox in sandboxes:
            task = asyncio.ensure_future(_detach(sandbox))
            self._letting_go.add(task)
            task.add_done_callback(self._letting_go.discard)


async def _detach(sandbox: Sandbox) -> None:
    with contextlib.suppress(ProviderError):  # a handle let go has no one to tell
        await sandbox.detach()
