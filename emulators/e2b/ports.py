"""E2B's edge for sandbox ports: ``https://{port}-{sandbox_id}.{domain}``.

The SDK builds a port's host from the sandbox's domain (``get_host``);
E2B's DNS points every such name at its edge, which routes on the host
name to the port inside the sandbox. The emulator's sandboxes report
`DOMAIN`, this edge listens on a port of its own, and
`E2BEmulator.resolve` says where those names point. A sandbox created
with restricted public traffic wants its ``E2B-Traffic-Access-Token``
header; the edge keeps it from the sandbox.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from aiohttp import web

from emulators.ingress import forward

if TYPE_CHECKING:
    from emulators.e2b import E2BEmulator

__all__ = ["DOMAIN", "PortEdge"]

DOMAIN = "e2b.emulator.test"
TOKEN_HEADER = "E2B-Traffic-Access-Token"
_HOST = re.compile(rf"(\d{{1,5}})-([a-z0-9]+)\.{re.escape(DOMAIN)}")


def _error(status: int, message: str) -> web.Response:
    return web.json_response({"code": status, "message": message}, status=status)


class PortEdge:
    """Routes a request for ``{port}-{id}.{DOMAIN}`` to that port in the sandbox."""

    def __init__(self, emulator: E2BEmulator) -> None:
        self.core = emulator.core

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self.handle)
        return app

    async def handle(self, request: web.Request) -> web.StreamResponse:
        matched = _HOST.fullmatch(request.host.partition(":")[0])
        if matched is None:
            return _error(404, f"no sandbox port at host {request.host!r}")
        port, sandbox_id = int(matched[1]), matched[2]
        sandbox = self.core.alive_sandbox(sandbox_id)
        if sandbox is None:
            return _error(502, f"The sandbox {sandbox_id} was not found")
        if not await self.core.woken(sandbox_id):
            return _error(502, f"The sandbox {sandbox_id} was not found: it is paused")
        token = sandbox.traffic_token
        if token is not None and request.headers.get(TOKEN_HEADER) != token:
            return _error(403, "missing or wrong traffic access token")
        return await forward(request, port, request.rel_url.path, drop=frozenset({TOKEN_HEADER}))
