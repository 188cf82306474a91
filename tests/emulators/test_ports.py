"""Ports handed out before someone binds them: never twice, never where the kernel draws."""

from __future__ import annotations

import socket

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
