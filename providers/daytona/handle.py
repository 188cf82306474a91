"""`DaytonaHandle`: what every call on a Daytona sandbox goes through.

The sandbox's DTO as the API last gave it, the organization's
`DaytonaClient`, the sandbox's toolbox client (its URL asked of the API once
when the sandbox came without one) and the mapping of their errors: a
toolbox call that failed in front of the daemon is `NotFound` once the API
says the sandbox no longer runs. The base of
`providers.daytona.sandbox.DaytonaSandbox`, under its commands, files and
code.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from providers.base import Sandbox
from providers.daytona.errors import DAEMON, facts, sdk_errors
from providers.daytona.states import state
from providers.errors import NotFound, ProviderError, SandboxError

if TYPE_CHECKING:
    from daytona import AsyncSandbox
    from daytona_api_client_async.models.sandbox import Sandbox as SandboxDto

    from providers.daytona.client import DaytonaClient, Toolbox

__all__ = ["LANGUAGE_LABEL", "DaytonaHandle", "json_object"]

LANGUAGE_LABEL = "code-toolbox-language"  # the language of Daytona's code runner in a sandbox


class DaytonaHandle(Sandbox):
    """A live Daytona sandbox, reached through the organization's `DaytonaClient`.

    ``native`` is the SDK's ``AsyncSandbox`` over the same connection, built on
    first use: the ``daytona`` package (~40 MB) is imported then, by its callers only.
    """

    def __init__(
        self,
        dto: SandboxDto,
        provider: str,
        client: DaytonaClient,
        *,
        workdir: str | None = None,
        request_timeout: float = 30.0,
        transfer_timeout: float = 300.0,
        snapshot_timeout: float = 600.0,
    ) -> None:
        self._dto = dto
        self.id = dto.id
        self.provider = provider
        self._client = client
        self._workdir = workdir
        self._request_timeout = request_timeout
        self._transfer_timeout = transfer_timeout
        self._snapshot_timeout = snapshot_timeout
        self._idle_sessions: list[str] = []
        self._work_dir: str | None = None
        self._toolbox_client: Toolbox | None = None
        self._native: AsyncSandbox | None = None
        self._interpreted: set[str] = set()  # contexts (default: "") that ran a cell here

    @property
    def native(self) -> AsyncSandbox:
        """The SDK's ``AsyncSandbox`` of this sandbox, on the adapter's connection (its
        state polled, not pushed: it has no Socket.IO client)."""
        if self._native is None:
            from daytona import AsyncSandbox
            from daytona.internal.event_subscription_manager import (
                AsyncEventSubscriptionManager,
            )

            self._native = AsyncSandbox(
                self._dto,
                self._client.toolbox,
                self._client.sandboxes,
                self.language,
                AsyncEventSubscriptionManager(None),
            )
        return self._native

    @property
    def language(self) -> str:
        """The language Daytona's code runner uses in this sandbox."""
        return (self._dto.labels or {}).get(LANGUAGE_LABEL) or "python"

    def _errors(self) -> contextlib.AbstractContextManager[None]:
        return sdk_errors(self.provider, self.id, in_sandbox=True)

    async def _tools(self) -> Toolbox:
        """The sandbox's toolbox client; its URL asked of the API once when the
        sandbox came without one."""
        if self._toolbox_client is None:
            url = self._dto.toolbox_proxy_url
            if not url:
                async with asyncio.timeout(self._request_timeout):
                    found = await self._client.sandboxes.get_toolbox_proxy_url(self.id)
                url = self._dto.toolbox_proxy_url = found.url
            self._toolbox_client = self._client.toolbox_of(self._dto, url)
        return self._toolbox_client

    @contextlib.asynccontextmanager
    async def _toolbox(self) -> AsyncIterator[None]:
        """Map the errors of toolbox calls (commands and files).

        A client error the daemon itself gave is the caller's; one from in
        front of it (the proxy) is the caller's only while the sandbox still
        runs, which the API is asked: a sandbox stopped or gone is `NotFound`.
        """
        try:
            with self._errors():
                yield
        except SandboxError as err:
            cause = err.__cause__
            if cause is None or facts(cause).source == DAEMON or not await self._gone():
                raise
            raise NotFound(
                f"sandbox {self.id} is not running ({err.message})",
                provider=self.provider,
                status=err.status,
                sandbox_id=self.id,
            ) from cause

    async def _gone(self) -> bool:
        """Whether the API says the sandbox no longer runs."""
        try:
            with self._errors():
                async with asyncio.timeout(self._request_timeout):
                    self._dto = await self._client.sandboxes.get_sandbox(self.id)
        except NotFound:
            return True
        except ProviderError:
            return False
        return state(self._dto.state) != "started"


def json_object(data: bytes | str) -> dict[str, Any]:
    """A JSON object, or nothing when ``data`` is not one."""
    with contextlib.suppress(ValueError):
        parsed = json.loads(data)
        if isinstance(parsed, dict):
            return parsed
    return {}
