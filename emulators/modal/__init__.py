"""A Modal emulator: the unmodified ``modal`` SDK runs against it over gRPC.

One loopback grpclib server (plaintext HTTP/2, which the SDK accepts for a
loopback ``MODAL_SERVER_URL``) plays both of Modal's services on the
``modal_proto`` server bases: the control plane (`emulators.modal.control`:
apps, images, secrets, auth tokens, V1 and V2 sandboxes) and the task
command router (`emulators.modal.command_router`: exec, stdio, stdin, and
through it ``Sandbox.filesystem``, whose ``modal-sandbox-fs-tools`` is
`emulators.modal.fs_tools`, and filesystem snapshots). RPCs outside those
flows answer UNIMPLEMENTED and are logged and counted by name
(`ModalEmulator.unimplemented`). Sandboxes are real local sandboxes
(`emulators.modal.sandboxes`) that end after their ``timeout`` or
``idle_timeout``, as on Modal. The tunnels of the ports a create declares
are served by an edge on a port of its own (`emulators.modal.tunnels`);
`ModalEmulator.resolve` says where their host names point. A filesystem
snapshot is an image a create can start from, until ``ImageDelete`` or its
TTL. Volumes (`emulators.modal.volumes`) are host directories a create's
``volumes`` mount in its sandbox and the SDK's volume file API reads and
writes; large uploads go through blob storage, an HTTP listener on a port
of its own (`emulators.modal.volumes.BlobStore`, its URLs presigned).

Faults come from the shared harness, per operation: ``hello``, ``lookup``
(AppGetOrCreate), ``environment``, ``image`` (image build and its wait),
``secret``, ``auth`` (AuthTokenGet), ``create`` (SandboxCreate and V2),
``get`` (wait / poll / task id / tags), ``list``, ``kill`` (terminate),
``connect`` (command router access), ``exec`` and ``files`` (execs of
fs-tools), ``port`` (tunnels), ``snapshot`` (filesystem snapshots and
``ImageDelete``), ``volume`` (volume RPCs and blob storage); ``image``
covers ``ImageFromId`` too. A status fault
answers the gRPC status Modal would (`emulators.modal.rpc.fault_error`: 429
is RESOURCE_EXHAUSTED, with an ``RPCRetryPolicy`` detail when the fault has
a ``retry_after``).

    with ModalEmulator() as emu:
        os.environ.update(emu.sdk_env())
        client = modal.Client.from_credentials(TEST_TOKEN_ID, TEST_TOKEN_SECRET)
"""

from __future__ import annotations

import os
import tempfile
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any

from aiohttp import web
from grpclib.server import Server

from emulators.harness import Emulator, free_port
from emulators.modal.command_router import CommandRouter
from emulators.modal.control import ControlPlane
from emulators.modal.images import Images, Mounts
from emulators.modal.rpc import DetailsCodec
from emulators.modal.sandboxes import ModalCore, new_id
from emulators.modal.tunnels import DOMAIN, TunnelEdge
from emulators.modal.volumes import BlobStore, Volumes

__all__ = ["TEST_TOKEN_ID", "TEST_TOKEN_SECRET", "ModalEmulator"]

TEST_TOKEN_ID = "ak-" + "5eNdb0xR0uTeR" + "0" * 9
TEST_TOKEN_SECRET = "as-" + "t35T53cR3t" + "0" * 12


class ModalEmulator(Emulator):
    """Modal's control plane and task command router on one loopback port.

    Args:
        tokens: the accepted token id -> secret pairs, one per workspace
            (default: the test token only).
        secrets: named Modal Secrets (name -> environment variables) that
            ``modal.Secret.from_name`` finds.
        images: registry tags an image build may pull; None pulls any.
        image_build_seconds: how long the first build of an image takes.
        list_page_size: sandboxes per ``SandboxList`` page.
        **kwargs: `emulators.harness.Emulator` arguments (``port``, ``root``...).
    """

    name = "modal"

    def __init__(
        self,
        *,
        tokens: Mapping[str, str] | None = None,
        secrets: Mapping[str, Mapping[str, str]] | None = None,
        images: Iterable[str] | None = None,
        image_build_seconds: float = 0.0,
        list_page_size: int = 100,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.core: ModalCore = ModalCore(
            self.name, self.core.local.root, isolation=self.core.isolation
        )
        self.tokens = dict(tokens) if tokens is not None else {TEST_TOKEN_ID: TEST_TOKEN_SECRET}
        for name, env in (secrets or {}).items():
            secret_id = new_id("st")
            self.core.secrets[secret_id] = dict(env)
            self.core.named_secrets[name] = secret_id
        self.images = Images(set(images) if images is not None else None, image_build_seconds)
        self.mounts = Mounts()
        root = self.core.local.root
        self.volumes = Volumes(root / ".modal-volumes")  # dot names: never a sandbox's
        self.blobs = BlobStore(root / ".modal-blobs", self.core.tokens)
        self.blob_port = free_port()
        self.list_page_size = list_page_size
        self.unimplemented: Counter[str] = Counter()
        self.tunnel_port = free_port()
        fd, self._config_path = tempfile.mkstemp(prefix="modal-emulator-", suffix=".toml")
        os.close(fd)

    def sdk_env(self) -> dict[str, str]:
        """The SDK's variables for this emulator; ``MODAL_CONFIG_PATH`` is an empty file."""
        return {
            "MODAL_SERVER_URL": self.url,
            "MODAL_TOKEN_ID": TEST_TOKEN_ID,
            "MODAL_TOKEN_SECRET": TEST_TOKEN_SECRET,
            "MODAL_CONFIG_PATH": self._config_path,
        }

    async def serve(self) -> Callable[[], Awaitable[None]]:
        server = Server(
            # fill_unimplemented answers every RPC the bases leave abstract; mypy cannot see it.
            [ControlPlane(self), CommandRouter(self)],  # type: ignore[abstract]
            status_details_codec=DetailsCodec(),
        )
        await server.start(self.host, self.port)
        edge = web.AppRunner(
            TunnelEdge(self.core).app(), access_log=None, handler_cancellation=True
        )
        await edge.setup()
        await web.TCPSite(edge, self.host, self.tunnel_port).start()
        blobs = web.AppRunner(self.blobs.app(), access_log=None)
        await blobs.setup()
        await web.TCPSite(blobs, self.host, self.blob_port).start()
        self.blobs.base = f"http://{self.host}:{self.blob_port}"

        async def stop() -> None:
            await blobs.cleanup()
            await edge.cleanup()
            server.close()
            await server.wait_closed()

        return stop

    def resolve(self, host: str) -> tuple[str, int] | None:
        """Modal's DNS: every tunnel host name is the tunnel edge."""
        name = host.rsplit(":", 1)[0].lower()
        return (self.host, self.tunnel_port) if name.endswith(f".{DOMAIN}") else None

    def stop(self) -> None:
        super().stop()
        if os.path.exists(self._config_path):
            os.unlink(self._config_path)
