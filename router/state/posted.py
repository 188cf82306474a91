"""Calls started now and answered in a callback: a commit or a free without a task.

After an acquire returns, its lease's commit, and after a release, the free
of its slot, run with nobody waiting for them. As tasks they cost loop steps
and a coroutine stack each, a good part of the router's own CPU per acquire
and release (see benchmarks/RESULTS.md). Posted, the Redis store's script is
written to the socket before the call returns, and the callback that reads
its reply settles a `Posted` future
(`router.state.resp.ScriptConnection.post`).

`then` chains what the ledger and the upkeep do with an answer. On a
`Posted` call that has not landed it folds the step into the call, so the
whole chain runs in the one callback that reads the reply; on anything else
(a store whose calls are coroutines) it is a plain callback on a future.

A caller awaiting a `Posted` may be cancelled before the reply: the call
still ran on the server, so `Posted.after_cancel` hands its answer to
whoever must undo it (a reservation nobody will use), without the task
or the extra loop turn a shield would cost on every call.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar, cast

__all__ = ["Posted", "posted", "then"]

T = TypeVar("T")
U = TypeVar("U")

Answer = Callable[[asyncio.Future[Any]], Any]


class Posted(asyncio.Future[T]):
    """The answer of a call already sent: settled by `land` with what its steps make of
    the finished call."""

    def __init__(self, answer: Answer, *, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(loop=loop)
        self._steps: list[Answer] = [answer]
        self._orphaned: list[Callable[[asyncio.Future[T]], None]] | None = None
        self._orphan: asyncio.Future[Any] | None = None  # the call that landed after a cancel

    def after_cancel(self, orphaned: Callable[[asyncio.Future[T]], None]) -> None:
        """For a caller cancelled while awaiting this call: give ``orphaned`` the call's
        answer (a done future), now if it has landed, else when it lands."""
        if self.done() and not self.cancelled():
            orphaned(self)
        elif self._orphan is not None:
            orphaned(self._answer(self._orphan))
        elif self._orphaned is None:
            self._orphaned = [orphaned]
        else:
            self._orphaned.append(orphaned)

    def fold(self, step: Callable[[asyncio.Future[T]], U]) -> Posted[U]:
        """Apply ``step`` to this call's answer when it lands; the same future, now of
        ``step``'s answer. Only for a call nobody else holds yet (see `then`)."""
        self._steps.append(step)
        return cast(Posted[U], self)

    def land(self, call: asyncio.Future[Any]) -> None:
        """Run the steps on the finished ``call`` and settle with the last one's answer
        (or what it raised). If this future was cancelled meanwhile, the steps run only
        for an `after_cancel` callback (they may act on what they read)."""
        if self.cancelled():
            if self._orphaned is None:
                self._orphan = call
            else:
                answer = self._answer(call)
                for orphaned in self._orphaned:
                    orphaned(answer)
            return
        if self.done():
            return
        answer = self._answer(call)
        if answer.cancelled():
            self.cancel()
        elif answer.exception() is not None:
            self.set_exception(cast(BaseException, answer.exception()))
        else:
            self.set_result(answer.result())

    def _answer(self, call: asyncio.Future[Any]) -> asyncio.Future[Any]:
        """The finished ``call`` through the steps: a done future of the last answer."""
        loop = self.get_loop()
        for step in self._steps:
            answer: asyncio.Future[Any] = loop.create_future()
            try:
                answer.set_result(step(call))
            except asyncio.CancelledError:
                answer.cancel()
                return answer
            except Exception as exc:
                answer.set_exception(exc)
            call = answer
        return call


def then(call: Awaitable[T], step: Callable[[asyncio.Future[T]], U]) -> asyncio.Future[U]:
    """``step`` of ``call``'s finished future, as a future; ``call`` starts now.

    A `Posted` call still in flight takes ``step`` as its own last step (no
    loop turn between them): so ``call`` must be one just made, that no one
    else waits for. A done one, or a coroutine (made a task), gets a callback.
    """
    if isinstance(call, Posted) and not call.done():
        return call.fold(step)
    started = asyncio.ensure_future(call)
    out: Posted[U] = Posted(step, loop=started.get_loop())
    started.add_done_callback(out.land)
    return out


def posted(call: Awaitable[T]) -> Posted[T]:
    """``call`` as a `Posted` future: itself when it is one, else its task's answer
    (a store whose calls are coroutines)."""
    if isinstance(call, Posted):
        return call
    started = asyncio.ensure_future(call)
    out: Posted[T] = Posted(asyncio.Future.result, loop=started.get_loop())
    started.add_done_callback(out.land)
    return out
