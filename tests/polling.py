"""Waiting for something another thread does (an emulator, a late create)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable


async def until(condition: Callable[[], object], seconds: float = 5.0) -> None:
    """Poll ``condition`` every 50 ms for up to ``seconds``; the caller asserts after."""
    for _ in range(int(seconds / 0.05)):
        if condition():
            return
        await asyncio.sleep(0.05)
