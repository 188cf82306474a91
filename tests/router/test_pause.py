"""Pause a lease's sandbox into a token and resume it, from any replica sharing one Redis;
sticky sessions pause instead of running through their idle TTL."""

from __future__ import annotations

import asyncio
import threading

import pytest

from providers.capabilities import Capability
from providers.errors import (
    InvalidArgument,
    LeaseError,
    NoProviderAvailable,
    NotFound,
    Unsupported,
)
from router import Lease
from router.testing import ScriptedProvider
from tests.polling import wait_until
from tests.router.conftest import Clock, fired


def only(name: str = "flaky", **quota: int) -> list[dict[str, object]]:
    return [{"name": name, "provider": "local", "quota": quota or {"sessions": 10}}]


def test_pause_meters_seconds_frees_the_slot_and_keeps_the_sandbox(
    make_router, scripted, clock: Clock, events
) -> None:
    flaky = scripted()
    router = make_router(providers={"flaky": flaky}, chain=only(sessions=10, concurrent=1))
    lease = router.acquire()
    lease.sandbox.write_file("notes.txt", "kept")
    clock.advance(12)
    token = lease.pause()
    assert lease.released
    with pytest.raises(LeaseError):
        lease.sandbox.read_file("notes.txt")
    assert flaky.paused() == [lease.sandbox_id]
    view = router.status().entries[0]
    assert view.used["sandbox_seconds"] == pytest.approx(12)
    assert (view.used["concurrent"], view.live_leases) == (0, 0)
    clock.advance(100)  # paused: not metered
    with router.acquire() as other:  # the one slot is free
        assert other.sandbox_id != lease.sandbox_id
    [paused] = fired(events, "paused")
    assert (paused["entry"], paused["sandbox_id"]) == ("flaky", lease.sandbox_id)
    assert token not in repr(events)
    assert router.status().entries[0].used["sandbox_seconds"] == pytest.approx(12)


def test_resume_from_another_replica_takes_a_slot_not_a_session(
    make_router, scripted, events
) -> None:
    flaky = scripted()
    a = make_router(providers={"flaky": flaky}, chain=only(sessions=10, concurrent=2))
    b = make_router(providers={"flaky": flaky}, chain=only(sessions=10, concurrent=2))
    with a.acquire() as lease:
        lease.sandbox.write_file("notes.txt", "kept")
        token = lease.pause()
    with b.resume(token) as resumed:
        assert resumed.sandbox_id == lease.sandbox_id
        assert resumed.sandbox.read_file("notes.txt") == b"kept"
        view = b.status().entries[0]
        assert (view.used["sessions"], view.used["concurrent"], view.live_leases) == (1, 1, 1)
        assert flaky.paused() == []
    assert flaky.alive() == []  # releasing a resumed lease kills the sandbox
    assert flaky.creates == 1
    assert [e["sandbox_id"] for e in fired(events, "resumed")] == [lease.sandbox_id]
    with pytest.raises(LeaseError, match="no paused sandbox") as spent:
        a.resume(token)  # a token is good for one resume
    assert token not in str(spent.value)


async def test_async_pause_and_resume(make_router, scripted) -> None:
    flaky = scripted()
    router = make_router(providers={"flaky": flaky}, chain=only())
    lease = await router.aacquire()
    await lease.sandbox.write_file("a.txt", "1")
    token = await lease.pause()
    async with router.aresume(token, timeout=10) as back:
        assert await back.sandbox.read_file("a.txt") == b"1"
    assert flaky.alive() == []


def test_resume_refused_when_concurrency_is_full_keeps_token_and_sandbox(
    make_router, scripted
) -> None:
    flaky = scripted()
    router = make_router(providers={"flaky": flaky}, chain=only(sessions=10, concurrent=1))
    token = router.acquire().pause()
    paused = flaky.paused()
    with router.acquire():  # takes the one slot
        with pytest.raises(NoProviderAvailable, match="flaky") as full:
            router.resume(token)
        assert "concurrent" in str(full.value)
        assert flaky.paused() == paused
    with router.resume(token) as back:
        assert [back.sandbox_id] == paused


def test_resume_of_a_gone_sandbox_is_not_found_and_drops_the_token(make_router, scripted) -> None:
    flaky = scripted()
    router = make_router(providers={"flaky": flaky}, chain=only(sessions=10, concurrent=1))
    lease = router.acquire()
    token = lease.pause()
    assert asyncio.run(flaky.kill(lease.sandbox_id))
    with pytest.raises(NotFound):
        router.resume(token)
    assert router.status().entries[0].used["concurrent"] == 0  # the slot was given back
    with pytest.raises(LeaseError, match="no paused sandbox"):
        router.resume(token)


def test_pause_on_an_entry_that_cannot_is_unsupported_and_the_lease_lives(
    make_router, scripted
) -> None:
    plain = scripted(capabilities=ScriptedProvider("x").capabilities - {Capability.PAUSE})
    router = make_router(providers={"flaky": plain}, chain=only())
    with router.acquire() as lease:
        with pytest.raises(Unsupported, match="pause"):
            lease.pause()
        assert not lease.released
        assert lease.sandbox.run("echo live").stdout == "live\n"
        assert plain.paused() == []
    assert plain.alive() == []


