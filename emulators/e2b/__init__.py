"""An E2B emulator: the unmodified ``e2b`` / ``e2b-code-interpreter`` SDKs run against it.

One loopback HTTP server plays all of E2B: the control plane
(`emulators.e2b.control`), envd inside each sandbox (`emulators.e2b.envd`)
and the code interpreter (`emulators.e2b.interpreter`). Their paths do not
overlap, so ``api_url`` and ``sandbox_url`` are the same URL; `sdk_env`
gives the SDK's variables for it (``E2B_DEBUG`` is not used: it would skip
the control plane). Sandboxes are real local sandboxes and expire after
their timeout, as on E2B.

Faults come from the shared harness, per operation: ``create``, ``list``,
``get``, ``kill``, ``timeout``, ``connect`` (control plane), ``exec``
(process service), ``files`` (filesystem service and ``/files``),
``run_code`` and ``health``. A status fault answers the JSON body E2B's API
and proxy use, ``{"code": <status>, "message": ...}``, with ``Retry-After``
when the fault has one.

    with E2BEmulator() as emu:
        sandbox = Sandbox.create(**emu.sdk_kwargs())
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from aiohttp import web

from emulators.e2b.control import ControlPlane, api_error
from emulators.e2b.envd import Envd
from emulators.e2b.interpreter import Interpreter
from emulators.e2b.ports import DOMAIN, PortEdge
from emulators.e2b.sandboxes import E2BCore
from emulators.harness import (
    Emulator,
    FaultSpec,
    free_port,
    http_fault_middleware,
    unknown_route_middleware,
)

__all__ = ["ENVD_VERSION", "TEST_API_KEY", "E2BEmulator"]

ENVD_VERSION = "0.6.4"
TEST_API_KEY = "e2b_" + "0e1f" * 10

_DEFAULT_MESSAGES = {
    401: "Invalid API key, please visit https://e2b.dev/docs/api-key for more information.",
    403: "forbidden",
    404: "not found",
    429: "too many requests, slow down",
    500: "internal server error",
    502: "bad gateway",
    503: "no capacity to place a sandbox right now",
    504: "gateway timeout",
}

_CONTROL_OPS = {
    ("POST", "/v2/sandboxes"): "create",
    ("GET", "/v2/sandboxes"): "list",
}


def _op_for(request: web.Request) -> str | None:
    method, path = request.method, request.path
    if (method, path) in _CONTROL_OPS:
        return _CONTROL_OPS[method, path]
    if path.startswith("/process.Process/"):
        return "exec"
    if path.startswith("/filesystem.Filesystem/") or path == "/files":
        return "files"
    if path == "/execute":
        return "run_code"
    if path == "/health":
        return "health"
    if path.startswith("/v2/sandboxes/") and path.endswith("/connect"):
        return "connect"
    if path.startswith("/sandboxes/"):
        if path.endswith("/timeout"):
            return "timeout"
        return {"GET": "get", "DELETE": "kill"}.get(method)
    return None


def _fault_response(fault: FaultSpec) -> web.StreamResponse:
    status = fault.status or 500
    headers = {"Retry-After": str(round(fault.retry_after))} if fault.retry_after else None
    return api_error(status, fault.message or _DEFAULT_MESSAGES.get(status, "error"), headers)


class E2BEmulator(Emulator):
    """E2B's control plane, envd and code interpreter on one loopback port.

    Args:
        templates: template names a create may use; None accepts any name
            (an unknown one answers 404 when a set is given).
        envd_version: the envd version reported to the SDK (it gates features).
        **kwargs: `emulators.harness.Emulator` arguments (``port``, ``root``...).
    """

    name = "e2b"

    def __init__(
        self,
        *,
        templates: Iterable[str] | None = None,
        envd_version: str = ENVD_VERSION,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.core: E2BCore = E2BCore(self.name, self.core.local.root, isolation=self.core.isolation)
        self.templates = set(templates) if templates is not None else None
        self.envd_version = envd_version
        self.edge_port = free_port()

    def sdk_env(self) -> dict[str, str]:
        return {
            "E2B_API_URL": self.url,
            "E2B_SANDBOX_URL": self.url,
            "E2B_API_KEY": TEST_API_KEY,
        }

    def sdk_kwargs(self, api_key: str = TEST_API_KEY) -> dict[str, Any]:
        """Keyword arguments pointing an SDK call here, SDK retries off."""
        return {"api_key": api_key, "api_url": self.url, "sandbox_url": self.url, "retries": 0}

    def _key_for(self, request: web.Request) -> str | None:
        key = request.headers.get("X-API-KEY")
        if key is not None:
            return key
        sandbox = self.core.e2b.get(request.headers.get("E2b-Sandbox-Id", ""))
        return sandbox.api_key if sandbox is not None else None

    async def serve(self) -> Callable[[], Awaitable[None]]:
        app = web.Application(
            middlewares=[
                unknown_route_middleware(lambda _, status, message: api_error(status, message)),
                http_fault_middleware(self.core, _op_for, self._key_for, _fault_response),
            ],
            client_max_size=256 * 1024 * 1024,
        )
        envd = Envd(self)
        app.add_routes(ControlPlane(self).routes())
        app.add_routes(envd.routes())
        app.add_routes(Interpreter(self, envd).routes())
        runner = web.AppRunner(app, access_log=None, handler_cancellation=True)
        await runner.setup()
        await web.TCPSite(runner, self.host, self.port).start()
        edge = web.AppRunner(PortEdge(self).app(), access_log=None, handler_cancellation=True)
        await edge.setup()
        await web.TCPSite(edge, self.host, self.edge_port).start()

        async def stop() -> None:
            await edge.cleanup()
            await runner.cleanup()

        return stop

    def resolve(self, host: str) -> tuple[str, int] | None:
        """E2B's DNS: every ``{port}-{id}.{DOMAIN}`` name is the port edge."""
        return (self.host, self.edge_port) if host.endswith(f".{DOMAIN}") else None
