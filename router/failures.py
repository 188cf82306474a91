"""What a failed create tells the router: the breaker's outcome, and the event.

A vendor's quota or rate-limit error may say when it ends; the breaker's
block then lasts until then rather than its own cooldown.
"""

from __future__ import annotations

import asyncio

from policies.breaker import Outcome
from policies.outcome import classify
from providers.errors import QuotaExceeded, RateLimited
from router.events import CreateFailed

__all__ = ["create_failed", "verdict"]


def verdict(exc: BaseException, now: float) -> tuple[Outcome, float | None]:
    """What a failure tells the breaker, and until when a block it sets lasts."""
    if isinstance(exc, asyncio.CancelledError):
        return Outcome.NEUTRAL, None
    if isinstance(exc, QuotaExceeded) and exc.reset_at is not None:
        return classify(exc).outcome, exc.reset_at.timestamp()
    if isinstance(exc, RateLimited) and exc.retry_after is not None:
        return classify(exc).outcome, now + exc.retry_after
    return classify(exc).outcome, None


def create_failed(
    entry: str, exc: BaseException, attempt: int, started: float, now: float
) -> CreateFailed:
    return CreateFailed(
        entry=entry,
        reason=classify(exc).reason,
        error=str(exc)[:300],
        attempt=attempt,
        latency=now - started,
    )
