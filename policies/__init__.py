"""Pure decision logic: quota windows and ledger, breaker, retry, ordering.

Nothing here does I/O: functions take facts (usage, limits, failures, the
clock) and return decisions, so they are tested exhaustively and the state
stores apply them atomically (a Lua script on Redis, one transaction on
SQLite).
"""

from policies.breaker import Admission, BreakerConfig, BreakerState, Outcome
from policies.ordering import Candidate, order
from policies.outcome import Verdict, classify
from policies.quota import Limits, MonthlyWindow, PoolState
from policies.retry import RetryPolicy

__all__ = [
    "Admission",
    "BreakerConfig",
    "BreakerState",
    "Candidate",
    "Limits",
    "MonthlyWindow",
    "Outcome",
    "PoolState",
    "RetryPolicy",
    "Verdict",
    "classify",
    "order",
]
