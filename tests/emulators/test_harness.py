"""An emulator's own loop: what still runs on it at stop is cancelled, as ``asyncio.run`` does.

Left pending on a closed loop, such a task (a Modal sandbox's exit watcher caught in its
kill) was destroyed by the collector later, in whatever test then ran, with "Task was
destroyed but it is pending!" on the asyncio logger.
"""

from __future__ import annotations

import asyncio
import concurrent.futures

import pytest

from emulators.e2b import E2BEmulator


def test_work_left_on_the_loop_at_stop_is_cancelled() -> None:
    with E2BEmulator(isolation="none") as emu:
        assert emu._loop is not None
        left = asyncio.run_coroutine_threadsafe(asyncio.sleep(3600), emu._loop)
    with pytest.raises(concurrent.futures.CancelledError):
        left.result(timeout=5)
