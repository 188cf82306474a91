"""The one exception tree of sandbox-router: the router's errors and the providers' alike.

Every error the library raises derives from ``SandboxRouterError``, and
every class of the tree is defined here, drawn below once. This is its home
because everything imports it and it imports nothing: ``providers`` is the
layer ``policies`` and ``router`` build on (and ``router`` exports each
class), so the router's own errors live beside the providers' without an
import running upwards. Adapters map each vendor SDK exception to the most
specific class here, always with ``raise ... from exc`` so the SDK's own
exception stays on ``__cause__``::

    SandboxRouterError
    ├── ConfigError                 bad config file, field or value (router.config)
    ├── InvalidArgument             a hostile or impossible API argument (also a ValueError)
    │   └── ArgumentTypeError       an argument of the wrong type (also a TypeError)
    ├── StateUnavailable            the shared state store cannot be reached
    ├── RouterClosed                a call on a router after its close (also a RuntimeError)
    ├── NoProviderAvailable         every chain entry was skipped or failed (router)
    ├── BudgetExceeded              a pool's usd budget cannot hold a pause's storage
    ├── LeaseError                  a lease was used after release, or lost
    │   └── SessionBusy             another live lease held the session past the timeout
    └── ProviderError               raised by a provider adapter
        ├── AuthError               permanent: credentials missing or refused
        ├── QuotaExceeded           the provider's own quota answer (reset_at)
        ├── RateLimited             transient 429 (retry_after)
        ├── CapacityExceeded        the provider's concurrency cap
        ├── Unavailable             transient: 5xx, refused, timeouts
        ├── NotFound                no such sandbox or template
        └── SandboxError            the user's command or file op failed:
            ├── SandboxPathError    a path escapes the sandbox
            └── Unsupported         the serving entry lacks a capability used

How the router treats each class is decided in ``policies.outcome``: only
``Unavailable`` (and ``RateLimited`` inside its retry-after) is retried on the
same entry; ``SandboxError`` never causes a failover and never counts against
a provider's health.
"""

from __future__ import annotations

from datetime import datetime

__all__ = [
    "ArgumentTypeError",
    "AuthError",
    "BudgetExceeded",
    "CapacityExceeded",
    "ConfigError",
    "InvalidArgument",
    "LeaseError",
    "NoProviderAvailable",
    "NotFound",
    "ProviderError",
    "QuotaExceeded",
    "RateLimited",
    "RouterClosed",
    "SandboxError",
    "SandboxPathError",
    "SandboxRouterError",
    "SessionBusy",
    "StateUnavailable",
    "Unavailable",
    "Unsupported",
]


class SandboxRouterError(Exception):
    """Root of every error raised by sandbox-router."""


class ConfigError(SandboxRouterError, ValueError):
    """The configuration is invalid.

    The message names the file, the field path and what was expected, so an
    operator can fix it without reading code.
    """


class InvalidArgument(SandboxRouterError, ValueError):
    """An argument no provider could take (an env name with ``=``, a NUL byte...).

    Refused by `SandboxSpec` and the lease's sandbox handle before any SDK
    sees it, the same on every provider. The message names the argument and
    what is wrong with it, never an env value (it may be a secret).
    """


class ArgumentTypeError(InvalidArgument, TypeError):
    """An argument of the wrong type (a number given as a string, a path as an int).

    A ``TypeError`` as Python's own checks raise it, and inside the tree, so
    an app catching ``SandboxRouterError`` around a call catches it too.
    """


class RouterClosed(SandboxRouterError, RuntimeError):
    """The router was closed: its loop, SDK clients and store connections are gone.

    Raised by its calls and its leases' calls after `Router.close`, rather
    than quietly opening everything again (a lease acquired then would be
    one nothing releases).
    """


class StateUnavailable(SandboxRouterError):
    """The shared state store (Redis or SQLite) cannot be reached.

    Raised with ``on_state_error: fail_closed`` (the default) so no sandbox is
    created that the fleet's quota ledger does not know about.
    """


class LeaseError(SandboxRouterError):
    """A lease was used after it was released, or its state was lost."""


class SessionBusy(LeaseError):
    """Another live lease held the sticky session for the whole of the acquire's timeout.

    A session has one holder at a time: a second acquire of it waits for the
    first's release. Nothing was reserved or created while it waited.
    """


