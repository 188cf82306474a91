from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from router.state import StateStore, open_store


@pytest.fixture(params=["redis", "sqlite", "memory"])
async def store(
    request: pytest.FixtureRequest, redis_url: str, key_prefix: str, tmp_path: Path
) -> AsyncIterator[StateStore]:
    url = {
        "redis": redis_url,
        "sqlite": f"sqlite:///{tmp_path}/state.db",
        "memory": "memory://",
    }[request.param]
    s = open_store(url, key_prefix)
    yield s
    await s.close()
