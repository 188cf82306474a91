"""The health of one chain entry: a circuit breaker plus temporary blocks.

Circuit (transient failures only, shared by every replica)::

    closed --N consecutive failures, or failure rate >= R over the
             sliding window with >= min_calls--> open
    open   --cooldown passed--> half_open (exactly one probe admitted)
    half_open --probe succeeded--> closed
    half_open --probe failed--> open (longer cooldown)

The sliding window is ``WINDOW_BUCKETS`` buckets of ``window_seconds / 10``
each, holding call and failure counts (resilience4j's time-based window):
the state stays a few hundred bytes however busy the entry is, which
matters because the Redis store decodes and encodes it inside every script.

The cooldown grows with each consecutive opening, ``base x openings`` up to
``cooldown_max`` (Envoy's ejection time), and a deadline only ever extends:
a late, shorter verdict from another replica never shortens it.

Blocks come from the provider's own answers and do not touch the circuit:
``misconfigured`` (AuthError: until the entry's config changes),
``exhausted`` (QuotaExceeded: until its reset), ``rate_limited``
(RateLimited: until retry-after) and ``capacity`` (CapacityExceeded: until a
lease on the entry is released or a short cooldown passes).

Everything here is pure: state in, state and verdict out. The Redis store
runs the same rules in Lua (``router/state/lua/lib.lua``);
``tests/state/test_lua_matches_policies.py`` holds the two to the same answers.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from typing import Any

__all__ = [
    "WINDOW_BUCKETS",
    "Admission",
    "BreakerConfig",
    "BreakerState",
    "Circuit",
    "Outcome",
    "admit",
    "clear_capacity",
    "record",
]

MISCONFIGURED = "misconfigured"
EXHAUSTED = "exhausted"
RATE_LIMITED = "rate_limited"
CAPACITY = "capacity"
WINDOW_BUCKETS = 10


class Circuit(StrEnum):
    """The breaker's circuit states (equal to their names as strings, as stored)."""

    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


class Outcome(StrEnum):
    """What one provider call told us about the entry's health."""

    SUCCESS = "success"
    TRANSIENT = "transient"
    AUTH = "auth"
    QUOTA = "quota"
    RATE_LIMITED = "rate_limited"
    CAPACITY = "capacity"
    NEUTRAL = "neutral"  # says nothing about health (user error, not found, cancelled)


@dataclass(frozen=True, slots=True)
class BreakerConfig:
    failure_threshold: int = 5
    failure_rate: float = 0.5
    window_seconds: float = 60.0
    min_calls: int = 10
    cooldown_base: float = 30.0
    cooldown_max: float = 600.0
    probe_timeout: float = 120.0
    capacity_cooldown: float = 10.0
    rate_limit_default: float = 5.0
    quota_default: float = 3600.0


@dataclass(slots=True)
class BreakerState:
    circuit: Circuit = Circuit.CLOSED
    failures: int = 0
    openings: int = 0
    open_until: float = 0.0
    probe_until: float = 0.0
    window: list[list[int]] = field(default_factory=list)  # [bucket, calls, failed]
    block: str = ""
    block_until: float = 0.0
    block_detail: str = ""
    fingerprint: str = ""

    def __post_init__(self) -> None:
        self.circuit = Circuit(self.circuit)  # stores hold it as a plain string

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> BreakerState:
        if not data:
            return cls()
        state = cls(**{k: data[k] for k in cls.__dataclass_fields__ if k in data})
        state.window = [list(b) for b in state.window] if state.window else []
        return state


@dataclass(frozen=True, slots=True)
class Admission:
    """May a call go to the entry now? ``probe`` marks the half-open probe."""

    allowed: bool
    probe: bool = False
    reason: str = ""
    until: float = 0.0
    transition: tuple[str, str] | None = None


