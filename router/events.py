"""Instrumentation as hooks: every routing event goes to each hook.

The router never logs or counts directly; it emits an `Event` and the hooks
decide: `log_hook` writes one structured log line per event
(``sandbox_router.<name>``), the Prometheus hook in ``router.metrics``
counts. A hook that raises is logged and otherwise ignored, so
instrumentation can never break an acquire.

Events and their fields:

* ``acquired``: entry, lease_id, sandbox_id, attempts, latency, probe
* ``acquire_failed``: reasons, latency
* ``create_failed``: entry, reason, error, attempt, latency
* ``created``: entry, latency
* ``failover``: from_entry, to_entry (``none`` at the end), reason
* ``refund``: entry, lease_id, reason
* ``breaker``: entry, from_state, to_state
* ``released``: entry, lease_id, seconds
* ``lease_lost``: entry, lease_id (its commit or a heartbeat found it gone from the store)
* ``kill_failed``: entry, sandbox_id, error
* ``state_error``: operation (reserve, commit, refund, release, heartbeat, ...), error,
  mode (fail_closed / fail_open)
* ``state_warning``: url, problem (e.g. Redis without persistence)
* ``session_lost``: session, entry, reason (the bound sandbox is gone: a new one is bound)
* ``session_closed``: session, entry, sandbox_id
* ``reaped``: entry, sandbox_id, lease_id (the janitor killed an orphan)
* ``quota_changed``: pool, unit, value
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import structlog

__all__ = ["Event", "Hook", "emit", "log_hook"]

_log = structlog.get_logger("sandbox_router")

_WARN = frozenset(
    {
        "failover",
        "refund",
        "state_error",
        "lease_lost",
        "kill_failed",
        "acquire_failed",
        "quota_changed",
        "state_warning",
        "session_lost",
        "reaped",
    }
)


@dataclass(frozen=True, slots=True)
class Event:
    name: str
    fields: dict[str, Any] = field(default_factory=dict)


Hook = Callable[[Event], None]


def log_hook(event: Event) -> None:
    """One structured log line per event, at warning level for trouble."""
    level = "warning" if event.name in _WARN else "info"
    if event.name == "breaker" and event.fields.get("to_state") == "open":
        level = "warning"
    getattr(_log, level)(f"sandbox_router.{event.name}", **event.fields)


def emit(hooks: Sequence[Hook], name: str, **fields: Any) -> None:
    event = Event(name, fields)
    for hook in hooks:
        try:
            hook(event)
        except Exception:  # a broken hook must not break routing
            with contextlib.suppress(Exception):
                _log.exception("sandbox_router.hook_failed", hook=repr(hook), event_name=name)
