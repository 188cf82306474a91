"""Every tool, through the SDK's client over stdio, on `local` sandboxes."""

from __future__ import annotations

import base64
import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.mcp.conftest import needs_mcp

needs_mcp()

from emulators.harness import free_port  # noqa: E402
from tests.mcp.conftest import local_entry  # noqa: E402
from tests.mcp.harness import McpClient, fetch, server_env, stdio, write_config  # noqa: E402
from tests.polling import wait_until  # noqa: E402

LIMITS = {"max_write_bytes": 4096, "max_read_bytes": 4096, "max_command_bytes": 1024,
          "max_output_chars": 2000}  # fmt: skip


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("mcp-tools")


@pytest.fixture(scope="module")
def server(workdir: Path):  # type: ignore[no-untyped-def]
    config = write_config(workdir / "chain.yaml", [local_entry(workdir / "sb")], mcp=LIMITS)
    return stdio(config, server_env(workdir / "state"))


@pytest.fixture(scope="module")
def client(server) -> Iterator[McpClient]:  # type: ignore[no-untyped-def]
    with McpClient(server) as made:
        yield made


def test_the_tools_are_listed_with_schemas_a_model_can_use(client: McpClient) -> None:
    tools = {tool.name: tool for tool in client.tools()}
    assert set(tools) == {
        "open_sandbox", "run_command", "run_code", "read_file", "write_file", "list_files",
        "remove_file", "start_process", "read_process_output", "kill_process", "expose_port",
        "pause_sandbox", "resume_sandbox", "close_sandbox", "list_sandboxes",
    }  # fmt: skip
    for tool in tools.values():
        assert len(tool.description or "") > 40, tool.name
        assert tool.output_schema is not None
        assert tool.output_schema["type"] == "object"
        for name, prop in tool.input_schema.get("properties", {}).items():
            described = prop.get("description") or any(
                "description" in option for option in prop.get("anyOf", [])
            )
            assert described, f"{tool.name}({name}) has no description"
    assert tools["run_command"].input_schema["required"] == ["command"]
    assert tools["remove_file"].annotations is not None
    assert tools["remove_file"].annotations.destructive_hint is True


def test_a_first_command_opens_a_sandbox_and_its_output_streams(server) -> None:  # type: ignore[no-untyped-def]
    progress: list[tuple[float, float, str | None]] = []
    with McpClient(server) as client:
        call = client.submit("run_command", {"command": "echo first; sleep 1; echo second"},
                             progress)  # fmt: skip
        result = call.result(60)
        ended = max(t for t, _, _ in progress)
        listed = client.ok("list_sandboxes")
    assert not result.is_error
    out = result.structured_content
    assert out is not None
    assert (out["exit_code"], out["stdout"], out["timed_out"]) == (0, "first\nsecond\n", False)
    assert [message for _, _, message in progress] == ["first\n", "second\n"]
    assert progress[0][0] < ended - 0.5  # the first line arrived while the command ran
    [only] = listed["sandboxes"]
    assert (only["sandbox_id"], only["current"], only["entry"]) == (out["sandbox_id"], True,
                                                                    "local")  # fmt: skip


def test_commands_take_cwd_env_and_timeout(client: McpClient) -> None:
    sandbox = client.ok("open_sandbox")["sandbox_id"]
    client.ok("run_command", {"command": "mkdir -p work", "sandbox_id": sandbox})
    ran = client.ok("run_command", {"command": "pwd; echo $GREETING; exit 3", "cwd": "work",
                                    "env": {"GREETING": "hi"}, "sandbox_id": sandbox})  # fmt: skip
    assert ran["exit_code"] == 3
    assert ran["stdout"].splitlines()[1] == "hi"
    assert ran["stdout"].splitlines()[0].endswith("/work")
    slow = client.ok("run_command", {"command": "sleep 30", "timeout": 0.5, "sandbox_id": sandbox})
    assert slow["timed_out"] is True


