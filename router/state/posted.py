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
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar, cast

__all__ = ["Posted", "then"]

T = TypeVar("T")
U = TypeVar("U")

Answer = Callable[[asyncio.Future[Any]], Any]


class Posted(asyncio.Future[T]):
    """The answer of a call already sent: settled by `land` with what its steps make of
    the finished call."""

    def __init__(self, answer: Answer, *, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(loop=loop)
        self._steps: list[Answer] = [answer]

    def fold(self, step: Callable[[asyncio.Future[T]], U]) -> Posted[U]:
        """Apply ``step`` to this call's answer when it lands; the same future, now of
        ``step``'s answer. Only for a call nobody else holds yet (see `then`)."""
        self._steps.append(step)
        return cast(Posted[U], self)

    def land(self, call: asyncio.Future[Any]) -> None:
        """Run the steps on the finished ``call`` and settle with the last one's answer
        (or what it raised), unless this future was cancelled meanwhile."""
        if self.done():
            return
        loop = self.get_loop()
        for step in self._steps:
            answer: asyncio.Future[Any] = loop.create_future()
            try:
                answer.set_result(step(call))
            except asyncio.CancelledError:
                self.cancel()
                return
            except Exception as exc:
                answer.set_exception(exc)
            call = answer
        if call.exception() is not None:
            self.set_exception(cast(BaseException, call.exception()))
        else:
            self.set_result(call.result())


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
