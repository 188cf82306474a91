"""An account reached with one API key: what the Daytona, Runloop and E2B adapters share.

The key comes from the entry's ``api_key`` option, else the vendor's
environment variable (`providers.base.credential`). The SDK client is opened
on first use on each event loop (`LoopBound`: an async client's connections
belong to the loop that opened them) and closed with the provider.
Clean-ups of failed creates that cannot be awaited where they start (the
create itself was cancelled) run as tasks the provider keeps and awaits when
it closes.
"""

from __future__ import annotations

import abc
from typing import ClassVar, Generic, TypeVar

from pydantic import SecretStr

from providers.base import LoopBound, Provider, ProviderOptions, credential, missing_api_key
from providers.errors import AuthError

__all__ = ["KeyedOptions", "KeyedProvider"]

C = TypeVar("C")


class KeyedOptions(ProviderOptions):
    """Options of an entry whose account is one API key.

    Attributes:
        api_key: the account's API key; the vendor's environment variable
            when unset.
    """

    api_key: SecretStr | None = None


class KeyedProvider(Provider, Generic[C]):
    """A provider whose account is one API key and whose SDK client ``C`` is per loop."""

    api_key_env: ClassVar[str]

    def __init__(self, name: str, options: ProviderOptions | None = None) -> None:
        super().__init__(name, options)
        self._client: LoopBound[C] = LoopBound()

    def _api_key(self) -> str | None:
        assert isinstance(self.options, KeyedOptions)
        return credential(self.options.api_key, self.api_key_env)

    def unconfigured_reason(self) -> str | None:
        return missing_api_key(self.api_key_env) if self._api_key() is None else None

    def _api(self) -> C:
        """The entry's SDK client on the running event loop."""
        return self._client.get(self._open)

    def _open(self) -> C:
        api_key = self._api_key()
        if api_key is None:
            raise AuthError(missing_api_key(self.api_key_env), provider=self.name)
        return self._open_client(api_key)

    @abc.abstractmethod
    def _open_client(self, api_key: str) -> C:
        """A new SDK client for the account."""

    async def _close_client(self, client: C) -> None:
        """Release a client's connections (clients that hold none need not)."""

    async def aclose(self) -> None:
        await super().aclose()
        client = self._client.take()
        if client is not None:
            await self._close_client(client)
