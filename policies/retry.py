"""Backoff inside one entry, as tenacity strategy objects.

Only transient errors (``Unavailable``, timeouts) are retried on the same
entry; everything else fails over at once (see `policies.outcome`). The
wait is exponential with full jitter, capped, and never sleeps past the
acquire's overall deadline (the router checks that before sleeping).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import tenacity

__all__ = ["RetryPolicy", "StopAtDeadline"]


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """Attempts per entry and the backoff between them.

    Attributes:
        attempts: creates tried on one entry before failing over (>= 1).
        initial: the backoff scale in seconds (first wait is up to this).
        maximum: the cap of a single wait.
    """

    attempts: int = 3
    initial: float = 0.2
    maximum: float = 5.0

    def __post_init__(self) -> None:
        if self.attempts < 1:
            raise ValueError(f"retry attempts must be >= 1, got {self.attempts}")

    def wait(self) -> tenacity.wait.wait_base:
        """Full jitter: uniform in [0, min(maximum, initial * 2**n)]."""
        return tenacity.wait_random_exponential(multiplier=self.initial, max=self.maximum)

    def stop(self, deadline: float, clock: Callable[[], float]) -> tenacity.stop.stop_base:
        """Stop after ``attempts``, or when the next wait would pass ``deadline``."""
        return tenacity.stop_after_attempt(self.attempts) | StopAtDeadline(deadline, clock)


class StopAtDeadline(tenacity.stop.stop_base):
    """Stop when sleeping the upcoming backoff would reach the deadline."""

    def __init__(self, deadline: float, clock: Callable[[], float]) -> None:
        self.deadline = deadline
        self.clock = clock

    def __call__(self, retry_state: tenacity.RetryCallState) -> bool:
        return self.clock() + (retry_state.upcoming_sleep or 0.0) >= self.deadline
