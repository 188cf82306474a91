"""Closing a router ends its reaper even when a pass in flight swallows the cancel.

A vendor SDK's own timeout scope can take an outside cancel for its timeout when the
two coincide (anyio's scopes inside httpx do), and the pass then ends with an error
instead of the cancel: the reaper must still stop. Seen once in CI as a close that
waited forever (pytest-timeout at 120 s) in tests/router/test_kill_retry.py.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Mapping
from pathlib import Path

from providers.base import SandboxInfo
from router import Router
from router.testing import ScriptedProvider


class SwallowsACancel(ScriptedProvider):
    """Its listing turns the first cancel it sees into a timeout error, as such an SDK
    does."""

    def __init__(self, name: str, root: Path) -> None:
        super().__init__(name, root)
        self.listing = threading.Event()
        self.swallowed = 0

    async def list(self, labels: Mapping[str, str] | None = None) -> list[SandboxInfo]:
        self.listing.set()
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            self.swallowed += 1
            raise TimeoutError("request timed out") from None
        return []


def test_close_ends_a_reaper_whose_pass_swallowed_the_cancel(tmp_path: Path) -> None:
    provider = SwallowsACancel("p", tmp_path)
    config = {"state_url": "memory://", "reap_every": 1,
              "chain": [{"name": "p", "provider": "local"}]}  # fmt: skip
    router = Router.from_config(config, providers={"p": provider}, hooks=[])
    router.acquire().release()  # the reaper starts with the router's first call
    assert provider.listing.wait(10)
    closing = threading.Thread(target=router.close, daemon=True)
    closing.start()
    closing.join(15)
    assert not closing.is_alive()
    assert provider.swallowed == 1
