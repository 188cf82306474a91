"""`DaytonaClient`: one organization's connection to Daytona, over the generated API clients.

Daytona's SDK is built on two generated clients, ``daytona_api_client_async``
(the control plane: sandboxes, snapshots, warm pools, configuration) and
``daytona_toolbox_api_client_async`` (the toolbox inside each sandbox:
processes, files, terminals); the adapter uses them without the SDK, whose
import alone (its Socket.IO client, OpenTelemetry, the sync clients) takes a
fresh interpreter to ~100 MB. As the SDK does, both clients share one
``aiohttp`` session (one connection pool), which the adapter also uses for
what the generated clients cannot do (streamed file transfers, websockets),
and send the organization's API key as a bearer token.

Like the SDK, a request is retried (twice, 0.25 s apart and more) when its
connection was refused, and when it was dropped and the method is
idempotent; nothing else is retried here, the router's retry policy is the one.
"""

from __future__ import annotations

import asyncio
import copy
import random
import re
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import urlencode

import aiohttp
from daytona_api_client_async import __version__ as CLIENT_VERSION
from daytona_api_client_async.api.config_api import ConfigApi
from daytona_api_client_async.api.sandbox_api import SandboxApi
from daytona_api_client_async.api.snapshots_api import SnapshotsApi
from daytona_api_client_async.api.warm_pools_api import WarmPoolsApi
from daytona_api_client_async.api_client import ApiClient
from daytona_api_client_async.configuration import Configuration
from daytona_api_client_async.rest import RESTResponse
from daytona_toolbox_api_client_async.api.file_system_api import FileSystemApi
from daytona_toolbox_api_client_async.api.info_api import InfoApi
from daytona_toolbox_api_client_async.api.interpreter_api import InterpreterApi
from daytona_toolbox_api_client_async.api.process_api import ProcessApi
from daytona_toolbox_api_client_async.api_client import ApiClient as ToolboxApiClient
from daytona_toolbox_api_client_async.configuration import (
    Configuration as ToolboxConfiguration,
)
from daytona_toolbox_api_client_async.exceptions import ApiException
from daytona_toolbox_api_client_async.rest import RESTResponse as ToolboxResponse

if TYPE_CHECKING:
    from daytona_api_client_async.models.sandbox import Sandbox as SandboxDto

__all__ = ["DEFAULT_API_URL", "DaytonaClient", "Toolbox"]

DEFAULT_API_URL = "https://app.daytona.io/api"
SOURCE = "sandbox-router"  # X-Daytona-Source: who calls (the SDK sends sdk-python-async)
_RETRIES = 2
_IDEMPOTENT = frozenset({"GET", "HEAD", "OPTIONS", "TRACE", "PUT", "DELETE"})
_CONNECT_TIMEOUT = 30.0
_POOL_SIZE = 250  # connections open at once, as the SDK allows (a followed log holds one)
_HEARTBEAT = 20.0  # seconds between a websocket's pings

T = TypeVar("T")


async def _retrying(method: str, call: Callable[[], Awaitable[T]]) -> T:
    """``call``, again after a refused connection, or a dropped one when ``method`` is idempotent.

    A refused connection sent nothing; a dropped one may have been served,
    so only a request that may be repeated is.
    """
    dropped = (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError, ConnectionError)
    for attempt in range(1, _RETRIES + 2):
        try:
            return await call()
        except (aiohttp.ClientConnectorError, *dropped) as exc:
            refused = isinstance(exc, aiohttp.ClientConnectorError)
            if attempt > _RETRIES or not (refused or method.upper() in _IDEMPOTENT):
                raise
        await asyncio.sleep(0.25 * attempt + random.random() * 0.1)  # jitter
    raise AssertionError("unreachable")


class _Api(ApiClient):
    """The control plane's generated client, its requests retried as `_retrying` says."""

    async def call_api(
        self,
        method: str,
        url: str,
        header_params: Any = None,
        body: Any = None,
        post_params: Any = None,
        _request_timeout: Any = None,
    ) -> RESTResponse:
        call = super().call_api
        return await _retrying(
            method, lambda: call(method, url, header_params, body, post_params, _request_timeout)
        )