def test_resume_refuses_a_bad_token_and_timeout(make_router, scripted) -> None:
    router = make_router(providers={"flaky": scripted()}, chain=only())
    with pytest.raises(InvalidArgument, match="token"):
        router.resume("")
    with pytest.raises(InvalidArgument, match="timeout"):
        router.resume("x", timeout=0)
    with pytest.raises(LeaseError, match="no paused sandbox"):
        router.resume("never-issued")


def test_janitor_keeps_a_paused_sandbox_until_pause_ttl(
    make_router, scripted, clock: Clock
) -> None:
    flaky = scripted()
    router = make_router(providers={"flaky": flaky}, chain=only(), lease_ttl=60, pause_ttl=3600)
    lease = router.acquire()
    token = lease.pause()
    clock.advance(600)  # long past the lease's TTL
    report = router.reap()
    assert (report.killed, report.kept) == ([], 1)
    assert flaky.paused() == [lease.sandbox_id]
    clock.advance(3001)
    assert router.reap().killed == [("flaky", lease.sandbox_id)]
    assert flaky.alive() == []
    with pytest.raises(LeaseError, match="no paused sandbox"):
        router.resume(token)


def test_a_released_session_is_paused_and_resumed_on_its_next_acquire(
    make_router, scripted, events
) -> None:
    flaky = scripted()
    a = make_router(providers={"flaky": flaky}, chain=only(sessions=10, concurrent=1))
    b = make_router(providers={"flaky": flaky}, chain=only(sessions=10, concurrent=1))
    with a.acquire(session="conv-1") as first:
        first.sandbox.write_file("state.txt", "step 1")
    assert flaky.paused() == [first.sandbox_id]
    assert [e["session"] for e in fired(events, "paused")] == ["conv-1"]
    with b.acquire(session="conv-1") as second:
        assert second.resumed
        assert second.sandbox_id == first.sandbox_id
        assert second.sandbox.read_file("state.txt") == b"step 1"
        assert flaky.paused() == []
        assert b.status().entries[0].used["sessions"] == 1
    assert [e["session"] for e in fired(events, "resumed")] == ["conv-1"]
    assert flaky.paused() == [first.sandbox_id]
    assert a.close_session("conv-1")
    assert flaky.alive() == []


@pytest.mark.parametrize("why", ["entry", "setting"])
def test_a_session_that_cannot_pause_stays_running(make_router, scripted, why: str) -> None:
    if why == "entry":
        flaky = scripted(capabilities=ScriptedProvider("x").capabilities - {Capability.PAUSE})
        router = make_router(providers={"flaky": flaky}, chain=only())
    else:
        flaky = scripted()
        router = make_router(providers={"flaky": flaky}, chain=only(), session_pause=False)
    with router.acquire(session="s") as first:
        pass
    assert (flaky.alive(), flaky.paused()) == ([first.sandbox_id], [])
    with router.acquire(session="s") as second:
        assert second.resumed
        assert second.sandbox_id == first.sandbox_id
    router.close_session("s")


def test_pausing_a_session_lease_hands_its_sandbox_to_the_token(make_router, scripted) -> None:
    flaky = scripted()
    router = make_router(providers={"flaky": flaky}, chain=only())
    lease = router.acquire(session="conv-2")
    token = lease.pause()
    with router.acquire(session="conv-2") as fresh:
        assert not fresh.resumed
        assert fresh.sandbox_id != lease.sandbox_id
    with router.resume(token) as back:
        assert back.sandbox_id == lease.sandbox_id
    router.close_session("conv-2")
    assert flaky.alive() == []


@pytest.mark.parametrize("store", ["memory", "sqlite"])
def test_pause_resume_and_reap_on_the_other_stores(
    make_router, scripted, tmp_path, clock: Clock, store: str
) -> None:
    url = f"sqlite:///{tmp_path}/s.db" if store == "sqlite" else "memory://"
    flaky = scripted()
    router = make_router(providers={"flaky": flaky}, chain=only(), state_url=url, pause_ttl=60)
    with router.resume(router.acquire().pause()) as back:
        back.sandbox.write_file("a", "1")
        token = back.pause()
    assert router.reap().killed == []
    clock.advance(61)
    assert router.reap().killed == [("flaky", back.sandbox_id)]
    with pytest.raises(LeaseError):
        router.resume(token)


def test_a_session_key_cannot_reach_into_the_pause_tokens(make_router, scripted) -> None:
    router = make_router(providers={"flaky": scripted()}, chain=only())
    token = router.acquire().pause()
    with pytest.raises(InvalidArgument, match="pause"):
        router.acquire(session="pause:" + token)


def test_pausing_a_held_session_hands_it_to_the_acquire_waiting_for_it(
    make_router, scripted, events
) -> None:
    """The token takes the paused sandbox; the session, free again, gets a new one."""
    flaky = scripted()
    a = make_router(providers={"flaky": flaky}, chain=only())
    b = make_router(providers={"flaky": flaky}, chain=only())
    lease = a.acquire(session="conv-3")
    got: list[Lease] = []
    waiting = threading.Thread(target=lambda: got.append(b.acquire(session="conv-3")))
    waiting.start()
    wait_until(lambda: fired(events, "session_held"), 10)
    token = lease.pause()
    waiting.join(30)
    [fresh] = got
    assert fresh.sandbox_id != lease.sandbox_id
    assert flaky.paused() == [lease.sandbox_id]
    fresh.release()
    with a.resume(token) as back:
        assert back.sandbox_id == lease.sandbox_id
    b.close_session("conv-3")
