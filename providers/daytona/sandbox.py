"""`DaytonaSandbox`: a live Daytona sandbox, and its stop, snapshot and delete.

Its calls are in one module a concern: commands (`providers.daytona.commands`),
files (`providers.daytona.files`) and code (`providers.daytona.interpreter`),
over what they all go through (`providers.daytona.handle`). Background
processes and terminals are in `providers.daytona.processes`.
`DaytonaSandbox.snapshot` keeps the sandbox's filesystem as a Daytona
snapshot, a template for creates on the entry.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import secrets
from collections.abc import Callable
from typing import TYPE_CHECKING

from providers.base import PortURL, Snapshot
from providers.daytona.commands import DaytonaCommands
from providers.daytona.files import DaytonaFiles
from providers.daytona.interpreter import DaytonaCode
from providers.daytona.states import FAILED, SNAPSHOT_MAKING, SNAPSHOT_READY, failed, state
from providers.errors import NotFound, SandboxError, Unavailable

if TYPE_CHECKING:
    from daytona_api_client_async.models.snapshot_dto import SnapshotDto

__all__ = ["SNAPSHOT_PREFIX", "DaytonaSandbox"]

SNAPSHOT_PREFIX = "sandbox-router-"  # the names of the snapshots made without one
_SNAPSHOT_POLL = 1.0
_STATE_POLL = 0.05  # between the GETs of a sandbox stopping or snapshotting, at first
_STATE_POLL_MOST = 1.0


class DaytonaSandbox(DaytonaCommands, DaytonaFiles, DaytonaCode):
    """A live Daytona sandbox, reached through the organization's `DaytonaClient`."""

    async def expose(self, port: int) -> PortURL:
        """The port's preview link; a private sandbox's wants its token in a header."""
        with self._errors():
            async with asyncio.timeout(self._request_timeout):
                link = await self._client.sandboxes.get_port_preview_url(self.id, port)
        return PortURL(port, link.url, {"X-Daytona-Preview-Token": link.token})

    async def pause(self) -> None:
        """Daytona's ``stop``: the filesystem stays, processes end, and a stopped sandbox
        bills its disk only; `DaytonaProvider.resume` starts it again on the same id.

        The router creates sandboxes that Daytona deletes once stopped (auto-delete 0,
        so a lost one costs nothing), so a pause first keeps it (-1: never deleted);
        the paused sandbox is then the router's to kill (the janitor, ``pause_ttl``).
        """
        sandboxes = self._client.sandboxes
        with self._errors():
            async with asyncio.timeout(self._transfer_timeout):
                await sandboxes.set_auto_delete_interval(self.id, -1)
                async with asyncio.timeout(math.ceil(self._request_timeout)):
                    await sandboxes.stop_sandbox(self.id)
                    await self._until(lambda now: now in ("stopped", "destroyed"), gone_ok=True)

    async def _until(self, reached: Callable[[str], bool], *, gone_ok: bool = False) -> None:
        """Poll the sandbox until its state is ``reached``; `Unavailable` if it fails
        (``error``, ``build_failed``) first. A sandbox the API no longer knows has
        reached it when ``gone_ok``. A stop takes seconds, a snapshot minutes: the
        polls thin out from 50 ms to one a second."""
        every = _STATE_POLL
        while True:
            try:
                self._dto = await self._client.sandboxes.get_sandbox(self.id)
            except Exception as exc:
                if gone_ok and getattr(exc, "status", None) == 404:
                    return
                raise
            now = state(self._dto.state)
            if now in FAILED:
                raise failed(self._dto, self.provider)
            if reached(now):
                return
            await asyncio.sleep(every)
            every = min(every * 1.5, _STATE_POLL_MOST)

    async def snapshot(self, name: str | None = None) -> Snapshot:
        """Daytona's snapshot of the sandbox: its filesystem (not its processes or memory)
        committed and pushed to the organization's registry; its id is the template.

        The sandbox is ``snapshotting`` meanwhile, and is waited for to leave that
        state. Daytona writes the snapshot, ``active``, before
        the sandbox leaves it, and when the copy fails or the name is taken it writes
        none and says nothing. So a name of the caller's is checked first (an existing
        one would else pass for the new snapshot), and a snapshot missing afterwards is
        `Unavailable`. Without ``name`` a unique one is made (names are unique per
        organization) and returned as the snapshot's ``name``.
        """
        from daytona_api_client_async.models.create_sandbox_snapshot import (
            CreateSandboxSnapshot,
        )

        if name is not None and not name.strip():
            raise SandboxError(
                "snapshot: a Daytona snapshot's name must not be blank",
                provider=self.provider,
                sandbox_id=self.id,
            )
        made = name if name is not None else SNAPSHOT_PREFIX + secrets.token_hex(8)
        with self._errors():
            async with asyncio.timeout(self._snapshot_timeout + self._request_timeout):
                if name is not None and await self._find_snapshot(name) is not None:
                    raise SandboxError(
                        f"snapshot: the organization already has a snapshot named {name!r}",
                        provider=self.provider,
                        sandbox_id=self.id,
                    )
                async with asyncio.timeout(self._snapshot_timeout):
                    self._dto = await self._client.sandboxes.create_sandbox_snapshot(
                        self.id, CreateSandboxSnapshot(name=made)
                    )
                    if state(self._dto.state) == "snapshotting":
                        await self._until(lambda now: now != "snapshotting")
                found = await self._find_snapshot(made)
                while found is not None and state(found.state) in SNAPSHOT_MAKING:
                    await asyncio.sleep(_SNAPSHOT_POLL)
                    found = await self._find_snapshot(made)
        if found is None or state(found.state) != SNAPSHOT_READY:
            why = "none was made" if found is None else f"it is {state(found.state)}"
            reason = f": {found.error_reason}" if found is not None and found.error_reason else ""
            raise Unavailable(
                f"snapshot {made!r} of the sandbox failed ({why}{reason})",
                provider=self.provider,
                sandbox_id=self.id,
            )
        return Snapshot(found.id, self.provider, made)

    async def _find_snapshot(self, name: str) -> SnapshotDto | None:
        """The organization's snapshot of this name, None when it has none."""
        try:
            with self._errors():
                async with asyncio.timeout(self._request_timeout):
                    return await self._client.snapshots.get_snapshot(name)
        except NotFound:
            return None

    async def kill(self) -> None:
        with contextlib.suppress(NotFound), self._errors():
            async with asyncio.timeout(self._request_timeout):
                await self._client.sandboxes.delete_sandbox(self.id)

    async def keepalive(self, seconds: float) -> None:
        """Reset the sandbox's auto-stop timer (Daytona counts idle time from the last activity)."""
        with self._errors():
            async with asyncio.timeout(self._request_timeout):
                await self._client.sandboxes.update_last_activity(self.id)
