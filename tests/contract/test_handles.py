"""The sync sandbox handle is derived from the async one: same methods, same signatures."""

from __future__ import annotations

import inspect
from collections.abc import Iterator
from pathlib import Path

import pytest

from providers.errors import LeaseError
from router import Router
from router.lease import AsyncSandboxHandle, SyncSandbox
from router.portal import blocking

# These return a handle (process, terminal), so their twins wrap it in its sync twin.
HANDING_OUT = {"start", "attach", "open_terminal"}


def async_methods() -> list[str]:
    return [
        name
        for name, member in vars(AsyncSandboxHandle).items()
        if not name.startswith("_") and inspect.iscoroutinefunction(member)
    ]


def test_every_async_method_has_its_sync_twin() -> None:
    assert async_methods(), "the async handle has methods"
    for name in async_methods():
        twin = inspect.getattr_static(SyncSandbox, name, None)
        if name in HANDING_OUT:
            params = list(inspect.signature(getattr(AsyncSandboxHandle, name)).parameters)
            assert list(inspect.signature(twin).parameters) == params, name
            continue
        assert isinstance(twin, blocking), f"SyncSandbox.{name} is not derived from the async one"
        assert twin.method is getattr(AsyncSandboxHandle, name)


@pytest.fixture
def router(tmp_path: Path) -> Iterator[Router]:
    config = {
        "state_url": "memory://",
        "chain": [{"name": "local", "provider": "local", "options": {"root": str(tmp_path)}}],
    }
    with Router.from_config(config, hooks=[]) as made:
        yield made


def test_sync_methods_show_the_async_signature_and_doc(router: Router) -> None:
    with router.acquire() as lease:
        for name in set(async_methods()) - HANDING_OUT:
            sync, original = getattr(lease.sandbox, name), getattr(AsyncSandboxHandle, name)
            params = list(inspect.signature(original).parameters)
            assert list(inspect.signature(sync).parameters) == params[1:], name
            assert sync.__doc__ == original.__doc__
        assert lease.sandbox.run(["echo", "ran"], timeout=5).stdout == "ran\n"


def test_a_released_lease_refuses_every_call(router: Router) -> None:
    lease = router.acquire()
    sandbox = lease.sandbox
    lease.release()
    for call in (
        lambda: sandbox.run("true"),
        lambda: sandbox.write_file("f", b""),
        lambda: sandbox.read_file("f"),
        lambda: sandbox.list_files("."),
        lambda: sandbox.run_code("1"),
    ):
        with pytest.raises(LeaseError, match=f"lease {lease.id} on local was already released"):
            call()


async def test_a_released_async_lease_refuses_calls(router: Router) -> None:
    lease = await router.aacquire()
    await lease.release()
    with pytest.raises(LeaseError, match="already released"):
        await lease.sandbox.run("true")
