"""The providers the contract suite runs over: `local`, the scripted fake and the four
vendors' adapters on their real SDKs against the emulators.

Each test of the suite asks for ``backend`` and runs once per provider. An emulator
is started once per module and parameter (pytest groups the tests by it); each test
gets a fresh adapter, and whatever it left alive is killed after it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from emulators import daytona, e2b, emulator_class, modal, runloop
from emulators.daytona import DaytonaEmulator
from emulators.e2b import E2BEmulator
from emulators.harness import Emulator
from emulators.modal import ModalEmulator
from emulators.runloop import RunloopEmulator
from providers.base import Provider, Sandbox, SandboxSpec
from providers.daytona import DaytonaOptions, DaytonaProvider
from providers.e2b import E2BOptions, E2BProvider
from providers.local import HOME, LocalOptions, LocalProvider
from providers.modal import ModalOptions, ModalProvider
from providers.runloop import RunloopOptions, RunloopProvider
from router.testing import ScriptedProvider

VENDORS = ("daytona", "e2b", "modal", "runloop")
PROVIDERS = ("local", "scripted", *VENDORS)


@dataclass
class Backend:
    """One provider under test and what differs between providers by design.

    Attributes:
        home: the directory commands start in, as the sandbox sees it.
        unknown_id: shaped like this provider's sandbox ids, never created.
        template: a template the provider knows; None where templates are ignored.
        emulator: the vendor's emulator; None for ``local`` and ``scripted``.
        only_templates: makes the emulator refuse every template but those given.
    """

    name: str
    kind: str
    provider: Provider
    home: str
    unknown_id: str
    template: str | None = None
    emulator: Emulator | None = None
    only_templates: Callable[[set[str] | None], None] | None = None

    async def create(self, **spec: Any) -> Sandbox:
        return await self.provider.create(SandboxSpec(**spec), timeout=10)


def _local(name: str, emu: Emulator | None, root: Path) -> Backend:
    provider = LocalProvider(name, LocalOptions(root=root))
    return Backend(name, "local", provider, HOME, "local-" + "0" * 16)


def _scripted(name: str, emu: Emulator | None, root: Path) -> Backend:
    return Backend(name, "local", ScriptedProvider(name, root), HOME, "local-" + "0" * 16)


def _daytona(name: str, emu: Emulator | None, root: Path) -> Backend:
    assert isinstance(emu, DaytonaEmulator)
    options = DaytonaOptions(api_key=daytona.TEST_API_KEY, api_url=emu.api_url, request_timeout=5)

    def only(templates: set[str] | None) -> None:
        emu.snapshots = templates

    return Backend(
        name,
        "daytona",
        DaytonaProvider(name, options),
        "/home/daytona",
        "00000000-0000-0000-0000-000000000000",
        "base",
        only_templates=only,
    )


def _e2b(name: str, emu: Emulator | None, root: Path) -> Backend:
    assert isinstance(emu, E2BEmulator)
    options = E2BOptions(
        api_key=e2b.TEST_API_KEY, api_url=emu.url, sandbox_url=emu.url, request_timeout=5
    )

    def only(templates: set[str] | None) -> None:
        emu.templates = templates

    return Backend(
        name, "e2b", E2BProvider(name, options), "/home/user", "i" + "0" * 19, "base",
        only_templates=only,
    )  # fmt: skip


def _modal(name: str, emu: Emulator | None, root: Path) -> Backend:
    assert isinstance(emu, ModalEmulator)
    options = ModalOptions(
        token_id=modal.TEST_TOKEN_ID,
        token_secret=modal.TEST_TOKEN_SECRET,
        server_url=emu.url,
        request_timeout=5,
    )

    def only(templates: set[str] | None) -> None:
        emu.images.allowed = templates

    return Backend(
        name,
        "modal",
        ModalProvider(name, options),
        "/root",
        "sb-" + "x" * 26,
        "python:3.12-slim",
        only_templates=only,
    )


def _runloop(name: str, emu: Emulator | None, root: Path) -> Backend:
    assert isinstance(emu, RunloopEmulator)
    options = RunloopOptions(
        api_key=runloop.TEST_API_KEY, base_url=emu.url, request_timeout=5, pool_shards=1
    )

    def only(templates: set[str] | None) -> None:
        emu.blueprints = templates

    return Backend(
        name,
        "runloop",
        RunloopProvider(name, options),
        "/home/user",
        "dbx_never_made",
        "base",
        only_templates=only,
    )


BUILD: dict[str, Callable[[str, Emulator | None, Path], Backend]] = {
    "local": _local,
    "scripted": _scripted,
    "daytona": _daytona,
    "e2b": _e2b,
    "modal": _modal,
    "runloop": _runloop,
}


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Every provider; only the four vendors for a test that asks for ``vendor``."""
    if "emulated" in metafunc.fixturenames:
        names = VENDORS if "vendor" in metafunc.fixturenames else PROVIDERS
        metafunc.parametrize("emulated", names, indirect=True, scope="module")


@pytest.fixture(scope="module")
def emulated(request: pytest.FixtureRequest) -> Iterator[tuple[str, Emulator | None]]:
    """The provider's name and its emulator, running for the whole module."""
    name: str = request.param
    if name not in VENDORS:
        yield name, None
        return
    with emulator_class(name)() as emu:
        yield name, emu


@pytest.fixture
async def backend(
    emulated: tuple[str, Emulator | None], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[Backend]:
    name, emu = emulated
    if isinstance(emu, ModalEmulator):
        for key, value in emu.sdk_env().items():  # no ~/.modal.toml of the machine's user
            monkeypatch.setenv(key, value)
    made = BUILD[name](name, emu, tmp_path)
    made.emulator = emu
    yield made
    if emu is not None:
        emu.clear_faults()
    if made.only_templates is not None:
        made.only_templates(None)
    for info in await made.provider.list():
        await made.provider.kill(info.id)
    await made.provider.aclose()
    if emu is not None:
        assert emu.alive() == [], "a sandbox outlived its test"


@pytest.fixture
def vendor(backend: Backend) -> Backend:
    """A vendor's adapter, whose emulator can refuse templates and inject faults."""
    return backend
