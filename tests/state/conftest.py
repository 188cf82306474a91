from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from router.state import StateStore, open_store
from router.state.redis import RedisStore

STORES = ["redis-resp", "redis-py", "sqlite", "memory"]


def make_store(kind: str, redis_url: str, prefix: str, tmp_path: Path) -> StateStore:
    """A store of ``kind``: Redis through either script runner, SQLite, or memory."""
    if kind == "redis-resp":
        return RedisStore(redis_url, prefix, runner="resp")
    if kind == "redis-py":
        return RedisStore(redis_url, prefix, runner="redis-py")
    return open_store(
        {"sqlite": f"sqlite:///{tmp_path}/state.db", "memory": "memory://"}[kind], prefix
    )


@pytest.fixture(params=STORES)
async def store(
    request: pytest.FixtureRequest, redis_url: str, key_prefix: str, tmp_path: Path
) -> AsyncIterator[StateStore]:
    s = make_store(request.param, redis_url, key_prefix, tmp_path)
    yield s
    await s.close()
