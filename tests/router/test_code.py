"""The code interpreter through a lease, both APIs: contexts, state, rich results.

The behaviour of each provider is the contract suite's (tests/contract/test_code.py);
here the handle's own part: the sync twin derived from the async handle, and the
context a handle hands out working on that handle only.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from providers.base import SandboxSpec
from providers.errors import SandboxError, Unsupported
from router import CodeContext, Router
from router.testing import ScriptedProvider


def _config(root: Path) -> dict[str, object]:
    return {
        "state_url": "memory://",
        "chain": [{"name": "local", "provider": "local", "options": {"root": str(root)}}],
    }


def test_sync_handle_keeps_state_and_contexts(tmp_path: Path) -> None:
    with (
        Router.from_config(_config(tmp_path), hooks=[]) as router,
        router.acquire(requires=("run_code.stateful",)) as lease,
    ):
        box = lease.sandbox
        assert box.run_code("x = 20").stateful
        ran = box.run_code("print('seen')\nx * 2 + 2")
        assert (ran.stdout, ran.text, ran.results[0].is_main_result) == ("seen\n", "42", True)
        ctx = box.code_context()
        assert isinstance(ctx, CodeContext)
        assert box.run_code("x", context=ctx).error == "NameError: name 'x' is not defined"
        assert box.run_code("import os\nos.environ['V']", env={"V": "v"}).text == "v"
        box.remove_code_context(ctx)
        with pytest.raises(SandboxError, match="no code context"):
            box.run_code("1", context=ctx)


async def test_async_handle_keeps_state_and_contexts(tmp_path: Path) -> None:
    async with (
        Router.from_config(_config(tmp_path), hooks=[]) as router,
        await router.aacquire() as lease,
    ):
        box = lease.sandbox
        await box.run_code("y = 1")
        ctx = await box.code_context(cwd="/tmp")
        await box.run_code("y = 2", context=ctx)
        assert (await box.run_code("y")).text == "1"
        assert (await box.run_code("y", context=ctx)).text == "2"
        assert (await box.run_code("import os; os.getcwd()", context=ctx)).text == "/tmp"


async def test_an_entry_without_processes_runs_code_once_per_call(tmp_path: Path) -> None:
    """No background process, no kernel: each call a new interpreter, said in the result,
    and a context has nothing to run in."""
    plain = ScriptedProvider("plain", tmp_path, capabilities={"run_code"})
    sandbox = await plain.create(SandboxSpec(), timeout=10)
    try:
        await sandbox.run_code("x = 1")
        again = await sandbox.run_code("x")
        assert (again.stateful, again.error) == (False, "NameError: name 'x' is not defined")
        context = await sandbox.code_context()
        with pytest.raises(Unsupported, match=r"run_code\.stateful"):
            await sandbox.run_code("1", context=context)
    finally:
        await sandbox.kill()