class NoProviderAvailable(SandboxRouterError):
    """No chain entry could serve; ``reasons`` maps each entry to why."""

    def __init__(self, reasons: dict[str, str]) -> None:
        self.reasons = dict(reasons)
        lines = "\n".join(f"  - {name}: {why}" for name, why in self.reasons.items())
        super().__init__(
            f"no sandbox provider available:\n{lines}"
            if lines
            else "no sandbox provider available: the chain is empty"
        )


class BudgetExceeded(SandboxRouterError):
    """A pool's ``usd`` budget cannot hold what a call would spend (a pause's storage for
    its whole pause): nothing was done, the lease is as it was."""


class ProviderError(SandboxRouterError):
    """An error from one provider adapter.

    Attributes:
        provider: the chain entry or provider name that raised it.
        status: the HTTP/gRPC status the provider answered, when there was one.
        sandbox_id: the sandbox concerned, when there is one.
        attempt: which attempt on this entry raised it (set by the router).
    """

    def __init__(
        self,
        message: str,
        *,
        provider: str | None = None,
        status: int | None = None,
        sandbox_id: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.provider = provider
        self.status = status
        self.sandbox_id = sandbox_id
        self.attempt: int | None = None

    def __str__(self) -> str:
        where = [f"provider={self.provider}"] if self.provider else []
        if self.sandbox_id:
            where.append(f"sandbox={self.sandbox_id}")
        if self.status is not None:
            where.append(f"status={self.status}")
        return f"{self.message} ({', '.join(where)})" if where else self.message


class AuthError(ProviderError):
    """Credentials are missing or refused: the entry is misconfigured."""


class QuotaExceeded(ProviderError):
    """The provider says the account's quota is spent, until ``reset_at``."""

    def __init__(
        self,
        message: str,
        *,
        reset_at: datetime | None = None,
        provider: str | None = None,
        status: int | None = None,
        sandbox_id: str | None = None,
    ) -> None:
        super().__init__(message, provider=provider, status=status, sandbox_id=sandbox_id)
        self.reset_at = reset_at


class RateLimited(ProviderError):
    """A transient 429; ``retry_after`` seconds when the provider said."""

    def __init__(
        self,
        message: str,
        *,
        retry_after: float | None = None,
        provider: str | None = None,
        status: int | None = None,
        sandbox_id: str | None = None,
    ) -> None:
        super().__init__(message, provider=provider, status=status, sandbox_id=sandbox_id)
        self.retry_after = retry_after


class CapacityExceeded(ProviderError):
    """The provider's cap on concurrent sandboxes is reached."""


class Unavailable(ProviderError):
    """Transient: 5xx, connection refused or reset, timeouts.

    Attributes:
        unanswered: the request went out and no answer came back (the
            connection was lost, the request timed out), so the vendor may
            have done it all the same. A create that fails so may have made a
            sandbox: the router looks it up by the create's lease label
            (`router.late_creates.LateCreates.failed`). False for an answer, and for a
            connection that could not be made (nothing was sent).
    """

    def __init__(
        self,
        message: str,
        *,
        unanswered: bool = False,
        provider: str | None = None,
        status: int | None = None,
        sandbox_id: str | None = None,
    ) -> None:
        super().__init__(message, provider=provider, status=status, sandbox_id=sandbox_id)
        self.unanswered = unanswered


class NotFound(ProviderError):
    """No such sandbox (or template) on the provider."""


class SandboxError(ProviderError):
    """The user's command or file operation failed; never a reason to fail over."""


class SandboxPathError(SandboxError, ValueError):
    """A file path escapes the sandbox's directory."""


class Unsupported(SandboxError):
    """The serving provider lacks a capability the caller used (e.g. ``pty.resize``).

    Routing avoids it up front: ``acquire(requires=("pty.resize",))`` only
    picks entries that declare it.
    """

    def __init__(self, provider: str, capability: str) -> None:
        # The hint is code to paste: the name, never the enum's repr.
        super().__init__(
            f"{provider} does not support {capability}: acquire with "
            f'requires=("{capability}",) to route to an entry that does',
            provider=provider,
        )
        self.capability = capability
