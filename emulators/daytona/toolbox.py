"""The sandbox daemon's toolbox API behind the toolbox proxy: the proxy, and the daemon's shape.

The SDK sends toolbox calls to ``{toolboxProxyUrl}/{sandboxId}/...`` with
the API key; the emulator's proxy URL is ``/toolbox`` on its own port.
Errors are the daemon's ``{statusCode, message, code, source, path, method,
timestamp}`` with ``source: DAYTONA_DAEMON`` and its codes
(``FILE_NOT_FOUND``, ``PROCESS_EXECUTION_TIMEOUT``, ``SESSION_ENDED``...);
the proxy in front answers a refused key (401), an unknown sandbox (404) and
one not running (400) in the same shape with ``source: DAYTONA_PROXY``.
`Toolbox.errors` plays the proxy for every toolbox route: it finds the
sandbox (`BOX` on the request), counts the call as activity and answers
`DaemonError` raised by a handler. The daemon's routes are grouped by what
they serve:

* commands, code and sessions: `emulators.daytona.processes`;
* terminals: `emulators.daytona.terminals`;
* the stateful interpreter and its contexts: `emulators.daytona.interpreter`;
* listing and managing files: `emulators.daytona.files`;
* uploads and downloads: `emulators.daytona.transfers`; the proxy also takes
  ``GET /files/download`` and ``POST /files/upload-v2`` with no key when
  pre-signed (``path``, ``expires``, ``signature``: `_check_signature`).

Here: ``GET /work-dir`` and ``/user-home-dir``, both ``/home/daytona``;
``GET /system/metrics``, a usage sample (`emulators.daytona.sandboxes.metrics`).
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from aiohttp import web

from emulators.daytona.api import bearer
from emulators.daytona.sandboxes import DAYTONA_HOME, Box, iso, metrics

if TYPE_CHECKING:
    from emulators.daytona import DaytonaEmulator

__all__ = ["BOX", "PROXY", "DaemonError", "Toolbox", "daemon_error", "json_body"]

PROXY = "DAYTONA_PROXY"
BOX = web.RequestKey("box", Box)


def daemon_error(
    status: int,
    message: str,
    code: str,
    request: web.Request | None = None,
    headers: dict[str, str] | None = None,
    source: str = "DAYTONA_DAEMON",
) -> web.Response:
    """The daemon's error body (``source`` ``DAYTONA_PROXY`` when the proxy answers)."""
    body = {
        "statusCode": status,
        "message": message,
        "code": code,
        "source": source,
        "path": request.path if request is not None else "",
        "method": request.method if request is not None else "",
        "timestamp": iso(time.time()),
    }
    return web.json_response(body, status=status, headers=headers)


class DaemonError(Exception):
    def __init__(self, status: int, message: str, code: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code


async def json_body(request: web.Request) -> dict[str, Any]:
    """The request's JSON object, else the daemon's 400."""
    try:
        body = await request.json()
    except (ValueError, UnicodeDecodeError):
        raise DaemonError(400, "invalid request body", "INVALID_REQUEST_BODY") from None
    if not isinstance(body, dict):
        raise DaemonError(400, "invalid request body", "INVALID_REQUEST_BODY")
    return body


class Toolbox:
    """The toolbox proxy (`errors`) and the daemon's own small routes, over the emulator's core."""

    def __init__(self, emulator: DaytonaEmulator) -> None:
        self.emulator = emulator
        self.core = emulator.core

    def routes(self) -> list[web.RouteDef]:
        base = "/toolbox/{sandbox}"
        return [
            web.get(base + "/work-dir", self.home_dir),
            web.get(base + "/system/metrics", self.system_metrics),
            web.get(base + "/user-home-dir", self.home_dir),
        ]

    @web.middleware
    async def errors(
        self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        """Authenticate through the proxy, count activity, answer errors in the daemon's shape."""
        if not request.path.startswith("/toolbox/"):
            return await handler(request)
        key = bearer(request)
        signed = _signed_operation(request)
        if signed is not None and not self.core.key_ok(key):
            box = self.core.boxes.get(_sandbox_id(request))
            refused = _check_signature(request, signed, box)
            if refused is not None:
                return daemon_error(401, refused, "UNAUTHORIZED", request, source=PROXY)
        elif not self.core.key_ok(key):
            return daemon_error(401, "Unauthorized", "UNAUTHORIZED", request, source=PROXY)
        else:
            assert key is not None
            box = self.core.find(_sandbox_id(request), key)
        if box is None or box.state == "destroyed":
            return daemon_error(404, "sandbox not found", "NOT_FOUND", request, source=PROXY)
        if box.state != "started":
            message = f"sandbox is not running (state: {box.state})"
            return daemon_error(400, message, "BAD_REQUEST", request, source=PROXY)
        request[BOX] = box
        self.core.touch(box)
        try:
            return await handler(request)
        except DaemonError as exc:
            return daemon_error(exc.status, exc.message, exc.code, request)
        except web.HTTPNotFound:
            tail = "/" + "/".join(request.path.split("/")[3:])
            message = f"route not found: {request.method} {tail}"
            return daemon_error(404, message, "NOT_FOUND", request)

    async def home_dir(self, request: web.Request) -> web.Response:
        """The user's home, which is also the working directory."""
        return web.json_response({"dir": DAYTONA_HOME})

    async def system_metrics(self, request: web.Request) -> web.Response:
        return web.json_response(await asyncio.to_thread(metrics, request[BOX]))


_SIGNED = {("GET", "/files/download"): "GET", ("HEAD", "/files/download"): "GET"}
_SIGNED[("POST", "/files/upload-v2")] = "POST"


def _sandbox_id(request: web.Request) -> str:
    """The sandbox a toolbox request names (``/toolbox/{id}/...``), whether a route matched."""
    return request.match_info.get("sandbox") or request.path.split("/")[2]


def _signed_operation(request: web.Request) -> str | None:
    """The method a pre-signed file URL was signed for, if ``request`` is one."""
    if "signature" not in request.query:
        return None
    tail = "/" + "/".join(request.path.split("/")[3:])
    return _SIGNED.get((request.method, tail))


def _check_signature(request: web.Request, method: str, box: Box | None) -> str | None:
    """Why the proxy refuses a pre-signed file URL (None: it accepts it).

    The signature is ``v1_`` and the unpadded base64url HMAC-SHA256, under the
    sandbox's signing key, of ``v1:files:{method}:{path}:{expires}``; ``expires``
    0 never expires.
    """
    raw_expires, path = request.query.get("expires", ""), request.query.get("path", "")
    if not raw_expires.isdigit():
        return "invalid expires query parameter"
    expires = int(raw_expires)
    if expires and time.time() > expires:
        return "signature is expired"
    signature = request.query["signature"]
    if not signature.startswith("v1_"):
        return "unsupported signature scheme"
    if box is None:
        return "failed to resolve signing key"
    canonical = f"v1:files:{method}:{path}:{expires}".encode()
    digest = hmac.new(box.signing_key.encode(), canonical, hashlib.sha256).digest()
    wanted = "v1_" + base64.urlsafe_b64encode(digest).rstrip(b"=").decode()
    return None if hmac.compare_digest(wanted, signature) else "invalid signature"
