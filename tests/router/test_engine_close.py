"""Closing a router's own loop ends what still ran on it, as ``asyncio.run`` does.

A lease the app still held at ``close`` keeps a `local` process's follower (with its output
files open) and a kernel's reader on the loop. Stopping the loop without cancelling them left
each to be destroyed pending by the collector ("Task was destroyed but it is pending!" on
the app's stderr) with their files left open.
"""

from __future__ import annotations

import gc
import logging
from pathlib import Path

import pytest

from router import Router


def test_close_cancels_the_tasks_left_on_the_loop(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    config = {
        "chain": [{"name": "local", "provider": "local", "options": {"root": str(tmp_path)}}],
        "state_url": "memory://",
    }
    gc.collect()  # what earlier tests in this worker left (a vendor SDK's failed connect)
    caplog.clear()
    router = Router.from_config(config)
    lease = router.acquire()
    assert lease.sandbox.run_code("1 + 1").text == "2"
    process = lease.sandbox.start("sleep 30")
    loop = router._engine.loop
    router.close()
    with caplog.at_level(logging.ERROR, logger="asyncio"):
        del process, lease
        gc.collect()
    assert [r.getMessage() for r in caplog.records] == []
    assert loop.is_closed()
    with Router.from_config(config) as after:  # the sandbox the app left: no lease holds it
        assert len(after.reap().killed) == 1
