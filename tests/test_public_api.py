"""The public surface is explicit: ``__all__`` is sorted and lists what exists."""

from __future__ import annotations

import importlib

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


def test_policies_do_no_io_and_import_no_sdk() -> None:
    import ast
    from pathlib import Path

    forbidden = {
        "redis", "sqlite3", "socket", "httpx", "aiohttp", "asyncio", "subprocess", "router",
        "daytona", "modal", "e2b", "e2b_code_interpreter", "runloop_api_client",
    }  # fmt: skip
    for path in Path("policies").glob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name.split(".")[0] for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module.split(".")[0]]
            assert not forbidden & set(names), f"{path} imports {forbidden & set(names)}"


def test_no_vendor_sdk_import_outside_providers() -> None:
    import ast
    from pathlib import Path

    sdks = {"daytona", "modal", "e2b", "e2b_code_interpreter", "runloop_api_client"}
    for package in ("router", "policies"):
        for path in Path(package).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Import):
                    roots = {a.name.split(".")[0] for a in node.names}
                elif isinstance(node, ast.ImportFrom) and node.module:
                    roots = {node.module.split(".")[0]}
                else:
                    continue
                assert not roots & sdks, f"{path} imports {roots & sdks}"
