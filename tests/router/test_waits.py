"""`until_done`: waiting for a future without owning it."""

from __future__ import annotations

import asyncio

import pytest

from router.waits import until_done


async def test_it_returns_when_the_future_is_done() -> None:
    work = asyncio.ensure_future(asyncio.sleep(0.01, result="made"))
    assert await until_done(work, 5) is True
    assert work.result() == "made"


async def test_a_timeout_leaves_the_future_running() -> None:
    work = asyncio.ensure_future(asyncio.sleep(0.2, result="late"))
    assert await until_done(work, 0.01) is False
    assert not work.done()
    assert await work == "late"


async def test_a_cancelled_waiter_leaves_the_future_running() -> None:
    work = asyncio.ensure_future(asyncio.sleep(0.05, result="kept"))
    waiting = asyncio.ensure_future(until_done(work))
    await asyncio.sleep(0)
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert await work == "kept"


async def test_a_failed_future_is_done_and_keeps_its_error() -> None:
    failed: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    failed.set_exception(OSError("gone"))
    assert await until_done(failed, 1) is True
    with pytest.raises(OSError, match="gone"):
        failed.result()
