"""sandbox-router: a live code-execution sandbox from the best available provider.

    from router import Router

    with Router.from_env().acquire() as lease:
        print(lease.sandbox.run("python3 -c 'print(1 + 1)'").stdout)

The error classes are drawn as one tree in ``providers.errors``.
"""

from providers.base import (
    CodeContext,
    CodeError,
    CodeResult,
    CommandResult,
    FileInfo,
    PortURL,
    RichResult,
    SandboxSpec,
    Snapshot,
)
from providers.errors import (
    ArgumentTypeError,
    AuthError,
    BudgetExceeded,
    CapacityExceeded,
    ConfigError,
    InvalidArgument,
    LeaseError,
    NoProviderAvailable,
    NotFound,
    ProviderError,
    QuotaExceeded,
    RateLimited,
    RouterClosed,
    SandboxError,
    SandboxPathError,
    SandboxRouterError,
    SessionBusy,
    StateUnavailable,
    Unavailable,
    Unsupported,
)
from router.config import RouterConfig, load_config
from router.core import EntryView, ReapReport, Router, RouterStatus
from router.events import Event, Hook
from router.lease import AsyncLease, Lease, PendingLease
from router.logs import configure_logging
from router.state import TenantUsage

__all__ = [
    "ArgumentTypeError",
    "AsyncLease",
    "AuthError",
    "BudgetExceeded",
    "CapacityExceeded",
    "CodeContext",
    "CodeError",
    "CodeResult",
    "CommandResult",
    "ConfigError",
    "EntryView",
    "Event",
    "FileInfo",
    "Hook",
    "InvalidArgument",
    "Lease",
    "LeaseError",
    "NoProviderAvailable",
    "NotFound",
    "PendingLease",
    "PortURL",
    "ProviderError",
    "QuotaExceeded",
    "RateLimited",
    "ReapReport",
    "RichResult",
    "Router",
    "RouterClosed",
    "RouterConfig",
    "RouterStatus",
    "SandboxError",
    "SandboxPathError",
    "SandboxRouterError",
    "SandboxSpec",
    "SessionBusy",
    "Snapshot",
    "StateUnavailable",
    "TenantUsage",
    "Unavailable",
    "Unsupported",
    "configure_logging",
    "load_config",
]
