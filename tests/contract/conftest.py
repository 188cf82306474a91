"""The providers the contract suite runs over: `local`, the scripted fake and the four
vendors' adapters on their real SDKs against the emulators.

Each test of the suite asks for ``backend`` and runs once per provider. An emulator
is started once per module and parameter (pytest groups the tests by it); each test
gets a fresh adapter, and whatever it left alive is killed after it.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from emulators import daytona, e2b, emulator_class, modal, runloop
from emulators.daytona import DaytonaEmulator
from emulators.e2b import E2BEmulator
from emulators.e2b.interpreter import Kernel as E2BKernel
from emulators.harness import Emulator
from emulators.modal import ModalEmulator
from emulators.runloop import RunloopEmulator
from providers.base import PortURL, Provider, Sandbox, SandboxSpec
from providers.daytona import DaytonaOptions, DaytonaProvider
from providers.e2b import E2BOptions, E2BProvider
from providers.local import HOME, LocalOptions, LocalProvider
from providers.modal import ModalOptions, ModalProvider
from providers.runloop import RunloopOptions, RunloopProvider
from router.testing import ScriptedProvider

VENDORS = ("daytona", "e2b", "modal", "runloop")
PROVIDERS = ("local", "scripted", *VENDORS)
LOCAL_ID = "local-" + "0" * 16
UUID0 = "00000000-0000-0000-0000-000000000000"


@dataclass
class Backend:
    """One provider under test and what differs between providers by design.

    Attributes:
        kind: the ``provider:`` of its chain entry in a config.
        home: the directory commands start in, as the sandbox sees it.
        unknown_id: shaped like this provider's sandbox ids, never created.
        template: a template the provider knows; None where templates are ignored.
        emulator: the vendor's emulator; None for ``local`` and ``scripted``.
        code_template: the template to create for `run_code` (a code interpreter
            where the vendor has one).
        templates_at: the object and attribute where the emulator keeps the
            templates it accepts (None: any).
    """

    name: str
    kind: str
    provider: Provider
    home: str
    unknown_id: str
    template: str | None = None
    emulator: Emulator | None = None
    templates_at: tuple[object, str] | None = None
    code_template: str | None = None  # the template whose sandboxes run code (None: any)

    async def create(self, **spec: Any) -> Sandbox:
        return await self.provider.create(SandboxSpec(**spec), timeout=10)

    async def fetch(self, exposed: PortURL, path: str = "/") -> httpx.Response:
        """GET ``path`` from an exposed port as an app would, with the port's headers.

        A wildcard host name the vendor's DNS would point at its edge is sent to
        the emulator's ingress (`Emulator.resolve`), keeping the name as ``Host``.
        """
        url = httpx.URL(exposed.url.rstrip("/") + path)  # the link's own path kept
        headers = dict(exposed.headers)
        target = self.emulator.resolve(url.host) if self.emulator is not None else None
        if target is not None:
            headers["Host"] = url.netloc.decode()
            url = url.copy_with(scheme="http", host=target[0], port=target[1])
        async with httpx.AsyncClient(timeout=5) as client:
            return await client.get(url, headers=headers)

    async def kill_kernel(self, sandbox: Sandbox) -> None:
        """End the sandbox's default code kernel from outside it, as the OOM killer would:
        the vendor's own kernel (E2B's, Daytona's) in its emulator, the router's through
        the kernel's process (`Sandbox.start`'s handle)."""
        if isinstance(self.emulator, E2BEmulator) and self.code_template is not None:
            context = self.emulator.core.e2b[sandbox.id].contexts.default
            await asyncio.to_thread(self.emulator.call, _ended(context.kernel, context.close))
        elif isinstance(self.emulator, DaytonaEmulator):
            interpreter = self.emulator.core.boxes[sandbox.id].interpreter
            assert interpreter is not None
            await asyncio.to_thread(self.emulator.call, interpreter.close())
        else:
            process = sandbox._kernels().process(None)
            assert process is not None
            await process.kill()

    def only_templates(self, templates: set[str] | None) -> None:
        """Make the emulator refuse every template but ``templates`` (None: accept any)."""
        assert self.templates_at is not None
        setattr(*self.templates_at, templates)


async def _ended(kernel: E2BKernel | None, close: Callable[[], None]) -> None:
    """Close an E2B emulator's kernel and wait for its process to end (on its loop)."""
    close()
    if kernel is not None:
        await kernel.process.proc.wait()


def build(name: str, emu: Emulator | None, root: Path) -> Backend:
    """The adapter of provider ``name``, pointed at its emulator ``emu``."""
    if name == "local":
        return Backend(name, "local", LocalProvider(name, LocalOptions(root=root)), HOME, LOCAL_ID)
    if name == "scripted":
        return Backend(name, "local", ScriptedProvider(name, root), HOME, LOCAL_ID)
    if isinstance(emu, DaytonaEmulator):
        opts = DaytonaOptions(api_key=daytona.TEST_API_KEY, api_url=emu.api_url, request_timeout=5)
        made = DaytonaProvider(name, opts)
        return Backend(
            name, "daytona", made, "/home/daytona", UUID0, "base", emu, (emu, "snapshots")
        )
    if isinstance(emu, E2BEmulator):
        url = emu.url
        opts = E2BOptions(api_key=e2b.TEST_API_KEY, api_url=url, sandbox_url=url, request_timeout=5)
        made = E2BProvider(name, opts)
        return Backend(
            name,
            "e2b",
            made,
            "/home/user",
            "i" + "0" * 19,
            "base",
            emu,
            (emu, "templates"),
            code_template="code-interpreter-v1",
        )
    if isinstance(emu, ModalEmulator):
        token = {"token_id": modal.TEST_TOKEN_ID, "token_secret": modal.TEST_TOKEN_SECRET}
        made = ModalProvider(name, ModalOptions(**token, server_url=emu.url, request_timeout=5))
        image, images = "python:3.12-slim", (emu.images, "allowed")
        return Backend(name, "modal", made, "/root", "sb-" + "x" * 26, image, emu, images)
    assert isinstance(emu, RunloopEmulator)
    opts = RunloopOptions(
        api_key=runloop.TEST_API_KEY, base_url=emu.url, request_timeout=5, pool_shards=1
    )
    made = RunloopProvider(name, opts)
    return Backend(
        name, "runloop", made, "/home/user", "dbx_never_made", "base", emu, (emu, "blueprints")
    )


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
    made = build(name, emu, tmp_path)
    yield made
    if emu is not None:
        emu.clear_faults()
    if made.templates_at is not None:
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