def test_files_round_trip(client: McpClient) -> None:
    sandbox = client.ok("open_sandbox")["sandbox_id"]
    at = {"sandbox_id": sandbox}
    assert client.ok("write_file", {"path": "notes/a.txt", "content": "héllo\n", **at})["size"] == 7
    blob = bytes(range(256))
    wrote = {"path": "notes/b.bin", "content": base64.b64encode(blob).decode(), **at}
    client.ok("write_file", {**wrote, "encoding": "base64"})
    text = client.ok("read_file", {"path": "notes/a.txt", **at})
    assert (text["encoding"], text["content"]) == ("utf-8", "héllo\n")
    binary = client.ok("read_file", {"path": "notes/b.bin", **at})
    assert (binary["encoding"], base64.b64decode(binary["content"])) == ("base64", blob)
    listed = client.ok("list_files", {"path": "notes", **at})
    assert sorted((e["name"], e["size"], e["is_dir"]) for e in listed["entries"]) == [
        ("a.txt", 7, False), ("b.bin", 256, False)]  # fmt: skip
    client.ok("remove_file", {"path": "notes", **at})
    assert "notes/a.txt" in client.error("read_file", {"path": "notes/a.txt", **at})


def test_run_code_says_whether_its_state_persists(client: McpClient) -> None:
    sandbox = client.ok("open_sandbox")["sandbox_id"]
    first = client.ok("run_code", {"code": "x = 41\nprint(x + 1)", "sandbox_id": sandbox})
    assert (first["stdout"], first["error"]) == ("42\n", None)
    assert first["stateful"] is True  # the router's kernel keeps local's variables
    again = client.ok("run_code", {"code": "print(x)", "sandbox_id": sandbox})
    assert (again["stdout"], again["error"]) == ("41\n", None)


def test_a_background_server_is_reached_through_its_exposed_port(client: McpClient) -> None:
    sandbox = client.ok("open_sandbox", {"requires": ["port", "process.kill"]})["sandbox_id"]
    at = {"sandbox_id": sandbox}
    port = free_port()
    client.ok("write_file", {"path": "site/index.html", "content": "served from a sandbox", **at})
    started = client.ok("start_process", {"command": f"python3 -m http.server {port}",
                                          "cwd": "site", **at})  # fmt: skip
    process = started["process_id"]
    seen: list[str] = []

    def serving() -> bool:
        read = client.ok("read_process_output", {"process_id": process, "wait_seconds": 1})
        seen.append(read["stdout"] + read["stderr"])
        return "Serving HTTP" in "".join(seen)

    wait_until(serving, 20)
    exposed = client.ok("expose_port", {"port": port, **at})
    assert fetch(exposed["url"], exposed["headers"]).text == "served from a sandbox"
    assert client.ok("kill_process", {"process_id": process})["killed"] is True
    wait_until(lambda: not client.ok("read_process_output", {"process_id": process})["running"])
    assert client.ok("read_process_output", {"process_id": process})["running"] is False


def test_router_errors_reach_the_model_as_tool_errors(client: McpClient) -> None:
    none = client.error("open_sandbox", {"requires": ["gpu"]})
    assert "no sandbox provider available" in none
    assert "local: lacks capability gpu" in none
    assert "Traceback" not in none
    assert "no such sandbox" in client.error("run_command", {"command": "true",
                                                             "sandbox_id": "nope"})  # fmt: skip
    invalid = client.error("run_command", {"command": "true", "timeout": -1, "extra": 1})
    assert "timeout: Input should be greater than 0" in invalid
    assert "extra: Extra inputs are not permitted" in invalid
    assert "no tool 'nope'" in client.error("nope")
    assert "no process" in client.error("kill_process", {"process_id": "12345"})


def test_oversized_arguments_are_refused_and_big_results_capped(client: McpClient) -> None:
    sandbox = client.ok("open_sandbox")["sandbox_id"]
    at = {"sandbox_id": sandbox}
    write = client.error("write_file", {"path": "big", "content": "x" * 5000, **at})
    assert "5000 bytes, over this server's limit of 4096 bytes (mcp.max_write_bytes)" in write
    command = client.error("run_command", {"command": "echo " + "x" * 2000, **at})
    assert "mcp.max_command_bytes" in command
    assert "mcp.max_command_bytes" in client.error("run_code", {"code": "#" * 2000, **at})
    client.ok("run_command", {"command": "head -c 10000 /dev/zero > big.bin", **at})
    assert "mcp.max_read_bytes" in client.error("read_file", {"path": "big.bin", **at})
    loud = client.ok("run_command", {"command": "python3 -c \"print('y' * 5000)\"", **at})
    assert loud["omitted_chars"] == 5001 - 2000
    assert "characters omitted" in loud["stdout"]
    assert len(loud["stdout"]) < 2100
    assert client.ok("run_command", {"command": "echo still here", **at})["exit_code"] == 0


