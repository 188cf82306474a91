"""What spans cost: with no tracer installed (what every command and transfer pays), and
through the OpenTelemetry tracer."""

from __future__ import annotations

import asyncio
import timeit
from collections.abc import Callable
from pathlib import Path
from typing import Any

from opentelemetry.sdk.trace import TracerProvider

from benchmarks.common import local_chain, paired
from router import Router
from router.spans import CommandSpan, Spans
from router.tracing import instrument


def _best_us(call: Callable[[], None], number: int) -> float:
    """Microseconds per call, best of 5, the loop's own cost taken off."""

    def bare() -> None:
        pass

    def best(timed: Callable[[], None]) -> float:
        return min(timeit.repeat(timed, number=number, repeat=5)) / number * 1e6

    return best(call) - best(bare)


def span_costs(root: Path, number: int) -> dict[str, float]:
    """One command's span: untraced (its record, a call, an empty ``with``), through the
    OpenTelemetry tracer into the SDK (no exporter), and the SDK's own bare span."""
    untraced, traced = Spans(), Spans()
    provider = TracerProvider()
    with Router.from_config(local_chain("memory://", "bench-spans", root), hooks=[]) as r:
        traced.tracers.append(instrument(r, provider).tracer)

        def untraced_span() -> None:
            with untraced(CommandSpan("run", "local", "sandbox", "true")):
                pass

        def traced_span() -> None:
            with traced(CommandSpan("run", "local", "sandbox", "true")):
                pass

        sdk = provider.get_tracer("bench")

        def sdk_span() -> None:
            with sdk.start_as_current_span("run", attributes={"a": "local", "b": "sandbox"}):
                pass

        costs = {
            "untraced_ns": round(_best_us(untraced_span, number * 10) * 1000, 1),
            "traced_us": round(_best_us(traced_span, number), 2),
            "sdk_span_us": round(_best_us(sdk_span, number), 2),
        }
    provider.shutdown()
    return costs


def tracing_cost(state_url: str, root: Path, iterations: int) -> dict[str, Any]:
    """The spans' costs (`span_costs`), and an acquire + release (4 spans: acquire, reserve,
    create, release) on a router traced into the SDK, paired against an untraced one;
    async API, both on the benchmark's loop, no command (whose subprocess would hide it)."""

    async def pair() -> dict[str, Any]:
        bare = Router.from_config(local_chain(state_url, "bench-untraced", root / "u"), hooks=[])
        traced = Router.from_config(local_chain(state_url, "bench-traced", root / "t"), hooks=[])
        provider = TracerProvider()
        instrument(traced, provider)
        async with bare, traced:

            async def cycle(router: Router) -> None:
                async with await router.aacquire():
                    pass

            got = await paired(lambda: cycle(traced), lambda: cycle(bare), iterations)
        provider.shutdown()
        return got

    return {"span": span_costs(root / "s", 2000), "traced_cycle": asyncio.run(pair())}
