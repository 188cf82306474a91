"""Modal's control plane (``modal.client.ModalClient``): apps, images, secrets, sandboxes.

The RPCs the SDK calls for ``Client.hello``, ``App.lookup``, images and their local files
(`emulators.modal.images`), ``Sandbox.create`` (V2, and V1
for GPU sandboxes), ``from_id``, ``list``, ``get_tags`` / ``set_tags``, ``poll`` / ``wait``,
``tunnels``, ``terminate``, a V1 sandbox's entrypoint stdio (``SandboxGetLogs``,
``SandboxStdinWrite``; a V2 one's is the command router's), ``Image.from_id`` and
``modal.experimental.image_delete``, volumes and blobs (`emulators.modal.volumes`)
(and ``SandboxSnapshotFs``, the V1 snapshot the SDK takes with
``MODAL_USE_LEGACY_FILESYSTEM_SNAPSHOT=1``; otherwise it snapshots through the
command router); every other RPC answers UNIMPLEMENTED.

A create's ``encrypted_ports`` each get a tunnel (`emulators.modal.tunnels`),
in the V2 create's answer and in ``SandboxGetTunnels`` / ``SandboxGetTunnelsV2``;
a port not declared has none. ``unencrypted_ports`` also get a raw TCP tunnel
(``Tunnel.tcp_socket``: a listener on the emulator's host); HTTP/2 ports
answer UNIMPLEMENTED. A create's ``name`` is unique among its app's running
sandboxes (ALREADY_EXISTS) and ``Sandbox.from_name`` finds it. A create
whose image is a filesystem snapshot
(`emulators.modal.sandboxes.KeptImage`) starts from a copy of its files;
``ImageDelete`` deletes a snapshot or a built registry image, NOT_FOUND for
an id the workspace does not have. A create's ``volume_mounts`` mount its
volumes' directories in the sandbox.

Every request carries ``x-modal-token-id`` / ``x-modal-token-secret``: an
unknown pair is UNAUTHENTICATED. A token stands for a workspace: it sees
only its own apps and sandboxes (NOT_FOUND otherwise). The V2 sandbox RPCs
also need the ``x-modal-auth-token`` JWT that ``AuthTokenGet`` hands out.
Account limits come from the harness: a spent concurrency cap or creation
quota answers RESOURCE_EXHAUSTED with a message in Modal's style.
"""

from __future__ import annotations

import asyncio
import codecs
import contextlib
import posixpath
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from google.protobuf import empty_pb2  # type: ignore[import-untyped]
from grpclib import GRPCError, Status
from grpclib.server import Stream
from modal_proto import api_grpc, api_pb2

from emulators.filesystem import PathRefused
from emulators.harness import QuotaViolation
from emulators.modal.images import Copy
from emulators.modal.rpc import apply_fault, fill_unimplemented, metadata_value
from emulators.modal.sandboxes import MODAL_HOME, Container, ModalSandbox, new_id
from emulators.modal.tunnels import tunnel_host
from emulators.modal.volumes import VolumeRpcs
from providers.base import SandboxSpec

if TYPE_CHECKING:
    from emulators.modal import ModalEmulator

__all__ = ["CONCURRENCY_MESSAGE", "QUOTA_MESSAGE", "ControlPlane"]

CONCURRENCY_MESSAGE = (
    "Sandbox limit reached: this workspace already has {limit} concurrently running sandboxes. "
    "Terminate some, or contact Modal support to raise the limit."
)
QUOTA_MESSAGE = (
    "Workspace billing limit reached: sandbox creation is blocked until the billing cycle "
    "resets ({limit} sandboxes created)."
)
IMAGE_BUILDER_VERSION = "2025.06"
_AUTH_TOKEN_TTL = 20 * 60
_ROUTER_TOKEN_TTL = 10 * 60
_CONNECT_TOKEN_TTL = 24 * 3600
_MAX_WAIT = 55.0
_SUCCESS = api_pb2.GenericResult(status=api_pb2.GenericResult.GENERIC_STATUS_SUCCESS)
_Req = Stream[Any, Any]


