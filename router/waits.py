"""Waiting for a future the waiter does not own.

A create, a kill or a free runs as a task or a posted call of its own, so
that a caller who is cancelled or gives up does not cut it off: upkeep
counts, kills or frees what it leaves. `until_done` is the wait for one
such future: `asyncio.wait` on one future with a timeout, or
`asyncio.shield` without one, minus their sets, checks and extra futures;
it is on every acquire and release.
"""

from __future__ import annotations

import asyncio
from typing import Any

__all__ = ["until_done"]


async def until_done(future: asyncio.Future[Any], timeout: float | None = None) -> bool:
    """Wait until ``future`` is done, for ``timeout`` seconds at most; True when it is.

    Neither the waiter's cancellation nor the timeout touches ``future``.
    """
    if future.done():
        return True
    loop = asyncio.get_running_loop()
    waiter = loop.create_future()

    def wake(_: object = None) -> None:
        if not waiter.done():
            waiter.set_result(None)

    future.add_done_callback(wake)
    timer = None if timeout is None else loop.call_later(timeout, wake)
    try:
        await waiter
    finally:
        if timer is not None:
            timer.cancel()
        future.remove_done_callback(wake)
    return future.done()
