"""Streaming output, background processes, terminals and code: what each provider declares,
it does; what it does not declare, it refuses with `Unsupported`, never silently.

Each test asks the provider's declared capabilities first: a declared one is exercised,
an undeclared one must raise `Unsupported` naming the capability.
"""

from __future__ import annotations

import asyncio
import signal
import time

import pytest

from providers.base import Sandbox
from providers.capabilities import Capability
from providers.errors import NotFound, Unsupported
from providers.processes import OutputChunk
from tests.contract.conftest import Backend


def declares(backend: Backend, capability: Capability) -> bool:
    return capability in backend.provider.capabilities


async def test_stream_first_chunk_arrives_while_the_command_runs(backend: Backend) -> None:
    sbx = await backend.create()
    try:
        if not declares(backend, Capability.STREAM):
            with pytest.raises(Unsupported, match="process"):
                async for _ in sbx.stream("echo x"):
                    pass
            return
        started = time.monotonic()
        chunks = sbx.stream("echo first; sleep 2; echo second >&2")
        first = await anext(chunks)
        assert first == OutputChunk("stdout", "first\n")
        assert time.monotonic() - started < 1.8  # before the sleep ended
        rest = [chunk async for chunk in chunks]
        assert "".join(c.data for c in rest if c.stream == "stderr") == "second\n"
    finally:
        await sbx.kill()


async def test_stream_run_with_callbacks_and_stdin(backend: Backend) -> None:
    sbx = await backend.create()
    try:
        out: list[str] = []
        err: list[str] = []

        async def on_err(data: str) -> None:
            err.append(data)

        if not declares(backend, Capability.STREAM):
            with pytest.raises(Unsupported):
                await sbx.run_streaming("echo a", on_stdout=out.append)
            return
        ran = await sbx.run_streaming(
            "echo out; echo err >&2; exit 4", on_stdout=out.append, on_stderr=on_err
        )
        assert (ran.stdout, ran.stderr, ran.exit_code) == ("out\n", "err\n", 4)
        assert ("".join(out), "".join(err)) == ("out\n", "err\n")
        if declares(backend, Capability.STDIN):
            fed = await sbx.run_streaming("tr a-z A-Z", stdin="shout\n")
            assert fed.stdout == "SHOUT\n"
        slow = await sbx.run_streaming("echo begun; sleep 30", timeout=1, on_stdout=out.append)
        assert slow.timed_out
        assert "begun\n" in out
    finally:
        await sbx.kill()


async def test_process_start_wait_stdin_and_kill(backend: Backend) -> None:
    sbx = await backend.create()
    try:
        if not declares(backend, Capability.PROCESS):
            with pytest.raises(Unsupported, match="process"):
                await sbx.start("sleep 1")
            return
        proc = await sbx.start("echo $WHO at $(pwd)", env={"WHO": "bg"}, cwd="/tmp")
        assert proc.id
        done = await proc.wait(timeout=10)
        assert (done.stdout, done.exit_code, done.timed_out) == ("bg at /tmp\n", 0, False)
        assert proc.finished

        if declares(backend, Capability.STDIN):
            cat = await sbx.start("cat")
            await cat.write_stdin("line one\n")
            await cat.write_stdin(b"line two\n")
            await cat.close_stdin()
            assert (await cat.wait(timeout=10)).stdout == "line one\nline two\n"
        else:
            sleeper = await sbx.start("sleep 5")
            with pytest.raises(Unsupported, match="stdin"):
                await sleeper.write_stdin("x")
            await sleeper.kill()

        long = await sbx.start("echo up; sleep 60")
        if declares(backend, Capability.PROCESS_KILL):
            first = await anext(long.output())
            assert first.data == "up\n"
            assert await long.kill() is True
            ended = await long.wait(timeout=10)
            assert ended.exit_code != 0
            assert not ended.timed_out
            assert await long.kill() is False
        else:
            with pytest.raises(Unsupported, match=r"process\.kill"):
                await long.kill()
        timed = await sbx.start("sleep 60")
        if declares(backend, Capability.PROCESS_KILL):
            assert (await timed.wait(timeout=0.5)).timed_out
    finally:
        await sbx.kill()


