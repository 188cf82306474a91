"""Over HTTP: a token's tenant is the tenant its leases count to, limited by ``tenants``."""

from __future__ import annotations

import secrets
from collections.abc import Iterator

import pytest

from tests.mcp.conftest import needs_mcp

needs_mcp()

from tests.mcp.conftest import local_entry  # noqa: E402
from tests.mcp.harness import HttpServer, McpClient, server_env, write_config  # noqa: E402

ACME = "acme-" + secrets.token_urlsafe(24)
BETA = "beta-" + secrets.token_urlsafe(24)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HttpServer]:
    base = tmp_path_factory.mktemp("mcp-tenants")
    config = write_config(
        base / "chain.yaml",
        [local_entry(base / "sb")],
        mcp={"tokens": {"acme": ACME, "beta": BETA}},
        tenants={"default": {"concurrent": 1}, "overrides": {"beta": {"concurrent": 2}}},
    )
    made = HttpServer(config, server_env(base / "state"))
    yield made
    made.stop()


def test_a_token_s_tenant_limits_that_caller_and_no_other(server: HttpServer) -> None:
    with McpClient(server.url, token=ACME) as acme, McpClient(server.url, token=BETA) as beta:
        acme.ok("open_sandbox")
        refused = acme.error("open_sandbox")
        assert "tenant 'acme' limit reached: concurrent 1/1" in refused
        with McpClient(server.url, token=ACME) as again:  # another session, the same tenant
            assert "tenant 'acme' limit reached" in again.error("open_sandbox")
        beta.ok("open_sandbox")
        beta.ok("open_sandbox")  # its override: two
        assert "tenant 'beta' limit reached: concurrent 2/2" in beta.error("open_sandbox")
    with McpClient(server.url, token=ACME) as acme:  # the ended session released its lease
        acme.ok("open_sandbox")
