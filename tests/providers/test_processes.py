"""The process and terminal handles every adapter feeds (providers.processes)."""

from __future__ import annotations

import asyncio

import pytest

from providers.errors import SandboxError, Unsupported
from providers.processes import (
    Capability,
    OutputChunk,
    ProcessBase,
    ProcessResult,
    TerminalBase,
    deliver,
)


class Fed(ProcessBase):
    killed = 0

    async def kill(self) -> bool:
        self.killed += 1
        self._finish(-9)
        return True


class Tty(TerminalBase):
    async def write(self, data: str | bytes) -> None:
        self._feed(data.encode() if isinstance(data, str) else data)

    async def kill(self) -> bool:
        self._finish(-9)
        return True


async def test_output_arrives_in_order_and_wait_collects_it() -> None:
    proc = Fed("p1", "local")
    reader = asyncio.create_task(_read(proc))
    proc._feed("stdout", "a")
    await asyncio.sleep(0)
    proc._feed("stderr", "b")
    proc._feed("stdout", "")  # nothing is no chunk
    proc._finish(3)
    proc._feed("stdout", "late")  # after the exit: dropped
    assert await reader == [OutputChunk("stdout", "a"), OutputChunk("stderr", "b")]
    result = await proc.wait()
    assert (result.stdout, result.stderr, result.exit_code) == ("a", "b", 3)
    assert not result.timed_out


async def _read(proc: ProcessBase) -> list[OutputChunk]:
    return [chunk async for chunk in proc.output()]


async def test_discarded_output_still_streams_but_is_not_kept_for_wait() -> None:
    proc = Fed("p1", "local")
    proc._feed("stdout", "before")
    proc.discard_output()
    proc._feed("stdout", "after")
    proc._finish(0)
    assert [c.data for c in await _read(proc)] == ["before", "after"]
    assert (await proc.wait()).stdout == ""


async def test_wait_past_its_timeout_kills_and_says_so() -> None:
    proc = Fed("p2", "local")
    proc._feed("stdout", "partial")
    result = await proc.wait(timeout=0.01)
    assert result == ProcessResult("partial", "", -9, result.duration, timed_out=True)
    assert proc.killed == 1


async def test_a_failed_stream_fails_its_reader() -> None:
    proc = Fed("p3", "e2b")
    proc._fail(ConnectionError("stream broke"))
    with pytest.raises(ConnectionError):
        await _read(proc)


async def test_stdin_is_unsupported_unless_the_adapter_says_otherwise() -> None:
    proc = Fed("p4", "modal")
    with pytest.raises(Unsupported, match=r"modal does not support stdin") as caught:
        await proc.write_stdin("x")
    assert isinstance(caught.value, SandboxError)  # never a failover
    assert caught.value.capability == Capability.STDIN


async def test_a_terminal_echoes_until_it_exits_and_cannot_resize_by_default() -> None:
    tty = Tty("t1", "modal")
    await tty.write("ls\n")
    await tty.kill()
    assert [piece async for piece in tty.output()] == [b"ls\n"]
    assert await tty.wait(1) == -9
    with pytest.raises(Unsupported, match=r"pty\.resize"):
        await tty.resize(10, 40)


async def test_callbacks_may_be_plain_or_async() -> None:
    seen: list[str] = []

    async def later(data: str) -> None:
        seen.append("async " + data)

    await deliver(seen.append, "plain")
    await deliver(later, "x")
    await deliver(None, "nobody")
    assert seen == ["plain", "async x"]
