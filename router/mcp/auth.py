"""Who may use the MCP server over HTTP: bearer tokens, each naming a tenant.

Tokens come from the config's ``mcp.tokens`` and from the environment
variable ``SANDBOX_ROUTER_MCP_TOKENS`` (``tenant=token`` entries separated by
commas or whitespace). A presented token is hashed and its digest compared,
with `hmac.compare_digest`, against every tenant's, all of them every time:
neither whether a token matched nor which one shows in the time taken.

`BearerGate` answers 401 to a request without a known token, before the SDK
sees it, and otherwise sets the SDK's authenticated user (`AccessToken`) to
the tenant: the SDK then binds each MCP session to the tenant that opened it
(another tenant's request for it is answered 404), and the tools read the
tenant from `mcp.server.auth.middleware.auth_context.get_access_token`.
The token itself is kept nowhere but in the digests: the `AccessToken`'s
token field holds the tenant's name, so no repr or log line can show it.
With no tenant configured every request is the tenant ``local``, and the
server listens on loopback only (`is_loopback`).
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import json
import re
from collections.abc import Mapping

from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser
from mcp.server.auth.provider import AccessToken
from pydantic import SecretStr
from starlette.types import ASGIApp, Receive, Scope, Send

from providers.errors import ConfigError
from router.config import MIN_TOKEN_LENGTH, McpSettings

__all__ = ["ENV", "LOCAL_TENANT", "TOKEN_SCOPE", "BearerGate", "Tenants", "is_loopback"]

ENV = "SANDBOX_ROUTER_MCP_TOKENS"
LOCAL_TENANT = "local"  # the stdio client, and every HTTP client when no token is configured
TOKEN_SCOPE = "tenant"  # on a request a bearer token named its tenant (`Owner.counted`)
_TENANT = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,62}")


class Tenants:
    """The configured tenants, each known by the SHA-256 digest of its token."""

    def __init__(self, tokens: Mapping[str, SecretStr]) -> None:
        self._digests: list[tuple[bytes, str]] = []
        seen: dict[bytes, str] = {}
        for tenant, token in tokens.items():
            digest = _digest(token.get_secret_value())
            if digest in seen:
                raise ConfigError(
                    f"mcp tokens: tenants {seen[digest]!r} and {tenant!r} have the same token; "
                    "a token must name one tenant"
                )
            seen[digest] = tenant
            self._digests.append((digest, tenant))

    @classmethod
    def load(cls, settings: McpSettings, env: Mapping[str, str]) -> Tenants:
        """The config's ``mcp.tokens`` and ``SANDBOX_ROUTER_MCP_TOKENS``'s, together."""
        from_env = parse_env(env.get(ENV, ""))
        if both := sorted(set(from_env) & set(settings.tokens)):
            raise ConfigError(
                f"{ENV}: tenant(s) {', '.join(both)} also have a token in the config's mcp.tokens"
            )
        return cls({**settings.tokens, **from_env})

    @property
    def names(self) -> list[str]:
        return sorted(tenant for _, tenant in self._digests)

    def tenant(self, token: str) -> str | None:
        """The tenant ``token`` names, or None; compared in constant time with every tenant's."""
        presented = _digest(token)
        found = None
        for digest, tenant in self._digests:
            if hmac.compare_digest(presented, digest):
                found = tenant
        return found

    def __bool__(self) -> bool:
        return bool(self._digests)

    def __repr__(self) -> str:
        return f"<Tenants {self.names}>"


def parse_env(value: str) -> dict[str, SecretStr]:
    """``SANDBOX_ROUTER_MCP_TOKENS``: ``tenant=token`` entries; no error shows a token."""
    tokens: dict[str, SecretStr] = {}
    for number, item in enumerate(re.split(r"[\s,]+", value.strip()) if value.strip() else [], 1):
        tenant, sep, token = item.partition("=")
        if not sep or not _TENANT.fullmatch(tenant):
            raise ConfigError(
                f"{ENV}: entry {number} is not tenant=token (a tenant is letters, digits, "
                "'_', '.' and '-', starting with a letter or digit)"
            )
        if len(token) < MIN_TOKEN_LENGTH:
            raise ConfigError(
                f"{ENV}: the token of tenant {tenant!r} is shorter than {MIN_TOKEN_LENGTH} "
                "characters: too short for a bearer secret"
            )
        if tenant in tokens:
            raise ConfigError(f"{ENV}: tenant {tenant!r} is given twice")
        tokens[tenant] = SecretStr(token)
    return tokens


def is_loopback(host: str) -> bool:
    """Whether ``host`` (a listen address) is reachable from this machine only."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode("utf-8", "surrogateescape")).digest()


class BearerGate:
    """ASGI middleware: a request's tenant from its bearer token, or a 401 without one."""

    def __init__(self, app: ASGIApp, tenants: Tenants) -> None:
        self._app = app
        self._tenants = tenants

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":  # lifespan: the SDK's session manager starts and stops
            await self._app(scope, receive, send)
            return
        tenant = LOCAL_TENANT
        if self._tenants:
            token = _bearer(scope)
            found = self._tenants.tenant(token) if token is not None else None
            if found is None:
                await _refuse(send, presented=token is not None)
                return
            tenant = found
        scopes = [TOKEN_SCOPE] if self._tenants else []  # a token's tenant: its leases count
        scope["user"] = AuthenticatedUser(
            AccessToken(token=f"tenant:{tenant}", client_id=tenant, scopes=scopes)
        )
        await self._app(scope, receive, send)


def _bearer(scope: Scope) -> str | None:
    for name, value in scope["headers"]:
        if name == b"authorization":
            scheme, _, token = value.decode("latin-1").partition(" ")
            return token.strip() if scheme.lower() == "bearer" and token.strip() else None
    return None


async def _refuse(send: Send, *, presented: bool) -> None:
    """401, the same for a missing and a wrong token (RFC 6750's challenge)."""
    body = json.dumps(
        {"error": "invalid_token", "error_description": "a valid bearer token is required"}
    ).encode()
    challenge = 'Bearer realm="sandbox-router"' + (', error="invalid_token"' if presented else "")
    await send(
        {
            "type": "http.response.start",
            "status": 401,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                (b"www-authenticate", challenge.encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})
