"""What Daytona's sandbox and snapshot states mean to the router."""

from __future__ import annotations

from typing import Any

from providers.errors import Unavailable

__all__ = [
    "DELETED",
    "FAILED",
    "SNAPSHOT_MAKING",
    "SNAPSHOT_READY",
    "SNAPSHOT_REMOVING",
    "STARTABLE",
    "UNUSABLE",
    "failed",
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


def failed(dto: Any, provider: str) -> Unavailable:
    """The error of a sandbox found in a `FAILED` state, with Daytona's reason."""
    return Unavailable(
        f"Sandbox {dto.id} entered error state: {state(dto.state)}, "
        f"error reason: {dto.error_reason}",
        provider=provider,
        sandbox_id=dto.id,
    )
