"""The router's code kernel (`providers.kernel`) where only its own rules are at stake:
the channel a cell cannot break, the interrupt's escalation, cancellation, a kernel that
cannot start. Run on ``local``; the contract suite holds every provider to the rest."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from providers.base import SandboxSpec
from providers.errors import SandboxError
from providers.kernel.host import source
from providers.local import LocalOptions, LocalProvider, LocalSandbox


@pytest.fixture
async def sandbox(tmp_path: Path) -> AsyncIterator[LocalSandbox]:
    provider = LocalProvider("local", LocalOptions(root=tmp_path))
    made = await provider.create(SandboxSpec(), timeout=10)
    yield made
    await made.kill()


def test_the_program_is_python_3_8() -> None:
    """It runs on the sandbox's Python, which a vendor's image may keep old. Parsed in a
    process of its own: CPython 3.11's AST conversion is not thread-safe
    (python/cpython#106905), and another thread of this one may be converting."""
    check = "import ast, sys; ast.parse(sys.stdin.read(), feature_version=(3, 8))"
    parsed = subprocess.run(
        [sys.executable, "-c", check], input=source(), capture_output=True, text=True, check=False
    )
    assert parsed.returncode == 0, parsed.stderr


async def test_what_a_cell_prints_cannot_break_the_channel(sandbox: LocalSandbox) -> None:
    code = (
        "import os, sys\n"
        'print(\'\\x1esandbox-router:00:{"id": 1, "type": "done"}\')\n'
        "sys.stdout.write('no newline')\n"
        "os.system('echo from a subprocess; echo and its stderr >&2')\n"
        "os.write(1, b'\\x00\\x1b[sandbox-router-drain:x]')\n"
        "print('x' * 300_000)"
    )
    ran = await sandbox.run_code(code)
    assert ran.error is None
    assert ran.stdout.startswith('\x1esandbox-router:00:{"id": 1, "type": "done"}\nno newline')
    assert "from a subprocess\n" in ran.stdout
    assert "\x00\x1b[sandbox-router-drain:x]" in ran.stdout
    assert ran.stdout.endswith("x" * 300_000 + "\n")
    assert ran.stderr == "and its stderr\n"
    assert (await sandbox.run_code("input()")).error.name == "EOFError"  # type: ignore[union-attr]
    elsewhere = (
        "import os\nsaved = os.dup(1)\nos.dup2(os.open('out.txt', os.O_WRONLY | os.O_CREAT), 1)"
    )
    started = time.monotonic()
    assert (await sandbox.run_code(elsewhere)).error is None
    assert time.monotonic() - started < 1.5  # no drain mark waited for, none in the file
    assert (await sandbox.run_code("os.dup2(saved, 1)\nopen('out.txt').read()")).text == ""
    assert (await sandbox.run_code("'still here'")).text == "still here"


async def test_a_cell_that_ignores_its_interrupt_ends_the_kernel(sandbox: LocalSandbox) -> None:
    await sandbox.run_code("kept = 1")
    stubborn = (
        "import time\n"
        "while True:\n"
        "    try:\n"
        "        time.sleep(10)\n"
        "    except KeyboardInterrupt:\n"
        "        pass"
    )
    ran = await sandbox.run_code(stubborn, timeout=1)
    assert (ran.timed_out, ran.stateful) == (True, False)
    assert ran.error is not None
    assert ran.error.name == "TimeoutError"
    assert "did not stop" in ran.error.value
    after = await sandbox.run_code("'kept' in globals()")
    assert (after.text, after.restarted) == ("False", True)


async def test_a_kernel_that_answers_nothing_is_killed(sandbox: LocalSandbox) -> None:
    """C code that holds the GIL: neither the SIGINT nor the kernel's timer can run."""
    started = time.monotonic()
    ran = await sandbox.run_code("sum(range(10**13))", timeout=1)
    assert time.monotonic() - started < 20
    assert (ran.timed_out, ran.stateful) == (True, False)
    assert ran.error is not None
    assert "did not answer" in ran.error.value
    assert (await sandbox.run_code("1 + 1")).restarted


async def test_a_cancelled_call_interrupts_its_cell(sandbox: LocalSandbox) -> None:
    await sandbox.run_code("kept = 'yes'")
    call = asyncio.ensure_future(sandbox.run_code("import time\ntime.sleep(60)", timeout=None))
    await asyncio.sleep(1)
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call
    started = time.monotonic()
    after = await sandbox.run_code("kept", timeout=30)
    assert (after.text, after.restarted) == ("yes", False)
    assert time.monotonic() - started < 10  # the sleep was interrupted, not waited for


async def test_a_kernel_that_cannot_start_is_a_sandbox_error(tmp_path: Path) -> None:
    provider = LocalProvider("local", LocalOptions(root=tmp_path, python="no-such-python3"))
    sandbox = await provider.create(SandboxSpec(), timeout=10)
    try:
        with pytest.raises(SandboxError, match="no-such-python3"):
            await sandbox.run_code("1")
    finally:
        await sandbox.kill()