def admit(state: BreakerState, cfg: BreakerConfig, now: float, fingerprint: str) -> Admission:
    """Decide admission; takes the fleet-wide probe when the cooldown is over."""
    if state.block:
        if state.block == MISCONFIGURED:
            if state.fingerprint == fingerprint:
                return Admission(False, reason=MISCONFIGURED)
            _clear_block(state)
        elif now < state.block_until:
            return Admission(False, reason=state.block, until=state.block_until)
        else:
            _clear_block(state)
    if state.circuit is Circuit.OPEN:
        if now < state.open_until:
            return Admission(False, reason=Circuit.OPEN, until=state.open_until)
        state.circuit = Circuit.HALF_OPEN
        state.probe_until = now + cfg.probe_timeout
        return Admission(True, probe=True, transition=(Circuit.OPEN, Circuit.HALF_OPEN))
    if state.circuit is Circuit.HALF_OPEN:
        if now < state.probe_until:
            return Admission(False, reason=Circuit.HALF_OPEN, until=state.probe_until)
        state.probe_until = now + cfg.probe_timeout
        return Admission(True, probe=True)
    return Admission(True)


def record(
    state: BreakerState,
    cfg: BreakerConfig,
    outcome: Outcome,
    now: float,
    *,
    fingerprint: str = "",
    detail: str = "",
    until: float | None = None,
) -> tuple[str, str] | None:
    """Apply one call's outcome; returns the circuit transition, if any.

    ``until`` is the absolute end of a quota or rate-limit block when the
    provider said (reset_at, now + retry_after).
    """
    before = state.circuit
    if outcome is Outcome.SUCCESS:
        _count(state, cfg, now, failed=0)
        state.failures = 0
        if state.circuit is Circuit.HALF_OPEN:
            state.circuit, state.openings, state.probe_until = Circuit.CLOSED, 0, 0.0
    elif outcome is Outcome.TRANSIENT:
        _count(state, cfg, now, failed=1)
        state.failures += 1
        if state.circuit is Circuit.HALF_OPEN or (
            state.circuit is Circuit.CLOSED and _tripped(state, cfg)
        ):
            _open(state, cfg, now)
    else:
        if state.circuit is Circuit.HALF_OPEN:
            state.probe_until = 0.0
        if outcome is Outcome.AUTH:
            state.block, state.block_until = MISCONFIGURED, 0.0
            state.block_detail, state.fingerprint = detail, fingerprint
        elif outcome is Outcome.QUOTA:
            _block(state, EXHAUSTED, until if until else now + cfg.quota_default, detail)
        elif outcome is Outcome.RATE_LIMITED:
            _block(state, RATE_LIMITED, until if until else now + cfg.rate_limit_default, detail)
        elif outcome is Outcome.CAPACITY:
            _block(state, CAPACITY, now + cfg.capacity_cooldown, detail)
    return (before, state.circuit) if state.circuit != before else None


def clear_capacity(state: BreakerState) -> None:
    """A lease on the entry was released: its concurrency cap has room again."""
    if state.block == CAPACITY:
        _clear_block(state)


def _count(state: BreakerState, cfg: BreakerConfig, now: float, *, failed: int) -> None:
    """Count a call into the current bucket, dropping buckets that left the window."""
    current = math.floor(now / (cfg.window_seconds / WINDOW_BUCKETS))
    state.window = [b for b in state.window if b[0] > current - WINDOW_BUCKETS]
    for bucket in state.window:
        if bucket[0] == current:
            bucket[1] += 1
            bucket[2] += failed
            return
    state.window.append([current, 1, failed])


def _tripped(state: BreakerState, cfg: BreakerConfig) -> bool:
    if state.failures >= cfg.failure_threshold:
        return True
    calls = sum(b[1] for b in state.window)
    failed = sum(b[2] for b in state.window)
    return calls >= cfg.min_calls and failed / calls >= cfg.failure_rate


def _open(state: BreakerState, cfg: BreakerConfig, now: float) -> None:
    state.openings += 1
    cooldown = min(cfg.cooldown_base * state.openings, cfg.cooldown_max)
    state.circuit = Circuit.OPEN
    state.open_until = max(state.open_until, now + cooldown)
    state.probe_until = 0.0
    state.failures = 0
    state.window = []


def _block(state: BreakerState, reason: str, until: float, detail: str) -> None:
    if state.block == MISCONFIGURED:
        return
    if state.block == reason:
        until = max(until, state.block_until)
    elif state.block and state.block_until > until:
        return
    state.block, state.block_until, state.block_detail = reason, until, detail


def _clear_block(state: BreakerState) -> None:
    state.block, state.block_until, state.block_detail, state.fingerprint = "", 0.0, "", ""
