"""The README's and docs/mcp.md's ``mcpServers`` entry, run exactly as a client runs it."""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

import pytest

from tests.mcp.conftest import needs_mcp

needs_mcp()

from mcp import StdioServerParameters  # noqa: E402

from tests.mcp.harness import ROOT, McpClient, server_env  # noqa: E402


@pytest.mark.parametrize("page", ["README.md", "docs/mcp.md"])
def test_the_documented_client_entry_starts_a_working_server(tmp_path: Path, page: str) -> None:
    text = (ROOT / page).read_text()
    [block] = [b for b in re.findall(r"```json\n(.*?)```", text, re.S) if "mcpServers" in b]
    [entry] = json.loads(block)["mcpServers"].values()
    # The entry as written; the environment only isolates the test (its state, this checkout,
    # the virtualenv's bin on PATH as in an activated shell).
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    env = {**entry.get("env", {}), **server_env(tmp_path / "state", {"PATH": path})}
    server = StdioServerParameters(command=entry["command"], args=entry["args"], env=env)
    with McpClient(server) as client:
        assert "run_command" in {tool.name for tool in client.tools()}
        ran = client.ok("run_command", {"command": "echo hello from the docs"})
    assert ran["stdout"] == "hello from the docs\n"
