"""Ports: a server started in the sandbox is reached through the URL `expose` gives
(E2B host, Daytona preview link and token, Modal tunnel, Runloop tunnel, local loopback).
"""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest

from emulators.harness import free_port
from providers.capabilities import Capability
from providers.errors import InvalidArgument, Unsupported
from tests.contract.conftest import Backend


async def test_port_url_reaches_a_server_in_the_sandbox(backend: Backend) -> None:
    port = free_port()
    sbx = await backend.create(ports=(port,))
    try:
        if Capability.PORT not in backend.provider.capabilities:
            with pytest.raises(Unsupported, match="port"):
                await sbx.expose(port)
            return
        await sbx.write_file("site/hello.txt", b"hello from the sandbox\n")
        server = await sbx.start(
            ["python3", "-m", "http.server", str(port), "--bind", "127.0.0.1"], cwd="site"
        )
        exposed = await sbx.expose(port)
        assert exposed.port == port
        assert all(value not in repr(exposed) for value in exposed.headers.values())
        deadline = time.monotonic() + 15
        while True:
            try:
                answer = await backend.fetch(exposed, "/hello.txt")
            except httpx.ConnectError:  # a loopback URL refuses until the server listens
                if time.monotonic() > deadline:
                    raise
            else:
                if answer.status_code == 200 or time.monotonic() > deadline:
                    break
            await asyncio.sleep(0.2)
        assert (answer.status_code, answer.text) == (200, "hello from the sandbox\n")
        await server.kill()
    finally:
        await sbx.kill()


async def test_port_number_out_of_range_is_refused(backend: Backend) -> None:
    with pytest.raises(InvalidArgument, match="ports"):
        await backend.create(ports=(70000,))
