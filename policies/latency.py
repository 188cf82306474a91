"""Recent create latency per entry (a bounded sketch), and when to hedge a create.

A replica keeps, per entry, the last `SAMPLES` create latencies in a fixed
ring: O(1) to add, bounded memory, and a percentile over what the entry did
lately (a provider that degrades shows within a few dozen creates, which a
whole-history histogram would hide). Percentiles are nearest-rank over the
ring (sorting at most `SAMPLES` floats).

`hedge_delay` turns an entry's ``hedge.after`` (seconds, or ``"p95"``-style:
that percentile of the entry's recent creates) into the seconds to wait
before starting a second create beside a slow one. A percentile needs
`MIN_SAMPLES` creates first: with fewer the entry is not hedged (its usual
latency is not known, so no delay is better than a guess).
Pure: no I/O.
"""

from __future__ import annotations

import math
import re

__all__ = ["MIN_SAMPLES", "PERCENTILE", "SAMPLES", "LatencySketch", "hedge_delay", "percentile"]

SAMPLES = 128
MIN_SAMPLES = 10
PERCENTILE = re.compile(r"^p(\d{1,2}(?:\.\d+)?)$")  # p50, p95, p99.9: 0 < q < 100


def percentile(spec: str) -> float | None:
    """``"p95"`` -> 0.95; None when ``spec`` is no percentile in (0, 100)."""
    m = PERCENTILE.match(spec)
    if m is None:
        return None
    q = float(m.group(1))
    return q / 100 if 0 < q < 100 else None


class LatencySketch:
    """The last ``size`` latencies (seconds), oldest overwritten first."""

    def __init__(self, size: int = SAMPLES) -> None:
        if size < 1:
            raise ValueError(f"size must be at least 1, got {size}")
        self._ring: list[float] = []
        self._size = size
        self._next = 0

    def __len__(self) -> int:
        return len(self._ring)

    def add(self, seconds: float) -> None:
        if not seconds >= 0:  # also refuses NaN
            raise ValueError(f"a latency is a non-negative number of seconds, got {seconds}")
        if len(self._ring) < self._size:
            self._ring.append(seconds)
        else:
            self._ring[self._next] = seconds
        self._next = (self._next + 1) % self._size

    def quantile(self, q: float) -> float | None:
        """The nearest-rank ``q`` quantile (0 < q <= 1) of the samples; None when empty."""
        if not 0 < q <= 1:
            raise ValueError(f"q must be in (0, 1], got {q}")
        if not self._ring:
            return None
        ordered = sorted(self._ring)
        return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def hedge_delay(after: float | str, sketch: LatencySketch) -> float | None:
    """Seconds to wait before hedging, or None (a percentile with too few samples)."""
    if isinstance(after, str):
        q = percentile(after)
        if q is None:
            raise ValueError(f"hedge after {after!r}: give seconds or a percentile like 'p95'")
        if len(sketch) < MIN_SAMPLES:
            return None
        return sketch.quantile(q)
    return after
