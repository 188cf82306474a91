"""The public surface is explicit: ``__all__`` is sorted and lists what exists."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

MODULES = ["router", "providers", "providers.base", "providers.errors", "policies", "emulators"]


@pytest.mark.parametrize("name", MODULES)
def test_all_is_sorted_and_resolvable(name: str) -> None:
    module = importlib.import_module(name)
    exported = module.__all__
    assert exported == sorted(exported, key=lambda s: (not s.isupper(), s))
    for attr in exported:
        assert hasattr(module, attr), f"{name}.{attr}"


def test_router_exports() -> None:
    import router

    assert {"Router", "Lease", "AsyncLease", "NoProviderAvailable", "SandboxSpec"} <= set(
        router.__all__
    )


def test_every_error_derives_from_the_one_root() -> None:
    from providers import errors

    for name in errors.__all__:
        cls = getattr(errors, name)
        assert issubclass(cls, errors.SandboxRouterError), name
        assert name in errors.__doc__, f"{name} is missing from the tree in the docstring"


def imported_roots(path: Path) -> set[str]:
    """Top-level packages a module imports (a line scan: ast.parse is avoided on purpose,
    CPython 3.11.7 can fail it late in a long session)."""
    roots = set()
    for line in path.read_text().splitlines():
        match = IMPORT.match(line)
        if match:
            roots.add(match.group(1))
    return roots


IMPORT = re.compile(r"^\s*(?:from|import)\s+([A-Za-z_][A-Za-z0-9_]*)")


def test_policies_do_no_io_and_import_no_sdk() -> None:
    forbidden = {
        "redis", "sqlite3", "socket", "httpx", "aiohttp", "asyncio", "subprocess", "router",
        "daytona", "modal", "e2b", "e2b_code_interpreter", "runloop_api_client",
    }  # fmt: skip
    for path in Path("policies").glob("*.py"):
        assert not forbidden & imported_roots(path), path


def test_no_vendor_sdk_import_outside_providers() -> None:
    sdks = {"daytona", "modal", "e2b", "e2b_code_interpreter", "runloop_api_client"}
    for package in ("router", "policies"):
        for path in Path(package).rglob("*.py"):
            assert not sdks & imported_roots(path), path
