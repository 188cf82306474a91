"""Routers on the private Redis with a scripted failing entry and the real local one."""

from __future__ import annotations

import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from router import Router
from router.testing import ScriptedProvider

RouterFactory = Callable[..., Router]


class Clock:
    """A wall clock the test can move (the router and the collector share it)."""

    def __init__(self, offset: float = 0.0) -> None:
        import time

        self._time = time.time
        self.offset = offset

    def __call__(self) -> float:
        return self._time() + self.offset

    def advance(self, seconds: float) -> None:
        self.offset += seconds


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def chain_config(redis_url: str, key_prefix: str, root: Path, **settings: Any) -> dict[str, Any]:
    """flaky (scripted in tests) then local, each its own pool; small limits."""
    return {
        "state_url": redis_url,
        "key_prefix": key_prefix,
        "create_timeout": 5,
        "acquire_timeout": 30,
        "retry": {"attempts": 3, "initial": 0.01, "maximum": 0.05},
        "breaker": {"failure_threshold": 3, "cooldown_base": 120, "cooldown_max": 600},
        "chain": [
            {
                "name": "flaky",
                "provider": "local",
                "quota": {"sessions": 100, "sandbox_seconds": 36000, "concurrent": 5},
            },
            {
                "name": "local",
                "provider": "local",
                "quota": {"sessions": 12, "sandbox_seconds": 36000, "concurrent": 4},
                "options": {"root": str(root / "local")},
            },
        ],
        **settings,
    }


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def make_router(
    redis_url: str, key_prefix: str, tmp_path: Path, clock: Clock, new_router: RouterFactory
) -> RouterFactory:
    def make(
        script: list[Any] | None = None, *, config: dict[str, Any] | None = None, **settings: Any
    ) -> Router:
        flaky = ScriptedProvider("flaky", tmp_path, script or [])
        return new_router(
            config or chain_config(redis_url, key_prefix, tmp_path, **settings),
            providers={"flaky": flaky},
            clock=clock,
            hooks=[],
        )

    return make
