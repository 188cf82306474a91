"""Routers over `local` and the four vendors' emulators for the framework backends' tests.

Each emulator runs once per module (``emulated``, parametrized indirectly over
`PROVIDERS` or `VENDORS`); each test gets routers on its own key prefix, and
leaves no sandbox alive on the emulator or the `local` root.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from emulators import emulator_class
from emulators.harness import Emulator
from emulators.modal import ModalEmulator
from router import Router
from tests.mcp.conftest import VENDORS, local_entry, vendor_entry

PROVIDERS = ("local", *VENDORS)
# E2B's code interpreter template runs E2B's own kernel; the others the router's
CODE_TEMPLATE = {"e2b": "code-interpreter-v1"}

MakeRouter = Callable[..., Router]


@pytest.fixture(scope="module")
def emulated(request: pytest.FixtureRequest) -> Iterator[tuple[str, Emulator | None]]:
    """The provider's name and its emulator (None for `local`), for the whole module."""
    name: str = request.param
    if name == "local":
        yield name, None
        return
    with emulator_class(name)() as emu:
        yield name, emu


@pytest.fixture
def make_router(
    emulated: tuple[str, Emulator | None],
    redis_url: str,
    key_prefix: str,
    tmp_path: Path,
    new_router: Callable[..., Router],
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[MakeRouter]:
    """A router whose first entry is the provider under test; ``failover`` puts `local`
    after it and makes every create on the vendor fail, as an outage does."""
    name, emu = emulated
    if isinstance(emu, ModalEmulator):
        for key, value in emu.sdk_env().items():  # no ~/.modal.toml of the machine's user
            monkeypatch.setenv(key, value)
    local = local_entry(tmp_path / "local")

    def make(*, failover: bool = False, template: str | None = None) -> Router:
        first = local if emu is None else vendor_entry(emu)[0]
        first = {**first, "quota": {"sessions": 100}}
        if template is not None:
            first["template"] = template
        chain = [first]
        if failover:
            assert emu is not None, "failover needs a vendor first"
            emu.inject("create", status=503, times=None, message="service unavailable")
            chain.append({**local_entry(tmp_path / "next"), "name": "next"})
        config: dict[str, Any] = {
            "state_url": redis_url,
            "key_prefix": key_prefix,
            "retry": {"attempts": 1},
            "chain": chain,
        }
        return new_router(config, hooks=[])

    yield make
    if emu is not None:
        emu.clear_faults()
        assert emu.alive() == [], f"a sandbox outlived its test on {name}"


def used(router: Router, entry: str) -> dict[str, float]:
    """The quota units ``entry`` has spent this window (``concurrent``: its live leases)."""
    return dict(next(v for v in router.status().entries if v.name == entry).used)


def gone(tmp_path: Path, sandbox_id: str) -> bool:
    """A `local` sandbox's directory is gone from both entries' roots (killed)."""
    return not any((tmp_path / root / sandbox_id).exists() for root in ("local", "next"))


DOC = Path(__file__).resolve().parents[2] / "docs" / "frameworks.md"
_CLOUD = ("DAYTONA_API_KEY", "RUNLOOP_API_KEY", "MODAL_TOKEN_ID", "MODAL_TOKEN_SECRET",
          "E2B_API_KEY", "SANDBOX_ROUTER_CONFIG", "REDIS_URL")  # fmt: skip


def doc_example(framework: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """The Python block of the framework's section of the doc, with `Router.from_env` set
    to build its default chain as on a machine with no cloud keys (`local`, SQLite)."""
    from tests.test_docs import blocks

    section = DOC.read_text().split(f"## {framework}", 1)[1].split("\n## ", 1)[0]
    [code] = [b.code for b in blocks(section) if b.lang == "python"]
    for key in _CLOUD:
        monkeypatch.delenv(key, raising=False)
    return code
