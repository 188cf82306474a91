"""A session's sandboxes end with it: stdio end of input, HTTP delete, idle timeout, shutdown."""

from __future__ import annotations

import asyncio
import secrets
import signal
import socket
from pathlib import Path
from typing import Any

import pytest

from tests.mcp.conftest import needs_mcp

needs_mcp()

from emulators.harness import Emulator  # noqa: E402
from router import Router  # noqa: E402
from tests.mcp.conftest import local_entry, vendor_entry  # noqa: E402
from tests.mcp.harness import (  # noqa: E402
    HttpServer,
    McpClient,
    server_env,
    stdio,
    write_config,
)
from tests.polling import wait_until  # noqa: E402
from tests.processes import processes_with  # noqa: E402


def live_leases(config: Path) -> int:
    with Router.from_config(config) as router:
        return sum(view.live_leases for view in router.status().entries)


def long_command(marker: str) -> dict[str, Any]:
    """A command that prints, then runs for minutes with ``marker`` on its command line."""
    return {"command": f"echo started; python3 -c 'import time; time.sleep(300)' {marker}"}


def test_a_stdio_client_gone_mid_command_leaves_nothing_alive(tmp_path: Path) -> None:
    config = write_config(tmp_path / "chain.yaml", [local_entry(tmp_path / "sb")])
    marker = f"mcp-{secrets.token_hex(6)}"
    progress: list[Any] = []
    with McpClient(stdio(config, server_env(tmp_path / "state"))) as client:
        client.submit("run_command", long_command(marker), progress)
        wait_until(lambda: progress, 30)
        assert processes_with(marker)
    wait_until(lambda: not processes_with(marker), 10)
    assert processes_with(marker) == []
    assert live_leases(config) == 0
    assert not [p for p in (tmp_path / "sb").iterdir() if p.name.startswith("local-")]


@pytest.mark.parametrize("emulated", ["e2b"], indirect=True)
def test_a_stdio_session_on_an_emulator_releases_its_sandboxes(
    tmp_path: Path, emulated: Emulator
) -> None:
    entry, env = vendor_entry(emulated)
    config = write_config(tmp_path / "chain.yaml", [entry])
    progress: list[Any] = []
    with McpClient(stdio(config, server_env(tmp_path / "state", env))) as client:
        opened = client.ok("open_sandbox")
        client.ok("open_sandbox")
        client.submit("run_command", long_command("x"), progress)
        wait_until(lambda: progress, 30)
        assert len(emulated.alive()) == 2
    wait_until(lambda: not emulated.alive(), 10)
    assert emulated.alive() == []
    assert opened["entry"] == "e2b"
    assert live_leases(config) == 0


@pytest.fixture(scope="module")
def http(tmp_path_factory: pytest.TempPathFactory) -> tuple[HttpServer, Path]:
    base = tmp_path_factory.mktemp("mcp-http")
    config = write_config(base / "chain.yaml", [local_entry(base / "sb")],
                          mcp={"session_idle_timeout": 1.0})  # fmt: skip
    server = HttpServer(config, server_env(base / "state"))
    yield server, config
    server.stop()


def test_an_http_session_deleted_mid_command_leaves_nothing_alive(
    http: tuple[HttpServer, Path],
) -> None:
    server, config = http
    marker = f"mcp-{secrets.token_hex(6)}"
    progress: list[Any] = []
    with McpClient(server.url) as client:
        client.submit("run_command", long_command(marker), progress)
        wait_until(lambda: progress, 30)
        assert processes_with(marker)
    wait_until(lambda: not processes_with(marker), 10)
    assert processes_with(marker) == []
    wait_until(lambda: live_leases(config) == 0, 5)
    assert live_leases(config) == 0


def test_an_http_session_left_idle_ends_with_its_sandboxes(
    http: tuple[HttpServer, Path],
) -> None:
    server, config = http
    marker = f"mcp-{secrets.token_hex(6)}"
    with McpClient(server.url, terminate_on_close=False) as client:  # gone without a DELETE
        client.ok(
            "start_process", {"command": f"python3 -c 'import time; time.sleep(300)' {marker}"}
        )
        assert processes_with(marker)
    wait_until(lambda: not processes_with(marker), 10)  # idle timeout 1 s, then a tick
    assert processes_with(marker) == []
    wait_until(lambda: live_leases(config) == 0, 5)  # released once the kill is done
    assert live_leases(config) == 0


def test_shutting_the_http_server_down_releases_every_session(tmp_path: Path) -> None:
    config = write_config(tmp_path / "chain.yaml", [local_entry(tmp_path / "sb")])
    server = HttpServer(config, server_env(tmp_path / "state"))
    marker = f"mcp-{secrets.token_hex(6)}"
    try:
        clients = [McpClient(server.url).__enter__() for _ in range(2)]
        for client in clients:
            client.ok("start_process", {"command": f"sleep 300 && echo {marker}"})
            client.ok(
                "start_process", {"command": f"python3 -c 'import time; time.sleep(300)' {marker}"}
            )
        assert len(processes_with(marker)) >= 2
        assert live_leases(config) == 2
    finally:
        assert server.stop(signal.SIGTERM) == 0
    assert processes_with(marker) == []
    assert live_leases(config) == 0
    for client in clients:
        client.close()


async def test_http_connections_send_without_waiting_for_acks() -> None:
    """Each SSE reply is several small writes: Nagle's algorithm held each for the client's
    delayed ACK (~40 ms a call) until the listener said TCP, which makes asyncio set NODELAY."""
    from router.mcp.server import _listen

    listener = _listen("127.0.0.1", 0)
    accepted: asyncio.Future[int] = asyncio.get_running_loop().create_future()

    def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        sock = writer.get_extra_info("socket")
        accepted.set_result(sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
        writer.close()  # the server's side; asyncio closes it with the server

    server = await asyncio.start_server(serve, sock=listener)
    async with server:
        _, writer = await asyncio.open_connection(*listener.getsockname())
        try:
            assert await asyncio.wait_for(accepted, 10) != 0
        finally:
            writer.close()
            await writer.wait_closed()
