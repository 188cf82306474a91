"""A sticky session's binding to its sandbox, held by the lease that uses it.

Bindings live in the shared store only (a session resumed on another
replica must find its sandbox there); the fail-open share never holds one.
"""

from __future__ import annotations

from collections.abc import Callable

from router.lease import Held
from router.state import StateStore

__all__ = ["Bindings"]


class Bindings:
    def __init__(self, store: StateStore, clock: Callable[[], float]) -> None:
        self._store = store
        self._clock = clock

    async def bind(self, held: Held, ttl: float, *, kept: bool = False) -> bool:
        """Bind the lease's sticky session to its sandbox for ``ttl`` seconds, held by the
        lease: False while another holder has the session; ``kept`` (a heartbeat): only
        while the session names this sandbox and this lease."""
        assert held.session is not None
        now = self._clock()
        return await self._store.bind_session(
            held.session, held.entry, held.sandbox.id, now + ttl, now, kept=kept,
            holder=held.holder,
        )  # fmt: skip

    async def let_go(
        self, held: Held, ttl: float, *, paused: bool = False, drop: bool = False
    ) -> bool:
        """The lease lets go of its session: its sandbox stays bound, unheld, for ``ttl``
        seconds (marked ``paused``), or the binding goes (``drop``). False when the lease
        did not hold it (the session was closed, or it names another sandbox)."""
        assert held.session is not None
        now = self._clock()
        return await self._store.release_session(
            held.session, held.holder, now + ttl, now, sandbox_id=held.sandbox.id,
            paused=paused, drop=drop,
        )  # fmt: skip
