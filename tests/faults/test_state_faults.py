"""Redis killed and restarted under the router, and an app killed holding leases."""

from __future__ import annotations

import os
import signal
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import redis

from emulators.redis_server import RedisServer
from providers.errors import NoProviderAvailable, StateUnavailable
from router import Event, Router
from router.testing import ScriptedProvider
from tests.faults.test_fleet_outage import heartbeated
from tests.forked import processes
from tests.polling import needs_script_noreplicas, wait_until

pytestmark = pytest.mark.slow


def router(url: str, tmp_path: Path, events: list[Event], **settings: Any) -> Router:
    return Router.from_config(
        {
            "state_url": url + "?socket_timeout=1&socket_connect_timeout=1",
            "key_prefix": "faults",
            "chain": [
                {
                    "name": "only",
                    "provider": "local",
                    "quota": {"sessions": 6},
                    "options": {"root": str(tmp_path / "sb")},
                }
            ],
            **settings,
        },
        providers={"only": ScriptedProvider("only", tmp_path)},
        hooks=[events.append],
    )


def drain(r: Router) -> tuple[int, NoProviderAvailable]:
    """Acquire and release until refused: how many were served, and the refusal."""
    served = 0
    while True:
        try:
            r.acquire().release()
        except NoProviderAvailable as refusal:
            return served, refusal
        served += 1


def test_redis_killed_mid_run_fail_closed(aof_redis: RedisServer, tmp_path: Path) -> None:
    events: list[Event] = []
    with router(aof_redis.url, tmp_path, events) as r:
        r.acquire().release()
        provider = r.provider("only")
        assert isinstance(provider, ScriptedProvider)
        aof_redis.stop()
        with pytest.raises(StateUnavailable, match="state store"):
            r.acquire()
        assert provider.creates == 1  # nothing created without the ledger
        assert not r.status().state_ok
    assert any(e.name == "state_error" and e.fields["mode"] == "fail_closed" for e in events)


def test_redis_killed_mid_run_fail_open(aof_redis: RedisServer, tmp_path: Path) -> None:
    events: list[Event] = []
    with router(aof_redis.url, tmp_path, events, on_state_error="fail_open",
                fail_open_journal=str(tmp_path / "journal.db"),
                fleet_heartbeat=0.2) as r:  # fmt: skip
        r.acquire().release()
        heartbeated(aof_redis.url, "faults")  # its share of an outage is known
        aof_redis.stop()
        served, refusal = drain(r)
        assert served == 5  # alone in the fleet: all that was left at its last contact
        assert "sessions 5/5" in str(refusal)
        status = r.status()
        assert status.entries[0].used["sessions"] == 1 + 5  # the fleet's as last seen + ours
        assert not status.state_ok
        assert status.state_error
    assert any(e.name == "state_error" and e.fields["mode"] == "fail_open" for e in events)


def test_redis_killed_during_a_create_keeps_the_sandbox_and_says_so(
    aof_redis: RedisServer, tmp_path: Path
) -> None:
    """The reservation was made; the commit, off the caller's path, finds Redis gone."""
    events: list[Event] = []
    with router(aof_redis.url, tmp_path, events) as r:
        provider = r.provider("only")
        assert isinstance(provider, ScriptedProvider)
        gate = threading.Event()
        provider.script = [gate]
        with ThreadPoolExecutor(1) as pool:
            acquiring = pool.submit(r.acquire)
            wait_until(lambda: provider.creates == 1)
            aof_redis.stop()
            gate.set()
            with acquiring.result(30) as lease:
                assert lease.sandbox.run("true").exit_code == 0
        assert provider.alive() == []
    failed = [e.fields["operation"] for e in events if e.name == "state_error"]
    assert failed == ["commit", "release"]


