"""Sticky sessions and the orphan janitor, across routers sharing one Redis."""

from __future__ import annotations

import asyncio

import pytest

from providers.base import LABEL_ENTRY, LABEL_ROUTER, SandboxSpec
from tests.router.conftest import Clock, fired


def only(name: str = "flaky", **quota: int) -> list[dict[str, object]]:
    return [{"name": name, "provider": "local", "quota": quota or {"sessions": 10}}]


def test_session_reconnects_to_its_sandbox_from_another_replica(make_router, scripted) -> None:
    flaky = scripted()
    a = make_router(providers={"flaky": flaky}, chain=only())
    b = make_router(providers={"flaky": flaky}, chain=only())
    with a.acquire(session="conv-42") as first:
        assert not first.resumed
        first.sandbox.write_file("state.txt", "step 1")
    assert flaky.alive() == [first.sandbox_id]  # kept for the session's idle TTL
    with b.acquire(session="conv-42") as second:
        assert second.resumed
        assert second.sandbox_id == first.sandbox_id
        assert second.sandbox.read_file("state.txt") == b"step 1"
        view = b.status().entries[0]
        assert (view.used["sessions"], view.live_leases) == (1, 1)  # a slot, no new session
    assert flaky.creates == 1


def test_a_gone_session_sandbox_is_replaced_and_said_so(make_router, scripted, events) -> None:
    flaky = scripted()
    router = make_router(providers={"flaky": flaky}, chain=only())
    with router.acquire(session="conv-7") as first:
        pass
    flaky.local.root.joinpath(first.sandbox_id).rename(flaky.local.root / "gone")
    with router.acquire(session="conv-7") as second:
        assert not second.resumed
        assert second.sandbox_id != first.sandbox_id
    [lost] = fired(events, "session_lost")
    assert (lost["session"], lost["sandbox_id"]) == ("conv-7", first.sandbox_id)
    assert str(lost["reason"]).startswith("not_found")
    assert router.status().entries[0].used["sessions"] == 2


def test_close_session_kills_and_forgets(make_router, scripted) -> None:
    flaky = scripted()
    router = make_router(providers={"flaky": flaky}, chain=only())
    with router.acquire(session="s") as lease:
        pass
    assert router.close_session("s")
    assert flaky.alive() == []
    assert not router.close_session("s")
    with router.acquire(session="s") as again:
        assert not again.resumed
        assert again.sandbox_id != lease.sandbox_id


def test_session_labels_name_router_entry_lease_and_session(make_router, scripted, key_prefix):
    flaky = scripted()
    router = make_router(providers={"flaky": flaky}, chain=only())
    with router.acquire(session="conv-9", labels={"team": "a"}) as lease:
        [info] = asyncio.run(flaky.list({"team": "a"}))
        assert info.labels == {
            "team": "a",
            "sandbox_router": key_prefix,
            "sandbox_router_entry": "flaky",
            "sandbox_router_lease": lease.id,
            "sandbox_router_session": "conv-9",
        }
    router.close_session("conv-9")


def test_janitor_kills_orphans_only(make_router, scripted, clock: Clock, key_prefix) -> None:
    flaky = scripted()
    router = make_router(providers={"flaky": flaky}, chain=only(), lease_ttl=60,
                         session_idle_ttl=600)  # fmt: skip
    held = router.acquire()  # live lease: kept
    crashed = make_router(providers={"flaky": flaky}, chain=only(), lease_ttl=60)
    orphan = crashed.acquire()  # its app "crashes": never released
    with router.acquire(session="keep") as bound:  # bound to a session: kept
        pass
    stranger = asyncio.run(flaky.local.create(SandboxSpec(labels={"team": "x"})))
    other_router = asyncio.run(
        flaky.local.create(SandboxSpec(labels={LABEL_ROUTER: "someone-else", LABEL_ENTRY: "flaky"}))
    )
    clock.advance(30)
    ref = router._entries["flaky"].ref  # white-box: one heartbeat at a chosen time
    assert router._engine.run(router.store.heartbeat(ref, held.id, clock(), 60))
    clock.advance(40)  # the crashed lease expired; the held one was heartbeated
    report = router.reap()
    assert report.killed == [("flaky", orphan.sandbox_id)]
    assert report.kept == 2
    alive = {s.id for s in asyncio.run(flaky.local.list())}
    assert orphan.sandbox_id not in alive
    assert {held.sandbox_id, bound.sandbox_id, stranger.id, other_router.id} <= alive
    held.release()
    router.close_session("keep")
    for sb in (stranger, other_router):
        asyncio.run(sb.kill())


def test_expired_session_binding_is_reaped(make_router, scripted, clock: Clock) -> None:
    flaky = scripted()
    router = make_router(providers={"flaky": flaky}, chain=only(), session_idle_ttl=30)
    with router.acquire(session="idle") as lease:
        pass
    assert router.reap().killed == []
    clock.advance(31)
    assert router.reap().killed == [("flaky", lease.sandbox_id)]
    assert flaky.alive() == []


def test_janitor_lock_lets_one_replica_reap_an_entry(make_router, scripted, clock) -> None:
    router = make_router(providers={"flaky": scripted()}, chain=only())
    assert router._engine.run(router.store.lock("janitor:flaky", "other", 60, clock()))
    report = router.reap()
    assert report.skipped == {"flaky": "another replica is reaping it"}


def test_a_create_still_running_when_the_router_closes_is_found_and_killed(
    make_router, scripted, events
) -> None:
    flaky = scripted(script=["late"])
    router = make_router(providers={"flaky": flaky}, create_timeout=0.3, retry={"attempts": 1})
    with router.acquire() as lease:
        assert lease.entry == "local"
    [late] = flaky.alive()
    assert router.status().entries[0].used["sessions"] == 1  # the provider may bill it
    assert router.reap().killed == []  # its create is still followed: not an orphan yet
    router.close()  # the create is cut off; one list by its lease label finds what it made
    assert [(e["outcome"], e["sandbox_id"]) for e in fired(events, "late_create")] == [
        ("found", late)
    ]
    assert flaky.alive() == []
    survivor = make_router(providers={"flaky": flaky})
    assert survivor.status().entries[0].used["sessions"] == 1  # counted, its slot freed
    assert survivor.status().entries[0].live_leases == 0


@pytest.mark.parametrize("store", ["sqlite", "redis"])
def test_sessions_work_on_both_stores(make_router, scripted, tmp_path, store) -> None:
    url = f"sqlite:///{tmp_path}/s.db" if store == "sqlite" else None
    flaky = scripted()
    settings = {"state_url": url} if url else {}
    router = make_router(providers={"flaky": flaky}, chain=only(), **settings)
    with router.acquire(session="x") as first:
        pass
    with router.acquire(session="x") as second:
        assert second.resumed
        assert second.sandbox_id == first.sandbox_id
    router.close_session("x")
