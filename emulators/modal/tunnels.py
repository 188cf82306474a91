"""Modal's edge for sandbox tunnels: ``https://<key>.<DOMAIN>``, one name per declared port.

Modal opens a sandbox's ports at create only (``encrypted_ports``): each
gets a tunnel, a host name of its own (Modal's ``<key>.r<n>.modal.host``)
on port 443, which the SDK reads from the V2 create's answer or from
``SandboxGetTunnels`` / ``SandboxGetTunnelsV2``. Modal's DNS points those
names at its edge, which ends TLS and proxies to the port in the container.
Here the edge is a plain-HTTP listener of the emulator's own that routes on
the ``Host`` header (`emulators.modal.ModalEmulator.resolve` plays the
DNS). A port not declared at create has no name, so nothing reaches it. An
``unencrypted_ports`` port also gets a raw TCP tunnel
(`emulators.modal.sandboxes.ModalSandbox.open_tcp_tunnel`). A connect token's
URL is a host name of its own too, for any port; the edge forwards only the
requests that bear its token (``Authorization: Bearer`` or the
``_modal_connect_token`` query parameter, neither passed on) and answers 401
to the rest.
"""

from __future__ import annotations

import secrets

from aiohttp import web

from emulators.ingress import forward
from emulators.modal.sandboxes import ModalCore

__all__ = ["DOMAIN", "TunnelEdge", "tunnel_host"]

DOMAIN = "modal.emulator.test"
_CONNECT_QUERY = "_modal_connect_token"


def tunnel_host() -> str:
    """A new tunnel's host name, as unguessable as Modal's."""
    return f"{secrets.token_hex(7)}.{DOMAIN}"


class TunnelEdge:
    """Routes a request for a tunnel's host name to its port in the sandbox."""

    def __init__(self, core: ModalCore) -> None:
        self.core = core

    def app(self) -> web.Application:
        app = web.Application(client_max_size=0)
        app.router.add_route("*", "/{tail:.*}", self.handle)
        return app

    async def handle(self, request: web.Request) -> web.StreamResponse:
        host = request.host.partition(":")[0].lower()
        found = self.core.tunnel_hosts.get(host)
        drop: frozenset[str] = frozenset()
        if found is None and host in self.core.connect_hosts:
            found = self.core.connect_hosts[host]
            if not self._bears_token(request, host):
                return web.Response(status=401, text="a valid Modal connect token is required\n")
            query = request.rel_url.query.copy()
            query.popall(_CONNECT_QUERY, None)
            request = request.clone(rel_url=request.rel_url.with_query(query))
            drop = frozenset({"authorization"})
        if found is None:
            return web.Response(status=404, text=f"no Modal tunnel at host {request.host!r}\n")
        sandbox, port = found
        if not sandbox.running:
            return web.Response(status=502, text=f"the sandbox {sandbox.id} has finished\n")
        sandbox.touch()
        return await forward(request, port, request.rel_url.path, drop=drop)

    def _bears_token(self, request: web.Request, host: str) -> bool:
        """The request carries a connect token for ``host``: ``Authorization: Bearer`` or
        the ``_modal_connect_token`` query parameter."""
        scheme, _, token = request.headers.get("Authorization", "").partition(" ")
        if scheme.lower() != "bearer":
            token = request.rel_url.query.get(_CONNECT_QUERY, "")
        claims = self.core.tokens.claims(token)
        return claims is not None and claims.get("connect") == host
