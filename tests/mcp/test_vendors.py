"""A model's session on each vendor's adapter (its real SDK against the emulator), over stdio
and over HTTP; and failover when the first entry is down."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.mcp.conftest import needs_mcp

needs_mcp()

from emulators.harness import Emulator, free_port  # noqa: E402
from tests.mcp.conftest import VENDORS, local_entry, vendor_entry  # noqa: E402
from tests.mcp.harness import HttpServer, McpClient, fetch, server_env, stdio, write_config  # noqa: E402
from tests.polling import wait_until  # noqa: E402


@dataclass
class Served:
    config: Path
    env: dict[str, str]


@pytest.fixture(scope="module")
def served(emulated: Emulator, tmp_path_factory: pytest.TempPathFactory) -> Served:
    base = tmp_path_factory.mktemp(f"mcp-{emulated.name}")
    entry, env = vendor_entry(emulated)
    return Served(write_config(base / "chain.yaml", [entry]), server_env(base / "state", env))


@pytest.fixture(scope="module")
def http_server(served: Served) -> Iterator[HttpServer]:
    server = HttpServer(served.config, served.env)
    yield server
    server.stop()


@pytest.fixture(params=["stdio", "http"])
def client(request: pytest.FixtureRequest, served: Served) -> Iterator[McpClient]:
    if request.param == "stdio":
        made = McpClient(stdio(served.config, served.env))
    else:
        made = McpClient(request.getfixturevalue("http_server").url)
    with made:
        yield made


@pytest.mark.parametrize("emulated", VENDORS, indirect=True)
def test_a_session_on_the_vendor(client: McpClient, emulated: Emulator) -> None:
    port = free_port()
    opened = client.ok("open_sandbox", {"ports": [port]})  # Modal opens ports at create
    assert (opened["entry"], opened["failovers"]) == (emulated.name, [])
    progress: list[Any] = []
    call = client.submit("run_command", {"command": "echo one; sleep 0.6; echo two"}, progress)
    ran = call.result(60)
    assert not ran.is_error
    assert ran.structured_content is not None
    assert (ran.structured_content["stdout"], ran.structured_content["exit_code"]) == (
        "one\ntwo\n", 0)  # fmt: skip
    assert "".join(m for _, _, m in progress) == "one\ntwo\n"
    assert progress[0][0] < max(t for t, _, _ in progress) - 0.4  # streamed while it ran

    client.ok("write_file", {"path": "site/index.html", "content": f"hello from {emulated.name}"})
    assert [e["name"] for e in client.ok("list_files", {"path": "site"})["entries"]] == [
        "index.html"]  # fmt: skip
    process = client.ok("start_process", {"command": f"python3 -m http.server {port}",
                                          "cwd": "site"})["process_id"]  # fmt: skip
    exposed = client.ok("expose_port", {"port": port})
    wait_until(lambda: _answers(exposed, emulated), 20)
    assert fetch(exposed["url"], exposed["headers"], emulated).text == f"hello from {emulated.name}"
    client.ok("kill_process", {"process_id": process})

    client.ok("close_sandbox")
    assert client.ok("list_sandboxes") == {"sandboxes": []}
    assert emulated.alive() == []


def _answers(exposed: dict[str, Any], emulated: Emulator) -> bool:
    with contextlib.suppress(httpx.HTTPError):
        return fetch(exposed["url"], exposed["headers"], emulated).status_code == 200
    return False


@pytest.mark.parametrize("emulated", ["daytona"], indirect=True)
def test_the_next_entry_serves_when_the_first_is_down(emulated: Emulator, tmp_path: Path) -> None:
    entry, env = vendor_entry(emulated)
    config = write_config(tmp_path / "chain.yaml", [entry, local_entry(tmp_path / "sb")],
                          retry={"attempts": 1})  # fmt: skip
    emulated.inject("create", status=503, times=None, message="service unavailable")
    try:
        with McpClient(stdio(config, server_env(tmp_path / "state", env))) as client:
            ran = client.ok("run_command", {"command": "echo served"})
            [only] = client.ok("list_sandboxes")["sandboxes"]
    finally:
        emulated.clear_faults()
    assert ran["stdout"] == "served\n"
    assert only["entry"] == "local"
    assert emulated.alive() == []
