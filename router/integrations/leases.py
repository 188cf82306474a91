"""The lease an integration's backend runs on: acquired and released by the backend, or one the
app already holds (and releases itself).

A framework calls its backend both ways (deepagents' ``invoke`` and ``ainvoke``), so the
backend needs the sandbox's sync and async handles whichever flavour of lease it got.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from providers.base import SandboxSpec
from providers.errors import ArgumentTypeError, LeaseError
from router.core import Router
from router.lease import AsyncLease, AsyncSandboxHandle, Lease, SyncSandbox

__all__ = ["Acquire", "Held"]


@dataclass(frozen=True)
class Acquire:
    """What to ask the router for when the backend is entered."""

    router: Router
    spec: SandboxSpec | None = None
    requires: tuple[str, ...] = ()
    labels: Mapping[str, str] | None = None
    session: str | None = None
    timeout: float | None = None

    def sync(self) -> Lease:
        return self.router.acquire(
            self.spec,
            requires=self.requires,
            labels=self.labels,
            session=self.session,
            timeout=self.timeout,
        )

    async def aio(self) -> AsyncLease:
        return await self.router.aacquire(
            self.spec,
            requires=self.requires,
            labels=self.labels,
            session=self.session,
            timeout=self.timeout,
        )


@dataclass
class Held:
    """The backend's lease and both handles on its sandbox; ``owned`` when the backend
    acquired it, so releases it."""

    source: Router | Lease | AsyncLease
    acquire: Acquire | None
    what: str
    lease: Lease | AsyncLease | None = None
    owned: bool = False
    handles: tuple[SyncSandbox, AsyncSandboxHandle] | None = field(default=None, repr=False)

    @classmethod
    def of(
        cls,
        source: Router | Lease | AsyncLease,
        what: str,
        spec: SandboxSpec | None,
        requires: Iterable[str],
        labels: Mapping[str, str] | None,
        session: str | None,
        timeout: float | None,
    ) -> Held:
        if isinstance(source, Lease | AsyncLease):
            held = cls(source, None, what)
            held.take(source, owned=False)
            return held
        if not isinstance(source, Router):
            raise ArgumentTypeError(
                f"{what}(source): a Router, Lease or AsyncLease, not {type(source).__name__}"
            )
        wanted = Acquire(source, spec, tuple(requires), labels, session, timeout)
        return cls(source, wanted, what)

    def take(self, lease: Lease | AsyncLease, *, owned: bool) -> None:
        self.lease, self.owned = lease, owned
        self.handles = (lease.sync_sandbox, lease.async_sandbox)

    def sync(self) -> SyncSandbox:
        return self._handles()[0]

    def aio(self) -> AsyncSandboxHandle:
        return self._handles()[1]

    def _handles(self) -> tuple[SyncSandbox, AsyncSandboxHandle]:
        if self.handles is None:
            raise LeaseError(
                f"{self.what} holds no sandbox: enter it first (`with {self.what}(router) as "
                "backend:` or `async with`), or give it a lease the app holds"
            )
        return self.handles

    def enter(self) -> None:
        if self.acquire is not None:
            self._check_unheld()
            self.take(self.acquire.sync(), owned=True)

    async def aenter(self) -> None:
        if self.acquire is not None:
            self._check_unheld()
            self.take(await self.acquire.aio(), owned=True)

    def _check_unheld(self) -> None:
        if self.lease is not None and not self.lease.released:
            raise LeaseError(f"{self.what} already holds lease {self.lease.id}: enter it once")

    def exit(self) -> None:
        lease, self.handles = self.lease, None
        if self.owned and isinstance(lease, Lease):  # `with` gave it a sync lease
            lease.release()

    async def aexit(self) -> None:
        lease, self.handles = self.lease, None
        if self.owned and isinstance(lease, AsyncLease):  # `async with` gave it an async one
            await lease.release()
