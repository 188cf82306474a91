"""Posted calls: steps folded into the callback that reads the reply, or chained."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from router.state.posted import Posted, then


def finished(value: Any = None, error: Exception | None = None) -> asyncio.Future[Any]:
    done: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
    if error is not None:
        done.set_exception(error)
    else:
        done.set_result(value)
    return done


async def test_steps_fold_into_a_posted_call_and_run_when_it_lands() -> None:
    call: Posted[int] = Posted(lambda c: c.result() + 1, loop=asyncio.get_running_loop())
    tenfold = then(call, lambda c: c.result() * 10)
    assert tenfold is call
    described = then(tenfold, lambda c: f"answer {c.result()}")
    call.land(finished(1))
    assert described.result() == "answer 20"  # in the landing callback, no loop turn


async def test_a_step_sees_what_the_one_before_raised() -> None:
    def refuse(call: asyncio.Future[int]) -> int:
        raise LookupError(f"no such lease {call.result()}")

    def recover(call: asyncio.Future[int]) -> str:
        with pytest.raises(LookupError, match="no such lease 7") as raised:
            call.result()
        return f"recovered from {type(raised.value).__name__}"

    call: Posted[int] = Posted(refuse, loop=asyncio.get_running_loop())
    call.land(finished(7))
    assert call.exception() is not None
    recovered: Posted[int] = Posted(refuse, loop=asyncio.get_running_loop())
    then(recovered, recover).land(finished(7))
    assert recovered.result() == "recovered from LookupError"


async def test_the_call_error_reaches_the_first_step() -> None:
    call: Posted[str] = Posted(lambda c: repr(c.exception()), loop=asyncio.get_running_loop())
    call.land(finished(error=ConnectionError("reset")))
    assert call.result() == "ConnectionError('reset')"


async def test_a_cancelled_call_ignores_its_reply() -> None:
    ran: list[int] = []
    call: Posted[None] = Posted(lambda c: ran.append(c.result()), loop=asyncio.get_running_loop())
    call.cancel()
    call.land(finished(1))
    assert call.cancelled()
    assert ran == []


async def test_a_step_that_raises_cancelled_cancels_the_call() -> None:
    def cancelled(_: asyncio.Future[Any]) -> None:
        raise asyncio.CancelledError

    call: Posted[None] = Posted(cancelled, loop=asyncio.get_running_loop())
    call.land(finished(1))
    assert call.cancelled()


async def test_a_coroutine_or_a_landed_call_is_chained_not_folded() -> None:
    async def answer() -> int:
        await asyncio.sleep(0)
        return 5

    assert await then(answer(), lambda c: c.result() * 2) == 10
    landed: Posted[int] = Posted(lambda c: c.result(), loop=asyncio.get_running_loop())
    landed.land(finished(3))
    chained = then(landed, lambda c: c.result() + 1)
    assert chained is not landed
    assert await chained == 4
    assert landed.result() == 3


async def test_a_cancelled_callers_answer_reaches_after_cancel_however_the_turns_fall() -> None:
    """The server ran the call; whoever undoes it gets the answer whether it landed before
    the cancelled caller's handler ran, after it, or without any cancel taking hold."""
    loop = asyncio.get_running_loop()
    seen: list[Any] = []

    def undo(answer: asyncio.Future[int]) -> None:
        seen.append(answer.result())

    registered_first: Posted[int] = Posted(lambda c: c.result() + 1, loop=loop)
    registered_first.cancel()
    registered_first.after_cancel(undo)
    registered_first.land(finished(1))

    landed_first: Posted[int] = Posted(lambda c: c.result() + 1, loop=loop)
    landed_first.cancel()
    landed_first.land(finished(2))
    landed_first.after_cancel(undo)

    not_cancelled: Posted[int] = Posted(lambda c: c.result() + 1, loop=loop)
    not_cancelled.land(finished(3))  # the reply won the race: the cancel never took
    not_cancelled.after_cancel(undo)
    assert seen == [2, 3, 4]
    assert registered_first.cancelled()
    assert landed_first.cancelled()


async def test_a_task_cancelled_awaiting_a_posted_call_leaves_its_answer_to_undo() -> None:
    loop = asyncio.get_running_loop()
    call: Posted[str] = Posted(lambda c: c.result(), loop=loop)
    undone: list[str] = []

    async def caller() -> str:
        try:
            return await call
        except asyncio.CancelledError:
            call.after_cancel(lambda answer: undone.append(answer.result()))
            raise

    task = asyncio.ensure_future(caller())
    await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    call.land(finished("granted l-1"))
    assert undone == ["granted l-1"]
