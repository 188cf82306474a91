"""An entry whose pool is used up costs no reserve round trip once this replica knows it.

The defect (issue 18, "skip15"): with 15 exhausted entries ahead of a good one,
every acquire asked the store 16 times. The reserve calls are counted on the
real store (memory, SQLite and Redis)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from router import Router
from tests.router.conftest import Clock

STORES = ["memory", "sqlite", "redis"]


def _chain(tmp_path: Path) -> list[dict[str, Any]]:
    root = {"root": str(tmp_path / "local")}
    spent = [
        {"name": f"spent{i}", "provider": "local", "options": root, "quota": {"sessions": 1}}
        for i in range(15)
    ]
    return [*spent, {"name": "good", "provider": "local", "options": root}]


def _count_reserves(router: Router) -> list[str]:
    """Wrap the real store's reserve: the entries it was asked for, in order."""
    store = router._ledger.store
    calls: list[str] = []
    reserve = store.reserve

    async def counted(ref: Any, *args: Any, **kwargs: Any) -> Any:
        calls.append(ref.entry)
        return await reserve(ref, *args, **kwargs)

    store.reserve = counted  # type: ignore[method-assign]
    return calls


@pytest.fixture
def state_url(request: pytest.FixtureRequest, tmp_path: Path, redis_url: str) -> str:
    kind = request.param
    if kind == "memory":
        return "memory://"
    if kind == "sqlite":
        return f"sqlite:///{tmp_path / 'state.db'}"
    if not redis_url:
        pytest.skip("no redis-server")
    return redis_url


@pytest.mark.parametrize("state_url", STORES, indirect=True)
def test_second_acquire_reserves_once_and_quota_reset_brings_entries_back(
    new_router: Any, state_url: str, key_prefix: str, tmp_path: Path, clock: Clock
) -> None:
    router = new_router(
        {"state_url": state_url, "key_prefix": key_prefix, "chain": _chain(tmp_path)},
        clock=clock,
        hooks=[],
    )
    for i in range(15):
        router.set_usage(f"spent{i}", "sessions", 1)
    calls = _count_reserves(router)
    with router.acquire() as lease:
        assert lease.entry == "good"
    assert len(calls) == 16  # the first acquire learns what is spent
    calls.clear()
    with router.acquire() as lease:
        assert lease.entry == "good"
    assert calls == ["good"]

    # `quota reset spent3` from another process: this replica has not seen it yet...
    ref = router._entries["spent3"].ref
    router._engine.run(router._ledger.store.set_usage(ref, "sessions", 0, clock()))
    calls.clear()
    with router.acquire() as lease:
        assert lease.entry == "good"
    assert calls == ["good"]
    router.status()  # ...until any pool status it reads (status, balanced's snapshot)
    calls.clear()
    with router.acquire() as lease:
        assert lease.entry == "spent3"
    assert calls == ["spent3"]

    router.set_usage("spent5", "sessions", 0)  # its own `quota set`: known at once
    calls.clear()
    with router.acquire() as lease:
        assert lease.entry == "spent5"
    assert calls == ["spent3", "spent5"]  # spent3's last session went just now: asked once


@pytest.mark.parametrize("state_url", ["memory"], indirect=True)
def test_remembered_exhaustion_is_rechecked_and_ends_with_the_window(
    new_router: Any, state_url: str, tmp_path: Path, clock: Clock
) -> None:
    router = new_router(
        {"state_url": state_url, "chain": _chain(tmp_path)[-2:], "fleet_heartbeat": 5},
        clock=clock,
        hooks=[],
    )
    router.set_usage("spent14", "sessions", 1)
    calls = _count_reserves(router)
    for _ in range(2):
        with router.acquire():
            pass
    assert calls == ["spent14", "good", "good"]
    calls.clear()
    clock.advance(5)  # fleet_heartbeat: what no status read told is asked again
    with router.acquire():
        pass
    assert calls == ["spent14", "good"]
    calls.clear()
    clock.advance(40 * 86400)  # a new window: the pool has its sessions again
    with router.acquire() as lease:
        assert lease.entry == "spent14"
    assert calls == ["spent14"]
