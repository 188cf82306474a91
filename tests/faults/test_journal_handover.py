"""Replicas that end during a Redis outage leave their journal on disk: whichever router or
command reaches Redis next and can see the file hands it over, before it answers."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from emulators.harness import Emulator
from emulators.redis_server import RedisServer
from providers.errors import NoProviderAvailable
from router import Router
from router.cli import main
from router.config import load_config
from router.state import EntryRef, open_store
from tests.providers.test_failover import NAMES, VENDORS

pytestmark = pytest.mark.slow

PREFIX = "handover"


def write_config(tmp_path: Path, url: str, entry: dict[str, Any], **settings: Any) -> Path:
    path = tmp_path / f"chain-{settings.get('on_state_error', 'fail_open')}.yaml"
    config = {
        "state_url": url + "?socket_timeout=0.5&socket_connect_timeout=0.5",
        "key_prefix": PREFIX,
        "on_state_error": "fail_open",
        "fail_open_blind": 0.25,  # opted in: these replicas serve without a settled view
        "fail_open_journal": str(tmp_path / "journal.db"),
        "chain": [entry],
        **settings,
    }
    path.write_text(yaml.safe_dump(config))
    return path


def ledger_sessions(path: Path) -> float:
    """The pool's sessions as the store has them, read without a router (which would hand
    the journal over itself)."""
    cfg = load_config(path)
    entry = cfg.chain[0]
    ref = EntryRef(entry.name, entry.pool, cfg.pool_quota(entry).limits(), cfg.window(entry))

    async def read() -> float:
        store = open_store(cfg.resolved_state_url(), cfg.key_prefix)
        try:
            return (await store.snapshot([ref], time.time())).pools[entry.pool].used["sessions"]
        finally:
            await store.close()

    return asyncio.run(read())


def serve_through_the_outage(redis: RedisServer, path: Path, replicas: int) -> int:
    """``replicas`` routers each serve once, then their share while Redis is down, and
    end before it is back. Returns how many they granted in all."""
    routers = [Router.from_config(path, hooks=[]) for _ in range(replicas)]
    granted = 0
    try:
        for router in routers:
            router.acquire().release()
            granted += 1
        redis.stop()
        for router in routers:
            while True:
                try:
                    router.acquire(timeout=5).release()
                except NoProviderAvailable:
                    break
                granted += 1
    finally:
        for router in routers:
            router.close()  # the store is down: each leaves its rows to the next
    redis.start()
    return granted


def _status(path: Path, capsys: pytest.CaptureFixture[str]) -> float:
    assert main(["status", "--json", "--config", str(path)]) == 0
    return float(json.loads(capsys.readouterr().out)["entries"][0]["used"]["sessions"])


def _quota_show(path: Path, capsys: pytest.CaptureFixture[str]) -> float:
    assert main(["quota", "show", "local", "--config", str(path)]) == 0
    return float(json.loads(capsys.readouterr().out)["local"]["used"]["sessions"])


def _janitor(path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["janitor", "--json", "--config", str(path)]) == 0
    assert json.loads(capsys.readouterr().out)["killed"] == []


def _doctor(path: Path, capsys: pytest.CaptureFixture[str]) -> float:
    assert main(["doctor", "--json", "--config", str(path)]) == 0
    [check] = json.loads(capsys.readouterr().out)
    return 20 - float(check["quota_left"]["sessions"])


def _acquire(path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with Router.from_config(path, hooks=[]) as router:
        router.acquire().release()


def _quota_reset(path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The operator's count replaces the journal's too: handed over first, then reset."""
    assert main(["quota", "reset", "local", "--config", str(path)]) == 0


COMMANDS: dict[str, Callable[[Path, pytest.CaptureFixture[str]], float | None]] = {
    "status": _status,
    "quota-show": _quota_show,
    "janitor": _janitor,
    "doctor": _doctor,
    "acquire": _acquire,
    "quota-reset": _quota_reset,
}


@pytest.mark.parametrize("command", list(COMMANDS))
def test_the_first_command_to_reach_the_store_hands_the_journal_over(
    aof_redis: RedisServer, tmp_path: Path, capsys: pytest.CaptureFixture[str], command: str
) -> None:
    local = {"name": "local", "provider": "local", "quota": {"sessions": 20},
             "options": {"root": str(tmp_path / "sb")}}  # fmt: skip
    path = write_config(tmp_path, aof_redis.url, local)
    granted = serve_through_the_outage(aof_redis, path, replicas=3)
    assert granted == 3 + 3 * 5  # each: one before, then its blind 25 % of 20
    assert ledger_sessions(path) == 3  # nobody has handed the journal over yet
    # The command runs with fail_closed (an operator's, or an app that never heartbeats
    # into the fleet): what it can see of the journal is handed over all the same.
    closed = write_config(tmp_path, aof_redis.url, local, on_state_error="fail_closed")
    shown = COMMANDS[command](closed, capsys)
    after = 0 if command == "quota-reset" else granted + (command == "acquire")
    assert ledger_sessions(path) == after
    with Router.from_config(path, hooks=[]) as later:  # nothing is left to hand over
        later.acquire().release()
        assert later.status().entries[0].used["sessions"] == after + 1
    if shown is not None:
        assert shown == after  # its own answer counts the journal already
    assert list((tmp_path / "sb").glob("local-*")) == []


@pytest.mark.parametrize("vendor", NAMES)
def test_outage_sandboxes_on_each_vendor_are_handed_over_by_status(
    aof_redis: RedisServer, tmp_path: Path, request: pytest.FixtureRequest, vendor: str
) -> None:
    emu: Emulator = request.getfixturevalue(f"{vendor}_emulator")
    entry = {"name": vendor, "provider": vendor, "quota": {"sessions": 8},
             "options": VENDORS[vendor].options(emu)}  # fmt: skip
    path = write_config(tmp_path, aof_redis.url, entry)
    granted = serve_through_the_outage(aof_redis, path, replicas=1)
    assert granted == 1 + 2
    assert len(emu.records()) == 3  # every grant was a real create on the vendor's API
    assert emu.alive() == []
    assert ledger_sessions(path) == 1
    with Router.from_config(path, hooks=[]) as reader:
        assert reader.status().entries[0].used["sessions"] == 3
    assert ledger_sessions(path) == 3


def test_a_tenant_s_outage_spend_is_written_back_to_it(
    aof_redis: RedisServer, tmp_path: Path
) -> None:
    """Each lease granted while Redis was down counts to its tenant once handed over,
    and the tenant's limit then holds across the outage's spend."""
    local = {"name": "local", "provider": "local", "quota": {"sessions": 20},
             "options": {"root": str(tmp_path / "sb")}}  # fmt: skip
    path = write_config(tmp_path, aof_redis.url, local, tenants={"default": {"sessions": 6}})
    with Router.from_config(path, hooks=[]) as router:
        router.acquire(tenant="t").release()
        aof_redis.stop()
        served = 0
        while True:  # the blind share: 25 % of the pool's 20
            try:
                router.acquire(tenant="t", timeout=5).release()
            except NoProviderAvailable:
                break
            served += 1
        assert served == 5
    aof_redis.start()
    with Router.from_config(path, hooks=[]) as later:  # hands the journal over first
        later.acquire().release()
        [spent] = later.tenants()
        assert (spent.tenant, spent.sessions) == ("t", 6)
        with pytest.raises(NoProviderAvailable, match="tenant 't' limit reached: sessions 6/6"):
            later.acquire(tenant="t", timeout=5)
