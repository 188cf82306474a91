"""``sandbox-router mcp``: the router as a Model Context Protocol server, on stdio or HTTP.

Built on the official SDK's low-level `mcp.server.Server`, the layer its
`MCPServer` (FastMCP until mcp 2) is made of: `MCPServer` configures the
process's root logger when it is built (``logging.basicConfig``), which a
library must not do, and prefixes the message of every tool error it
reports; here each tool's schema is its argument model's, and its result
and errors are exactly what the model should read (`router.mcp.tools`).

A tool call runs in its MCP session (`router.mcp.sessions`): on stdio the
one session of the process, over Streamable HTTP the session the SDK keeps
per client (its ``Mcp-Session-Id``) under the caller's tenant
(`router.mcp.auth`). HTTP needs those sessions, so a client that opens with
the 2026 protocol's ``server/discover`` is told the handshake versions only
and falls back to them; a sessionless call is refused with a tool error
saying so. Every router error reaches the model as a tool error with the
router's message (``isError``); anything else is logged with its traceback
and reported as an internal error, without it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import threading
from collections.abc import Callable, Iterator
from typing import Any

import anyio
import mcp_types as types
import uvicorn
from mcp.server import Server, ServerRequestContext
from mcp.server.auth.middleware.auth_context import AuthContextMiddleware, get_access_token
from mcp.server.context import CallNext, HandlerResult
from mcp.server.stdio import stdio_server
from mcp.server.transport_security import DEFAULT_MAX_REQUEST_BODY_SIZE
from mcp.shared.jsonrpc_dispatcher import progress_token_from_params
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS
from pydantic import ValidationError

from providers.errors import ConfigError, LeaseError, SandboxRouterError, Unsupported
from providers.logs import Log
from router.config import McpSettings, RouterConfig
from router.core import Router
from router.mcp.auth import LOCAL_TENANT, TOKEN_SCOPE, BearerGate, Tenants, is_loopback
from router.mcp.sessions import SESSION_HEADER, STDIO, McpSessions, Owner, SessionWatch
from router.mcp.stdio import wire
from router.mcp.tools import TOOLS, Call, Progress, dump

__all__ = ["build_server", "serve", "serve_http", "serve_stdio"]

log = Log("sandbox_router.mcp")

NAME = "sandbox-router"
PATH = "/mcp"
INSTRUCTIONS = (
    "Run commands and code in isolated cloud sandboxes. The first tool call opens a sandbox "
    "for this session (or call open_sandbox to choose capabilities); every tool works on the "
    "current sandbox unless given a sandbox_id. Sandboxes are released when the session ends."
)
CLOSE_SECONDS = 60.0  # the most a shutdown waits for its sandboxes' releases

OwnerOf = Callable[[ServerRequestContext[Any, Any]], Owner]


def build_server(sessions: McpSessions, owner_of: OwnerOf, *, http: bool = False) -> Server[Any]:
    """The MCP server: the tools of `router.mcp.tools`, each call in its caller's session."""
    listing = types.ListToolsResult(
        tools=[
            types.Tool(
                name=tool.name,
                title=tool.title,
                description=tool.description,
                input_schema=tool.args.model_json_schema(),
                output_schema=tool.result.model_json_schema(),
                annotations=tool.annotations,
            )
            for tool in TOOLS.values()
        ]
    )

    async def list_tools(
        ctx: ServerRequestContext[Any, Any], params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        return listing

    async def call_tool(
        ctx: ServerRequestContext[Any, Any], params: types.CallToolRequestParams
    ) -> types.CallToolResult:
        tool = TOOLS.get(params.name)
        if tool is None:
            return _error(f"no tool {params.name!r}; the tools are {', '.join(TOOLS)}")
        try:
            args = tool.args.model_validate(params.arguments or {})
        except ValidationError as exc:
            return _error(_invalid(tool.name, exc))
        try:
            session = sessions.get(owner_of(ctx))
            wants_progress = progress_token_from_params(ctx.params) is not None
            progress = _progress(ctx) if wants_progress else None
            result = await tool.run(Call(session, progress), args)
        except SandboxRouterError as exc:
            return _error(_message(exc))
        except Exception:
            log.line(
                logging.ERROR, "sandbox_router.mcp.tool_failed", {"tool": tool.name}, exc_info=True
            )
            return _error(f"{tool.name} failed inside the sandbox server (its log has the details)")
        data, text = dump(result)
        return types.CallToolResult(
            content=[types.TextContent(type="text", text=text)], structured_content=data
        )

    server: Server[Any] = Server(
        NAME, instructions=INSTRUCTIONS, on_list_tools=list_tools, on_call_tool=call_tool
    )
    if http:
        server.middleware.append(_handshake_only(server))
    return server


def _handshake_only(server: Server[Any]) -> Callable[..., Any]:
    """Answer ``server/discover`` with the handshake versions: a client that probes with it
    (the 2026 protocol has no sessions over HTTP) falls back to the handshake, and a session."""

    async def middleware(ctx: ServerRequestContext[Any, Any], call_next: CallNext) -> HandlerResult:
        if ctx.method == "server/discover":
            return types.DiscoverResult(
                supported_versions=list(HANDSHAKE_PROTOCOL_VERSIONS),
                capabilities=server.get_capabilities(),
                instructions=INSTRUCTIONS,
            )
        return await call_next(ctx)

    return middleware


def http_owner(ctx: ServerRequestContext[Any, Any]) -> Owner:
    """An HTTP call's session: its ``Mcp-Session-Id`` under the caller's tenant."""
    headers = getattr(ctx.request, "headers", None)
    session_id = headers.get(SESSION_HEADER) if headers is not None else None
    if not session_id:
        raise LeaseError(
            "this call belongs to no MCP session, and sandboxes live in one: connect with the "
            "session handshake (initialize, protocol 2025-11-25 or earlier)"
        )
    token = get_access_token()
    if token is None:
        return Owner(LOCAL_TENANT, session_id)
    return Owner(token.client_id, session_id, token=TOKEN_SCOPE in token.scopes)


def _progress(ctx: ServerRequestContext[Any, Any]) -> Progress:
    """Output as progress notifications; ``progress`` counts the characters sent so far."""
    sent = 0

    async def report(text: str) -> None:
        nonlocal sent
        sent += len(text)
        await ctx.session.report_progress(sent, None, text)

    return report


def _error(message: str) -> types.CallToolResult:
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=message)], is_error=True
    )


