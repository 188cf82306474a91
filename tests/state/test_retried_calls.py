"""A script call retried after a timeout applies once.

A proxy in front of Redis loses one reply, as a network can: the script ran,
the runner times out waiting and sends the call again on a new connection,
and the server runs it a second time. The call id the store gives each call
makes that second run return the first answer instead of applying again.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from policies.breaker import BreakerConfig, Outcome
from policies.quota import Limits, MonthlyWindow
from router.state import EntryRef
from router.state.redis import RedisStore
from router.state.scripts import RunnerName
from router.state.warm import WarmRecord
from tests.redis_proxy import RedisProxy

NOW = 1_790_000_000.0
CFG = BreakerConfig(failure_threshold=100)
r = EntryRef("a", "p", Limits(), MonthlyWindow(), fingerprint="f")


@pytest.fixture(params=["resp", "redis-py"])
async def store(
    request: pytest.FixtureRequest, proxy: RedisProxy, key_prefix: str
) -> AsyncIterator[RedisStore]:
    """A store behind the proxy, on each runner; a lost reply times out in 0.2 s."""
    runner: RunnerName = request.param
    url = f"redis://127.0.0.1:{proxy.port}/0?socket_timeout=0.2"
    store = RedisStore(url, key_prefix, runner)
    yield store
    await store.close()


async def test_a_settle_retried_after_a_lost_reply_counts_once(
    proxy: RedisProxy, store: RedisStore
) -> None:
    await store.reserve(r, CFG, "warm", NOW, 30)  # Redis knows both scripts now
    await store.settle(r, CFG, "warm", NOW, outcome=Outcome.SUCCESS, ttl=30)
    assert (await store.reserve(r, CFG, "l1", NOW, 30)).granted
    proxy.lose_next_reply = True
    settled = await store.settle(r, CFG, "l1", NOW, outcome=Outcome.TRANSIENT)
    assert proxy.lost == 1
    assert settled.applied
    snap = await store.snapshot([r], NOW)
    assert snap.entries["a"].breaker.failures == 1


async def test_a_warm_take_retried_after_a_lost_reply_still_says_it_took_it(
    proxy: RedisProxy, store: RedisStore
) -> None:
    """Else the refill, told nothing was there, would not kill the sandbox it took."""
    assert (await store.reserve(r, CFG, "w1", NOW, 30)).granted
    await store.settle(r, CFG, "w1", NOW, outcome=Outcome.SUCCESS, ttl=300)
    record = WarmRecord("sbx-1", NOW + 1, NOW + 200, NOW + 300)
    assert await store.warm_put(r, "w1", record, NOW + 1)
    assert await store.warm_take(r, "w0", NOW + 2) is None  # Redis knows the script now
    proxy.lose_next_reply = True
    assert await store.warm_take(r, "w1", NOW + 11) == pytest.approx(11)
    assert proxy.lost == 1
    assert await store.warm_list(r, NOW + 12) == {}


async def test_a_paused_warm_put_retried_after_a_lost_reply_still_says_it_put_it(
    proxy: RedisProxy, store: RedisStore
) -> None:
    """A paused put releases the lease; run again, it found no lease and said no, and the
    refill killed a sandbox the pool still offered."""
    assert not await store.warm_put(r, "w0", WarmRecord("s", NOW, NOW, NOW), NOW)  # loaded
    assert (await store.reserve(r, CFG, "w1", NOW, 30)).granted
    await store.settle(r, CFG, "w1", NOW, outcome=Outcome.SUCCESS, ttl=300)
    record = WarmRecord("sbx-1", NOW + 5, NOW + 200, NOW + 300, paused=True)
    proxy.lose_next_reply = True
    assert await store.warm_put(r, "w1", record, NOW + 5)
    assert proxy.lost == 1
    assert set(await store.warm_list(r, NOW + 6)) == {"w1"}
