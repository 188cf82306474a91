"""E2B's code interpreter ``POST /execute``, the request under `E2BSandbox.run_code`, sent
over an ``aiohttp`` session the provider keeps per event loop.

The SDK's ``AsyncSandbox.run_code`` makes an httpx client per call on its pyqwest transport,
whose answers come back to the loop from tokio's threads, and bounds each read of the
streamed answer with ``asyncio.wait_for`` (a task per chunk on Python 3.11). On E2B's
emulator a cell cost this process about 2.2 ms of CPU that way, twice the sync SDK's, and
about 0.6 ms over a kept aiohttp session (benchmarks/RESULTS.md, the smolagents row). So
the adapter sends the SDK's own request (its URL, headers and body, the envd token the SDK
keeps on the sandbox) itself, as the Daytona adapter speaks to its toolbox, and keeps the
rest the SDK's: its parser fills its ``Execution``, and a failure is the exception the SDK
raises there (`format_exception` of an answer that is not 2xx; its killed-sandbox error for
a stream cut with the sandbox gone), so `providers.e2b.sdk_errors` maps it as before. A
refused connection is tried again as the SDK's transport does (``E2B_CONNECTION_RETRIES``
times, backing off from 0.5 s). The execution's deadline is the caller's (an
``asyncio.timeout``); the connect is bounded by the entry's ``request_timeout``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import aiohttp
    from e2b_code_interpreter import AsyncSandbox

__all__ = ["cuts", "execute", "open_session", "running", "send"]

_BACKOFF = 0.5  # seconds before the first retry of a refused connect, growing 1.5x


def open_session(request_timeout: float) -> aiohttp.ClientSession:
    """A pool for the code interpreters' requests (on the running loop)."""
    import aiohttp

    return aiohttp.ClientSession(
        timeout=aiohttp.ClientTimeout(total=None, sock_connect=request_timeout)
    )


async def execute(
    session: aiohttp.ClientSession,
    native: AsyncSandbox,
    code: str,
    where: Mapping[str, str | None],
    env: Mapping[str, str] | None,
) -> Any:
    """The SDK's ``Execution`` of ``code`` in the context or language ``where`` names."""
    from e2b_code_interpreter.constants import JUPYTER_PORT

    url = native.connection_config.get_sandbox_url(
        native.sandbox_id, native.sandbox_domain, port=JUPYTER_PORT
    )
    headers = {
        "Content-Type": "application/json",
        "E2b-Sandbox-Id": native.sandbox_id,
        "E2b-Sandbox-Port": str(JUPYTER_PORT),
    }
    if native._envd_access_token:
        headers["X-Access-Token"] = native._envd_access_token
    if native.traffic_access_token:
        headers["E2B-Traffic-Access-Token"] = native.traffic_access_token
    body = {"code": code, "context_id": None, "language": None, "env_vars": env, **where}
    payload = json.dumps(body).encode()
    from e2b_code_interpreter.exceptions import format_sandbox_killed_error

    try:
        return await _read(await send(session, f"{url}/execute", payload, headers))
    except cuts() as cut:
        if not await running(native):
            raise format_sandbox_killed_error() from cut
        raise


async def send(
    session: aiohttp.ClientSession, url: str, payload: bytes, headers: Mapping[str, str]
) -> aiohttp.ClientResponse:
    """POST ``payload``, a refused connect tried again as the SDK's transport does; the
    caller reads and releases the answer."""
    import aiohttp
    from e2b.api import connection_retries

    retries = 0
    while True:
        try:
            return await session.post(url, data=payload, headers=headers)
        except aiohttp.ClientConnectorError:
            if retries >= connection_retries:
                raise
        await asyncio.sleep(_BACKOFF * 1.5**retries * random.uniform(0.5, 1.5))
        retries += 1


def cuts() -> tuple[type[BaseException], ...]:
    """What a connection cut after the request went out raises."""
    import aiohttp

    return (
        aiohttp.ClientPayloadError,
        aiohttp.ServerDisconnectedError,
        aiohttp.ClientOSError,
        asyncio.IncompleteReadError,
    )


async def _read(response: aiohttp.ClientResponse) -> Any:
    import httpx
    from e2b_code_interpreter.models import Execution, format_exception, parse_output

    async with response:
        try:
            if not 200 <= response.status < 300:
                answer = httpx.Response(
                    response.status,
                    headers=dict(response.headers),
                    content=await response.read(),
                )
                raise format_exception(answer)
            execution = Execution()
            pending = b""
            async for chunk in response.content.iter_any():
                *lines, pending = (pending + chunk).split(b"\n")
                for line in lines:
                    if line.strip():
                        parse_output(execution, line.decode())
            if pending.strip():
                parse_output(execution, pending.decode())
            return execution
        except BaseException:
            response.close()  # not back to the pool: the kernel sees the client go
            raise


async def running(native: AsyncSandbox) -> bool:
    """Whether the sandbox still runs (True when that cannot be told), as the SDK asks after
    a dropped stream."""
    with contextlib.suppress(Exception):
        return bool(await native.is_running())
    return True