def _message(exc: SandboxRouterError) -> str:
    if isinstance(exc, Unsupported):
        return (
            f"{exc.provider} does not support {exc.capability}: open a sandbox that does with "
            f'open_sandbox(requires=["{exc.capability}"])'
        )
    return str(exc)


def _invalid(tool: str, exc: ValidationError) -> str:
    """The arguments' problems by name, without their values (they may be huge, or secret)."""
    problems = [
        f"{'.'.join(str(part) for part in err['loc']) or 'arguments'}: {err['msg']}"
        for err in exc.errors(include_url=False, include_input=False, include_context=False)
    ]
    return f"invalid arguments for {tool}: " + "; ".join(problems)


# -- serving -------------------------------------------------------------------------
def serve(
    config: RouterConfig,
    *,
    http: bool = False,
    host: str = "127.0.0.1",
    port: int = 8765,
    announce: Callable[[str], None] = print,
) -> None:
    """Serve until end of input (stdio), SIGTERM or SIGINT; release every session's sandboxes.

    Raises:
        ConfigError: bad tokens, or a non-loopback ``host`` with no token configured.
    """
    tenants = Tenants.load(config.mcp, os.environ) if http else Tenants({})
    if http and not tenants and not is_loopback(host):
        raise ConfigError(
            f"mcp --host {host}: no bearer token is configured (mcp.tokens in the config, or "
            "SANDBOX_ROUTER_MCP_TOKENS), so the server listens on loopback only"
        )

    async def main() -> None:
        async with Router(config) as router:
            if http:
                await serve_http(router, config.mcp, tenants, host, port, announce)
            else:
                await serve_stdio(router, config.mcp)

    anyio.run(main)


async def serve_stdio(router: Router, settings: McpSettings) -> None:
    """One session on stdin/stdout, until end of input or a signal."""
    sessions = McpSessions(router, settings)
    server = build_server(sessions, lambda _ctx: STDIO)
    with anyio.CancelScope() as scope, _on_signals(scope.cancel):
        try:
            async with wire() as (lines, writer), stdio_server(lines, writer) as (read, write):  # type: ignore[arg-type]
                await server.run(read, write, server.create_initialization_options())
        finally:
            await _close(sessions)


async def serve_http(
    router: Router,
    settings: McpSettings,
    tenants: Tenants,
    host: str,
    port: int,
    announce: Callable[[str], None],
) -> None:
    """Streamable HTTP at ``/mcp``, until a signal; sessions end as `McpSessions` says."""
    sessions = McpSessions(router, settings)
    server = build_server(sessions, http_owner, http=True)
    app = server.streamable_http_app(
        streamable_http_path=PATH,
        session_idle_timeout=settings.session_idle_timeout,
        max_request_body_size=_body_limit(settings),
        host=host,
    )
    gated = BearerGate(AuthContextMiddleware(SessionWatch(app, sessions)), tenants)
    listener = _listen(host, port)
    # A client's standalone GET stream never ends by itself: a stop gives requests a second.
    config = uvicorn.Config(
        gated, log_config=None, access_log=False, lifespan="on", timeout_graceful_shutdown=1
    )
    web = _Uvicorn(config)
    shown = f"[{host}]" if ":" in host else host
    who = f"tenants {', '.join(tenants.names)}" if tenants else "no token: loopback only"
    announce(f"serving MCP on http://{shown}:{listener.getsockname()[1]}{PATH} ({who})")
    reaper = asyncio.ensure_future(sessions.reaper())

    def stop() -> None:
        web.should_exit = True

    with _on_signals(stop):
        try:
            await web.serve(sockets=[listener])
        finally:
            reaper.cancel()
            await _close(sessions)


def _body_limit(settings: McpSettings) -> int:
    """The largest request body read: room for the largest argument a tool accepts, in
    base64 or escaped JSON, so the tool (not the transport) refuses one over its limit."""
    largest = max(settings.max_write_bytes, settings.max_command_bytes)
    return max(DEFAULT_MAX_REQUEST_BODY_SIZE, 2 * largest + 2**20)


def _listen(host: str, port: int) -> socket.socket:
    """The listening socket, made TCP explicitly: asyncio sets TCP_NODELAY only on a socket
    whose protocol says TCP, and without it each SSE reply waited for a delayed ACK (~40 ms)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    listener = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((host.strip("[]"), port))
        listener.listen(socket.SOMAXCONN)
    except OSError:
        listener.close()
        raise
    return listener


async def _close(sessions: McpSessions) -> None:
    """End every session, even while the server is being cancelled, within `CLOSE_SECONDS`."""
    with anyio.move_on_after(CLOSE_SECONDS, shield=True):
        await sessions.close()


@contextlib.contextmanager
def _on_signals(stop: Callable[[], None]) -> Iterator[None]:
    """SIGTERM and SIGINT call ``stop`` (the command's own; in another thread, nothing)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop)
    try:
        yield
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)


class _Uvicorn(uvicorn.Server):
    """uvicorn's server without its signal handling: it would raise the signal again after
    stopping, ending the process before the sessions' sandboxes are released."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield
