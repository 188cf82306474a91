"""One sticky session, one holder at a time: a second acquire of a session a live lease
holds waits for that lease's release (up to its timeout), on any replica; its sandbox is
never paused or killed under the lease that holds it.

Two routers share one Redis, each with its own adapter on the same provider: every
provider that declares ``pause`` (a released session's sandbox is paused there), on its
emulator, and ``local``.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from emulators import emulator_class
from emulators.harness import Emulator
from providers import provider_class
from providers.capabilities import Capability
from providers.errors import LeaseError, SessionBusy
from router import Router
from tests.contract.conftest import VENDORS, build
from tests.polling import wait_until
from tests.router.conftest import fired

PAUSING = [n for n in ("local", *VENDORS) if Capability.PAUSE in provider_class(n).capabilities]


@pytest.fixture(scope="module", params=PAUSING)
def emulated(request: pytest.FixtureRequest) -> Iterator[tuple[str, Emulator | None]]:
    name: str = request.param
    if name == "local":
        yield name, None
        return
    with emulator_class(name)() as emu:
        yield name, emu


@dataclass
class Replicas:
    a: Router
    b: Router
    alive: Callable[[], set[str]]  # the provider's sandboxes not killed (paused ones too)


@pytest.fixture
def replicas(
    emulated: tuple[str, Emulator | None], make_router: Any, tmp_path: Path
) -> Iterator[Replicas]:
    """Two routers on one Redis, each with an adapter of its own on the same provider."""
    name, emu = emulated
    one, two = build(name, emu, tmp_path), build(name, emu, tmp_path)
    chain = [{"name": "v", "provider": one.kind, "quota": {"sessions": 10}}]
    a = make_router(chain=chain, providers={"v": one.provider})
    b = make_router(chain=chain, providers={"v": two.provider})

    def alive() -> set[str]:
        if emu is not None:
            return {record.id for record in emu.alive()}
        return {info.id for info in asyncio.run(one.provider.list())}

    yield Replicas(a, b, alive)
    a.close_session("s")
    wait_until(lambda: alive() == set())
    assert alive() == set(), "a sandbox outlived its test"


def test_a_second_acquire_waits_for_the_holder_and_never_pauses_under_it(
    replicas: Replicas, events: list[Any]
) -> None:
    a, b = replicas.a, replicas.b
    first = a.acquire(session="s")
    first.sandbox.write_file("state.txt", "from a")
    got: dict[str, Any] = {}

    def second() -> None:
        with b.acquire(session="s", timeout=60) as lease:
            got["sandbox"], got["resumed"] = lease.sandbox_id, lease.resumed
            got["state"] = lease.sandbox.read_file("state.txt")
            lease.sandbox.write_file("state.txt", "from b")

    waiting = threading.Thread(target=second)
    waiting.start()
    try:
        wait_until(lambda: fired(events, "session_held") or not waiting.is_alive(), 30)
        # The holder's sandbox is still its own: not paused by the other replica's release.
        assert first.sandbox.run("echo still mine").stdout == "still mine\n"
        assert waiting.is_alive(), "the second acquire did not wait for the holder"
        [held] = fired(events, "session_held")
        assert (held["session"], held["sandbox_id"]) == ("s", first.sandbox_id)
    finally:
        first.release()
        waiting.join(60)
    assert got == {"sandbox": first.sandbox_id, "resumed": True, "state": b"from a"}
    with a.acquire(session="s") as third:  # the last release paused it; it comes back
        assert third.sandbox_id == first.sandbox_id
        assert third.sandbox.read_file("state.txt") == b"from b"
    assert a.status().entries[0].used["sessions"] == 1


def test_a_second_acquire_past_its_timeout_is_busy_and_spends_nothing(
    replicas: Replicas,
) -> None:
    a, b = replicas.a, replicas.b
    with a.acquire(session="s") as first:
        with pytest.raises(SessionBusy, match="held by another live lease") as busy:
            b.acquire(session="s", timeout=0.3)
        assert isinstance(busy.value, LeaseError)
        assert first.sandbox_id in str(busy.value)
        view = b.status().entries[0]
        assert (view.used["sessions"], view.live_leases) == (1, 1)
        assert first.sandbox.run("echo live").stdout == "live\n"
    with b.acquire(session="s", timeout=30) as again:  # free once its holder released it
        assert again.sandbox_id == first.sandbox_id


def test_closing_a_held_session_kills_its_sandbox_only_at_the_holders_release(
    replicas: Replicas,
) -> None:
    a, b = replicas.a, replicas.b
    with a.acquire(session="s") as held:
        assert b.close_session("s")
        assert held.sandbox.run("echo mine").stdout == "mine\n"
        assert held.sandbox_id in replicas.alive()
    wait_until(lambda: held.sandbox_id not in replicas.alive())
    assert held.sandbox_id not in replicas.alive()  # killed at its holder's release
    with b.acquire(session="s") as fresh:  # the session was forgotten: a new sandbox
        assert not fresh.resumed
        assert fresh.sandbox_id != held.sandbox_id