def test_counts_survive_a_redis_restart_with_aof(aof_redis: RedisServer, tmp_path: Path) -> None:
    events: list[Event] = []
    with router(aof_redis.url, tmp_path, events) as r:
        for _ in range(4):
            r.acquire().release()
        aof_redis.restart()
        granted, _ = drain(r)
        assert granted == 2  # 4 before + 2 after = the limit of 6: nothing overspent
        assert r.status().entries[0].used["sessions"] == 6
    assert not [e for e in events if e.name == "state_warning"]


def test_router_warns_when_redis_persists_nothing(redis_url: str, tmp_path: Path) -> None:
    events: list[Event] = []
    with router(redis_url, tmp_path, events) as r:
        r.acquire().release()
    [warning] = [e.fields for e in events if e.name == "state_warning"]
    assert "persists nothing" in str(warning["problem"])


def _crashing_worker(config: dict[str, Any], ready: Any) -> None:
    r = Router.from_config(config, hooks=[])
    leases = [r.acquire() for _ in range(3)]
    ready.set()
    time.sleep(600)  # killed long before
    del leases


def test_app_killed_holding_leases_leaks_nothing(redis_url: str, tmp_path: Path) -> None:
    config = {
        "state_url": redis_url,
        "key_prefix": f"crash-{os.getpid()}",
        "lease_ttl": 5,
        "chain": [{"name": "local", "provider": "local", "quota": {"concurrent": 3},
                   "options": {"root": str(tmp_path / "sb")}}],
    }  # fmt: skip
    ctx = processes(__name__)
    ready = ctx.Event()
    worker = ctx.Process(target=_crashing_worker, args=(config, ready))
    worker.start()
    assert ready.wait(60)
    os.kill(worker.pid, signal.SIGKILL)  # type: ignore[arg-type]
    worker.join()
    with Router.from_config(config, hooks=[]) as survivor:
        assert survivor.status().entries[0].live_leases == 3
        with pytest.raises(NoProviderAvailable, match="concurrent 3/3"):
            survivor.acquire()
        assert survivor.reap().killed == []  # their leases are still live: not orphans yet
        time.sleep(5.5)  # the TTL passes without heartbeats
        assert survivor.status().entries[0].live_leases == 0
        report = survivor.reap()
        assert len(report.killed) == 3
        assert list((tmp_path / "sb").glob("local-*")) == []
        with survivor.acquire() as lease:
            assert lease.entry == "local"


@pytest.mark.parametrize("mode", ["fail_closed", "fail_open"])
def test_redis_refusing_writes_is_a_state_error_not_a_provider_failure(
    aof_redis: RedisServer, tmp_path: Path, mode: str
) -> None:
    events: list[Event] = []
    with router(aof_redis.url, tmp_path, events, on_state_error=mode, fail_open_blind=0.5) as r:
        r.acquire().release()
        with redis.Redis(port=aof_redis.port) as admin:
            needs_script_noreplicas(admin)
            admin.config_set("min-replicas-to-write", 1)
        if mode == "fail_closed":
            with pytest.raises(StateUnavailable, match="NOREPLICAS"):
                r.acquire()
        else:
            r.acquire().release()  # served from the fallback ledger
    assert any(e.name == "state_error" and e.fields["mode"] == mode for e in events)


