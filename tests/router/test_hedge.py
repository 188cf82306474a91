"""Hedged creates: behaviour (who wins, what is counted), not timing."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from emulators import available, emulator_class
from providers.errors import NoProviderAvailable, Unavailable
from router import Router
from router.events import HedgeSettled, HedgeStarted, LateCreate, RouterEvent
from router.metrics import instrument
from router.testing import ScriptedProvider
from tests.polling import wait_until


@pytest.fixture
def gate() -> Any:
    """A create step that waits until the test opens it (opened at the end in any case)."""
    event = threading.Event()
    yield event
    event.set()


def build(
    new_router: Any,
    events: list[RouterEvent],
    providers: dict[str, ScriptedProvider],
    hedged: int = 1,
    **hedge: Any,
) -> Router:
    """A chain of ``providers`` in order, the first ``hedged`` entries with ``hedge``."""
    chain: list[dict[str, Any]] = [
        {"name": name, "provider": "local", "quota": {"sessions": 10}} for name in providers
    ]
    for entry in chain[:hedged]:
        entry["hedge"] = hedge
    config = {"state_url": "memory://", "create_timeout": 20, "chain": chain}
    return new_router(config, providers=providers, hooks=[events.append])


def of(events: list[RouterEvent], kind: type[Any]) -> list[Any]:
    return [e for e in events if isinstance(e, kind)]


def test_slow_create_is_hedged_winner_returned_loser_killed_and_counted(
    new_router: Any, tmp_path: Path, gate: threading.Event
) -> None:
    slow = ScriptedProvider("slow", tmp_path, [gate])
    spare = ScriptedProvider("spare", tmp_path)
    events: list[RouterEvent] = []
    router = build(new_router, events, {"slow": slow, "spare": spare}, after=0.2)
    started = time.monotonic()
    with router.acquire() as lease:
        assert time.monotonic() - started >= 0.2  # not before `after`
        assert lease.entry == "spare"
        assert lease.failovers == []
        assert lease.sandbox.run("echo hi").stdout == "hi\n"
    assert of(events, HedgeStarted) == [HedgeStarted("slow", "spare", 0.2)]
    assert of(events, HedgeSettled) == [HedgeSettled("slow", "spare", winner="spare")]

    gate.set()  # the provider finishes the loser's create after all
    wait_until(lambda: of(events, LateCreate), seconds=10)
    [late] = of(events, LateCreate)
    assert (late.entry, late.outcome, late.sandbox_id) == ("slow", "killed", slow.created[0])
    assert slow.alive() == []
    used = {v.name: v.used for v in router.status().entries}
    assert used["slow"]["sessions"] == 1  # the provider made it: it stays counted
    assert used["slow"]["sandbox_seconds"] == pytest.approx(late.seconds)
    assert used["spare"]["sessions"] == 1


def test_a_create_done_in_time_is_not_hedged(new_router: Any, tmp_path: Path) -> None:
    fast, spare = ScriptedProvider("fast", tmp_path), ScriptedProvider("spare", tmp_path)
    events: list[RouterEvent] = []
    router = build(new_router, events, {"fast": fast, "spare": spare}, after=5)
    with router.acquire() as lease:
        assert lease.entry == "fast"
    assert (spare.creates, of(events, HedgeStarted)) == (0, [])


def test_no_hedge_when_the_next_entry_has_no_quota(
    new_router: Any, tmp_path: Path, gate: threading.Event
) -> None:
    slow, spare = ScriptedProvider("slow", tmp_path, [gate]), ScriptedProvider("spare", tmp_path)
    events: list[RouterEvent] = []
    router = build(new_router, events, {"slow": slow, "spare": spare}, after=0.05)
    router.set_usage("spare", "sessions", 10)
    threading.Timer(0.4, gate.set).start()
    with router.acquire() as lease:
        assert lease.entry == "slow"
    assert (spare.creates, of(events, HedgeStarted)) == (0, [])


def test_at_most_one_extra_create_per_acquire(new_router: Any, tmp_path: Path) -> None:
    gates = [threading.Event(), threading.Event()]
    slow = ScriptedProvider("slow", tmp_path, [gates[0]])
    slower = ScriptedProvider("slower", tmp_path, [gates[1]])
    third = ScriptedProvider("third", tmp_path)
    events: list[RouterEvent] = []
    providers = {"slow": slow, "slower": slower, "third": third}
    router = build(new_router, events, providers, hedged=2, after=0.05)  # the hedge may not hedge
    try:
        threading.Timer(0.5, gates[1].set).start()
        with router.acquire() as lease:
            assert lease.entry == "slower"
    finally:
        for g in gates:
            g.set()
    assert len(of(events, HedgeStarted)) == 1
    assert third.creates == 0


def test_a_failed_hedge_leaves_the_slow_create_running(
    new_router: Any, tmp_path: Path, gate: threading.Event
) -> None:
    slow = ScriptedProvider("slow", tmp_path, [gate])
    spare = ScriptedProvider("spare", tmp_path, [Unavailable("down")])
    events: list[RouterEvent] = []
    router = build(new_router, events, {"slow": slow, "spare": spare}, after=0.05)
    threading.Timer(0.4, gate.set).start()
    with router.acquire() as lease:
        assert lease.entry == "slow"
    assert of(events, HedgeSettled) == [HedgeSettled("slow", "spare", winner="slow")]
    assert {v.name: v.used["sessions"] for v in router.status().entries}["spare"] == 0


def test_percentile_mode_waits_for_that_percentile_of_recent_creates(
    new_router: Any, tmp_path: Path, gate: threading.Event
) -> None:
    slow, spare = ScriptedProvider("slow", tmp_path, [gate]), ScriptedProvider("spare", tmp_path)
    events: list[RouterEvent] = []
    router = build(new_router, events, {"slow": slow, "spare": spare}, after="p95")
    sketch = router._acquirer._hedger.sketch("slow")
    for latency in [0.01] * 18 + [0.15, 0.3]:
        sketch.add(latency)
    with router.acquire() as lease:
        assert lease.entry == "spare"
    assert of(events, HedgeStarted) == [HedgeStarted("slow", "spare", 0.15)]


def test_percentile_mode_does_not_hedge_before_it_knows_the_entry(
    new_router: Any, tmp_path: Path, gate: threading.Event
) -> None:
    slow, spare = ScriptedProvider("slow", tmp_path, [gate]), ScriptedProvider("spare", tmp_path)
    events: list[RouterEvent] = []
    router = build(new_router, events, {"slow": slow, "spare": spare}, after="p50")
    threading.Timer(0.3, gate.set).start()
    with router.acquire() as lease:
        assert lease.entry == "slow"
    assert of(events, HedgeStarted) == []
    assert len(router._acquirer._hedger.sketch("slow")) == 1  # learned from this create


def test_hedges_and_create_latency_are_exported(
    new_router: Any, tmp_path: Path, gate: threading.Event
) -> None:
    slow, spare = ScriptedProvider("slow", tmp_path, [gate]), ScriptedProvider("spare", tmp_path)
    router = build(new_router, [], {"slow": slow, "spare": spare}, after=0.05)
    registry = CollectorRegistry()
    instrument(router, registry)
    with router.acquire():
        pass
    labels = {"entry": "slow", "hedge_entry": "spare"}
    assert registry.get_sample_value("sandbox_router_hedges_started_total", labels) == 1
    assert registry.get_sample_value("sandbox_router_hedge_wins_total", labels) == 1
    p95 = {"entry": "spare", "quantile": "0.95"}
    assert registry.get_sample_value("sandbox_router_create_latency_seconds", p95) is not None


@pytest.mark.slow
@pytest.mark.parametrize("name", available(["e2b"]))
def test_a_vendor_create_slowed_by_the_emulator_is_hedged_and_its_sandbox_killed(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The vendor's SDK on its emulator: the slow leg's sandbox is made on the vendor's
    side, answered late, then killed by the router."""
    with emulator_class(name)() as emu:
        for key, value in emu.sdk_env().items():
            monkeypatch.setenv(key, value)
        chain = [
            {"name": name, "provider": name, "hedge": {"after": 0.3}},
            {"name": "local", "provider": "local", "options": {"root": str(tmp_path)}},
        ]
        events: list[RouterEvent] = []
        config = {"state_url": "memory://", "key_prefix": "hedge", "chain": chain}
        warm_chain = [{"name": name, "provider": name}]  # SDK imports: seconds, not hedged
        warm = Router.from_config({**config, "chain": warm_chain}, hooks=[])
        with warm, warm.acquire() as lease:
            assert lease.entry == name
        known = {r.id for r in emu.records()}
        with Router.from_config(config, hooks=[events.append]) as router:
            emu.inject("create", delay=2.0, after=True)
            with router.acquire() as lease:
                assert lease.entry == "local"
            wait_until(lambda: of(events, LateCreate), seconds=15)
            [late] = of(events, LateCreate)
            assert late.outcome == "killed"
            made = [r for r in emu.records() if r.id not in known]
            assert [r.id for r in made] == [late.sandbox_id]
            assert not made[0].alive


