"""What Daytona's sandbox states mean to the router."""

from __future__ import annotations

from typing import Any

__all__ = ["DELETED", "STARTABLE", "UNUSABLE", "state"]

DELETED = frozenset({"destroyed", "destroying"})
UNUSABLE = DELETED | {"error", "build_failed"}
STARTABLE = frozenset({"stopped", "archived"})


def state(value: Any) -> str:
    """The state's name, whether the SDK gave an enum or a string."""
    return str(getattr(value, "value", value) or "unknown")
