from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from emulators import emulator_class
from emulators.harness import Emulator
from router import Event, Router
from router.testing import ScriptedProvider

NOW = 1_790_000_000.0


class Clock:
    """A fake wall clock shared by routers (and the tenacity sleep)."""

    def __init__(self, t: float = NOW) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t

    def advance(self, seconds: float) -> None:
        self.t += seconds

    async def sleep(self, seconds: float) -> None:
        self.t += seconds


def fired(events: list[Event], name: str) -> list[dict[str, object]]:
    """The fields of every ``name`` event, in order."""
    return [e.fields for e in events if e.name == name]


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def events() -> list[Event]:
    return []


RouterFactory = Callable[..., Router]


@pytest.fixture
def make_router(
    redis_url: str,
    key_prefix: str,
    tmp_path: Path,
    clock: Clock,
    events: list[Event],
    new_router: RouterFactory,
) -> RouterFactory:
    """Build routers on the private Redis; ``scripted`` maps entry -> script."""

    def make(
        chain: list[dict[str, Any]] | None = None,
        providers: dict[str, ScriptedProvider] | None = None,
        **settings: Any,
    ) -> Router:
        config = {
            "state_url": redis_url,
            "key_prefix": key_prefix,
            "create_timeout": 2,
            "acquire_timeout": 30,
            "retry": {"attempts": 3, "initial": 0.1, "maximum": 1},
            "breaker": {"failure_threshold": 3, "cooldown_base": 30, "cooldown_max": 120},
            "chain": chain
            or [
                {"name": "flaky", "provider": "local"},
                {
                    "name": "local",
                    "provider": "local",
                    "options": {"root": str(tmp_path / "local")},
                },
            ],
            **settings,
        }
        return new_router(
            config,
            providers=providers or {},
            clock=clock,
            sleep=clock.sleep,
            hooks=[events.append],
        )

    return make


@pytest.fixture
def scripted(tmp_path: Path) -> Callable[..., ScriptedProvider]:
    def make(name: str = "flaky", script: list[Any] | None = None, **kw: Any) -> ScriptedProvider:
        return ScriptedProvider(name, tmp_path, script or [], **kw)

    return make


@pytest.fixture(params=("daytona", "e2b", "modal", "runloop"))
def vendor(request: pytest.FixtureRequest) -> Iterator[tuple[str, Emulator]]:
    """Each vendor's name and a running emulator of it."""
    with emulator_class(request.param)() as emu:
        yield request.param, emu
