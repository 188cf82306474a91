"""Over HTTP: bearer tokens name tenants, a session sees only its own sandboxes, nothing leaks."""

from __future__ import annotations

import secrets
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from pydantic import SecretStr

from tests.mcp.conftest import needs_mcp

needs_mcp()

from providers.errors import ConfigError  # noqa: E402
from router.config import McpSettings  # noqa: E402
from router.mcp.auth import ENV, Tenants, is_loopback, parse_env  # noqa: E402
from tests.mcp.conftest import local_entry  # noqa: E402
from tests.mcp.harness import HttpServer, McpClient, server_env, write_config  # noqa: E402
from tests.polling import wait_until  # noqa: E402

ACME = "acme-" + secrets.token_urlsafe(24)  # from the config file
BETA = "beta-" + secrets.token_urlsafe(24)  # from the environment
INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {"protocolVersion": "2025-11-25", "capabilities": {},
               "clientInfo": {"name": "raw", "version": "0"}},
}  # fmt: skip
ACCEPT = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HttpServer]:
    base = tmp_path_factory.mktemp("mcp-auth")
    config = write_config(
        base / "chain.yaml",
        [local_entry(base / "sb")],
        mcp={"tokens": {"acme": ACME}, "max_write_bytes": 2048, "max_command_bytes": 512},
        log={"format": "json", "level": "debug"},
    )
    made = HttpServer(config, server_env(base / "state", {ENV: f"beta={BETA}"}))
    yield made
    made.stop()


def test_no_token_and_a_wrong_token_are_refused(server: HttpServer) -> None:
    for headers in ({}, {"Authorization": "Bearer " + "x" * 40}, {"Authorization": ACME}):
        answer = httpx.post(server.url, json=INITIALIZE, headers={**ACCEPT, **headers})
        assert answer.status_code == 401
        assert answer.headers["www-authenticate"].startswith('Bearer realm="sandbox-router"')
    with pytest.raises(Exception):  # noqa: B017, PT011 - the SDK's client cannot connect
        McpClient(server.url, token="y" * 40).__enter__()


def test_a_session_sees_only_its_own_sandboxes(server: HttpServer) -> None:
    with McpClient(server.url, token=ACME) as acme, McpClient(server.url, token=BETA) as beta:
        mine = acme.ok("open_sandbox")["sandbox_id"]
        acme.ok("write_file", {"path": "secret.txt", "content": "acme's"})
        assert beta.ok("list_sandboxes")["sandboxes"] == []
        assert "no such sandbox" in beta.error("read_file", {"path": "secret.txt",
                                                              "sandbox_id": mine})  # fmt: skip
        theirs = beta.ok("run_command", {"command": "cat secret.txt"})  # beta's own sandbox
        assert theirs["sandbox_id"] != mine
        assert theirs["exit_code"] != 0
        with McpClient(server.url, token=ACME) as acme_again:  # another session, same tenant
            assert acme_again.ok("list_sandboxes")["sandboxes"] == []
        assert [s["sandbox_id"] for s in acme.ok("list_sandboxes")["sandboxes"]] == [mine]


def test_another_tenants_token_cannot_use_a_session(server: HttpServer) -> None:
    opened = httpx.post(server.url, json=INITIALIZE,
                        headers={**ACCEPT, "Authorization": f"Bearer {ACME}"})  # fmt: skip
    assert opened.status_code == 200
    session = opened.headers["mcp-session-id"]
    call = {"jsonrpc": "2.0", "id": 2, "method": "tools/list"}
    headers = {**ACCEPT, "mcp-session-id": session, "Authorization": f"Bearer {BETA}"}
    stolen = httpx.post(server.url, json=call, headers=headers)
    assert stolen.status_code == 404


