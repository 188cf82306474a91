"""Contract tests: the real modal SDK (sync and ``.aio``) against the Modal emulator.

If Modal's gRPC protocol moves under a new SDK version, these fail first.
"""

from __future__ import annotations

import asyncio
import io
import os
import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import modal
import modal.experimental
import pytest
import structlog
from grpclib.exceptions import StreamTerminatedError
from modal import exception as mx
from modal.types import FileEntryType, FileWatchEventType
from modal_proto import api_pb2

from emulators.harness import Emulator, free_port
from emulators.modal import TEST_TOKEN_ID, TEST_TOKEN_SECRET, ModalEmulator
from emulators.modal.control import CONCURRENCY_MESSAGE, QUOTA_MESSAGE
from emulators.modal.sandboxes import OutputLog
from emulators.modal.tunnels import DOMAIN
from tests.polling import until, wait_until

IMAGE = "python:3.12-slim"


@pytest.fixture
def emu(modal_emulator: Emulator, monkeypatch: pytest.MonkeyPatch) -> Iterator[ModalEmulator]:
    assert isinstance(modal_emulator, ModalEmulator)
    for key, value in modal_emulator.sdk_env().items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("MODAL_MAX_THROTTLE_WAIT", "0")
    yield modal_emulator
    assert modal_emulator.alive() == [], "a test left a sandbox alive"


@pytest.fixture
def client(emu: ModalEmulator) -> Iterator[Any]:
    sdk_client = modal.Client.from_credentials(TEST_TOKEN_ID, TEST_TOKEN_SECRET)
    yield sdk_client
    sdk_client.close()


def create(client: Any, *entrypoint: str, app_name: str = "contract", **kw: Any) -> Any:
    app = modal.App.lookup(app_name, create_if_missing=True, client=client)
    kw.setdefault("image", modal.Image.from_registry(IMAGE))
    return modal.Sandbox.create(*entrypoint, app=app, client=client, **kw)


def test_sync_sdk(emu: ModalEmulator, client: Any) -> None:
    app = modal.App.lookup("contract", create_if_missing=True, client=client)
    assert modal.App.lookup("contract", client=client).app_id == app.app_id
    sb = modal.Sandbox.create(
        app=app,
        image=modal.Image.from_registry(IMAGE),
        env={"GLOBAL": "g"},
        tags={"team": "a"},
        workdir="/root/work",
        timeout=120,
        client=client,
    )
    assert emu.core.modal[sb.object_id].v2
    process = sb.exec(
        "bash", "-c", "echo out $GLOBAL $LOCAL; echo err >&2; exit 5", env={"LOCAL": "l"}
    )
    assert (process.stdout.read(), process.stderr.read(), process.wait()) == (
        "out g l\n",
        "err\n",
        5,
    )
    sb.exec("mkdir", "-p", "sub").wait()
    assert sb.exec("ls", workdir="/root/work").stdout.read() == "sub\n"

    payload = bytes(range(256)) * 32
    sb.filesystem.write_bytes(payload, "/root/work/sub/blob.bin")
    assert sb.filesystem.read_bytes("/root/work/sub/blob.bin") == payload
    sb.filesystem.write_text("héllo", "/root/work/note.txt")
    assert sb.filesystem.read_text("/root/work/note.txt") == "héllo"
    sb.filesystem.make_directory("/root/work/a/b")
    listed = {e.name: e for e in sb.filesystem.list_files("/root/work")}
    assert sorted(listed) == ["a", "note.txt", "sub"]
    assert listed["a"].is_dir()
    assert sb.filesystem.stat("/root/work/sub/blob.bin").size == len(payload)
    sb.filesystem.remove("/root/work/a", recursive=True)
    assert "a" not in [e.name for e in sb.filesystem.list_files("/root/work")]

    again = modal.Sandbox.from_id(sb.object_id, client=client)
    assert again.returncode is None
    assert again.exec("cat", "note.txt").stdout.read() == "héllo"
    assert again.get_tags() == {"team": "a"}
    assert [s.object_id for s in modal.Sandbox.list(app_id=app.app_id, client=client)] == [
        sb.object_id
    ]
    assert list(modal.Sandbox.list(app_id=app.app_id, tags={"team": "b"}, client=client)) == []

    sb.terminate()
    assert sb.poll() == 137
    with pytest.raises(mx.SandboxTerminatedError):
        sb.wait()
    assert modal.Sandbox.from_id(sb.object_id, client=client).returncode == 137
    with pytest.raises(mx.NotFoundError):
        again.exec("true").wait()
    assert [r.ended_by for r in emu.records()] == ["kill"]


async def test_async_sdk(emu: ModalEmulator) -> None:
    client = await modal.Client.from_credentials.aio(TEST_TOKEN_ID, TEST_TOKEN_SECRET)
    app = await modal.App.lookup.aio("contract", create_if_missing=True, client=client)
    sb = await modal.Sandbox.create.aio(
        app=app, image=modal.Image.from_registry(IMAGE), tags={"mode": "aio"}, client=client
    )
    process = await sb.exec.aio("bash", "-c", "echo aio; exit 2")
    assert await process.stdout.read.aio() == "aio\n"
    assert await process.wait.aio() == 2
    await sb.filesystem.write_bytes.aio(b"\x00\xffbin", "/root/x.bin")
    assert await sb.filesystem.read_bytes.aio("/root/x.bin") == b"\x00\xffbin"
    found = [s.object_id async for s in modal.Sandbox.list.aio(app_id=app.app_id, client=client)]
    assert found == [sb.object_id]
    again = await modal.Sandbox.from_id.aio(sb.object_id, client=client)
    assert await (await again.exec.aio("cat", "x.bin", text=False)).stdout.read.aio() == (
        b"\x00\xffbin"
    )
    await sb.terminate.aio()
    assert await again.poll.aio() == 137
    await client.close.aio()


def test_exec_timeout_stdin_and_streaming(emu: ModalEmulator, client: Any) -> None:
    sb = create(client)
    try:
        started = time.monotonic()
        slow = sb.exec("bash", "-c", "echo begun; sleep 30", timeout=1)
        # -1 when the SDK's deadline passes first, 128 + SIGKILL when the emulator's kill
        # is reported first (a race, as on Modal); the adapter reads both as a timeout.
        assert slow.wait() in (-1, 137)
        assert time.monotonic() - started < 3
        execs = emu.core.modal[sb.object_id].execs
        asyncio.run(until(lambda: all(e.done for e in execs.values())))
        assert [e.signal for e in execs.values() if e.signal] == [9]

        cat = sb.exec("cat")
        cat.stdin.write(b"fed through stdin\n")
        cat.stdin.write_eof()
        cat.stdin.drain()
        assert (cat.stdout.read(), cat.wait()) == ("fed through stdin\n", 0)

        ticks = sb.exec("bash", "-c", "for i in 1 2 3; do echo $i; sleep 0.05; done", bufsize=1)
        assert list(ticks.stdout) == ["1\n", "2\n", "3\n"]
        assert ticks.poll() == 0
    finally:
        sb.terminate()


def test_a_large_output_comes_through_whole_and_is_not_kept(
    emu: ModalEmulator, client: Any
) -> None:
    """24 MiB of stdout reach the SDK byte for byte (a cap once cut it at 10 MiB
    silently), and the emulator keeps only a window behind what was read."""
    sb = create(client)
    try:
        size = 24 * 1024 * 1024
        cat = sb.exec("sh", "-c", f"yes | head -c {size}", text=False)
        got = cat.stdout.read()
        assert (len(got), cat.wait()) == (size, 0)
        [execution] = [e for e in emu.core.modal[sb.object_id].execs.values() if e.op]
        assert execution.stdout.base >= size - OutputLog.KEEP - 1024 * 1024
    finally:
        sb.terminate()