def test_pause_and_resume_keep_the_files(client: McpClient) -> None:
    sandbox = client.ok("open_sandbox", {"requires": ["pause"]})["sandbox_id"]
    at = {"sandbox_id": sandbox}
    client.ok("write_file", {"path": "kept.txt", "content": "still here", **at})
    assert client.ok("pause_sandbox", at)["paused"] is True
    assert "paused: call resume_sandbox" in client.error("run_command", {"command": "true", **at})
    assert client.ok("resume_sandbox", at)["paused"] is False
    assert client.ok("read_file", {"path": "kept.txt", **at})["content"] == "still here"
    client.ok("close_sandbox", at)


def test_close_sandbox_kills_it(client: McpClient, workdir: Path) -> None:
    sandbox = client.ok("open_sandbox")["sandbox_id"]
    assert (workdir / "sb" / sandbox).exists()
    assert client.ok("close_sandbox", {"sandbox_id": sandbox})["closed"] is True
    assert sandbox not in [s["sandbox_id"] for s in client.ok("list_sandboxes")["sandboxes"]]
    assert not (workdir / "sb" / sandbox).exists()
    assert "no such sandbox" in client.error("run_command", {"command": "true",
                                                             "sandbox_id": sandbox})  # fmt: skip


@pytest.mark.parametrize("source", ["file", "pipe"])
def test_requests_sent_before_the_input_ends_are_all_answered(
    workdir: Path,
    server,  # type: ignore[no-untyped-def]
    source: str,
) -> None:
    """A file of requests (no pipe to poll), or a pipe its writer closed at once: every
    request is answered, even one still running when the input ended (the SDK cancels
    what is in flight at end of input)."""
    hello = {"protocolVersion": "2025-11-25", "capabilities": {},
             "clientInfo": {"name": source, "version": "0"}}  # fmt: skip
    slow = {"name": "run_command", "arguments": {"command": "sleep 1; echo late"}}
    messages = [
        {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": hello},
        {"jsonrpc": "2.0", "method": "notifications/initialized"},
        {"jsonrpc": "2.0", "id": 2, "method": "tools/list"},
        {"jsonrpc": "2.0", "id": "three", "method": "tools/call", "params": slow},
    ]
    requests = "".join(json.dumps(m) + "\n" for m in messages)
    (workdir / "in.jsonl").write_text(requests)
    feed: dict[str, Any] = {"input": requests.encode()}
    with (workdir / "in.jsonl").open() as stdin, (workdir / "out.jsonl").open("w") as stdout:
        if source == "file":
            feed = {"stdin": stdin}
        command = [server.command, *server.args]
        env = {**os.environ, **server.env}
        subprocess.run(command, stdout=stdout, timeout=60, env=env, check=True, **feed)
    answers = [json.loads(line) for line in (workdir / "out.jsonl").read_text().splitlines()]
    assert [a["id"] for a in answers] == [1, 2, "three"]
    assert len(answers[1]["result"]["tools"]) == 15
    assert answers[2]["result"]["structuredContent"]["stdout"] == "late\n"


def test_a_server_whose_input_is_dev_null_ends_at_once(server) -> None:  # type: ignore[no-untyped-def]
    """``/dev/null`` is a character device no event loop can poll (epoll refuses it): a
    server started with it as stdin (a supervisor's default) reads its end and exits,
    as with an empty file, rather than wait forever on a reader never registered."""
    done = subprocess.run(
        [server.command, *server.args],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        timeout=30,
        env={**os.environ, **server.env},
        check=False,
    )
    assert done.returncode == 0
    assert b"Traceback" not in done.stderr, done.stderr.decode()


def test_a_server_started_without_stdin_says_so(server) -> None:  # type: ignore[no-untyped-def]
    """With fd 0 closed the first file the process opens takes its number: the stdio
    transport would read that. The command refuses at once, naming what is missing."""
    done = subprocess.run(
        [server.command, *server.args],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        timeout=30,
        env={**os.environ, **server.env},
        preexec_fn=lambda: os.close(0),
        check=False,
    )
    assert done.returncode == 2
    assert b"Traceback" not in done.stderr, done.stderr.decode()
    assert b"stdin" in done.stderr
