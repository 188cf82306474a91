"""Daytona's preview links: a sandbox's ports reached from outside, and the proxy serving them.

Over `emulators.daytona.api.SandboxApi`: ``GET
/api/sandbox/{id}/ports/{port}/preview-url`` gives ``/preview/{id}/{port}``
on the emulator's port and the token a private sandbox's link wants (or an
API key of its organization); ``GET .../ports/{port}/signed-preview-url`` a
``/signed-preview/{token}`` URL that needs nothing until it expires (``POST
.../{token}/expire``). The proxy routes ``/preview/...`` and
``/signed-preview/...`` forward to the port inside the sandbox
(`emulators.ingress.forward`), their errors in the API's shape
(`SandboxApi.errors`).
"""

from __future__ import annotations

import secrets
import time
from typing import TYPE_CHECKING, NamedTuple

from aiohttp import web

from emulators.daytona.api import ApiError, bearer
from emulators.daytona.sandboxes import GONE, Box, org_of
from emulators.ingress import forward

if TYPE_CHECKING:
    from emulators.daytona.api import SandboxApi

__all__ = ["PREVIEW_TOKEN", "Previews", "SignedPreview"]

PREVIEW_TOKEN = "X-Daytona-Preview-Token"
_PREVIEW_CREDENTIALS = frozenset({PREVIEW_TOKEN, "Authorization"})
SIGNED_PREVIEW_SECONDS = 60
MAX_SIGNED_PREVIEW_SECONDS = 24 * 60 * 60


class SignedPreview(NamedTuple):
    """What a signed preview URL opens, and until when (monotonic)."""

    sandbox_id: str
    port: int
    expires: float


class Previews:
    """The preview handlers and the preview proxy, over `SandboxApi`."""

    def __init__(self, api: SandboxApi) -> None:
        self.api = api
        self.core = api.core
        self._preview_tokens: dict[str, str] = {}
        self._signed: dict[str, SignedPreview] = {}

    def routes(self) -> list[web.RouteDef]:
        one = "/api/sandbox/{sandbox}"
        return [
            web.get(one + "/ports/{port}/preview-url", self.preview_url),
            web.get(one + "/ports/{port}/signed-preview-url", self.signed_preview_url),
            web.post(
                one + "/ports/{port}/signed-preview-url/{token}/expire", self.expire_signed_preview
            ),
            web.route("*", "/preview/{sandbox}/{port}{tail:(/.*)?}", self.preview),
            web.route("*", "/signed-preview/{token}{tail:(/.*)?}", self.signed_preview),
        ]

    async def preview_url(self, request: web.Request) -> web.Response:
        """A port's preview link and the token a private sandbox's link wants.

        Daytona's links are ``https://{port}-{id}.proxy.daytona.works``; the
        emulator's proxy is a path of its own server.
        """
        box = self.api.box_of(request)
        port = _port(request.match_info["port"])
        token = self._preview_tokens.setdefault(box.id, secrets.token_urlsafe(24))
        url = f"{self.api.emulator.url}/preview/{box.id}/{port}"
        return web.json_response({"sandboxId": box.id, "url": url, "token": token})

    async def preview(self, request: web.Request) -> web.StreamResponse:
        """The preview proxy: a private sandbox's link wants its token (``X-Daytona-Preview-Token``)
        or an API key of its organization (``Authorization: Bearer``); then the request is
        forwarded to the port inside the sandbox."""
        box = self._previewed(request.match_info["sandbox"])
        token = self._preview_tokens.get(box.id)
        key = bearer(request)
        authorized = (token is not None and request.headers.get(PREVIEW_TOKEN) == token) or (
            key is not None and self.core.key_ok(key) and org_of(key) == box.organization_id
        )
        if not box.public and not authorized:
            raise ApiError(401, "Unauthorized: send the preview token")
        by_key = key is not None and self.core.key_ok(key)
        drop = _PREVIEW_CREDENTIALS if by_key else frozenset({PREVIEW_TOKEN})
        return await self._forward(request, _port(request.match_info["port"]), drop)

    async def signed_preview_url(self, request: web.Request) -> web.Response:
        """A URL holding its own token, valid ``expiresInSeconds`` (default 60, at most a day)."""
        box = self.api.box_of(request)
        port = _port(request.match_info["port"])
        raw = request.query.get("expiresInSeconds", str(SIGNED_PREVIEW_SECONDS))
        if not raw.isdigit() or not 1 <= int(raw) <= MAX_SIGNED_PREVIEW_SECONDS:
            raise ApiError(
                400, f"expiresInSeconds must be between 1 and {MAX_SIGNED_PREVIEW_SECONDS}"
            )
        token = secrets.token_urlsafe(18)
        self._signed[token] = SignedPreview(box.id, port, time.monotonic() + int(raw))
        url = f"{self.api.emulator.url}/signed-preview/{token}"
        return web.json_response({"sandboxId": box.id, "port": port, "token": token, "url": url})

    async def expire_signed_preview(self, request: web.Request) -> web.Response:
        box = self.api.box_of(request)
        port = _port(request.match_info["port"])
        signed = self._signed.get(request.match_info["token"])
        if signed is None or (signed.sandbox_id, signed.port) != (box.id, port):
            raise ApiError(404, "Signed preview URL not found")
        del self._signed[request.match_info["token"]]
        return web.Response(status=200)

    async def signed_preview(self, request: web.Request) -> web.StreamResponse:
        signed = self._signed.get(request.match_info["token"])
        if signed is None or signed.expires <= time.monotonic():
            self._signed.pop(request.match_info["token"], None)
            raise ApiError(401, "Unauthorized: the signed preview URL expired")
        self._previewed(signed.sandbox_id)
        return await self._forward(request, signed.port, frozenset())

    def _previewed(self, sandbox_id: str) -> Box:
        box = self.core.boxes.get(sandbox_id)
        if box is None or box.state in GONE:
            raise ApiError(404, "sandbox not found")
        if box.state != "started":
            raise ApiError(502, f"sandbox is not running (state: {box.state})")
        return box

    @staticmethod
    async def _forward(request: web.Request, port: int, drop: frozenset[str]) -> web.StreamResponse:
        """To the port in the sandbox, the proxy's own credentials (``drop``) kept back."""
        return await forward(request, port, request.match_info["tail"] or "/", drop=drop)


def _port(raw: str) -> int:
    if not raw.isdigit() or not 1 <= int(raw) <= 65535:
        raise ApiError(400, f"port must be between 1 and 65535, got {raw!r}")
    return int(raw)
