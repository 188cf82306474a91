"""What a dead first entry adds to an acquire: on the first request, and once its
breaker is open (connection refused; hung with a create timeout)."""

from __future__ import annotations

import secrets
import socket
from pathlib import Path
from typing import Any

from benchmarks.common import summary_ms, timed
from emulators import available, emulator_class
from router import Router


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _router(redis_url: str, root: Path, first: dict[str, Any] | None) -> Router:
    chain: list[dict[str, Any]] = [first] if first else []
    chain.append({"name": "local", "provider": "local",
                  "options": {"root": str(root), "isolation": "none"}})  # fmt: skip
    config = {
        "state_url": redis_url,
        "key_prefix": f"fo-{secrets.token_hex(3)}",
        "create_timeout": 1.0,
        "retry": {"attempts": 2, "initial": 0.05, "maximum": 0.1},
        "breaker": {"failure_threshold": 2, "cooldown_base": 600},
        "chain": chain,
    }
    return Router.from_config(config, hooks=[])


def failover_cost(redis_url: str, root: Path, n: int) -> dict[str, Any]:
    if not available(["e2b"]):
        return {"skipped": "needs the e2b emulator and adapter"}
    results: dict[str, Any] = {}
    with _router(redis_url, root, None) as router:
        router.acquire().release()
        results["baseline_local_only"] = summary_ms(
            [timed(lambda: router.acquire().release()) for _ in range(n)]
        )
    dead = f"http://127.0.0.1:{_closed_port()}"
    refused = {"name": "e2b", "provider": "e2b",
               "options": {"api_key": "k", "api_url": dead, "sandbox_url": dead}}  # fmt: skip
    with _router(redis_url, root, refused) as router:
        first = timed(lambda: router.acquire().release())
        results["refused"] = {
            "first_ms": round(first * 1000, 2),
            "breaker_open": summary_ms(
                [timed(lambda: router.acquire().release()) for _ in range(n)]
            ),
        }
    with emulator_class("e2b")() as emu:
        emu.inject("create", hang=True, times=None)
        hung = {"name": "e2b", "provider": "e2b",
                "options": {"api_key": emu.sdk_env()["E2B_API_KEY"], "api_url": emu.url,
                            "sandbox_url": emu.url}}  # fmt: skip
        with _router(redis_url, root, hung) as router:
            first = timed(lambda: router.acquire().release())
            results["hung_create_timeout_1s"] = {
                "first_ms": round(first * 1000, 2),
                "breaker_open": summary_ms(
                    [timed(lambda: router.acquire().release()) for _ in range(n)]
                ),
            }
            router.reap()
    return results