def test_huge_arguments_are_refused_and_the_server_goes_on(server: HttpServer) -> None:
    with McpClient(server.url, token=BETA) as client:
        refused = client.error("write_file", {"path": "big", "content": "x" * 100_000})
        assert "over this server's limit of 2048 bytes (mcp.max_write_bytes)" in refused
        assert "mcp.max_command_bytes" in client.error("run_command", {"command": "#" * 600})
        assert client.ok("run_command", {"command": "echo fine"})["stdout"] == "fine\n"
    flood = b'{"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": "' + b"x" * 2**23
    answer = httpx.post(server.url, content=flood + b'"}',
                        headers={**ACCEPT, "Authorization": f"Bearer {BETA}"})  # fmt: skip
    assert answer.status_code == 413  # past the transport's body limit, before any parsing
    with McpClient(server.url, token=BETA) as client:
        assert client.ok("list_sandboxes") == {"sandboxes": []}


def test_a_client_opening_with_the_2026_protocol_is_given_a_session(server: HttpServer) -> None:
    with McpClient(server.url, token=ACME, mode="auto") as client:
        assert client.protocol_version == "2025-11-25"
        assert client.ok("run_command", {"command": "echo hi"})["stdout"] == "hi\n"


def test_tokens_never_reach_a_log_line_or_a_result(server: HttpServer) -> None:
    with McpClient(server.url, token=ACME) as client:
        seen = [str(client.ok("open_sandbox")), str(client.ok("run_command", {"command": "env"})),
                client.error("read_file", {"path": "nope"})]  # fmt: skip
        for tool in client.tools():
            seen.append(tool.model_dump_json())
    wait_until(lambda: "session_ended" in server.stderr)  # logged as the session ends
    seen.append(server.stderr)
    assert "session_ended" in server.stderr  # the debug log ran
    for text in seen:
        assert ACME not in text
        assert BETA not in text
    tenants = Tenants.load(McpSettings(tokens={"acme": SecretStr(ACME)}), {ENV: f"beta={BETA}"})
    assert repr(tenants) == "<Tenants ['acme', 'beta']>"
    assert ACME not in repr(McpSettings(tokens={"acme": SecretStr(ACME)}))


def test_tokens_are_checked_against_every_tenant() -> None:
    tenants = Tenants({"a": SecretStr("a" * 16), "b": SecretStr("b" * 16)})
    assert (tenants.tenant("a" * 16), tenants.tenant("b" * 16)) == ("a", "b")
    assert tenants.tenant("a" * 15) is None
    assert tenants.tenant("") is None
    with pytest.raises(ConfigError, match="tenants 'a' and 'b' have the same token"):
        Tenants({"a": SecretStr("s" * 16), "b": SecretStr("s" * 16)})


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ("acme", "entry 1 is not tenant=token"),
        ("ok=" + "k" * 16 + ", -bad=" + "k" * 16, "entry 2 is not tenant=token"),
        ("acme=short-secret", "the token of tenant 'acme' is shorter than 16"),
        ("acme=" + "k" * 16 + " acme=" + "j" * 16, "tenant 'acme' is given twice"),
    ],
)
def test_bad_token_settings_name_the_problem_not_the_token(value: str, problem: str) -> None:
    with pytest.raises(ConfigError, match=problem) as raised:
        parse_env(value)
    assert "short-secret" not in str(raised.value)
    assert "k" * 16 not in str(raised.value)


def test_without_tokens_the_server_listens_on_loopback_only(tmp_path: Path) -> None:
    config = write_config(tmp_path / "chain.yaml", [local_entry(tmp_path / "sb")])
    assert [is_loopback(h) for h in ("127.0.0.1", "::1", "localhost", "0.0.0.0", "10.0.0.1")] == [
        True, True, True, False, False]  # fmt: skip
    ran = subprocess.run(
        [sys.executable, "-m", "router.cli", "mcp", "--http", "--host", "0.0.0.0",
         "--config", str(config)],
        check=False, capture_output=True, text=True, timeout=60,
        env=server_env(tmp_path / "state"),
    )  # fmt: skip
    said = " ".join(ran.stderr.split())
    assert ran.returncode == 2
    assert "no bearer token is configured" in said
    assert "listens on loopback only" in said