def test_a_leg_that_made_its_sandbox_but_never_answered_is_found_and_killed(
    new_router: Any, tmp_path: Path, gate: threading.Event
) -> None:
    """The spare leg's connection drops after its sandbox was made: the slow leg still
    wins, and upkeep finds the spare's sandbox by its lease label, counts and kills it."""
    slow = ScriptedProvider("slow", tmp_path, [gate])
    spare = ScriptedProvider("spare", tmp_path, ["dropped"])
    events: list[RouterEvent] = []
    router = build(new_router, events, {"slow": slow, "spare": spare}, after=0.05)
    threading.Timer(0.5, gate.set).start()
    with router.acquire() as lease:
        assert lease.entry == "slow"
    assert of(events, HedgeSettled) == [HedgeSettled("slow", "spare", winner="slow")]
    wait_until(lambda: of(events, LateCreate), seconds=10)
    [late] = of(events, LateCreate)
    assert (late.entry, late.outcome, late.sandbox_id) == ("spare", "found", spare.created[0])
    assert spare.alive() == []
    assert {v.name: v.used["sessions"] for v in router.status().entries} == {
        "slow": 1,
        "spare": 1,
    }


def test_both_legs_past_their_budget_fail_over_and_are_followed(
    new_router: Any, tmp_path: Path
) -> None:
    gates = [threading.Event(), threading.Event()]
    slow = ScriptedProvider("slow", tmp_path, [gates[0]])
    spare = ScriptedProvider("spare", tmp_path, [gates[1]])
    events: list[RouterEvent] = []
    router = build(new_router, events, {"slow": slow, "spare": spare}, after=0.05)
    try:
        with pytest.raises(NoProviderAvailable):
            router.acquire(timeout=0.3)
    finally:
        for g in gates:
            g.set()
    assert of(events, HedgeSettled) == [HedgeSettled("slow", "spare", winner="none")]
    wait_until(lambda: len(of(events, LateCreate)) == 2, seconds=10)
    assert {(e.entry, e.outcome) for e in of(events, LateCreate)} == {
        ("slow", "killed"),
        ("spare", "killed"),
    }
    assert slow.alive() == spare.alive() == []
