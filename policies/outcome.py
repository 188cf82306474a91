"""Classify an error before counting it (pybreaker's lesson).

The router asks two questions of every error a provider raised: what it
says about the entry's health (an `Outcome` for the breaker), and whether
the same entry may be tried again within this acquire.
"""

from __future__ import annotations

from dataclasses import dataclass

from policies.breaker import Outcome
from providers.errors import (
    AuthError,
    CapacityExceeded,
    NotFound,
    QuotaExceeded,
    RateLimited,
    SandboxError,
    Unavailable,
)

__all__ = ["Verdict", "classify"]


@dataclass(frozen=True, slots=True)
class Verdict:
    """What to do after a failed create.

    Attributes:
        outcome: what the breaker records.
        retry_same: worth another attempt on the same entry (with backoff).
        fail_over: move on to the next entry; False gives the error to the caller.
        reason: a short label for logs and metrics (``unavailable``, ``auth``...).
    """

    outcome: Outcome
    retry_same: bool
    fail_over: bool
    reason: str


def classify(exc: BaseException) -> Verdict:
    """The verdict for an exception raised by a provider's create."""
    if isinstance(exc, SandboxError):
        return Verdict(Outcome.NEUTRAL, retry_same=False, fail_over=False, reason="sandbox_error")
    if isinstance(exc, AuthError):
        return Verdict(Outcome.AUTH, retry_same=False, fail_over=True, reason="auth")
    if isinstance(exc, QuotaExceeded):
        return Verdict(Outcome.QUOTA, retry_same=False, fail_over=True, reason="quota_exceeded")
    if isinstance(exc, RateLimited):
        return Verdict(
            Outcome.RATE_LIMITED, retry_same=False, fail_over=True, reason="rate_limited"
        )
    if isinstance(exc, CapacityExceeded):
        return Verdict(Outcome.CAPACITY, retry_same=False, fail_over=True, reason="capacity")
    if isinstance(exc, NotFound):
        return Verdict(Outcome.NEUTRAL, retry_same=False, fail_over=True, reason="not_found")
    if isinstance(exc, Unavailable | TimeoutError):
        return Verdict(Outcome.TRANSIENT, retry_same=True, fail_over=True, reason="unavailable")
    # An exception no adapter mapped is a bug there; the entry is treated as
    # failing (so one broken adapter cannot stop the fleet), never retried.
    return Verdict(Outcome.TRANSIENT, retry_same=False, fail_over=True, reason="error")
