"""Ports handed out before someone binds them: never twice, never to two processes at once,
never where the kernel draws."""

from __future__ import annotations

import multiprocessing
import socket
from typing import Any

from emulators.harness import free_port


def test_free_ports_are_never_handed_out_twice_and_stay_below_the_ephemeral_range() -> None:
    ports = [free_port() for _ in range(300)]
    assert len(set(ports)) == len(ports)
    with open("/proc/sys/net/ipv4/ip_local_port_range") as ephemeral:
        low = int(ephemeral.read().split()[0])
    assert max(ports) < low  # bind(0) and outgoing connections draw from there


def test_a_port_someone_listens_on_is_not_handed_out() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = taken.getsockname()[1]
        assert busy not in {free_port() for _ in range(300)}


def _draw(count: int, drawn: Any, done: Any) -> None:
    drawn.put([free_port() for _ in range(count)])
    done.wait(60)  # alive, its ports not yet bound, while the other process draws


def test_a_port_another_process_was_handed_is_not_handed_out_while_it_lives() -> None:
    """Two pytest-xdist workers draw ports for their emulators at once; one must not be
    handed a port the other holds and has not bound yet ("address already in use" at
    an emulator's start). 600 draws each of 12,768 ports would share about 28 ports
    if each process drew on its own."""
    ctx = multiprocessing.get_context("spawn")
    drawn, done = ctx.Queue(), ctx.Event()
    other = ctx.Process(target=_draw, args=(600, drawn, done))
    other.start()
    try:
        theirs = set(drawn.get(timeout=60))
        mine = {free_port() for _ in range(600)}
        assert not mine & theirs
    finally:
        done.set()
        other.join(30)
    assert not other.exitcode
