"""pytest fixtures starting the emulators, for this project and for users' CI.

Installed as a pytest plugin (entry point ``sandbox_router_emulators``): a
test asks for ``e2b_emulator`` (or ``daytona_emulator``, ``runloop_emulator``,
``modal_emulator``) and gets a running emulator on a free loopback port,
stopped after the test with every sandbox it made killed.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from emulators import emulator_class
from emulators.harness import Emulator


def _run(name: str) -> Iterator[Emulator]:
    with emulator_class(name)() as emu:
        yield emu


@pytest.fixture
def daytona_emulator() -> Iterator[Emulator]:
    yield from _run("daytona")


@pytest.fixture
def runloop_emulator() -> Iterator[Emulator]:
    yield from _run("runloop")


@pytest.fixture
def modal_emulator() -> Iterator[Emulator]:
    yield from _run("modal")


@pytest.fixture
def e2b_emulator() -> Iterator[Emulator]:
    yield from _run("e2b")
