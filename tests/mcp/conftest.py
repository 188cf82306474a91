"""Chain entries and emulators for the MCP server's tests.

Each test module skips, naming the package, where the ``mcp`` SDK is not
installed (`needs_mcp`); nothing here imports it.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from emulators import daytona, e2b, emulator_class, modal, runloop
from emulators.harness import Emulator

VENDORS = ("daytona", "e2b", "modal", "runloop")
NEEDS_MCP = 'the MCP server tests need the mcp SDK (pip install "sandbox-router[mcp]")'


def needs_mcp() -> None:
    """Skip the calling test module where the ``mcp`` SDK is not installed."""
    pytest.importorskip("mcp", reason=NEEDS_MCP)


def local_entry(root: Path, name: str = "local") -> dict[str, Any]:
    """A `local` entry whose sandboxes share the host's network, so their ports are reachable."""
    return {"name": name, "provider": "local", "options": {"root": str(root), "network": True}}


def vendor_entry(emu: Emulator) -> tuple[dict[str, Any], dict[str, str]]:
    """A chain entry on ``emu``'s vendor adapter, and what its server process's environment
    needs (Modal's SDK reads a config file: an empty one of the emulator's)."""
    name = emu.name
    options: dict[str, Any]
    env: dict[str, str] = {}
    if name == "daytona":
        options = {"api_key": daytona.TEST_API_KEY, "api_url": emu.api_url}
    elif name == "e2b":
        options = {"api_key": e2b.TEST_API_KEY, "api_url": emu.url, "sandbox_url": emu.url}
    elif name == "modal":
        options = {"token_id": modal.TEST_TOKEN_ID, "token_secret": modal.TEST_TOKEN_SECRET,
                   "server_url": emu.url}  # fmt: skip
        env = {"MODAL_CONFIG_PATH": emu.sdk_env()["MODAL_CONFIG_PATH"]}
    else:
        options = {"api_key": runloop.TEST_API_KEY, "base_url": emu.url, "pool_shards": 1}
    return {"name": name, "provider": name, "options": {**options, "request_timeout": 5}}, env


@pytest.fixture(scope="module")
def emulated(request: pytest.FixtureRequest) -> Iterator[Emulator]:
    """A vendor's emulator for the whole module (parametrize ``emulated`` indirectly)."""
    with emulator_class(request.param)() as emu:
        yield emu
