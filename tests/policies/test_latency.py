"""The create latency sketch and the hedge delay (pure)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from policies.latency import MIN_SAMPLES, LatencySketch, hedge_delay, percentile


def test_nearest_rank_quantiles() -> None:
    sketch = LatencySketch()
    assert sketch.quantile(0.5) is None
    for v in [5.0, 1.0, 3.0, 2.0, 4.0]:
        sketch.add(v)
    assert [sketch.quantile(q) for q in (0.2, 0.5, 0.95, 1.0)] == [1.0, 3.0, 5.0, 5.0]


@given(st.lists(st.floats(0, 1e6), min_size=1, max_size=300), st.integers(1, 50))
def test_the_ring_keeps_the_last_samples_only(samples: list[float], size: int) -> None:
    sketch = LatencySketch(size)
    for v in samples:
        sketch.add(v)
    kept = sorted(samples[-size:])
    assert len(sketch) == len(kept)
    assert sketch.quantile(1.0) == kept[-1]
    assert sketch.quantile(1 / len(kept)) == kept[0]


def test_bad_input_is_refused() -> None:
    with pytest.raises(ValueError, match="size"):
        LatencySketch(0)
    with pytest.raises(ValueError, match="latency"):
        LatencySketch().add(float("nan"))
    with pytest.raises(ValueError, match="q must"):
        LatencySketch().quantile(0)


@pytest.mark.parametrize(
    ("spec", "q"),
    [("p50", 0.5), ("p95", 0.95), ("p99.9", 0.999), ("p0", None), ("p100", None), ("95", None)],
)
def test_percentile_names(spec: str, q: float | None) -> None:
    assert percentile(spec) == pytest.approx(q) if q else percentile(spec) is None


def test_hedge_delay_in_seconds_or_once_enough_creates_are_known() -> None:
    sketch = LatencySketch()
    assert hedge_delay(1.5, sketch) == 1.5
    for _ in range(MIN_SAMPLES - 1):
        sketch.add(0.2)
    assert hedge_delay("p95", sketch) is None
    sketch.add(0.9)
    assert hedge_delay("p95", sketch) == 0.9
    assert hedge_delay("p50", sketch) == 0.2
    with pytest.raises(ValueError, match="percentile"):
        hedge_delay("fast", sketch)
