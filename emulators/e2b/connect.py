"""Connect RPC with the JSON codec, the protocol envd speaks, on aiohttp.

The e2b SDK talks to envd through ``connectrpc`` with a JSON codec and no
compression. Unary calls are a plain ``application/json`` POST; server
streams are ``application/connect+json`` bodies of enveloped messages (one
flag byte, a 4-byte big-endian length, the JSON), the last envelope flagged
end-of-stream and carrying the error, if any. Errors of unary calls are the
HTTP status of their code with a ``{"code", "message"}`` JSON body.

The ASGI server bases shipped in ``e2b.envd`` would need an ASGI server this
project does not depend on; the protocol is small enough to speak directly.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import struct
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

__all__ = [
    "RpcError",
    "StreamHandler",
    "UnaryHandler",
    "deadline_of",
    "end_of_stream",
    "envelope",
    "serve_stream",
    "serve_unary",
]

Message = dict[str, Any]
Send = Callable[[Message], Awaitable[None]]
UnaryHandler = Callable[[Message], Awaitable[Message]]
StreamHandler = Callable[[Message, Send], Awaitable[None]]

_END_STREAM = 0b10

# The Connect protocol's code -> HTTP status table.
CODE_STATUS = {
    "canceled": 499,
    "unknown": 500,
    "invalid_argument": 400,
    "deadline_exceeded": 504,
    "not_found": 404,
    "already_exists": 409,
    "permission_denied": 403,
    "resource_exhausted": 429,
    "failed_precondition": 400,
    "aborted": 409,
    "out_of_range": 400,
    "unimplemented": 501,
    "internal": 500,
    "unavailable": 503,
    "data_loss": 500,
    "unauthenticated": 401,
}


class RpcError(Exception):
    """An RPC failing with a Connect ``code`` (``not_found``, ``invalid_argument``...)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message

    def to_dict(self) -> Message:
        return {"code": self.code, "message": self.message}


def envelope(message: Message, *, end: bool = False) -> bytes:
    """One enveloped message of a Connect stream."""
    data = json.dumps(message, separators=(",", ":")).encode()
    return struct.pack(">BI", _END_STREAM if end else 0, len(data)) + data


def end_of_stream(error: RpcError | None = None) -> bytes:
    return envelope({"error": error.to_dict()} if error else {}, end=True)


def _first_envelope(body: bytes) -> Message:
    if len(body) < 5:
        raise RpcError("invalid_argument", "missing request envelope")
    flags, length = struct.unpack(">BI", body[:5])
    if flags & 0b01:
        raise RpcError("internal", "compressed messages are not supported")
    return _decode(body[5 : 5 + length])


def _decode(data: bytes) -> Message:
    try:
        message = json.loads(data or b"{}")
    except ValueError as exc:
        raise RpcError("invalid_argument", f"request is not valid JSON: {exc}") from None
    if not isinstance(message, dict):
        raise RpcError("invalid_argument", "request must be a JSON object")
    return message


def deadline_of(request: web.Request) -> float | None:
    """The call's deadline in seconds (``Connect-Timeout-Ms``); None: no limit."""
    raw = request.headers.get("Connect-Timeout-Ms")
    return int(raw) / 1000 if raw and raw.isdigit() else None


async def serve_unary(request: web.Request, handler: UnaryHandler) -> web.Response:
    """Answer a unary call: decode, run ``handler`` within the call's deadline, encode."""
    try:
        message = _decode(await request.read())
        async with asyncio.timeout(deadline_of(request)):
            reply = await handler(message)
    except RpcError as err:
        return web.json_response(err.to_dict(), status=CODE_STATUS[err.code])
    except TimeoutError:
        late = RpcError("deadline_exceeded", "the call's deadline passed")
        return web.json_response(late.to_dict(), status=CODE_STATUS[late.code])
    return web.json_response(reply)


async def serve_stream(request: web.Request, handler: StreamHandler) -> web.StreamResponse:
    """Answer a server-streaming call: ``handler`` sends messages until it returns.

    The call's ``Connect-Timeout-Ms`` deadline cancels the handler, which must
    release what it started (processes) in its own ``finally``.
    """
    body = await request.read()
    response = web.StreamResponse(headers={"Content-Type": "application/connect+json"})
    await response.prepare(request)

    async def send(message: Message) -> None:
        await response.write(envelope(message))

    error: RpcError | None = None
    try:
        message = _first_envelope(body)
        async with asyncio.timeout(deadline_of(request)):
            await handler(message, send)
    except RpcError as err:
        error = err
    except TimeoutError:
        error = RpcError("deadline_exceeded", "the call's deadline passed")
    except ConnectionResetError:
        return response
    with contextlib.suppress(ConnectionResetError):
        await response.write(end_of_stream(error))
        await response.write_eof()
    return response
