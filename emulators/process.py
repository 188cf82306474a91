"""An emulator served by a child process, driven through its control port.

In the caller's process an emulator's loop, threads and records take turns
with the code under test for the GIL and share its heap: a benchmark would
time them and a memory check would count them. Served from a child process,
as the vendor's service is, they do neither. `Remote` carries what the
caller needs: the address, the SDK environment, and the control calls
(faults, records) over HTTP.
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from typing import Any

import httpx

from emulators import emulator_class
from emulators.latency import LatencyProfile

__all__ = ["Remote", "emulator_process"]


@dataclass(frozen=True)
class Remote:
    """An emulator served by another process: its addresses, SDK environment and controls."""

    name: str
    url: str
    control_url: str
    env: dict[str, str]

    def sdk_env(self) -> dict[str, str]:
        return self.env

    def inject(self, op: str = "*", **fault: Any) -> None:
        """Add a fault (`emulators.harness.FaultSpec` fields) for ``op``."""
        httpx.post(f"{self.control_url}/faults", json={"op": op, **fault}).raise_for_status()

    def clear_faults(self) -> None:
        httpx.delete(f"{self.control_url}/faults").raise_for_status()

    def records(self) -> list[dict[str, Any]]:
        """Every sandbox the emulator made, alive or not (`SandboxRecord` fields)."""
        answer = httpx.get(f"{self.control_url}/records")
        answer.raise_for_status()
        sandboxes: list[dict[str, Any]] = answer.json()["sandboxes"]
        return sandboxes


@contextmanager
def emulator_process(
    name: str,
    latency: LatencyProfile | None = None,
    isolation: str = "none",
    resume: LatencyProfile | None = None,
) -> Iterator[Remote]:
    """Run ``name``'s emulator in a child process for the duration of the block.

    ``latency``: how long its creates take (`emulators.latency`), ``resume``
    how long a resume of a paused sandbox takes; None: as fast as it can.
    ``isolation`` defaults to none, no bubblewrap (each command in a mount
    namespace of its own where the host allows one: `emulators.confinement`),
    which costs a command about what a bare one does, less than bubblewrap.
    """
    ctx = multiprocessing.get_context("spawn")
    here, there = ctx.Pipe()
    process = ctx.Process(
        target=_serve,
        args=(name, there, latency, isolation, resume),
        name=f"emulator-{name}",
        daemon=True,
    )
    process.start()
    try:
        if here not in wait([here, process.sentinel], timeout=60):
            raise RuntimeError(f"the {name} emulator did not start (exit {process.exitcode})")
        url, control_url, env = here.recv()
        yield Remote(name, url, control_url, env)
    finally:
        here.send("stop")
        process.join(30)
        if process.is_alive():
            process.kill()


def _serve(
    name: str,
    conn: Connection,
    latency: LatencyProfile | None,
    isolation: str,
    resume: LatencyProfile | None,
) -> None:
    with emulator_class(name)(isolation=isolation, latency=latency, resume_latency=resume) as emu:
        conn.send((emu.url, emu.control_url, emu.sdk_env()))
        conn.recv()