async def test_a_killed_process_or_terminal_ends_with_128_plus_the_signal(
    backend: Backend,
) -> None:
    """A kill is SIGKILL, so every provider reports 137, as a shell reports a command a
    signal ended (E2B's envd says -1 and "signal: killed": the adapter maps it); a
    command that a signal ends on its own, the same."""
    sbx = await backend.create()
    try:
        assert (await sbx.run("kill -TERM $$")).exit_code == 128 + signal.SIGTERM
        if declares(backend, Capability.PROCESS_KILL):
            long = await sbx.start("echo up; sleep 60")
            assert (await anext(long.output())).data == "up\n"
            assert await long.kill() is True
            assert (await long.wait(timeout=10)).exit_code == 128 + signal.SIGKILL
        if declares(backend, Capability.PTY):
            tty = await sbx.open_terminal()
            output, seen = tty.output(), bytearray()
            await tty.write("echo ready\n")
            await asyncio.wait_for(_read_until(output, b"ready\r\n", seen), 10)
            assert await tty.kill() is True
            assert await tty.wait(10) == 128 + signal.SIGKILL
    finally:
        await sbx.kill()


async def test_process_list_and_attach_from_another_handle(backend: Backend) -> None:
    sbx = await backend.create()
    try:
        listing = declares(backend, Capability.PROCESS_LIST)
        attaching = declares(backend, Capability.PROCESS_ATTACH)
        if not listing:
            with pytest.raises(Unsupported, match=r"process\.list"):
                await sbx.processes()
        if not attaching:
            with pytest.raises(Unsupported, match=r"process\.attach"):
                await sbx.attach("1")
        if not (listing or attaching):
            return
        proc = await sbx.start("echo early; sleep 2; echo late")
        if listing:
            found = {p.id: p for p in await sbx.processes()}
            assert proc.id in found
            assert found[proc.id].running
        if attaching:
            other: Sandbox = await backend.provider.connect(sbx.id)  # another replica
            again = await other.attach(proc.id)
            seen = "".join([chunk.data async for chunk in again.output()])
            assert seen.endswith("late\n")
            assert (await again.wait(timeout=10)).exit_code == 0
            with pytest.raises(NotFound):
                await other.attach("999999" if backend.kind != "runloop" else "exe_none")
    finally:
        await sbx.kill()


async def _read_until(output: object, needle: bytes, seen: bytearray) -> None:
    async for data in output:  # type: ignore[attr-defined]
        seen.extend(data)
        if needle in seen:
            return


async def test_pty_size_env_cwd_input_resize(backend: Backend) -> None:
    sbx = await backend.create()
    try:
        if not declares(backend, Capability.PTY):
            with pytest.raises(Unsupported, match="pty"):
                await sbx.open_terminal()
            return
        tty = await sbx.open_terminal(rows=24, cols=80, env={"MOOD": "calm"}, cwd="/tmp")
        seen = bytearray()
        output = tty.output()
        await tty.write("echo mood=$MOOD; pwd; stty size\n")
        await asyncio.wait_for(_read_until(output, b"24 80", seen), 10)
        assert b"mood=calm" in seen
        assert b"/tmp" in seen
        if declares(backend, Capability.PTY_RESIZE):
            await tty.resize(30, 100)
            await tty.write("stty size\n")
            await asyncio.wait_for(_read_until(output, b"30 100", seen), 10)
        else:
            with pytest.raises(Unsupported, match=r"pty\.resize"):
                await tty.resize(30, 100)
        await tty.write("exit 3\n")
        assert await tty.wait(10) == 3
        assert await tty.kill() is False
    finally:
        await sbx.kill()


async def test_run_code_says_whether_a_kernel_kept_state(backend: Backend) -> None:
    sbx = await backend.create(template=backend.code_template)
    try:
        await sbx.run_code("kept = 41")
        again = await sbx.run_code("print(kept + 1)")
        if declares(backend, Capability.STATEFUL_CODE):
            assert (again.stdout, again.stateful) == ("42\n", True)
        else:
            assert again.stateful is False
            assert again.error is not None
            assert "kept" in again.error
    finally:
        await sbx.kill()