@fill_unimplemented
class ControlPlane(VolumeRpcs, api_grpc.ModalClientBase):
    """The control-plane RPCs, over the emulator's core."""

    def __init__(self, emulator: ModalEmulator) -> None:
        self.emu = emulator
        self.core = emulator.core
        self.unimplemented = emulator.unimplemented

    # -- shared checks --------------------------------------------------------
    async def _enter(self, stream: _Req, op: str | None, *, v2: bool = False) -> tuple[str, Any]:
        """Authenticate, play the op's fault, read the request; (workspace, request)."""
        token_id = metadata_value(stream, "x-modal-token-id")
        secret = metadata_value(stream, "x-modal-token-secret")
        if not token_id or self.emu.tokens.get(token_id) != secret:
            raise GRPCError(
                Status.UNAUTHENTICATED,
                "Token ID or secret is invalid. Please run `modal token new` to get a new token.",
            )
        if op is not None:
            await apply_fault(self.core.faults, stream, op, token_id)
        if v2:
            claims = self.core.tokens.claims(metadata_value(stream, "x-modal-auth-token") or "")
            if claims is None or claims.get("sub") != token_id:
                raise GRPCError(Status.UNAUTHENTICATED, "Missing or invalid auth token")
        request = await stream.recv_message()
        assert request is not None
        return token_id, request

    def _sandbox(self, workspace: str, sandbox_id: str) -> ModalSandbox:
        sandbox = self.core.modal.get(sandbox_id)
        if sandbox is None or sandbox.owner != workspace:
            raise GRPCError(Status.NOT_FOUND, f"Sandbox with id '{sandbox_id}' not found")
        return sandbox

    # -- apps, environments, images, secrets, tokens ------------------------------
    async def ClientHello(self, stream: _Req) -> None:
        await self._enter(stream, "hello")
        await stream.send_message(
            api_pb2.ClientHelloResponse(image_builder_version=IMAGE_BUILDER_VERSION)
        )

    async def AppGetOrCreate(self, stream: _Req) -> None:
        workspace, request = await self._enter(stream, "lookup")
        environment = request.environment_name or "main"
        key = (workspace, f"{environment}/{request.app_name}")
        if key not in self.core.apps:
            if request.object_creation_type != api_pb2.OBJECT_CREATION_TYPE_CREATE_IF_MISSING:
                raise GRPCError(
                    Status.NOT_FOUND,
                    f"App '{request.app_name}' not found in environment '{environment}'",
                )
            self.core.apps[key] = new_id("ap")
        await stream.send_message(api_pb2.AppGetOrCreateResponse(app_id=self.core.apps[key]))

    async def EnvironmentGetOrCreate(self, stream: _Req) -> None:
        _, request = await self._enter(stream, "environment")
        name = request.deployment_name or "main"
        settings = api_pb2.EnvironmentSettings(image_builder_version=IMAGE_BUILDER_VERSION)
        await stream.send_message(
            api_pb2.EnvironmentGetOrCreateResponse(
                environment_id="en-" + name,
                metadata=api_pb2.EnvironmentMetadata(name=name, settings=settings),
            )
        )

    async def ImageGetOrCreate(self, stream: _Req) -> None:
        _, request = await self._enter(stream, "image")
        image_id, result = self.emu.images.get_or_create(request.image)
        await stream.send_message(api_pb2.ImageGetOrCreateResponse(image_id=image_id, **result))

    async def ImageJoinStreaming(self, stream: _Req) -> None:
        _, request = await self._enter(stream, "image")
        result = await self.emu.images.join(request.image_id, min(request.timeout or 55, 55))
        await stream.send_message(api_pb2.ImageJoinStreamingResponse(**result))

    async def ImageFromId(self, stream: _Req) -> None:
        workspace, request = await self._enter(stream, "image")
        known = self.core.image(request.image_id, workspace) is not None
        if not (known or self.emu.images.built(request.image_id)):
            raise GRPCError(Status.NOT_FOUND, f"Image '{request.image_id}' not found")
        await stream.send_message(
            api_pb2.ImageFromIdResponse(
                image_id=request.image_id, metadata=api_pb2.ImageMetadata(workdir="/")
            )
        )

    async def ImageDelete(self, stream: _Req) -> None:
        workspace, request = await self._enter(stream, "snapshot")
        deleted = await self.core.delete_image(request.image_id, workspace)
        if not (deleted or self.emu.images.forget(request.image_id)):
            raise GRPCError(Status.NOT_FOUND, f"Image '{request.image_id}' not found")
        await stream.send_message(empty_pb2.Empty())

    async def MountBatchedCheckExistence(self, stream: _Req) -> None:
        _, request = await self._enter(stream, "image")
        missing = self.emu.mounts.missing(request.sha256_hex_hashes)
        await stream.send_message(
            api_pb2.MountBatchedCheckExistenceResponse(missing_sha256_hex_hashes=missing)
        )

    async def MountPutFile(self, stream: _Req) -> None:
        """Contents by SHA-256: inline, from a blob, or (neither) whether they are known."""
        _, request = await self._enter(stream, "image")
        if request.HasField("data_blob_id"):
            blob = self.emu.blobs.blob(request.data_blob_id)
            if not blob.exists():
                raise GRPCError(Status.NOT_FOUND, f"Blob '{request.data_blob_id}' not found")
            self.emu.mounts.put(request.sha256_hex, await asyncio.to_thread(blob.read_bytes))
        elif request.HasField("data"):
            self.emu.mounts.put(request.sha256_hex, request.data)
        exists = not self.emu.mounts.missing([request.sha256_hex])
        await stream.send_message(api_pb2.MountPutFileResponse(exists=exists))

    async def MountGetOrCreate(self, stream: _Req) -> None:
        _, request = await self._enter(stream, "image")
        mount_id = self.emu.mounts.create(request.files)
        await stream.send_message(api_pb2.MountGetOrCreateResponse(mount_id=mount_id))

    async def SecretGetOrCreate(self, stream: _Req) -> None:
        _, request = await self._enter(stream, "secret")
        if request.deployment_name and not request.env_dict:
            secret_id = self.core.named_secrets.get(request.deployment_name)
            if secret_id is None:
                raise GRPCError(
                    Status.NOT_FOUND,
                    f"Secret '{request.deployment_name}' not found in environment 'main'",
                )
            missing = set(request.required_keys) - set(self.core.secrets[secret_id])
            if missing:
                raise GRPCError(
                    Status.NOT_FOUND, f"Secret is missing key(s): {', '.join(sorted(missing))}"
                )
        else:
            secret_id = new_id("st")
            self.core.secrets[secret_id] = dict(request.env_dict)
        await stream.send_message(api_pb2.SecretGetOrCreateResponse(secret_id=secret_id))

    async def AuthTokenGet(self, stream: _Req) -> None:
        workspace, _ = await self._enter(stream, "auth")
        token = self.core.tokens.mint(_AUTH_TOKEN_TTL, sub=workspace)
        await stream.send_message(api_pb2.AuthTokenGetResponse(token=token))

    # -- sandboxes ------------------------------------------------------------
    async def SandboxCreateV2(self, stream: _Req) -> None:
        workspace, request = await self._enter(stream, "create", v2=True)
        env = self._env(request.definition.secret_ids, request.secret_sources)
        sandbox = await self._create(workspace, request, env, v2=True)
        await stream.send_message(
            api_pb2.SandboxCreateV2Response(
                sandbox_id=sandbox.id,
                task_id=sandbox.task_id,
                metadata=sandbox.metadata(),
                command_router_access=self._router_access(sandbox),
                tunnels=sandbox.tunnel_data(),
            )
        )

    async def SandboxCreate(self, stream: _Req) -> None:
        workspace, request = await self._enter(stream, "create")
        env = self._env(request.definition.secret_ids, ())
        sandbox = await self._create(workspace, request, env, v2=False)
        await stream.send_message(
            api_pb2.SandboxCreateResponse(sandbox_id=sandbox.id, metadata=sandbox.metadata())
        )

    def _env(self, secret_ids: Any, sources: Any) -> dict[str, str]:
        env: dict[str, str] = {}
        for secret_id in secret_ids:
            env.update(self._secret(secret_id))
        for source in sources:
            if source.HasField("env"):
                env.update(source.env.contents)
            else:
                env.update(self._secret(source.secret_id))
        return env

    def _secret(self, secret_id: str) -> dict[str, str]:
        try:
            return self.core.secrets[secret_id]
        except KeyError:
            raise GRPCError(Status.NOT_FOUND, f"Secret '{secret_id}' not found") from None

    async def _create(
        self, workspace: str, request: Any, env: dict[str, str], *, v2: bool
    ) -> ModalSandbox:
        definition: api_pb2.Sandbox = request.definition
        if (workspace, request.app_id) not in {(k[0], v) for k, v in self.core.apps.items()}:
            raise GRPCError(Status.NOT_FOUND, f"App '{request.app_id}' not found")
        kept = self.core.image(definition.image_id, workspace)
        built = self.emu.images.record(definition.image_id)
        if kept is None and built is None:
            raise GRPCError(Status.NOT_FOUND, f"Image '{definition.image_id}' not found")
        if kept is not None and kept.directory is not None:
            raise GRPCError(
                Status.INVALID_ARGUMENT, "a directory snapshot is mounted (mount_image), not run"
            )
        copies = list(built.copies) if built is not None else []
        copies += [Copy(mount_id, (".",), "/") for mount_id in definition.mount_ids]
        files = [
            placed for copy in copies for placed in copy.place(self.emu.mounts.files(copy.mount_id))
        ]
        image_workdir = built.workdir if built is not None else None
        workdir = definition.workdir or image_workdir
        if definition.workdir and not definition.workdir.startswith("/"):
            raise GRPCError(Status.INVALID_ARGUMENT, "workdir must be an absolute path")
        ports, unencrypted = _ports(definition.open_ports.ports)
        mounts, read_only = self.emu.volumes.mounts(workspace, definition.volume_mounts)
        named = self._named(workspace, request.app_id, definition.name)
        if definition.name and any(s.running for s in named):
            raise GRPCError(
                Status.ALREADY_EXISTS,
                f"Sandbox with name '{definition.name}' already exists in this app",
            )
        tags = {tag.tag_name: tag.tag_value for tag in request.tags}
        sandbox_id = new_id("sb", 22 if not v2 else 26)
        template = kept.copy if kept is not None else None
        image_env = dict(built.env) if built is not None else {}
        image_path = image_env.pop("PATH", None)
        try:
            local = await self.core.create(
                workspace,
                SandboxSpec(template=template, env={**image_env, **env}, labels=tags),
                home=MODAL_HOME,
                dirs=((workdir,) if workdir else ()) + tuple(_parents(files)),
                lifetime=definition.timeout_secs or 300,
                sandbox_id=sandbox_id,
                mounts=mounts,
            )
        except QuotaViolation as exc:
            template = CONCURRENCY_MESSAGE if exc.kind == "concurrent" else QUOTA_MESSAGE
            raise GRPCError(Status.RESOURCE_EXHAUSTED, template.format(limit=exc.limit)) from None
        container = self.core.sandboxes[sandbox_id] = Container(local, image_path, read_only)
        try:
            _write_files(container, files)
        except (PathRefused, OSError) as exc:
            await self.core.kill(sandbox_id)
            raise GRPCError(Status.INVALID_ARGUMENT, f"cannot put an image file: {exc}") from None
        sandbox = ModalSandbox(
            id=sandbox_id,
            task_id=new_id("ta", suffix="V" if v2 else "1"),
            v2=v2,
            app_id=request.app_id,
            owner=workspace,
            tags=tags,
            definition=definition,
            local=container,
            tunnels={port: tunnel_host() for port in ports},
            image_workdir=image_workdir,
        )
        self.core.add(sandbox)
        for port in unencrypted:
            await sandbox.open_tcp_tunnel(port, self.emu.host)
        if definition.entrypoint_args:
            await self.core.start_entrypoint(sandbox)
        return sandbox

    def _named(self, workspace: str, app_id: str, name: str) -> list[ModalSandbox]:
        """The app's sandboxes named ``name``, running ones first, then the latest."""
        return sorted(
            (
                s
                for s in self.core.modal.values()
                if s.owner == workspace and s.app_id == app_id and s.definition.name == name
            ),
            key=lambda s: (s.running, s.created_at),
            reverse=True,
        )

    async def SandboxGetFromNameV2(self, stream: _Req) -> None:
        await self._from_name(stream, v2=True)

    async def SandboxGetFromName(self, stream: _Req) -> None:
        await self._from_name(stream, v2=False)

    async def _from_name(self, stream: _Req, *, v2: bool) -> None:
        """The app's running sandbox of that name (of either version: the SDK asks V1 first),
        or with ``include_terminated`` the latest one."""
        workspace, request = await self._enter(stream, "get", v2=v2)
        environment = request.environment_name or "main"
        app_id = self.core.apps.get((workspace, f"{environment}/{request.app_name}"), "")
        named = self._named(workspace, app_id, request.sandbox_name)
        if not named or not (named[0].running or request.include_terminated):
            raise GRPCError(
                Status.NOT_FOUND,
                f"Sandbox with name '{request.sandbox_name}' not found in app '{request.app_name}'",
            )
        await stream.send_message(
            api_pb2.SandboxGetFromNameResponse(sandbox_id=named[0].id, metadata=named[0].metadata())
        )

    def _router_access(self, sandbox: ModalSandbox) -> api_pb2.CommandRouterAccess:
        jwt = self.core.tokens.mint(_ROUTER_TOKEN_TTL, task_id=sandbox.task_id)
        return api_pb2.CommandRouterAccess(url=self.emu.url, jwt=jwt)

    async def SandboxWaitV2(self, stream: _Req) -> None:
        await self._wait(stream, v2=True)

    async def SandboxWait(self, stream: _Req) -> None:
        await self._wait(stream, v2=False)

    async def _wait(self, stream: _Req, *, v2: bool) -> None:
        workspace, request = await self._enter(stream, "get", v2=v2)
        sandbox = self._sandbox(workspace, request.sandbox_id)
        if sandbox.running and request.timeout > 0:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(sandbox.ended.wait(), min(request.timeout, _MAX_WAIT))
        response = api_pb2.SandboxWaitResponse(metadata=sandbox.metadata())
        if sandbox.result is not None:
            response.result.CopyFrom(sandbox.result)
        await stream.send_message(response)

    async def SandboxGetTaskIdV2(self, stream: _Req) -> None:
        await self._task_id(stream, v2=True)

    async def SandboxGetTaskId(self, stream: _Req) -> None:
        await self._task_id(stream, v2=False)

    async def _task_id(self, stream: _Req, *, v2: bool) -> None:
        workspace, request = await self._enter(stream, "get", v2=v2)
        sandbox = self._sandbox(workspace, request.sandbox_id)
        response = api_pb2.SandboxGetTaskIdResponse(task_id=sandbox.task_id)
        if sandbox.result is not None:
            response.task_result.CopyFrom(sandbox.result)
        await stream.send_message(response)

    async def SandboxGetCommandRouterAccess(self, stream: _Req) -> None:
        workspace, request = await self._enter(stream, "connect", v2=True)
        if request.sandbox_id:
            sandbox = self._sandbox(workspace, request.sandbox_id)
        else:
            sandbox = self._task(workspace, request.task_id)
        access = self._live_access(sandbox)
        await stream.send_message(
            api_pb2.SandboxGetCommandRouterAccessResponse(url=access.url, jwt=access.jwt)
        )

    async def TaskGetCommandRouterAccess(self, stream: _Req) -> None:
        workspace, request = await self._enter(stream, "connect")
        access = self._live_access(self._task(workspace, request.task_id))
        await stream.send_message(
            api_pb2.TaskGetCommandRouterAccessResponse(url=access.url, jwt=access.jwt)
        )

    def _task(self, workspace: str, task_id: str) -> ModalSandbox:
        sandbox = self.core.tasks.get(task_id)
        if sandbox is None or sandbox.owner != workspace:
            raise GRPCError(Status.NOT_FOUND, f"Task '{task_id}' not found")
        return sandbox

    def _live_access(self, sandbox: ModalSandbox) -> api_pb2.CommandRouterAccess:
        """Access to a task's router, an ended one's too: it still serves the entrypoint's
        output (its other RPCs answer NOT_FOUND)."""
        return self._router_access(sandbox)

    async def SandboxListV2(self, stream: _Req) -> None:
        await self._list(stream, v2=True)

    async def SandboxList(self, stream: _Req) -> None:
        await self._list(stream, v2=False)

    async def _list(self, stream: _Req, *, v2: bool) -> None:
        workspace, request = await self._enter(stream, "list", v2=v2)
        wanted = {tag.tag_name: tag.tag_value for tag in request.tags}
        before = request.before_timestamp or time.time() + 1
        found = sorted(
            (
                s
                for s in self.core.modal.values()
                if s.owner == workspace
                and (s.running or request.include_finished)
                and (not request.app_id or s.app_id == request.app_id)
                and (v2 or not s.v2)
                and s.created_at < before
                and all(s.tags.get(k) == v for k, v in wanted.items())
            ),
            key=lambda s: s.created_at,
            reverse=True,
        )
        await stream.send_message(
            api_pb2.SandboxListResponse(
                sandboxes=[s.info() for s in found[: self.emu.list_page_size]]
            )
        )

    async def SandboxTagsGetV2(self, stream: _Req) -> None:
        await self._tags(stream, v2=True)

    async def SandboxTagsGet(self, stream: _Req) -> None:
        await self._tags(stream, v2=False)

    async def _tags(self, stream: _Req, *, v2: bool) -> None:
        workspace, request = await self._enter(stream, "get", v2=v2)
        sandbox = self._sandbox(workspace, request.sandbox_id)
        tags = [api_pb2.SandboxTag(tag_name=k, tag_value=v) for k, v in sandbox.tags.items()]
        await stream.send_message(api_pb2.SandboxTagsGetResponse(tags=tags))

    async def SandboxTagsSetV2(self, stream: _Req) -> None:
        await self._set_tags(stream, v2=True)

    async def SandboxTagsSet(self, stream: _Req) -> None:
        await self._set_tags(stream, v2=False)

    async def _set_tags(self, stream: _Req, *, v2: bool) -> None:
        """The request's tags replace all of the sandbox's (``list`` filters on the new ones)."""
        workspace, request = await self._enter(stream, "get", v2=v2)
        sandbox = self._sandbox(workspace, request.sandbox_id)
        sandbox.tags = {tag.tag_name: tag.tag_value for tag in request.tags}
        await stream.send_message(empty_pb2.Empty())

    async def SandboxCreateConnectTokenV2(self, stream: _Req) -> None:
        await self._connect_token(stream, v2=True)

    async def SandboxCreateConnectToken(self, stream: _Req) -> None:
        await self._connect_token(stream, v2=False)

    async def _connect_token(self, stream: _Req, *, v2: bool) -> None:
        """A URL of its own for the request's port and a token the edge wants with each
        request (`emulators.modal.tunnels`); the ``user_metadata`` is not passed on."""
        workspace, request = await self._enter(stream, "port", v2=v2)
        sandbox = _running(self._sandbox(workspace, request.sandbox_id))
        host = tunnel_host()
        self.core.connect_hosts[host] = (sandbox, request.port or 8080)
        token = self.core.tokens.mint(_CONNECT_TOKEN_TTL, connect=host)
        await stream.send_message(
            api_pb2.SandboxCreateConnectTokenResponse(url=f"https://{host}", token=token)
        )

    async def SandboxGetLogs(self, stream: _Req) -> None:
        """A V1 sandbox's entrypoint output as text batches; ``entry_id`` is the offset of the
        bytes given so far (a partial UTF-8 character waits for the rest). The stream ends at
        the request's timeout, and says ``eof`` once all was given."""
        workspace, request = await self._enter(stream, "get")
        sandbox = self._sandbox(workspace, request.sandbox_id)
        fd = 2 if request.file_descriptor == api_pb2.FILE_DESCRIPTOR_STDERR else 1
        offset = int(request.last_entry_id) if request.last_entry_id.isdigit() else 0
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(min(request.timeout or _MAX_WAIT, _MAX_WAIT)):
                if sandbox.entrypoint is not None:
                    text = codecs.getincrementaldecoder("utf-8")(errors="replace")
                    async for chunk, at in sandbox.entrypoint.output_from(fd, offset):
                        data = text.decode(chunk)
                        offset = at + len(chunk) - len(text.getstate()[0])
                        log = api_pb2.TaskLogs(data=data, file_descriptor=request.file_descriptor)
                        batch = api_pb2.TaskLogsBatch(entry_id=str(offset), items=[log])
                        await stream.send_message(batch)
                else:
                    await sandbox.ended.wait()
                await stream.send_message(api_pb2.TaskLogsBatch(entry_id=str(offset), eof=True))

    async def SandboxStdinWrite(self, stream: _Req) -> None:
        """A V1 sandbox's entrypoint stdin; a write whose ``index`` was applied is skipped."""
        workspace, request = await self._enter(stream, "exec")
        sandbox = _running(self._sandbox(workspace, request.sandbox_id))
        entrypoint = sandbox.entrypoint
        if entrypoint is None:
            raise GRPCError(Status.FAILED_PRECONDITION, "the sandbox has no entrypoint command")
        if request.index > sandbox.stdin_index:
            sandbox.stdin_index = request.index
            await entrypoint.write_stdin(entrypoint.stdin_written, request.input, request.eof)
        await stream.send_message(api_pb2.SandboxStdinWriteResponse())

    async def SandboxGetTunnelsV2(self, stream: _Req) -> None:
        await self._tunnels(stream, v2=True)

    async def SandboxGetTunnels(self, stream: _Req) -> None:
        await self._tunnels(stream, v2=False)

    async def _tunnels(self, stream: _Req, *, v2: bool) -> None:
        workspace, request = await self._enter(stream, "port", v2=v2)
        sandbox = _running(self._sandbox(workspace, request.sandbox_id))
        await stream.send_message(
            api_pb2.SandboxGetTunnelsResponse(result=_SUCCESS, tunnels=sandbox.tunnel_data())
        )

    async def SandboxSnapshotFs(self, stream: _Req) -> None:
        """The V1 snapshot: an image Modal keeps until it is deleted."""
        workspace, request = await self._enter(stream, "snapshot")
        sandbox = _running(self._sandbox(workspace, request.sandbox_id))
        image_id = await self.core.snapshot(sandbox, ttl=None)
        await stream.send_message(
            api_pb2.SandboxSnapshotFsResponse(
                image_id=image_id,
                result=_SUCCESS,
                image_metadata=api_pb2.ImageMetadata(workdir="/"),
            )
        )

    async def SandboxTerminateV2(self, stream: _Req) -> None:
        await self._terminate(stream, v2=True)

    async def SandboxTerminate(self, stream: _Req) -> None:
        await self._terminate(stream, v2=False)

    async def _terminate(self, stream: _Req, *, v2: bool) -> None:
        workspace, request = await self._enter(stream, "kill", v2=v2)
        sandbox = self._sandbox(workspace, request.sandbox_id)
        response = api_pb2.SandboxTerminateResponse()
        if sandbox.result is not None:
            response.existing_result.CopyFrom(sandbox.result)
        else:
            await self.core.kill(sandbox.id)
        await stream.send_message(response)


