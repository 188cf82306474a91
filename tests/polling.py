"""Waiting for something another thread does (an emulator, a late create)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable


async def until(condition: Callable[[], object], seconds: float = 5.0) -> None:
    """Poll ``condition`` every 50 ms for up to ``seconds``; the caller asserts after."""
    for _ in range(int(seconds / 0.05)):
        if condition():
            return
        await asyncio.sleep(0.05)


def wait_until(condition: Callable[[], object], seconds: float = 5.0) -> None:
    """`until` for a test's own thread: poll every 10 ms for up to ``seconds``."""
    deadline = time.monotonic() + seconds
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.01)