def test_a_cluster_down_at_start_is_served_by_fail_open(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = s.getsockname()[1]
    events: list[Event] = []
    url = f"redis+cluster://127.0.0.1:{dead}/0"
    with router(url, tmp_path, events, on_state_error="fail_open") as r:
        with pytest.raises(NoProviderAvailable, match="never reached the store"):
            r.acquire()  # it has not seen the fleet: it grants nothing by default
        assert not r.status().state_ok
    with router(url, tmp_path, events, on_state_error="fail_open", fail_open_blind=0.5) as r:
        r.acquire().release()  # opted in: half of each limit
    assert any(e.name == "state_error" and e.fields["mode"] == "fail_open" for e in events)


def test_outage_spend_outlives_the_replica_and_is_written_back_once(
    aof_redis: RedisServer, tmp_path: Path
) -> None:
    """A replica that closes while Redis is still down leaves its journal; the next
    router to reach Redis hands it over, once."""
    journal = str(tmp_path / "journal.db")
    events: list[Event] = []
    with router(aof_redis.url, tmp_path, events, on_state_error="fail_open",
                fail_open_journal=journal, fleet_heartbeat=0.2) as r:  # fmt: skip
        r.acquire().release()
        heartbeated(aof_redis.url, "faults")  # its share of an outage is known
        aof_redis.stop()
        served, _ = drain(r)
        assert served == 5
    aof_redis.start()
    with router(aof_redis.url, tmp_path, events, on_state_error="fail_open",
                fail_open_journal=journal) as later:  # fmt: skip
        with pytest.raises(NoProviderAvailable, match="sessions 6/6"):
            later.acquire()  # its first contact hands the journal over, before any grant
        assert later.status().entries[0].used["sessions"] == 1 + 5
    with router(aof_redis.url, tmp_path, events, on_state_error="fail_open",
                fail_open_journal=journal) as third:  # fmt: skip
        assert third.status().entries[0].used["sessions"] == 6  # not twice
    handed = [e.fields for e in events if e.name == "outage_handed_over"]
    assert [h["sessions"] for h in handed] == [5]


def test_fail_closed_reading_status_in_an_outage_serves_from_the_store_after(
    aof_redis: RedisServer, tmp_path: Path
) -> None:
    """Status reads the outage ledger while the store is down; under fail_closed that
    must not start serving from it once the store is back."""
    events: list[Event] = []
    with router(aof_redis.url, tmp_path, events) as r:
        r.acquire().release()
        aof_redis.stop()
        assert not r.status().state_ok
        aof_redis.start()
        for _ in range(5):
            r.acquire().release()
        assert r.status().entries[0].used["sessions"] == 6  # every one in the shared ledger
        with pytest.raises(NoProviderAvailable, match="sessions 6/6"):
            r.acquire()


def test_outage_usd_spend_is_handed_over_with_its_cost(
    aof_redis: RedisServer, tmp_path: Path
) -> None:
    """A priced lease granted while Redis is down is journaled with its price: its cost
    reaches the pool's usd when the store is back, and the outage share kept it in budget."""
    from providers.base import SandboxSpec

    journal = str(tmp_path / "journal.db")
    events: list[Event] = []
    priced = {"price": {"vcpu_hour": 36.0, "per_sandbox": 0.1}, "quota": {"usd": 0.7}}
    spec = SandboxSpec(lifetime=10)  # holds $0.1 + 10 s at $0.01
    with router(aof_redis.url, tmp_path, events, on_state_error="fail_open",
                fail_open_journal=journal, fleet_heartbeat=0.2, chain=[
                    {"name": "only", "provider": "local", **priced,
                     "options": {"root": str(tmp_path / "sb")}}]) as r:  # fmt: skip
        r.acquire(spec).release()
        heartbeated(aof_redis.url, "faults")
        aof_redis.stop()
        served, refused = 0, ""
        while True:
            try:
                r.acquire(spec).release()
            except NoProviderAvailable as refusal:
                refused = str(refusal)
                break
            served += 1
        assert served >= 1, refused
        aof_redis.start()
        wait_until(lambda: any(e.name == "outage_handed_over" for e in events), 30)
    costs = [e.fields["cost"] for e in events if e.name == "released"]
    [handed] = [e.fields for e in events if e.name == "outage_handed_over"]
    assert handed["usd"] == pytest.approx(sum(costs[1:]), abs=1e-9)
    with router(aof_redis.url, tmp_path, events) as later:
        view = later.status().entries[0]
    assert view.used["usd"] == pytest.approx(sum(costs), abs=1e-9)
    assert view.used["usd"] <= 0.7
