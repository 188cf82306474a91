"""Calls started now and answered in a callback: a commit or a free without a task.

After an acquire returns, its lease's commit, and after a release, the free
of its slot, run with nobody waiting for them. As tasks they cost a loop
step and a coroutine stack each (about a tenth of the router's CPU per
acquire and release, see benchmarks/RESULTS.md). Posted, the Redis store's
script is written to the socket before the call returns and its reply is
read by a callback (`router.state.resp.ScriptConnection.post`); `then`
chains what the ledger and the upkeep do with the answer the same way.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

__all__ = ["answered", "then"]

T = TypeVar("T")
U = TypeVar("U")


def answered(
    out: asyncio.Future[T], answer: Callable[[asyncio.Future[Any]], T], call: asyncio.Future[Any]
) -> None:
    """Settle ``out`` with ``answer`` of the finished ``call`` (what it raises included),
    unless ``out`` was cancelled meanwhile."""
    if out.done():
        return
    try:
        out.set_result(answer(call))
    except asyncio.CancelledError:
        out.cancel()
    except Exception as exc:
        out.set_exception(exc)


def then(call: Awaitable[T], answer: Callable[[asyncio.Future[T]], U]) -> asyncio.Future[U]:
    """``answer`` of ``call`` once it is done, as a future.

    ``call`` starts now: a future (a store's posted call) is used as it is, a
    coroutine becomes a task. ``answer`` runs in a callback, not a task.
    """
    started = asyncio.ensure_future(call)
    out: asyncio.Future[U] = started.get_loop().create_future()
    started.add_done_callback(lambda done: answered(out, answer, done))
    return out
