"""pytest fixtures starting the emulators, for this project and for users' CI.

Opt-in, so installing the package changes no one's pytest runs: load it with
``pytest -p emulators.pytest_plugin`` or a ``pytest_plugins =
["emulators.pytest_plugin"]`` line in a top-level ``conftest.py``. A test then
asks for ``e2b_emulator`` (or ``daytona_emulator``, ``runloop_emulator``,
``modal_emulator``) and gets a running emulator on a free loopback port,
stopped after the test with every sandbox it made killed.

PYTEST_DONT_REWRITE: the fixtures assert nothing, and a conftest that imported
the module before naming it in ``pytest_plugins`` gets no warning.
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
