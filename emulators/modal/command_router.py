"""The task command router (``modal.task_command_router.TaskCommandRouter``): execs.

On Modal each worker runs a command router; the control plane hands the
SDK its URL and a JWT per task (``authorization: Bearer <jwt>``). Here the
router shares the emulator's port. It plays ``Sandbox.exec`` and the
container process API: ``TaskExecStart`` starts a real command in the local
sandbox (``modal-sandbox-fs-tools`` included: that is how the SDK's
``Sandbox.filesystem`` works), ``TaskExecStdioRead`` streams stdout or
stderr from an offset until the command exits, ``TaskExecWait`` /
``TaskExecPoll`` give its exit code (or signal), and stdin is written with
``TaskExecStdinWrite`` or the client stream ``TaskExecStdinWriteStream``
(``TaskExecStdinStatus`` tells where to resume). The entrypoint command of a
create is read with ``SandboxStdioReadV2`` (after the sandbox ended too) and
fed with ``SandboxStdinWriteV2``; ``SandboxWaitUntilReady`` plays the create's
readiness probe. An exec with ``pty_info``
runs on a terminal of its own (`emulators.modal.pty_relay`), its output all
on stdout. ``TaskSnapshotFilesystem`` (``Sandbox.snapshot_filesystem``)
copies the sandbox's files into an image kept for the request's TTL
(``-1``: until deleted); ``TaskSnapshotDirectory`` one directory of them,
which ``TaskMountDirectory`` / ``TaskUnmountDirectory`` mount in a sandbox.
``TaskReloadVolumes`` (``Sandbox.reload_volumes``) succeeds: the sandbox's
volumes are always current (`emulators.modal.volumes`).
A task whose sandbox has ended is NOT_FOUND.
Faults: op ``exec``, ``files`` for fs-tools execs, ``snapshot``.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from google.protobuf import empty_pb2  # type: ignore[import-untyped]
from grpclib import GRPCError, Status
from grpclib.server import Stream
from modal_proto import task_command_router_grpc
from modal_proto import task_command_router_pb2 as sr

from emulators.modal.rpc import apply_fault, fill_unimplemented, metadata_value
from emulators.modal.sandboxes import FS_TOOLS, Exec, ModalSandbox

if TYPE_CHECKING:
    from emulators.modal import ModalEmulator

__all__ = ["CommandRouter"]

_NO_EXPIRY = -1  # a snapshot's ttl_seconds keeping it until it is deleted
_Req = Stream[Any, Any]


@fill_unimplemented
class CommandRouter(task_command_router_grpc.TaskCommandRouterBase):
    """The command router RPCs, over the emulator's core."""

    def __init__(self, emulator: ModalEmulator) -> None:
        self.emu = emulator
        self.core = emulator.core
        self.unimplemented = emulator.unimplemented

    async def _request(self, stream: _Req) -> Any:
        request = await stream.recv_message()
        assert request is not None
        return request

    def _task(self, stream: _Req, task_id: str, *, ended: bool = False) -> ModalSandbox:
        scheme, _, token = (metadata_value(stream, "authorization") or "").partition(" ")
        claims = self.core.tokens.claims(token) if scheme == "Bearer" else None
        if claims is None or claims.get("task_id") != task_id:
            raise GRPCError(Status.UNAUTHENTICATED, "Invalid or expired command router token")
        sandbox = self.core.tasks.get(task_id)
        if sandbox is None or not (sandbox.running or ended):
            raise GRPCError(Status.NOT_FOUND, f"Task {task_id} not found")
        sandbox.touch()
        return sandbox

    async def _exec(self, stream: _Req, task_id: str, exec_id: str) -> tuple[ModalSandbox, Exec]:
        sandbox = self._task(stream, task_id)
        execution = sandbox.execs.get(exec_id)
        if execution is None:
            raise GRPCError(Status.NOT_FOUND, f"Exec {exec_id} not found")
        await apply_fault(self.core.faults, stream, execution.op, sandbox.owner)
        return sandbox, execution

    async def TaskExecStart(self, stream: _Req) -> None:
        request = await self._request(stream)
        sandbox = self._task(stream, request.task_id)
        argv = list(request.command_args)
        op = "files" if argv[:1] == [FS_TOOLS] else "exec"
        await apply_fault(self.core.faults, stream, op, sandbox.owner)
        if request.exec_id not in sandbox.execs:
            env = dict(request.env)
            for source in request.secret_sources:
                if source.HasField("env"):
                    env.update(source.env.contents)
                else:
                    env.update(self.core.secrets.get(source.secret_id, {}))
            for secret_id in request.secret_ids:
                env.update(self.core.secrets.get(secret_id, {}))
            opts = self.core.local.opts
            pty = request.pty_info if request.HasField("pty_info") else None
            workdir = request.workdir or sandbox.workdir
            process = await sandbox.local.spawn(
                sandbox.argv(argv, workdir, opts.python, pty), env=env
            )
            execution = Exec(request.exec_id, op, process)
            sandbox.execs[execution.id] = execution
            execution.pump = asyncio.create_task(execution.run(request.timeout_secs or None))
        await stream.send_message(sr.TaskExecStartResponse())

    async def TaskExecStdioRead(self, stream: _Req) -> None:
        request = await self._request(stream)
        _, execution = await self._exec(stream, request.task_id, request.exec_id)
        fd = 1 if request.file_descriptor == sr.TASK_EXEC_STDIO_FILE_DESCRIPTOR_STDOUT else 2
        async for chunk, _ in execution.output_from(fd, request.offset):
            await stream.send_message(sr.TaskExecStdioReadResponse(data=chunk))

    async def SandboxStdioReadV2(self, stream: _Req) -> None:
        """The entrypoint's stdout or stderr from an offset, live and after the sandbox ended;
        a sandbox without one has no output and its streams end with it."""
        request = await self._request(stream)
        sandbox = self._task(stream, request.task_id, ended=True)
        await apply_fault(self.core.faults, stream, "exec", sandbox.owner)
        if sandbox.entrypoint is None:
            await sandbox.ended.wait()
            return
        fd = 1 if request.file_descriptor == sr.SANDBOX_STDIO_FILE_DESCRIPTOR_STDOUT else 2
        async for chunk, at in sandbox.entrypoint.output_from(fd, request.offset):
            await stream.send_message(sr.SandboxStdioReadV2Response(data=chunk, starting_offset=at))

    async def SandboxStdinWriteV2(self, stream: _Req) -> None:
        request = await self._request(stream)
        sandbox = self._task(stream, request.task_id, ended=True)
        await apply_fault(self.core.faults, stream, "exec", sandbox.owner)
        if not sandbox.running:
            raise GRPCError(Status.FAILED_PRECONDITION, f"Sandbox {sandbox.id} has finished")
        if sandbox.entrypoint is None:
            raise GRPCError(Status.FAILED_PRECONDITION, "the sandbox has no entrypoint command")
        await _write(sandbox.entrypoint, request.offset, request.data, request.eof)
        await stream.send_message(sr.SandboxStdinWriteV2Response())

    async def TaskExecWait(self, stream: _Req) -> None:
        request = await self._request(stream)
        _, execution = await self._exec(stream, request.task_id, request.exec_id)
        await execution.until(lambda: execution.done)
        await stream.send_message(sr.TaskExecWaitResponse(**_exit(execution)))

    async def TaskExecPoll(self, stream: _Req) -> None:
        request = await self._request(stream)
        _, execution = await self._exec(stream, request.task_id, request.exec_id)
        await stream.send_message(sr.TaskExecPollResponse(**_exit(execution)))

    async def TaskExecStdinWrite(self, stream: _Req) -> None:
        request = await self._request(stream)
        _, execution = await self._exec(stream, request.task_id, request.exec_id)
        await _write(execution, request.offset, request.data, request.eof)
        await stream.send_message(sr.TaskExecStdinWriteResponse())

    async def TaskExecStdinWriteStream(self, stream: _Req) -> None:
        first = await self._request(stream)
        if not first.HasField("start"):
            raise GRPCError(Status.INVALID_ARGUMENT, "the first message must be a start")
        _, execution = await self._exec(stream, first.start.task_id, first.start.exec_id)
        offset = first.start.offset
        async for message in stream:
            if message.HasField("end"):
                await _write(execution, offset, b"", True)
                break
            await _write(execution, offset, message.data, False)
            offset += len(message.data)
        await stream.send_message(sr.TaskExecStdinWriteStreamResponse())

    async def TaskExecStdinStatus(self, stream: _Req) -> None:
        request = await self._request(stream)
        _, execution = await self._exec(stream, request.task_id, request.exec_id)
        await stream.send_message(
            sr.TaskExecStdinStatusResponse(
                num_bytes_written=execution.stdin_written, closed=execution.stdin_closed
            )
        )

    async def SandboxWaitUntilReady(self, stream: _Req) -> None:
        """Until the create's readiness probe passes (tried every ``interval_ms``); past the
        request's timeout DEADLINE_EXCEEDED, which the SDK raises as its TimeoutError."""
        request = await self._request(stream)
        sandbox = self._task(stream, request.task_id)
        probe = sandbox.definition.readiness_probe
        if not sandbox.definition.HasField("readiness_probe"):
            raise GRPCError(Status.FAILED_PRECONDITION, "the sandbox has no readiness probe")
        deadline = time.monotonic() + request.timeout
        while sandbox.ready_at is None:
            if not sandbox.running:
                raise GRPCError(Status.FAILED_PRECONDITION, f"Sandbox {sandbox.id} has finished")
            if await sandbox.probe(self.core.local.opts.python):
                sandbox.ready_at = time.time()
                break
            if time.monotonic() >= deadline:
                raise GRPCError(Status.DEADLINE_EXCEEDED, "the sandbox is not ready yet")
            await asyncio.sleep((probe.interval_ms or 100) / 1000)
        await stream.send_message(sr.SandboxWaitUntilReadyTcrResponse(ready_at=sandbox.ready_at))

    async def TaskSnapshotFilesystem(self, stream: _Req) -> None:
        request = await self._request(stream)
        sandbox = await self._container(stream, request.task_id, request.container_id)
        image_id = await self.core.snapshot(sandbox, ttl=_ttl(request.ttl_seconds))
        await stream.send_message(sr.TaskSnapshotFilesystemResponse(image_id=image_id))

    async def TaskSnapshotDirectory(self, stream: _Req) -> None:
        request = await self._request(stream)
        sandbox = await self._container(stream, request.task_id, request.container_id)
        path = request.path.decode(errors="surrogateescape")
        image_id = await self.core.snapshot_directory(sandbox, path, _ttl(request.ttl_seconds))
        await stream.send_message(sr.TaskSnapshotDirectoryResponse(image_id=image_id))

    async def TaskMountDirectory(self, stream: _Req) -> None:
        """Mount a directory or filesystem snapshot, or an empty image (``from_scratch``: no
        id); a registry image's files are the host's, so mounting one is UNIMPLEMENTED."""
        request = await self._request(stream)
        sandbox = await self._container(stream, request.task_id, request.container_id)
        kept = self.core.image(request.image_id, sandbox.owner)
        built = self.emu.images.record(request.image_id)
        if kept is not None:
            tree: Path | None = self.core.tree(kept)
        elif not request.image_id or (built and built.tag == "scratch" and not built.copies):
            tree = None
        elif built is not None:
            raise GRPCError(
                Status.UNIMPLEMENTED, "mounting a registry image is not implemented by the emulator"
            )
        else:
            raise GRPCError(Status.NOT_FOUND, f"Image '{request.image_id}' not found")
        await sandbox.mount(request.path.decode(errors="surrogateescape"), tree)
        await stream.send_message(empty_pb2.Empty())

    async def TaskUnmountDirectory(self, stream: _Req) -> None:
        request = await self._request(stream)
        sandbox = await self._container(stream, request.task_id, request.container_id)
        await sandbox.unmount(request.path.decode(errors="surrogateescape"))
        await stream.send_message(empty_pb2.Empty())

    async def TaskReloadVolumes(self, stream: _Req) -> None:
        """Nothing to reload: a volume's mounts share its one directory
        (`emulators.modal.volumes`)."""
        request = await self._request(stream)
        await self._container(stream, request.task_id, request.container_id)
        await stream.send_message(sr.TaskReloadVolumesResponse())

    async def _container(self, stream: _Req, task_id: str, container_id: str) -> ModalSandbox:
        """The task's sandbox for a snapshot or mount (op ``snapshot``); sidecars are absent."""
        sandbox = self._task(stream, task_id)
        await apply_fault(self.core.faults, stream, "snapshot", sandbox.owner)
        if container_id:
            raise GRPCError(Status.NOT_FOUND, f"Container {container_id} not found")
        return sandbox


def _ttl(ttl: int) -> float | None:
    """A snapshot request's ``ttl_seconds`` (``-1``: kept until deleted)."""
    if ttl != _NO_EXPIRY and ttl <= 0:
        raise GRPCError(
            Status.INVALID_ARGUMENT, "ttl_seconds must be positive, or -1 for no expiry"
        )
    return None if ttl == _NO_EXPIRY else ttl


def _exit(execution: Exec) -> dict[str, int]:
    if execution.signal is not None:
        return {"signal": execution.signal}
    if execution.code is not None:
        return {"code": execution.code}
    return {}


async def _write(execution: Exec, offset: int, data: bytes, eof: bool) -> None:
    try:
        await execution.write_stdin(offset, data, eof)
    except ValueError as exc:
        raise GRPCError(Status.OUT_OF_RANGE, str(exc)) from None
