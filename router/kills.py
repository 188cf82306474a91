"""Kills tried again: a kill that fails is an event, and is retried in the background.

Backing off from 0.5 s to 30 s (full jitter, as a create's retries), for
`KILL_RETRY_FOR` seconds of the router's clock at most; then, or when the
router closes (after one last try), the sandbox is left to the reaper,
which kills it as an orphan (`router.janitor`). A sandbox whose kill fails
is one no lease or binding holds, so a retry never kills under another
lease.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import tenacity

from policies.retry import RetryPolicy, StopAtDeadline
from providers.base import Sandbox
from router.context import Context
from router.entries import Entry
from router.events import KillAbandoned, KillFailed

__all__ = ["KILL_RETRY_FOR", "Kills"]

KILL_RETRY_FOR = 600.0  # seconds a failed kill is tried again before the reaper gets it
_KILL_BACKOFF = RetryPolicy(initial=0.5, maximum=30.0)  # full jitter, as a create's retries
_LAST_KILL = 5.0  # seconds the last tries of the kills still failing take at close


@dataclass(slots=True)
class _Killing:
    """A kill being tried again: how, how often so far, and its last error."""

    entry: str
    sandbox_id: str
    kill: Callable[[], Awaitable[object]]
    attempts: int
    error: str
    task: asyncio.Task[None] | None = None


class Kills:
    """The kills of this router's sandboxes, and the failed ones being tried again."""

    def __init__(self, ctx: Context) -> None:
        self._ctx = ctx
        self._killing: dict[tuple[str, str], _Killing] = {}  # (entry, sandbox id) -> retries

    async def kill(self, entry: Entry, sandbox: Sandbox) -> None:
        """Kill; a failure is an event and is tried again in the background (`_kill`),
        not the caller's error."""
        await self._kill(entry, sandbox.id, sandbox.kill)

    async def kill_id(self, entry: Entry, sandbox_id: str) -> None:
        """`kill` by id through the provider (a sandbox no handle was made for)."""
        await self._kill(entry, sandbox_id, functools.partial(entry.provider.kill, sandbox_id))

    async def _kill(
        self, entry: Entry, sandbox_id: str, kill: Callable[[], Awaitable[object]]
    ) -> None:
        try:
            await kill()
        except Exception as exc:
            self._ctx.emit(KillFailed(entry.name, sandbox_id, str(exc), 1))
            key = (entry.name, sandbox_id)
            if key not in self._killing:
                killing = _Killing(entry.name, sandbox_id, kill, 1, str(exc))
                self._killing[key] = killing
                killing.task = asyncio.create_task(self._kill_again(killing, exc))
                killing.task.add_done_callback(lambda _: self._killing.pop(key, None))

    async def _kill_again(self, killing: _Killing, first: Exception) -> None:
        """Try a failed kill again, backing off (0.5 s to 30 s, full jitter), until it
        lands or `KILL_RETRY_FOR` seconds of the router's clock have passed; then the
        reaper gets it. Every failure is a `KillFailed`, the end a `KillAbandoned`."""
        retrying = tenacity.AsyncRetrying(
            stop=StopAtDeadline(self._ctx.clock() + KILL_RETRY_FOR, self._ctx.clock),
            wait=_KILL_BACKOFF.wait(),
            after=functools.partial(self._kill_failed, killing),
            reraise=True,
        )
        error: Exception | None = first
        try:
            async for attempt in retrying:
                with attempt:
                    if error is not None:  # the first try's error is tenacity's attempt 1
                        failed, error = error, None
                        raise failed
                    await killing.kill()
        except Exception:
            self._ctx.emit(
                KillAbandoned(
                    killing.entry,
                    killing.sandbox_id,
                    killing.attempts,
                    killing.error,
                    "retries_ended",
                )
            )

    def _kill_failed(self, killing: _Killing, state: tenacity.RetryCallState) -> None:
        if state.attempt_number == 1 or state.outcome is None:
            return  # the first failure was told when it happened
        killing.attempts, killing.error = state.attempt_number, str(state.outcome.exception())
        self._ctx.emit(
            KillFailed(killing.entry, killing.sandbox_id, killing.error, killing.attempts)
        )

    async def close(self) -> None:
        """At close: stop trying the failed kills again, try each once more (5 s at most
        for all), and leave the ones still failing to the reaper (`KillAbandoned`,
        reason ``closed``): their sandboxes are orphans, no lease holds them."""
        killing = list(self._killing.values())
        for each in killing:
            if each.task is not None:
                each.task.cancel()
        await asyncio.gather(*(k.task for k in killing if k.task), return_exceptions=True)

        async def last(each: _Killing) -> None:
            try:
                await asyncio.wait_for(each.kill(), _LAST_KILL)
            except Exception as exc:
                abandoned = KillAbandoned(
                    each.entry, each.sandbox_id, each.attempts + 1, str(exc), "closed"
                )
                self._ctx.emit(abandoned)

        await asyncio.gather(*(last(each) for each in killing))
