"""The public surface is explicit: ``__all__`` is sorted and lists what exists."""

from __future__ import annotations

import collections.abc
import importlib
import inspect
import re
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any

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


TREE_LINE = re.compile(r"^(?P<indent>[ │]*)[├└]── (?P<name>\w+)")


def test_the_error_tree_is_drawn_once_whole_and_as_the_classes_derive() -> None:
    """The docstring of `providers.errors` draws every class of the tree under its
    parent, and that module defines them all: the router's and the providers' alike."""
    import router
    from providers import errors

    assert errors.__doc__ is not None
    drawn: dict[str, str] = {}
    parents = ["SandboxRouterError"]
    for line in errors.__doc__.splitlines():
        match = TREE_LINE.match(line.strip("\n")[4:])
        if match:
            depth = len(match["indent"]) // 4
            del parents[depth + 1 :]
            drawn[match["name"]] = parents[depth]
            parents.append(match["name"])
    defined = {
        name: cls
        for name, cls in vars(errors).items()
        if isinstance(cls, type)
        and issubclass(cls, errors.SandboxRouterError)
        and cls.__module__ == errors.__name__
        and cls is not errors.SandboxRouterError
    }
    assert set(drawn) == set(defined), "drawn and defined differ"
    for name, cls in defined.items():
        parent = next(b for b in cls.__bases__ if issubclass(b, errors.SandboxRouterError))
        assert drawn[name] == parent.__name__, f"{name} is drawn under {drawn[name]}"
    assert set(errors.__all__) == {*defined, "SandboxRouterError"}
    assert set(errors.__all__) <= set(router.__all__), "router exports every error"


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


# Router's public attributes that are no call on the router's loop, and why they need no twin.
NO_TWIN = {
    "from_config": "a constructor: validates a mapping or reads a file, before any loop",
    "from_env": "a constructor, as from_config",
    "provider": "a lookup of an entry's adapter, whose own calls are async",
    "capabilities": "a lookup of what an entry declares, made in memory",
    "hooks": "a property: the event hook list",
    "tracers": "a property: the span hook list",
    "store": "a property: the state store object",
    "entries": "a property: the entry names",
}
# Sync twins written beside their async one rather than derived, and why.
HAND_WRITTEN = {
    "close": "stops the engine's thread from the caller's thread, so it cannot run on that loop",
}


def _is_async(call: Callable[..., Any]) -> bool:
    returns = typing.get_type_hints(call).get("return")
    awaitable = isinstance(returns, type) and issubclass(returns, collections.abc.Awaitable)
    return inspect.iscoroutinefunction(call) or awaitable


def test_every_router_call_has_its_twin_in_the_other_api() -> None:
    """Every public call exists sync and async (``name`` / ``aname``), with the same
    parameters, and the sync one is derived from the async one (`portal.sync_twin`)."""
    from router import Router

    public = {name: m for name, m in inspect.getmembers(Router) if not name.startswith("_")}
    assert set(NO_TWIN) <= set(public), "NO_TWIN names an attribute Router no longer has"
    calls = {name: m for name, m in public.items() if name not in NO_TWIN}
    asyncs = {name for name in calls if name.startswith("a") and name[1:] in calls}
    syncs = set(calls) - asyncs
    assert "acquire" in syncs
    missing = sorted(name for name in syncs if f"a{name}" not in calls)
    assert missing == [], f"no async twin: {missing}"
    for name in sorted(syncs):
        sync, twin = calls[name], calls[f"a{name}"]
        assert callable(sync), f"Router.{name} is no call: list it in NO_TWIN with a reason"
        assert _is_async(twin), f"Router.a{name} is not async"
        assert not _is_async(sync), f"Router.{name} is not sync"
        sync_params = list(inspect.signature(sync).parameters.values())
        assert sync_params == list(inspect.signature(twin).parameters.values()), name
        derived = getattr(sync, "__wrapped__", None) is twin
        assert derived != (name in HAND_WRITTEN), (
            f"Router.{name}: derive it with sync_twin(a{name}), or list it in HAND_WRITTEN"
        )
