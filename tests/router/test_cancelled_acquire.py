"""An acquire cancelled at any await gives back what it holds.

The caller's task can be cancelled (a timeout around ``aacquire``, a
client that went away) while the store is answering its reservation, or
after its sandbox exists but before the lease reached the caller. The
reservation the store granted, the session unit it took and the sandbox
are then nobody's: they must be given back, not left to block the pool's
concurrency until the reservation expires.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable

import pytest

from providers.base import Sandbox
from router import Router
from router.testing import ScriptedProvider
from tests.redis_proxy import RedisProxy


def _config(port: int, key_prefix: str, **entry: object) -> dict[str, object]:
    return {
        "state_url": f"redis://127.0.0.1:{port}/0",
        "key_prefix": key_prefix,
        "chain": [{"name": "fake", "provider": "local", "quota": {"concurrent": 1}, **entry}],
    }


async def _pool(router: Router) -> tuple[float, int]:
    view = (await router.astatus()).entries[0]
    return view.used["sessions"], view.live_leases


async def _settles(router: Router, want: Callable[[tuple[float, int]], bool]) -> tuple[float, int]:
    """The pool's (sessions used, live leases) once ``want`` holds, or after 5 s."""
    for _ in range(100):
        if want(pool := await _pool(router)):
            return pool
        await asyncio.sleep(0.05)
    return pool


async def _soon(condition: Callable[[], bool]) -> None:
    for _ in range(500):
        if condition():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("never happened")


async def test_cancelled_while_the_store_reserves_gives_the_reservation_back(
    proxy: RedisProxy, key_prefix: str
) -> None:
    fake = ScriptedProvider("fake")
    router = Router.from_config(_config(proxy.port, key_prefix), providers={"fake": fake}, hooks=[])
    async with router:
        await (await router.aacquire()).release()
        assert await _settles(router, lambda pool: pool == (1, 0)) == (1, 0)
        proxy.stop_replies()
        sent = proxy.requests
        acquiring = asyncio.ensure_future(router.aacquire())
        await _soon(lambda: proxy.requests > sent)
        acquiring.cancel()
        with pytest.raises(asyncio.CancelledError):
            await acquiring
        proxy.let_replies_through()
        assert await _settles(router, lambda pool: pool == (1, 0)) == (1, 0)
        assert fake.creates == 1
        async with await router.aacquire(timeout=5):  # the one slot is free again
            pass


async def test_cancelled_after_the_sandbox_exists_releases_the_lease(
    proxy: RedisProxy, key_prefix: str
) -> None:
    """Cancelled while binding a session (the lease and its sandbox exist): the lease is
    released as the caller's release would, so the sandbox stays the session's for its
    idle TTL, and closing the session ends it."""
    landing = threading.Event()
    fake = ScriptedProvider("fake", script=[None, landing])
    router = Router.from_config(_config(proxy.port, key_prefix), providers={"fake": fake}, hooks=[])
    async with router:
        await (await router.aacquire()).release()
        acquiring = asyncio.ensure_future(router.aacquire(session="s1"))
        await _soon(lambda: fake.creates == 2)
        proxy.stop_replies()  # the session's bind will wait: the lease and its sandbox exist
        sent = proxy.requests
        landing.set()
        await _soon(lambda: proxy.requests > sent)
        acquiring.cancel()
        with pytest.raises(asyncio.CancelledError):
            await acquiring
        proxy.let_replies_through()
        assert (await _settles(router, lambda pool: pool[1] == 0))[1] == 0
        async with await router.aacquire(session="s1", timeout=5) as again:
            assert again.sandbox_id == fake.created[1]
        assert await router.aclose_session("s1")
        await _soon(lambda: fake.alive() == [])


class _Gated(ScriptedProvider):
    """Its connect and resume wait for ``gate`` while ``hold`` is set."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.hold = False
        self.gate = asyncio.Event()
        self.reached = asyncio.Event()

    async def _held(self) -> None:
        if self.hold:
            self.reached.set()
            await self.gate.wait()

    async def connect(self, sandbox_id: str) -> Sandbox:
        await self._held()
        return await super().connect(sandbox_id)

    async def resume(self, sandbox_id: str, *, timeout: float) -> Sandbox:
        await self._held()
        return await super().resume(sandbox_id, timeout=timeout)


async def _lands_with_replies_held(proxy: RedisProxy, fake: _Gated) -> None:
    """Let the held call land while the store's replies wait: what follows is on the wire."""
    await asyncio.wait_for(fake.reached.wait(), 5)
    proxy.stop_replies()
    sent = proxy.requests
    fake.gate.set()
    await _soon(lambda: proxy.requests > sent)


async def test_a_resume_cancelled_after_the_wake_parks_the_sandbox_again(
    proxy: RedisProxy, key_prefix: str
) -> None:
    """The sandbox woke but the caller is gone: it is paused again under the same token,
    its slot freed, rather than left running under a lease nobody holds."""
    fake = _Gated("fake")
    router = Router.from_config(_config(proxy.port, key_prefix), providers={"fake": fake}, hooks=[])
    async with router:
        lease = await router.aacquire()
        await lease.sandbox.write_file("kept.txt", b"state")
        token = await lease.pause()
        fake.hold = True
        resuming = asyncio.ensure_future(router.aresume(token))
        await _lands_with_replies_held(proxy, fake)  # the token's unbind waits
        resuming.cancel()
        proxy.let_replies_through()
        with pytest.raises(asyncio.CancelledError):
            await resuming
        assert (await _settles(router, lambda pool: pool[1] == 0))[1] == 0
        await _soon(lambda: fake.paused() == fake.created)
        fake.hold = False
        async with await router.aresume(token) as again:
            assert await again.sandbox.read_file("kept.txt") == b"state"


@pytest.mark.parametrize("stage", ["connect", "commit"])
async def test_a_session_reconnect_cancelled_frees_its_slot_and_keeps_the_session(
    proxy: RedisProxy, key_prefix: str, stage: str
) -> None:
    fake = _Gated("fake")
    config = {**_config(proxy.port, key_prefix), "session_pause": False}
    router = Router.from_config(config, providers={"fake": fake}, hooks=[])
    async with router:
        await (await router.aacquire(session="s1")).release()
        fake.hold = True
        acquiring = asyncio.ensure_future(router.aacquire(session="s1"))
        if stage == "commit":  # the sandbox is reached; its commit's reply waits
            await _lands_with_replies_held(proxy, fake)
        else:
            await asyncio.wait_for(fake.reached.wait(), 5)
        acquiring.cancel()
        proxy.let_replies_through()
        with pytest.raises(asyncio.CancelledError):
            await acquiring
        assert (await _settles(router, lambda pool: pool[1] == 0))[1] == 0
        fake.hold = False
        async with await router.aacquire(session="s1", timeout=5) as again:
            assert again.resumed
            assert again.sandbox_id == fake.created[0]
