"""``sandbox-router mcp``: every MCP client gets a sandbox, with failover across the fleet.

An optional part (``pip install "sandbox-router[mcp]"``): importing it needs
the official ``mcp`` SDK. `serve` runs the server on stdio or Streamable
HTTP; `router.mcp.tools` holds the tools, `router.mcp.sessions` the
sandboxes of each MCP session and `router.mcp.auth` the HTTP tenants.
See docs/mcp.md.
"""

import mcp  # noqa: F401 - first: without the SDK, the error names it (the CLI says what to install)

from router.mcp.server import build_server, serve, serve_http, serve_stdio

__all__ = ["build_server", "serve", "serve_http", "serve_stdio"]
