"""How long a vendor takes to create, or to resume, a sandbox: profiles the emulators
can play back.

An emulator answers a create as fast as this machine can make a local
sandbox (a few ms), which no vendor does. A `LatencyProfile` makes its
creates take what the vendor's do: a log-normal draw with the vendor's
median and 95th percentile. `PUBLISHED` holds each vendor's create figure
and where it comes from, `RESUME` the same for waking a paused sandbox
(E2B's connect, Daytona's start, Runloop's resume; Modal cannot pause);
benchmarks/RESULTS.md names the sources too. No profile is set by default,
so tests stay fast; the benchmarks set one, and so can anyone through
`Emulator.set_latency` / `set_resume_latency` or ``PUT /latency`` and
``PUT /latency/resume`` on the control port.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

__all__ = ["PUBLISHED", "RESUME", "LatencyProfile"]

_Z95 = 1.6449  # the standard normal's 95th percentile


@dataclass(frozen=True, slots=True)
class LatencyProfile:
    """A create's latency: log-normal with median ``p50`` and 95th percentile ``p95`` (s).

    ``source`` says where the figures come from.
    """

    p50: float
    p95: float
    source: str = ""

    def __post_init__(self) -> None:
        if not 0 <= self.p50 <= self.p95:
            raise ValueError(f"latency profile needs 0 <= p50 <= p95, got {self.p50}, {self.p95}")

    def sample(self, rng: random.Random) -> float:
        """One create's latency in seconds."""
        if self.p50 == 0:
            return 0.0
        sigma = math.log(self.p95 / self.p50) / _Z95
        return rng.lognormvariate(math.log(self.p50), sigma)


PUBLISHED: dict[str, LatencyProfile] = {
    "e2b": LatencyProfile(
        0.150,
        0.300,
        "E2B: sandboxes start in ~150 ms (e2b.dev; third-party write-ups give <200 ms, "
        "50-200 ms); p95 assumed 2x the median",
    ),
    "daytona": LatencyProfile(
        0.090,
        0.200,
        "Daytona: sub-90 ms from create to first command (daytona.io; the Vstorm "
        "pydantic-ai-backend write-up); p95 assumed",
    ),
    "modal": LatencyProfile(
        1.0,
        2.5,
        "Modal: no single published figure; its 'Unpacking sandbox startup latency' "
        "post splits create/schedule/start; ~1 s to a started sandbox is an estimate",
    ),
    "runloop": LatencyProfile(
        1.5,
        3.0,
        "Runloop: no published boot time found; docs say suspend/resume 'typically "
        "takes seconds'; an estimate",
    ),
}

RESUME: dict[str, LatencyProfile] = {
    "e2b": LatencyProfile(
        1.0,
        2.0,
        "E2B: 'it takes about 1 second to resume the sandbox' (E2B's persistence docs); "
        "p95 assumed 2x the median",
    ),
    "daytona": LatencyProfile(
        1.0,
        3.0,
        "Daytona: no published figure for starting a stopped sandbox (it boots again from "
        "its disk); an estimate",
    ),
    "runloop": LatencyProfile(
        2.0,
        5.0,
        "Runloop: its docs say suspend/resume 'typically takes seconds'; an estimate",
    ),
}