def _write_files(container: Container, files: Iterable[tuple[str, bytes, int]]) -> None:
    """Put a create's mounted and copied files in its sandbox, with their modes."""
    for path, data, mode in files:
        target = container.host(path, write=True)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
        target.chmod((mode & 0o7777) or 0o644)


def _running(sandbox: ModalSandbox) -> ModalSandbox:
    if not sandbox.running:
        raise GRPCError(Status.FAILED_PRECONDITION, f"Sandbox {sandbox.id} has already finished")
    return sandbox


def _ports(specs: Iterable[api_pb2.PortSpec]) -> tuple[list[int], list[int]]:
    """The ports of a create's ``open_ports``, each with a tunnel the edge serves, and those
    of them that also get a raw TCP tunnel (``unencrypted``)."""
    ports: list[int] = []
    unencrypted: list[int] = []
    for spec in specs:
        if spec.tunnel_type == api_pb2.TUNNEL_TYPE_H2:
            raise GRPCError(
                Status.UNIMPLEMENTED, "HTTP/2 tunnels are not implemented by the Modal emulator"
            )
        if not 1 <= spec.port <= 65535:
            raise GRPCError(Status.INVALID_ARGUMENT, f"Invalid port {spec.port}")
        ports.append(spec.port)
        if spec.unencrypted:
            unencrypted.append(spec.port)
    return ports, unencrypted


def _parents(files: list[tuple[str, bytes, int]]) -> set[str]:
    """The directories an image's files go in: the sandbox has them, whatever its isolation."""
    return {posixpath.dirname(path) for path, _, _ in files}
