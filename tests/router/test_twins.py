"""``async with router.aacquire()``: the pending lease is entered as the lease is.

`Router.aacquire` and `Router.aresume` return a `PendingLease`: awaited, it is
the lease (``async with await router.aacquire()`` still works); entered, it
acquires and releases at the block's end, as ``with router.acquire()`` does. A lease of
either flavour also gives a handle of each (``sync_sandbox``, ``async_sandbox``).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from providers.errors import LeaseError, NoProviderAvailable
from router import Router


@pytest.fixture
def router(make_router: Any, tmp_path: Path) -> Router:
    chain = [{"name": "local", "provider": "local", "quota": {"sessions": 10},
              "options": {"root": str(tmp_path / "sandboxes"), "isolation": "none"}}]  # fmt: skip
    made: Router = make_router(chain=chain)
    return made


async def usage(router: Router) -> tuple[float, int]:
    view = (await router.astatus()).entries[0]
    return view.used["sessions"], view.live_leases


async def test_entering_aacquire_releases_the_lease_at_the_end(router: Router) -> None:
    async with router.aacquire() as lease:
        assert (await lease.sandbox.run("echo entered")).stdout == "entered\n"
        assert await usage(router) == (1, 1)
    assert lease.released
    assert await usage(router) == (1, 0)
    with pytest.raises(LeaseError, match="already released"):
        await lease.sandbox.run("true")


async def test_a_block_that_raises_still_releases(router: Router) -> None:
    with pytest.raises(KeyError, match="the app's own"):
        async with router.aacquire() as lease:
            raise KeyError("the app's own")
    assert lease.released
    assert await usage(router) == (1, 0)


async def test_an_acquire_that_fails_on_entry_raises_and_holds_nothing(router: Router) -> None:
    with pytest.raises(NoProviderAvailable, match="lacks capability gpu"):
        async with router.aacquire(requires=("gpu",)):
            pytest.fail("the block ran without a lease")
    assert await usage(router) == (0, 0)


async def test_entering_aresume_wakes_the_paused_sandbox_and_releases_it(router: Router) -> None:
    lease = await router.aacquire()
    await lease.sandbox.write_file("notes.txt", "kept")
    token = await lease.pause()
    async with router.aresume(token, timeout=10) as back:
        assert back.sandbox_id == lease.sandbox_id
        assert await back.sandbox.read_file("notes.txt") == b"kept"
    assert back.released
    assert await usage(router) == (1, 0)


def test_a_sync_lease_gives_an_async_handle_too(router: Router) -> None:
    """A backend an agent framework calls both ways on one lease (deepagents' ``invoke`` and
    ``ainvoke``) takes a handle of each flavour from it; both are refused once released."""
    with router.acquire() as lease:
        handles = (lease.sync_sandbox, lease.async_sandbox)
        assert handles[0].run("echo sync").stdout == "sync\n"
        assert asyncio.run(handles[1].run("echo async")).stdout == "async\n"
    with pytest.raises(LeaseError):
        handles[0].run("true")
    with pytest.raises(LeaseError):
        asyncio.run(handles[1].run("true"))


async def test_an_async_lease_gives_a_sync_handle_too(router: Router) -> None:
    async with router.aacquire() as lease:
        sync = lease.sync_sandbox
        assert (await asyncio.to_thread(sync.run, "echo sync")).stdout == "sync\n"
        assert (await lease.async_sandbox.run("echo async")).stdout == "async\n"
    with pytest.raises(LeaseError):
        await asyncio.to_thread(sync.run, "true")
