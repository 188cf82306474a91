"""When the state store is down: fail_closed refuses, fail_open serves a share."""

from __future__ import annotations

import socket
import time
from pathlib import Path

import pytest

from providers.errors import NoProviderAvailable, StateUnavailable
from router import Event, Router
from router.testing import ScriptedProvider


def dead_redis_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"redis://127.0.0.1:{port}/0?socket_connect_timeout=0.5"


def build(tmp_path: Path, mode: str, events: list[Event]) -> tuple[Router, ScriptedProvider]:
    provider = ScriptedProvider("only", tmp_path)
    router = Router.from_config(
        {
            "state_url": dead_redis_url(),
            "on_state_error": mode,
            "fail_open_blind": 0.5,
            "chain": [{"name": "only", "provider": "local", "quota": {"sessions": 4}}],
        },
        providers={"only": provider},
        hooks=[events.append],
    )
    return router, provider


def test_fail_closed_raises_and_creates_nothing(tmp_path: Path) -> None:
    events: list[Event] = []
    router, provider = build(tmp_path, "fail_closed", events)
    with router, pytest.raises(StateUnavailable, match=r"state store redis://127\.0\.0\.1"):
        router.acquire()
    assert provider.creates == 0
    assert [e.fields["mode"] for e in events if e.name == "state_error"] == ["fail_closed"]


def test_fail_open_serves_the_opted_in_blind_share_and_says_so(tmp_path: Path) -> None:
    """A replica that never reached the store serves ``fail_open_blind`` of each limit."""
    events: list[Event] = []
    router, provider = build(tmp_path, "fail_open", events)
    with router:
        for _ in range(2):  # half of the 4 sessions
            router.acquire().release()
        with pytest.raises(NoProviderAvailable, match=r"fail_open_blind 0\.5 .*sessions 2/2"):
            router.acquire()
        status = router.status()
    assert provider.creates == 2
    assert provider.alive() == []
    assert not status.state_ok
    assert "127.0.0.1" in (status.state_error or "")
    assert {e.fields["mode"] for e in events if e.name == "state_error"} == {"fail_open"}


def test_heartbeat_keeps_a_lease_alive_past_its_ttl(
    redis_url: str, key_prefix: str, tmp_path: Path
) -> None:
    router = Router.from_config(
        {
            "state_url": redis_url,
            "key_prefix": key_prefix,
            "lease_ttl": 5,
            "chain": [
                {
                    "name": "local",
                    "provider": "local",
                    "quota": {"concurrent": 1},
                    "options": {"root": str(tmp_path)},
                }
            ],
        },
        hooks=[],
    )
    with router, router.acquire() as lease:
        time.sleep(6.5)
        assert router.status().entries[0].live_leases == 1
        assert lease.sandbox.run("echo alive").stdout == "alive\n"


def test_pause_and_resume_need_the_shared_store(tmp_path: Path) -> None:
    router, provider = build(tmp_path, "fail_open", [])
    with router:
        with router.acquire() as lease:  # served from this replica's share
            with pytest.raises(StateUnavailable):
                lease.pause()
            assert not lease.released
            assert provider.paused() == []
        with pytest.raises(StateUnavailable):
            router.resume("some-token")