class Toolbox(ToolboxApiClient):
    """The toolbox's generated client, its requests retried as `_retrying` says.

    The provider's has no host: `DaytonaClient.toolbox_of` copies it for each
    sandbox, with the sandbox's toolbox URL as host and the pool shared.
    """

    handshake_timeout: float | None = None  # seconds a websocket's upgrade may take

    async def call_api(
        self,
        method: str,
        url: str,
        header_params: Any = None,
        body: Any = None,
        post_params: Any = None,
        _request_timeout: Any = None,
    ) -> ToolboxResponse:
        call = super().call_api
        return await _retrying(
            method, lambda: call(method, url, header_params, body, post_params, _request_timeout)
        )

    @property
    def session(self) -> aiohttp.ClientSession:
        """The shared pool, for what the generated client cannot do (streams, websockets)."""
        assert self.rest_client.pool_manager is not None
        return self.rest_client.pool_manager

    @property
    def process(self) -> ProcessApi:
        return ProcessApi(self)

    @property
    def files(self) -> FileSystemApi:
        return FileSystemApi(self)

    @property
    def info(self) -> InfoApi:
        return InfoApi(self)

    @property
    def interpreter(self) -> InterpreterApi:
        return InterpreterApi(self)

    def url(self, path: str, **query: str) -> str:
        """The sandbox's toolbox URL of ``path``, with ``query``."""
        tail = "?" + urlencode(query) if query else ""
        return f"{self.configuration.host}{path}{tail}"

    async def websocket(
        self, path: str, *, protocols: Sequence[str] = (), **query: str
    ) -> aiohttp.ClientWebSocketResponse:
        """A websocket to the toolbox's ``path``, pinged as the SDK pings it.

        A refused upgrade is raised as the generated client raises an error answer:
        aiohttp's own error holds the request, whose headers carry the API key. An
        upgrade unanswered past `handshake_timeout` raises TimeoutError.
        """
        try:
            async with asyncio.timeout(self.handshake_timeout):
                return await self.session.ws_connect(
                    re.sub(r"^http", "ws", self.url(path, **query)),
                    headers=self.default_headers,
                    protocols=protocols,
                    heartbeat=_HEARTBEAT,
                )
        except aiohttp.WSServerHandshakeError as exc:
            refused = ApiException(status=exc.status, reason=exc.message)
            refused.headers = exc.headers
        raise refused  # out of the handler: aiohttp's error is not even its context


class DaytonaClient:
    """The generated clients of one organization, on the event loop that opened them.

    Args:
        api_key: the organization's API key.
        api_url: the API's URL.
        request_timeout: seconds a toolbox websocket's upgrade may take.
    """

    def __init__(self, api_key: str, api_url: str, request_timeout: float | None = None) -> None:
        config = Configuration(host=api_url.rstrip("/"))
        self.api = _Api(config)
        self.toolbox = Toolbox(ToolboxConfiguration(host=""))
        self.toolbox.handshake_timeout = request_timeout
        headers = {
            "Authorization": f"Bearer {api_key}",
            "X-Daytona-Source": SOURCE,
            "X-Daytona-SDK-Version": CLIENT_VERSION,
            "User-Agent": f"{SOURCE} daytona-api-client-async/{CLIENT_VERSION}",
        }
        for client in (self.api, self.toolbox):
            client.default_headers.update(headers)
        # One pool for both clients and the direct calls. The generated client would make
        # its own session on its first request; its SSL context (the CA bundle loaded) is kept.
        self.session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(
                limit=_POOL_SIZE,
                keepalive_timeout=30,
                ssl=self.api.rest_client.ssl_context,
            ),
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=_CONNECT_TIMEOUT),
            trust_env=True,
        )
        self.api.rest_client.pool_manager = self.session
        self.toolbox.rest_client.pool_manager = self.session
        self.sandboxes = SandboxApi(self.api)
        self.snapshots = SnapshotsApi(self.api)
        self.warm_pools = WarmPoolsApi(self.api)
        self.config = ConfigApi(self.api)

    def toolbox_of(self, sandbox: SandboxDto, toolbox_url: str) -> Toolbox:
        """The toolbox client of ``sandbox``: a copy of the provider's whose host is
        ``<toolbox URL>/<sandbox id>``, sharing its pool and headers (a new client
        would load the CA bundle again, ~25 ms)."""
        clone = copy.copy(self.toolbox)
        clone.configuration = copy.copy(self.toolbox.configuration)
        clone.configuration.host = f"{toolbox_url.rstrip('/')}/{sandbox.id}"
        return clone

    async def close(self) -> None:
        await self.session.close()
