"""The agent-work API through a lease: streaming, background processes and terminals,
sync and async, on a real local sandbox behind the router's own thread."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from providers.errors import LeaseError
from router import Router
from tests.polling import until


@pytest.fixture
def router(tmp_path: Path) -> Iterator[Router]:
    config = {
        "state_url": "memory://",
        "chain": [{"name": "local", "provider": "local", "options": {"root": str(tmp_path)}}],
    }
    with Router.from_config(config, hooks=[]) as made:
        yield made


def test_sync_streaming_processes_and_terminal(router: Router) -> None:
    with router.acquire(requires=("stream", "process.attach", "pty.resize")) as lease:
        sbx = lease.sandbox
        out: list[str] = []
        err: list[str] = []
        ran = sbx.run("echo out; echo err >&2", on_stdout=out.append, on_stderr=err.append)
        assert (ran.stdout, "".join(out), "".join(err)) == ("out\n", "out\n", "err\n")
        assert sbx.run("tr a-z A-Z", stdin="shout\n").stdout == "SHOUT\n"

        started = time.monotonic()
        chunks = sbx.stream("echo first; sleep 2; echo second")
        assert next(chunks).data == "first\n"
        assert time.monotonic() - started < 1.8  # while the command still runs
        assert [c.data for c in chunks] == ["second\n"]

        cat = sbx.start("cat")
        cat.write_stdin("piped\n")
        cat.close_stdin()
        assert cat.wait(timeout=10).stdout == "piped\n"
        again = sbx.attach(cat.id)
        assert [c.data for c in again.output()] == ["piped\n"]
        assert cat.id in [p.id for p in sbx.processes()]

        tty = sbx.open_terminal(rows=20, cols=60)
        tty.resize(30, 100)
        tty.write("stty size; exit 3\n")
        assert b"30 100" in b"".join(tty.output())
        assert tty.wait(10) == 3


def test_a_released_lease_refuses_process_calls(router: Router) -> None:
    lease = router.acquire()
    sbx = lease.sandbox
    proc = sbx.start("sleep 30")
    tty = sbx.open_terminal()
    lease.release()
    for call in (
        lambda: sbx.start("true"),
        lambda: sbx.stream("true"),
        sbx.processes,
        lambda: sbx.attach(proc.id),
        sbx.open_terminal,
        lambda: sbx.run("true", on_stdout=print),
        proc.wait,
        proc.kill,
        lambda: proc.write_stdin("x"),
        proc.output,
        lambda: tty.write("x"),
        lambda: tty.resize(2, 2),
        tty.output,
    ):
        with pytest.raises(LeaseError, match="already released"):
            call()


async def test_async_callbacks_run_on_the_callers_loop(router: Router) -> None:
    caller = threading.get_ident()
    seen: list[tuple[str, int]] = []

    async def on_stdout(data: str) -> None:
        seen.append((data, threading.get_ident()))

    async with await router.aacquire() as lease:
        sbx = lease.sandbox
        ran = await sbx.run("echo a; sleep 0.2; echo b", on_stdout=on_stdout)
        assert ran.stdout == "a\nb\n"
        assert "".join(data for data, _ in seen) == "a\nb\n"
        assert {thread for _, thread in seen} == {caller}
        router_threads = {t.ident for t in threading.enumerate() if t.name == "sandbox-router"}
        assert router_threads  # the router runs on a thread of its own, not the caller's
        assert caller not in router_threads

        seen.clear()
        proc = await sbx.start("echo bg", on_stdout=on_stdout)
        assert (await proc.wait(timeout=10)).stdout == "bg\n"
        await until(lambda: seen)  # the pump hands the chunk over after the exit
        assert seen == [("bg\n", caller)]
        other = await sbx.attach(proc.id)
        assert [c.data async for c in other.output()] == ["bg\n"]
        assert [c.data async for c in sbx.stream("echo streamed")] == ["streamed\n"]
    with pytest.raises(LeaseError, match="already released"):
        await sbx.start("true")
    with pytest.raises(LeaseError, match="already released"):
        await proc.kill()
