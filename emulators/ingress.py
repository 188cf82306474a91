"""The vendors' edge for sandbox ports: an HTTP reverse proxy to a port inside a sandbox.

Every vendor reaches a sandbox's port through its own edge (E2B's
``{port}-{id}.{domain}``, Daytona's preview proxy, Modal's tunnels,
Runloop's ``{port}-{key}.tunnel.{domain}``). Each emulator serves that edge
with `forward`: it checks what the vendor checks (the token header), then
streams the request to the port on the sandbox's loopback and the answer
back, never holding a body whole. A vendor whose URLs are wildcard host
names routes on the ``Host`` header; `Emulator.resolve` tells a client
where such a name points (what the vendor's DNS does).
"""

from __future__ import annotations

import aiohttp
from aiohttp import web

__all__ = ["HOP_HEADERS", "forward"]

HOP_HEADERS = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailers",
        "transfer-encoding",
        "upgrade",
        "host",
        "content-length",
    }
)


async def forward(
    request: web.Request, port: int, path: str, *, drop: frozenset[str] = frozenset()
) -> web.StreamResponse:
    """Proxy ``request`` to ``http://127.0.0.1:{port}{path}``; 502 when nothing listens there.

    ``drop`` names the vendor's own headers (its access token) kept from the sandbox.
    """
    skip = HOP_HEADERS | {h.lower() for h in drop}
    headers = {k: v for k, v in request.headers.items() if k.lower() not in skip}
    query = f"?{request.query_string}" if request.query_string else ""
    target = f"http://127.0.0.1:{port}{path}{query}"
    body = request.content if request.can_read_body else None
    try:
        async with (
            aiohttp.ClientSession(auto_decompress=False) as session,
            session.request(
                request.method, target, headers=headers, data=body, allow_redirects=False
            ) as upstream,
        ):
            answer = web.StreamResponse(
                status=upstream.status,
                headers={k: v for k, v in upstream.headers.items() if k.lower() not in HOP_HEADERS},
            )
            await answer.prepare(request)
            async for chunk in upstream.content.iter_chunked(1 << 16):
                await answer.write(chunk)
            await answer.write_eof()
            return answer
    except aiohttp.ClientConnectionError:
        return web.json_response(
            {"message": f"no server is listening on port {port} in the sandbox"}, status=502
        )
