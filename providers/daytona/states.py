"""What Daytona's sandbox and snapshot states mean to the router."""

from __future__ import annotations

from typing import Any

__all__ = [
    "DELETED",
    "FAILED",
    "SNAPSHOT_MAKING",
    "SNAPSHOT_READY",
    "SNAPSHOT_REMOVING",
    "STARTABLE",
    "UNUSABLE",
    "state",
]

DELETED = frozenset({"destroyed", "destroying"})
FAILED = frozenset({"error", "build_failed"})
UNUSABLE = DELETED | FAILED
STARTABLE = frozenset({"stopped", "archived"})

SNAPSHOT_READY = "active"
SNAPSHOT_REMOVING = "removing"
SNAPSHOT_MAKING = frozenset(
    {
        "build_pending",
        "building",
        "pending",
        "pulling",
        "snapshotting",
        "pending_validation",
        "validating",
    }
)


def state(value: Any) -> str:
    """The state's name, whether the generated client gave an enum or a string."""
    return str(getattr(value, "value", value) or "unknown")