def test_execs_share_the_containers_pid_namespace(
    isolation: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One exec signals another by pid, as in a Modal container (the router's kill)."""
    with ModalEmulator(isolation=isolation) as emu:
        for key, value in emu.sdk_env().items():
            monkeypatch.setenv(key, value)
        sdk_client = modal.Client.from_credentials(TEST_TOKEN_ID, TEST_TOKEN_SECRET)
        sb = create(sdk_client)
        try:
            sleeper = sb.exec("bash", "-c", "echo $$; exec sleep 60")
            pid = next(iter(sleeper.stdout)).strip()
            assert sb.exec("kill", "-KILL", pid).wait() == 0
            assert sleeper.wait() == 128 + 9
        finally:
            sb.terminate()
            sdk_client.close()


def test_pty_exec_runs_on_a_terminal(client: Any) -> None:
    """``exec(pty=True)``: a controlling terminal, stdin typed into it, stderr merged into
    stdout; a caller without a tty asks for 0 x 0."""
    sb = create(client)
    try:
        shell = "tty -s && stty size && read -r line && echo got=$line && echo err >&2; exit 5"
        term = sb.exec("bash", "-c", shell, pty=True, text=False)
        term.stdin.write(b"typed\n")
        term.stdin.drain()
        out = term.stdout.read()
        assert b"0 0\r\n" in out
        assert b"got=typed\r\n" in out
        assert b"err\r\n" in out
        assert (term.stderr.read(), term.wait()) == (b"", 5)
    finally:
        sb.terminate()


def test_filesystem_errors(client: Any) -> None:
    sb = create(client)
    try:
        sb.filesystem.make_directory("/root/d/e")
        with pytest.raises(mx.SandboxFilesystemNotFoundError):
            sb.filesystem.read_bytes("/root/missing")
        with pytest.raises(mx.SandboxFilesystemIsADirectoryError):
            sb.filesystem.read_bytes("/root/d")
        with pytest.raises(mx.SandboxFilesystemIsADirectoryError):
            sb.filesystem.write_bytes(b"x", "/root/d/e")
        sb.filesystem.write_bytes(b"file", "/root/f")
        with pytest.raises(mx.SandboxFilesystemNotADirectoryError):
            sb.filesystem.write_bytes(b"x", "/root/f/x")
        with pytest.raises(mx.SandboxFilesystemNotADirectoryError):
            sb.filesystem.list_files("/root/f")
        with pytest.raises(mx.SandboxFilesystemPermissionError):
            sb.filesystem.write_bytes(b"x", "/etc/passwd")
        with pytest.raises(mx.SandboxFilesystemDirectoryNotEmptyError):
            sb.filesystem.remove("/root/d")
        with pytest.raises(mx.SandboxFilesystemPathAlreadyExistsError):
            sb.filesystem.make_directory("/root/d", create_parents=False)
    finally:
        sb.terminate()


def test_gpu_sandbox_takes_the_v1_rpcs(emu: ModalEmulator, client: Any) -> None:
    sb = create(client, gpu="A10G", tags={"gpu": "yes"})
    sandbox = emu.core.modal[sb.object_id]
    assert not sandbox.v2
    assert sandbox.definition.resources.gpu_config.gpu_type == "A10G"
    assert sb.exec("echo", "v1").stdout.read() == "v1\n"
    app = modal.App.lookup("contract", client=client)
    assert [s.object_id for s in modal.Sandbox.list(app_id=app.app_id, client=client)] == [
        sb.object_id
    ]
    again = modal.Sandbox.from_id(sb.object_id, client=client)
    assert again.exec("echo", "again").stdout.read() == "again\n"
    sb.terminate()
    assert again.poll() == 137


def test_list_is_paged(emu: ModalEmulator, client: Any) -> None:
    emu.list_page_size = 2
    made = [create(client, tags={"batch": "1"}) for _ in range(5)]
    app = modal.App.lookup("contract", client=client)
    listed = modal.Sandbox.list(app_id=app.app_id, tags={"batch": "1"}, client=client)
    assert sorted(s.object_id for s in listed) == sorted(s.object_id for s in made)
    for sb in made:
        sb.terminate()


def test_lifetime_and_lookup_errors(emu: ModalEmulator, client: Any) -> None:
    with pytest.raises(mx.NotFoundError, match="App 'nope' not found"):
        modal.App.lookup("nope", client=client)
    sb = create(client, timeout=1)
    with pytest.raises(mx.SandboxTimeoutError):
        sb.wait()
    assert [r.ended_by for r in emu.records()] == ["expired"]


@pytest.mark.parametrize(
    ("fault", "error"),
    [
        ({"status": 401}, mx.AuthError),
        ({"status": 403}, mx.PermissionDeniedError),
        ({"status": 404}, mx.NotFoundError),
        ({"status": 429}, mx.ResourceExhaustedError),
        ({"status": 500}, mx.InternalError),
        ({"status": 503}, mx.ServiceError),
        ({"drop": True}, StreamTerminatedError),
    ],
)
def test_faults_reach_the_sdk_as_its_own_errors(
    emu: ModalEmulator, client: Any, fault: dict[str, Any], error: type[Exception]
) -> None:
    emu.inject("create", times=None, **fault)
    with pytest.raises(error):
        create(client)
    emu.clear_faults()


def test_after_faults_make_the_sandbox_then_answer_late_or_drop_the_stream(
    emu: ModalEmulator, client: Any
) -> None:
    """``after``: SandboxCreate does its work, then its answer is late or never sent."""
    emu.inject("create", after=True, drop=True, times=None)  # the SDK retries a drop itself
    with pytest.raises(StreamTerminatedError):
        create(client, tags={"fault": "dropped"})
    dropped = emu.alive()
    assert len(dropped) == emu.core.faults.hits["create"]  # each request made its sandbox
    assert {r.labels["fault"] for r in dropped} == {"dropped"}
    emu.clear_faults()
    emu.inject("create", after=True, delay=0.5)
    started = time.monotonic()
    late = create(client)
    assert time.monotonic() - started >= 0.5
    assert len(emu.alive()) == len(dropped) + 1
    late.terminate()
    for record in dropped:
        modal.Sandbox.from_id(record.id, client=client).terminate()


def test_throttling_carries_the_retry_policy(
    emu: ModalEmulator, client: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    emu.inject("create", status=429, retry_after=7)
    with pytest.raises(mx.ResourceExhaustedError) as throttled:
        create(client)
    details = throttled.value._grpc_details
    assert [type(d) for d in details] == [api_pb2.RPCRetryPolicy]
    assert details[0].retry_after_secs == 7
    emu.inject("create", status=429, retry_after=0.2)
    monkeypatch.delenv("MODAL_MAX_THROTTLE_WAIT")
    sb = create(client)  # the SDK's own throttle wait, then the retry succeeds
    assert emu.core.faults.hits["create"] == 2
    sb.terminate()


def test_account_limits_answer_resource_exhausted(emu: ModalEmulator, client: Any) -> None:
    emu.set_quota(max_concurrent=1)
    first = create(client)
    with pytest.raises(mx.ResourceExhaustedError, match="1 concurrently running") as capped:
        create(client)
    assert str(capped.value) == CONCURRENCY_MESSAGE.format(limit=1)
    first.terminate()
    emu.set_quota(max_created=0)
    with pytest.raises(mx.ResourceExhaustedError) as spent:
        create(client)
    assert str(spent.value) == QUOTA_MESSAGE.format(limit=0)


def test_refused_token(emu: ModalEmulator, client: Any) -> None:
    client.hello()
    stranger = modal.Client.from_credentials(TEST_TOKEN_ID, "as-wrong")
    with pytest.raises(mx.AuthError):
        stranger.hello()
    with pytest.raises(mx.AuthError):
        modal.App.lookup("contract", create_if_missing=True, client=stranger)
    stranger.close()


def test_images_secrets_and_slow_builds(monkeypatch: pytest.MonkeyPatch) -> None:
    emu = ModalEmulator(
        secrets={"db": {"DB_USER": "admin"}}, images={IMAGE}, image_build_seconds=0.5
    )
    with emu:
        for key, value in emu.sdk_env().items():
            monkeypatch.setenv(key, value)
        slow_client = modal.Client.from_credentials(TEST_TOKEN_ID, TEST_TOKEN_SECRET)
        started = time.monotonic()
        sb = create(slow_client, secrets=[modal.Secret.from_name("db")])
        assert time.monotonic() - started >= 0.5
        assert sb.exec("bash", "-c", "echo $DB_USER").stdout.read() == "admin\n"
        sb.terminate()
        app = modal.App.lookup("contract", client=slow_client)
        with pytest.raises(mx.ImageBuildError, match="manifest unknown"):
            modal.Sandbox.create(
                app=app, image=modal.Image.from_registry("no/such:tag"), client=slow_client
            )
        with pytest.raises(mx.NotFoundError, match="Secret 'nope' not found"):
            create(slow_client, secrets=[modal.Secret.from_name("nope")])
        slow_client.close()
        assert emu.alive() == []


def test_unimplemented_rpcs_are_logged_by_name(emu: ModalEmulator, client: Any) -> None:
    with structlog.testing.capture_logs() as events, pytest.raises(mx.UnimplementedError):
        modal.Dict.from_name("data", create_if_missing=True, client=client).hydrate()
    assert emu.unimplemented == {"DictGetOrCreate": 1}
    assert [e["rpc"] for e in events if "unimplemented" in e["event"]] == ["DictGetOrCreate"]


@pytest.mark.parametrize("gpu", [None, "T4"])
def test_set_tags_replaces_the_tags_list_filters_on(client: Any, gpu: str | None) -> None:
    """``set_tags`` (V2 and V1 RPCs) replaces every tag, as Modal's does."""
    sb = create(client, tags={"team": "a", "old": "x"}, gpu=gpu)
    try:
        sb.set_tags({"team": "b"})
        assert modal.Sandbox.from_id(sb.object_id, client=client).get_tags() == {"team": "b"}
        app_id = modal.App.lookup("contract", client=client).app_id
        listed = modal.Sandbox.list(app_id=app_id, tags={"team": "b"}, client=client)
        assert [s.object_id for s in listed] == [sb.object_id]
        assert list(modal.Sandbox.list(app_id=app_id, tags={"old": "x"}, client=client)) == []
    finally:
        sb.terminate()


@pytest.mark.timeout(30)
def test_the_entrypoint_is_the_sandboxs_process(emu: ModalEmulator, client: Any) -> None:
    """``Sandbox.create(*args)`` runs ``args`` as the sandbox's own process: ``sb.stdin`` /
    ``sb.stdout`` / ``sb.stderr`` are its, and the sandbox ends when it exits, with its code;
    a new handle reads its output after the end too (its task id and router stay known)."""
    shell = "read -r line; echo out $line; echo err >&2; sleep 0.2; echo late; exit 3"
    sb = create(client, "bash", "-c", shell, workdir="/root/w")
    sb.stdin.write(b"typed\n")
    sb.stdin.write_eof()
    sb.stdin.drain()
    assert next(iter(sb.stdout)) == "out typed\n"
    assert sb.poll() is None
    sb.wait()
    assert (sb.returncode, sb.stdout.read(), sb.stderr.read()) == (3, "late\n", "err\n")
    ended = modal.Sandbox.from_id(sb.object_id, client=client)
    assert (ended.returncode, ended.stdout.read()) == (3, "out typed\nlate\n")
    assert [r.ended_by for r in emu.records()] == ["exited"]

    sleeper = create(client, "sleep", "60")
    sleeper.terminate()
    sleeper.wait(raise_on_termination=False)
    assert (sleeper.returncode, sleeper.stdout.read()) == (137, "")
    sleeper.stdin.write(b"late")
    with pytest.raises(ValueError, match="finished"):
        sleeper.stdin.drain()


def through_tunnel(
    emu: ModalEmulator, url: str, headers: dict[str, str] | None = None
) -> httpx.Response:
    """GET ``url`` (a tunnel's) where Modal's DNS would send it: the emulator's edge."""
    parsed = httpx.URL(url)
    target = emu.resolve(parsed.host)
    assert target is not None
    edge = parsed.copy_with(scheme="http", host=target[0], port=target[1])
    return httpx.get(edge, headers={"Host": parsed.host, **(headers or {})}, timeout=5)


def test_tunnels_of_declared_ports_reach_a_server_in_the_sandbox(
    emu: ModalEmulator, client: Any
) -> None:
    port, other = free_port(), free_port()
    sb = create(client, encrypted_ports=[port])
    try:
        sb.filesystem.write_text("through the tunnel", "/root/site/hello.txt")
        sb.exec(
            "python3", "-m", "http.server", str(port), "--bind", "127.0.0.1", workdir="/root/site"
        )
        emu.inject("port", status=403)
        tunnels = sb.tunnels()  # no call: the V2 create's answer carried them
        assert list(tunnels) == [port]
        tunnel = tunnels[port]
        assert (tunnel.port, tunnel.url) == (443, f"https://{tunnel.host}")
        assert tunnel.host.endswith(f".{DOMAIN}")
        with pytest.raises(mx.PermissionDeniedError):  # a new handle asks SandboxGetTunnelsV2
            modal.Sandbox.from_id(sb.object_id, client=client).tunnels()
        assert modal.Sandbox.from_id(sb.object_id, client=client).tunnels() == tunnels

        page = tunnel.url + "/hello.txt"
        wait_until(lambda: through_tunnel(emu, page).status_code == 200, seconds=15)
        assert through_tunnel(emu, page).text == "through the tunnel"
        assert through_tunnel(emu, f"https://nope.{DOMAIN}/").status_code == 404
        with pytest.raises(mx.UnimplementedError, match="HTTP/2"):
            create(client, h2_ports=[other])
    finally:
        sb.terminate()
    assert through_tunnel(emu, page).status_code == 502
    with pytest.raises(mx.ConflictError, match="finished"):
        modal.Sandbox.from_id(sb.object_id, client=client).tunnels()


def test_filesystem_snapshot_is_an_image_a_create_starts_from(
    emu: ModalEmulator, client: Any
) -> None:
    registry = modal.Image.from_registry(IMAGE)
    sb = create(client, image=registry)
    try:
        sb.filesystem.write_text("kept", "/root/app/state.txt")
        image = sb.snapshot_filesystem()
        with pytest.raises(mx.InvalidError, match="ttl"):
            sb.snapshot_filesystem(ttl=0)
        forever = sb.snapshot_filesystem(ttl=None)
    finally:
        sb.terminate()
    assert image.object_id.startswith("im-")
    assert emu.core.kept[forever.object_id].expires_at is None
    expires_at = emu.core.kept[image.object_id].expires_at
    assert expires_at is not None
    assert expires_at - time.time() == pytest.approx(30 * 24 * 3600, abs=60)

    child = create(client, image=modal.Image.from_id(image.object_id, client=client))
    try:
        assert child.filesystem.read_text("/root/app/state.txt") == "kept"
    finally:
        child.terminate()

    modal.experimental.image_delete(image.object_id, client=client)
    with pytest.raises(mx.NotFoundError, match="not found"):
        modal.experimental.image_delete(image.object_id, client=client)
    with pytest.raises(mx.NotFoundError, match="not found"):
        create(client, image=modal.Image.from_id(image.object_id, client=client))
    emu.core.kept[forever.object_id].expires_at = time.time()  # its TTL passed
    with pytest.raises(mx.NotFoundError):
        create(client, image=modal.Image.from_id(forever.object_id, client=client))
    wait_until(lambda: not emu.core.kept)
    assert emu.core.kept == {}  # the reaper deleted its copy
    modal.experimental.image_delete(registry.object_id, client=client)  # any built image
    assert not emu.images.built(registry.object_id)


def test_v1_sandboxes_take_the_v1_tunnel_and_legacy_snapshot_rpcs(
    emu: ModalEmulator, client: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    port = free_port()
    sb = create(client, gpu="T4", encrypted_ports=[port])
    try:
        assert not emu.core.modal[sb.object_id].v2
        assert list(sb.tunnels()) == [port]  # SandboxGetTunnels: a V1 create answers none
        sb.filesystem.write_text("v1", "/root/v1.txt")
        monkeypatch.setenv("MODAL_USE_LEGACY_FILESYSTEM_SNAPSHOT", "1")
        image = sb.snapshot_filesystem()  # SandboxSnapshotFs
        assert emu.core.kept[image.object_id].expires_at is None
    finally:
        sb.terminate()
    child = create(client, image=modal.Image.from_id(image.object_id, client=client))
    try:
        assert child.filesystem.read_text("/root/v1.txt") == "v1"
    finally:
        child.terminate()


def test_emulator_listens_on_the_port_it_is_given() -> None:
    port = free_port()
    with ModalEmulator(port=port) as emu:
        env = emu.sdk_env()
        assert env["MODAL_SERVER_URL"] == f"http://127.0.0.1:{port}"
        assert (env["MODAL_TOKEN_ID"], env["MODAL_TOKEN_SECRET"]) == (
            TEST_TOKEN_ID,
            TEST_TOKEN_SECRET,
        )
        with open(env["MODAL_CONFIG_PATH"]) as config:
            assert config.read() == ""
    assert not os.path.exists(env["MODAL_CONFIG_PATH"])


def test_the_whole_filesystem(isolation: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """/tmp and workdir="/" work as on Modal. (An unknown gRPC method is grpclib's own
    UNIMPLEMENTED, the same as Modal's server answers.)"""
    with ModalEmulator(isolation=isolation) as emu:
        for key, value in emu.sdk_env().items():
            monkeypatch.setenv(key, value)
        sdk_client = modal.Client.from_credentials(TEST_TOKEN_ID, TEST_TOKEN_SECRET)
        sb = create(sdk_client)
        try:
            sb.filesystem.write_text("t", "/tmp/x")
            assert sb.filesystem.read_text("/tmp/x") == "t"
            ran = sb.exec("bash", "-c", "pwd; cat /tmp/x; echo; echo $HOME", workdir="/")
            assert ran.stdout.read() == "/\nt\n/root\n"
            assert sb.exec("pwd").stdout.read() == "/root\n"
            assert {"root", "tmp"} <= {e.name for e in sb.filesystem.list_files("/")}
        finally:
            sb.terminate()
            sdk_client.close()


def test_python_is_on_the_path(isolation: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Modal's images have ``python`` (the examples exec it): a sandbox whose system has only
    ``python3`` finds one last on its PATH; a PATH the create sets is kept. Its stdout is
    buffered, as in a Modal container: the code interpreter example reads a JSON line that
    ``print(..., flush=True)`` writes whole (unbuffered, its newline came as a chunk apart)."""
    with ModalEmulator(isolation=isolation) as emu:
        for key, value in emu.sdk_env().items():
            monkeypatch.setenv(key, value)
        sdk_client = modal.Client.from_credentials(TEST_TOKEN_ID, TEST_TOKEN_SECRET)
        sb = create(
            sdk_client, "python", "-c", "print('entry', flush=True); import time; time.sleep(60)"
        )
        own = create(sdk_client, env={"PATH": "/opt/own"})
        try:
            ran = sb.exec("python", "-c", "import sys; print(sys.version_info[0])")
            assert (ran.stdout.read(), ran.wait()) == ("3\n", 0)
            buffered = "import sys; print(sys.stdout.write_through)"
            assert sb.exec("python", "-c", buffered).stdout.read() == "False\n"
            assert next(iter(sb.stdout)) == "entry\n"
            assert own.exec("/bin/sh", "-c", "echo $PATH").stdout.read() == "/opt/own\n"
        finally:
            sb.terminate()
            own.terminate()
            sdk_client.close()


def test_a_named_sandbox_is_found_by_name(client: Any) -> None:
    """A create's ``name`` is unique among the app's running sandboxes; ``from_name`` finds
    it (the V1 lookup finds V2 sandboxes too), and a finished one with ``include_terminated``."""
    sb = create(client, name="worker")
    try:
        with pytest.raises(mx.AlreadyExistsError):
            create(client, name="worker")
        found = modal.Sandbox.from_name("contract", "worker", client=client)
        assert found.object_id == sb.object_id
        assert found.exec("echo", "named").stdout.read() == "named\n"
    finally:
        sb.terminate()
    with pytest.raises(mx.NotFoundError):
        modal.Sandbox.from_name("contract", "worker", client=client)
    ended = modal.Sandbox.from_name("contract", "worker", include_terminated=True, client=client)
    assert (ended.object_id, ended.returncode) == (sb.object_id, 137)
    again = create(client, name="worker")
    again.terminate()


def test_wait_until_ready_plays_the_readiness_probe(client: Any) -> None:
    """``wait_until_ready`` returns once the create's probe passes (a TCP connect or an exec
    exiting 0), and times out while it fails."""
    port = free_port()
    server = [
        "python3",
        "-c",
        f"import time, http.server as h; time.sleep(0.5); h.test(port={port})",
    ]
    started = time.monotonic()  # the server cannot listen sooner than 0.5 s after this
    by_tcp = create(client, *server, readiness_probe=modal.Probe.with_tcp(port))
    by_exec = create(client, readiness_probe=modal.Probe.with_exec("test", "-e", "/tmp/up"))
    try:
        by_tcp.wait_until_ready(timeout=10)
        assert 0.5 < time.monotonic() - started < 10
        with pytest.raises(mx.TimeoutError):
            by_exec.wait_until_ready(timeout=1)
        by_exec.exec("touch", "/tmp/up").wait()
        by_exec.wait_until_ready(timeout=10)
    finally:
        by_tcp.terminate()
        by_exec.terminate()


def test_an_unencrypted_port_is_a_tcp_tunnel(emu: ModalEmulator, client: Any) -> None:
    """``unencrypted_ports`` get a raw TCP tunnel (``tcp_socket``) on the emulator's host,
    which stops with the sandbox."""
    port = free_port()
    echo = f"import socket; s = socket.create_server(('127.0.0.1', {port})); c, _ = s.accept(); "
    echo += "c.sendall(c.recv(100).upper())"
    sb = create(client, "python3", "-c", echo, unencrypted_ports=[port])
    host, tcp_port = sb.tunnels()[port].tcp_socket
    assert host == emu.host
    wait_until(lambda: _tcp_echo(host, tcp_port, b"ping") == b"PING", seconds=15)
    sb.wait()
    with pytest.raises(ConnectionRefusedError):
        _tcp_echo(host, tcp_port, b"gone")


def _tcp_echo(host: str, port: int, data: bytes) -> bytes:
    with socket.create_connection((host, port), timeout=5) as conn:
        conn.sendall(data)
        return conn.recv(100)


def test_filesystem_watch_reports_changes_until_its_timeout(client: Any) -> None:
    """``filesystem.watch`` yields the changes under a directory (filtered by type) until
    the caller stops, and ends without error when its timeout passes."""
    sb = create(client)
    try:
        sb.filesystem.make_directory("/root/w/sub")
        events: list[tuple[FileWatchEventType, list[str]]] = []

        def watch() -> None:
            kinds = [FileWatchEventType.Create, FileWatchEventType.Remove]
            for event in sb.filesystem.watch("/root/w", recursive=True, filter=kinds, timeout=30):
                events.append((event.type, event.paths))
                if event.type == FileWatchEventType.Remove:
                    return

        watcher = threading.Thread(target=watch)
        watcher.start()
        made: list[str] = []

        def touched() -> bool:
            made.append(f"/root/w/sub/{len(made)}.done")
            sb.exec("touch", made[-1]).wait()
            return bool(events)

        wait_until(touched, seconds=10)
        created, [path] = events[0]
        assert created == FileWatchEventType.Create
        sb.exec("rm", path).wait()
        watcher.join(timeout=10)
        assert events[-1] == (FileWatchEventType.Remove, [path])
        assert list(sb.filesystem.watch("/root/w", timeout=1)) == []
        with pytest.raises(mx.SandboxFilesystemNotFoundError):
            next(iter(sb.filesystem.watch("/root/nope", timeout=1)))
    finally:
        sb.terminate()


def test_image_layers_bring_env_workdir_and_local_files(client: Any, tmp_path: Path) -> None:
    """Each image layer is an image of its own: its ``env`` (``$PATH`` expanded, as the
    examples' ``.env({"PATH": "...:$PATH"})`` needs) and ``workdir`` reach the sandbox's
    commands, and the files ``add_local_file`` / ``add_local_dir`` add (copied or mounted)
    are in the sandbox."""
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "mod.py").write_text("X = 1\n")
    (tmp_path / "run.sh").write_text("echo ran\n")
    base = modal.Image.from_registry(IMAGE)
    image = (
        base.env({"GREETING": "hi there"})
        .env({"PATH": "/opt/tools:$PATH"})
        .workdir("/srv/app")
        .add_local_file(tmp_path / "run.sh", "/opt/run.sh", copy=True)
        .add_local_dir(tmp_path / "pkg", "/srv/app/pkg")
    )
    sb = create(client, image=image)
    other = create(client, image=base.env({"GREETING": "other"}))
    try:
        ran = sb.exec("bash", "-c", 'pwd; echo "$GREETING"; cat pkg/mod.py; sh /opt/run.sh')
        assert ran.stdout.read() == "/srv/app\nhi there\nX = 1\nran\n"
        path = sb.exec("printenv", "PATH").stdout.read()
        assert path.startswith("/opt/tools:/usr/local/sbin:")
        assert sb.exec("python", "-c", "print(2)").stdout.read() == "2\n"
        assert other.exec("bash", "-c", "echo $GREETING").stdout.read() == "other\n"
    finally:
        sb.terminate()
        other.terminate()


def test_a_directory_snapshot_mounts_in_another_sandbox(emu: ModalEmulator, client: Any) -> None:
    """``snapshot_directory`` keeps one directory as an image that ``mount_image`` puts at a
    path of a running sandbox, over what was there until ``unmount_image`` (a filesystem
    snapshot and an empty image mount too)."""
    first = create(client)
    second = create(client)
    try:
        first.filesystem.write_text("v1", "/root/project/src/main.py")
        snap = first.snapshot_directory("/root/project")
        assert emu.core.kept[snap.object_id].expires_at is not None
        second.filesystem.write_text("own", "/srv/app/own.txt")
        second.mount_image("/srv/app", snap)
        assert second.filesystem.read_text("/srv/app/src/main.py") == "v1"
        assert second.exec("ls", "/srv/app").stdout.read() == "src\n"
        second.unmount_image("/srv/app")
        assert second.exec("ls", "/srv/app").stdout.read() == "own.txt\n"
        second.mount_image("/srv/empty", modal.Image.from_scratch())
        assert second.exec("ls", "-A", "/srv/empty").stdout.read() == ""
        second.mount_image("/mnt/whole", first.snapshot_filesystem())
        assert second.filesystem.read_text("/mnt/whole/root/project/src/main.py") == "v1"
        with pytest.raises(mx.NotFoundError):
            second.unmount_image("/srv/app")
    finally:
        first.terminate()
        second.terminate()
    modal.experimental.image_delete(snap.object_id, client=client)
    assert snap.object_id not in emu.core.kept


def test_a_v1_sandboxs_entrypoint_streams_through_the_control_plane(client: Any) -> None:
    """A V1 (GPU) sandbox's entrypoint is read with ``SandboxGetLogs`` and fed with
    ``SandboxStdinWrite``."""
    sb = create(client, "bash", "-c", "read -r l; echo out $l; echo é >&2; exit 4", gpu="T4")
    sb.stdin.write(b"v1\n")
    sb.stdin.drain()
    sb.wait()
    assert (sb.returncode, sb.stdout.read(), sb.stderr.read()) == (4, "out v1\n", "é\n")


def test_a_dockerfiles_copy_places_files_as_docker_does(client: Any, tmp_path: Path) -> None:
    """``Image.from_dockerfile``'s ``COPY``: a directory's contents into the destination, a
    file to a destination path or into a destination directory, relative to the WORKDIR."""
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "x.py").write_text("x")
    (tmp_path / "y.txt").write_text("y")
    dockerfile = tmp_path / "Dockerfile"
    copies = "COPY sub/ /dst/\nCOPY y.txt /etc2/z.txt\nCOPY y.txt sub/x.py multi/\nCOPY y.txt .\n"
    dockerfile.write_text(f"FROM {IMAGE}\nWORKDIR /srv\n{copies}")
    image = modal.Image.from_dockerfile(dockerfile, context_dir=tmp_path)
    sb = create(client, "bash", "-c", "find /dst /etc2 /srv -type f | sort", image=image)
    sb.wait()
    found = "/dst/x.py\n/etc2/z.txt\n/srv/multi/x.py\n/srv/multi/y.txt\n/srv/y.txt\n"
    assert sb.stdout.read() == found


def test_a_connect_token_reaches_the_port_it_names(emu: ModalEmulator, client: Any) -> None:
    """``create_connect_token`` gives a URL and a token: the edge forwards a request bearing
    the token (``Authorization: Bearer`` or ``_modal_connect_token``) to the port, and
    refuses one without (401)."""
    port = free_port()
    server = f"import http.server as h; h.test(h.SimpleHTTPRequestHandler, port={port})"
    sb = create(client, "python3", "-c", server, readiness_probe=modal.Probe.with_tcp(port))
    stranger = create(client)
    try:
        sb.wait_until_ready(timeout=10)
        creds = sb.create_connect_token(user_metadata={"user": "a"}, port=port)
        bearer = {"Authorization": f"Bearer {creds.token}"}
        assert through_tunnel(emu, creds.url + "/", bearer).status_code == 200
        with_query = f"{creds.url}/?_modal_connect_token={creds.token}"
        assert through_tunnel(emu, with_query).status_code == 200
        assert through_tunnel(emu, creds.url + "/").status_code == 401
        other = {"Authorization": f"Bearer {stranger.create_connect_token(port=port).token}"}
        assert through_tunnel(emu, creds.url + "/", other).status_code == 401
    finally:
        sb.terminate()
        stranger.terminate()


@pytest.mark.parametrize("version", [None, 2])
def test_a_volumes_file_api(client: Any, version: int | None) -> None:
    """``batch_upload`` (V1: mount contents, a blob from 4 MiB; V2: 8 MiB blocks, those
    missing PUT to their URLs), ``listdir``, ``read_file`` and ``read_file_into_fileobj``
    (a block URL each), ``copy_files``, ``remove_file``, ``commit`` and ``reload``."""
    vol = modal.Volume.from_name("files", create_if_missing=True, version=version, client=client)
    big = os.urandom(1024) + b"\0" * (9 * 1024 * 1024) + b"end"  # blocks past the zeros
    with vol.batch_upload() as batch:
        batch.put_file(io.BytesIO(b"hello"), "/a/hello.txt")
        batch.put_file(io.BytesIO(big), "/big.bin")
    with pytest.raises(FileExistsError), vol.batch_upload() as batch:
        batch.put_file(io.BytesIO(b"again"), "/a/hello.txt")
    listed = [(e.path, e.type, e.size) for e in vol.listdir("/", recursive=True)]
    file = FileEntryType.FILE
    assert listed[1:] == [("a/hello.txt", file, 5), ("big.bin", file, len(big))]
    assert [e.path for e in vol.listdir("/a")] == ["a/hello.txt"]
    assert b"".join(vol.read_file("a/hello.txt")) == b"hello"
    into = io.BytesIO()
    assert vol.read_file_into_fileobj("big.bin", into) == len(big)
    assert into.getvalue() == big
    vol.copy_files(["a/hello.txt"], "b/copy.txt")
    vol.remove_file("big.bin")
    with pytest.raises(FileNotFoundError):
        b"".join(vol.read_file("big.bin"))
    with pytest.raises(mx.InvalidError):
        vol.remove_file("a")
    vol.remove_file("a", recursive=True)
    vol.commit()
    vol.reload()
    assert [e.path for e in vol.listdir("/", recursive=True)] == ["b", "b/copy.txt"]


def test_volumes_by_name(client: Any) -> None:
    """Named volumes: looked up (NOT_FOUND unless created), created once, listed newest
    first, renamed and deleted; an ephemeral volume has no name and is not listed."""
    with pytest.raises(mx.NotFoundError):
        modal.Volume.from_name("absent", client=client).hydrate()
    modal.Volume.objects.create("one", client=client)
    with pytest.raises(mx.AlreadyExistsError):
        modal.Volume.objects.create("one", client=client)
    modal.Volume.objects.create("one", allow_existing=True, client=client)
    two = modal.Volume.from_name("two", create_if_missing=True, client=client).hydrate()
    assert modal.Volume.from_id(two.object_id, client=client).hydrate().name == "two"
    with modal.Volume.ephemeral(client=client) as scratch:
        assert scratch.listdir("/") == []
        assert [v.name for v in modal.Volume.objects.list(client=client)] == ["two", "one"]
    modal.Volume.rename("two", "three", client=client)
    modal.Volume.objects.delete("one", client=client)
    assert [v.name for v in modal.Volume.objects.list(client=client)] == ["three"]
    with pytest.raises(mx.NotFoundError):
        modal.Volume.objects.delete("one", client=client)


def test_a_volume_is_shared_by_the_sandboxes_mounting_it(
    emu: ModalEmulator, client: Any, tmp_path: Path
) -> None:
    """``Sandbox.create(volumes=...)`` mounts the volume's files for real: one sandbox's
    writes are read by another (a ``sub_path`` mount shows that directory, ``read_only``
    refuses writes), by its file API and by the volume's; a snapshot leaves them out. A
    5 MiB image file goes as a blob."""
    vol = modal.Volume.from_name("shared", create_if_missing=True, client=client)
    with vol.batch_upload() as batch:
        batch.put_file(io.BytesIO(b"seed"), "/users/u1/seed.txt")
    (tmp_path / "big.bin").write_bytes(b"b" * (5 * 1024 * 1024))
    image = modal.Image.from_registry(IMAGE).add_local_file(tmp_path / "big.bin", "/opt/big.bin")
    writer = create(client, image=image, volumes={"/mnt/data": vol})
    mine = vol.with_mount_options(sub_path="/users/u1", read_only=True)
    reader = create(client, volumes={"/home/u": mine})
    try:
        assert writer.exec("stat", "-c", "%s", "/opt/big.bin").stdout.read() == "5242880\n"
        script = "cat /mnt/data/users/u1/seed.txt && echo hi > /mnt/data/users/u1/new.txt"
        assert writer.exec("bash", "-c", script).stdout.read() == "seed"
        writer.reload_volumes()
        assert reader.exec("cat", "/home/u/new.txt").stdout.read() == "hi\n"
        writer.filesystem.write_text("back", "/mnt/data/users/u1/back.txt")
        assert reader.exec("cat", "/home/u/back.txt").stdout.read() == "back"
        assert b"".join(vol.read_file("users/u1/back.txt")) == b"back"
        with pytest.raises(mx.SandboxFilesystemPermissionError):
            reader.filesystem.write_text("no", "/home/u/back.txt")
        if emu.core.confinement != "none":  # on a bare host only the file API is kept out
            assert reader.exec("touch", "/home/u/no").wait() == 1
        snap = writer.snapshot_filesystem()
    finally:
        writer.terminate()
        reader.terminate()
    later = create(client, image=snap)
    try:
        assert later.exec("ls", "-A", "/mnt/data").stdout.read() == ""
    finally:
        later.terminate()
    assert [e.path for e in vol.listdir("users/u1")] == [
        "users/u1/back.txt",
        "users/u1/new.txt",
        "users/u1/seed.txt",
    ]


def test_an_exec_outlives_the_intermediate_process_that_joined_it_to_the_container(
    emu: ModalEmulator, client: Any
) -> None:
    """bubblewrap joins an exec to the container's PID namespace through an intermediate
    process that exits once it forked the command; with ``--die-with-parent`` the command
    tied its life to that process, and one that exited late (a loaded machine: the
    command ran first) killed it with SIGKILL (exit 137, no output). strace delays the
    intermediate's exit by 0.3 s here; the command, 0.6 s long, finishes."""
    if emu.core.confinement != "bwrap" or shutil.which("strace") is None:
        pytest.skip("needs bubblewrap and strace (apt-get install bubblewrap strace)")
    sb = create(client)
    try:
        assert sb.exec("true").wait() == 0  # the container's namespace holder runs
        container = emu.core.sandboxes[sb.object_id]
        delayed = ["strace", "-f", "-qq", "-o", "/dev/null", "-e", "trace=exit_group"]
        delayed += ["-e", "inject=exit_group:delay_enter=300000:when=1"]
        command = [*container._bwrap("/"), "/bin/sh", "-c", "sleep 0.6; echo done"]
        ran = subprocess.run([*delayed, *command], capture_output=True, timeout=30, check=False)
        assert (ran.returncode, ran.stdout) == (0, b"done\n"), ran.stderr
    finally:
        sb.terminate()
