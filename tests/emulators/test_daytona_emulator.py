"""Contract tests: the real daytona SDK (sync Daytona and AsyncDaytona) against the emulator.

If Daytona's wire protocol moves under a new SDK version, these fail first.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import re
import time
import tracemalloc
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from subprocess import PIPE
from typing import Any

import aiohttp
import pytest
import socketio  # type: ignore[import-untyped]
from daytona import (
    AsyncDaytona,
    CreateSandboxFromImageParams,
    CreateSandboxFromSnapshotParams,
    Daytona,
    DaytonaAuthenticationError,
    DaytonaBadRequestError,
    DaytonaConfig,
    DaytonaConflictError,
    DaytonaError,
    DaytonaForbiddenError,
    DaytonaNotFoundError,
    DaytonaRateLimitError,
    DaytonaTimeoutError,
    FileDownloadRequest,
    FileUpload,
    ListSandboxesQuery,
    Resources,
    SessionExecuteRequest,
    VolumeMount,
)

from emulators.daytona import TEST_API_KEY, DaytonaEmulator
from emulators.daytona.terminals import Terminal
from emulators.harness import Emulator
from emulators.latency import LatencyProfile
from providers.local import LocalProcess
from tests.polling import until
from tests.warned import warns


@pytest.fixture
def emu(daytona_emulator: Emulator) -> Iterator[DaytonaEmulator]:
    assert isinstance(daytona_emulator, DaytonaEmulator)
    daytona_emulator.reap_interval = 0.1
    yield daytona_emulator
    assert daytona_emulator.alive() == [], "a test left a sandbox alive"


@pytest.fixture
async def client(emu: DaytonaEmulator) -> AsyncIterator[AsyncDaytona]:
    daytona = AsyncDaytona(DaytonaConfig(**emu.sdk_config()))
    yield daytona
    emu.clear_faults()
    async for sandbox in daytona.list():
        await sandbox.delete()
    await daytona.close()


async def api(emu: DaytonaEmulator, method: str, path: str, **kw: Any) -> tuple[int, Any]:
    """One raw request to the emulator's API, for what the SDK does not show."""
    headers = {"Authorization": f"Bearer {kw.pop('key', TEST_API_KEY)}"}
    async with (
        aiohttp.ClientSession() as http,
        http.request(method, emu.api_url + path, headers=headers, **kw) as response,
    ):
        body = await response.read()
        return response.status, json.loads(body) if body else None


def demux(output: str) -> tuple[str, str]:
    """Split the daemon's log, each line labelled with its stream's prefix."""
    streams = {"\x01": "", "\x02": ""}
    for chunk in re.split(r"(\x01\x01\x01|\x02\x02\x02)", output)[1:]:
        if chunk in ("\x01\x01\x01", "\x02\x02\x02"):
            current = chunk[0]
        else:
            streams[current] += chunk
    return streams["\x01"], streams["\x02"]


def test_sync_sdk_smoke(emu: DaytonaEmulator) -> None:
    """The sync client, polling states (its Socket.IO thread has no way to be closed)."""
    with warns(DeprecationWarning, match="Polling-only"):
        daytona = Daytona(DaytonaConfig(**emu.sdk_config(), use_deprecated_polling=True))
    emu.boot_seconds = 0.3
    sandbox = daytona.create(
        CreateSandboxFromSnapshotParams(labels={"team": "a"}, env_vars={"G": "g"}), timeout=10
    )
    try:
        assert sandbox.state == "started"
        ran = sandbox.process.exec("echo out $G; pwd; echo err >&2; exit 3")
        assert (ran.result, ran.exit_code) == ("out g\n/home/daytona\nerr\n", 3)
        sandbox.process.create_session("s")
        split = sandbox.process.execute_session_command(
            "s", SessionExecuteRequest(command="echo out; echo err >&2; false")
        )
        assert (split.stdout, split.stderr, split.exit_code) == ("out\n", "err\n", 1)
        blob = bytes(range(256)) * 64
        sandbox.fs.upload_file(blob, "bin/blob")
        assert sandbox.fs.download_file("/home/daytona/bin/blob") == blob
        assert [f.name for f in sandbox.fs.list_files("bin")] == ["blob"]
        listed = daytona.list(ListSandboxesQuery(labels={"team": "a"}))
        assert [s.id for s in listed] == [sandbox.id]
        assert daytona.get(sandbox.id).labels["code-toolbox-language"] == "python"
    finally:
        daytona.delete(sandbox)
    with pytest.raises(DaytonaNotFoundError):
        daytona.get(sandbox.id)
    (record,) = emu.records()
    assert (record.id, record.ended_by, record.labels["team"]) == (sandbox.id, "kill", "a")


async def test_events_announce_each_state(emu: DaytonaEmulator, client: AsyncDaytona) -> None:
    """The SDK learns that a sandbox started from the gateway, not from polling (1 s)."""
    seen: list[tuple[str, str, str]] = []
    listener = socketio.AsyncClient()

    @listener.on("sandbox.state.updated")  # type: ignore[untyped-decorator]
    async def updated(data: dict[str, Any]) -> None:
        seen.append((data["sandbox"]["id"], data["oldState"], data["newState"]))

    await listener.connect(
        emu.url, socketio_path="/api/socket.io/", auth={"token": TEST_API_KEY}, wait=True
    )
    emu.boot_seconds = 0.3
    try:
        started = time.monotonic()
        sandbox = await client.create(timeout=10)
        assert time.monotonic() - started < 0.9
        await sandbox.delete()
        for _ in range(40):
            if len(seen) == 3:
                break
            await asyncio.sleep(0.05)
        assert seen == [
            (sandbox.id, "creating", "started"),
            (sandbox.id, "started", "destroying"),
            (sandbox.id, "destroying", "destroyed"),
        ]
    finally:
        await listener.disconnect()
    stranger = socketio.AsyncClient()
    emu.core.accepted_keys = {TEST_API_KEY}
    with pytest.raises(socketio.exceptions.ConnectionError):
        await stranger.connect(
            emu.url, socketio_path="/api/socket.io/", auth={"token": "dtn_other"}, wait=True
        )
    emu.core.accepted_keys = None


async def test_list_pages_filters_and_privacy(emu: DaytonaEmulator, client: AsyncDaytona) -> None:
    made = [
        await client.create(CreateSandboxFromSnapshotParams(labels={"i": str(i % 2)}))
        for i in range(5)
    ]
    query = ListSandboxesQuery(labels={"i": "0"}, limit=2)
    assert sorted(s.id for s in [s async for s in client.list(query)]) == sorted(
        s.id for s in made[::2]
    )
    status, first = await api(emu, "GET", "/sandbox", params={"limit": "2"})
    assert (status, len(first["items"]), first["nextCursor"] is not None) == (200, 2, True)
    pages = [first]
    while pages[-1]["nextCursor"]:
        _, page = await api(
            emu, "GET", "/sandbox", params={"limit": "2", "cursor": pages[-1]["nextCursor"]}
        )
        pages.append(page)
    ids = [item["id"] for page in pages for item in page["items"]]
    assert (len(pages), ids) == (3, [s.id for s in reversed(made)])
    assert "env" not in pages[0]["items"][0], "list items are SandboxListItem"
    status, body = await api(emu, "GET", "/sandbox", params={"labels": "{not json"})
    assert (status, body["statusCode"], body["error"]) == (400, 400, "Bad Request")
    status, other = await api(emu, "GET", "/sandbox", key="dtn_another_org")
    assert (status, other) == (200, {"items": [], "nextCursor": None})
    status, body = await api(emu, "GET", f"/sandbox/{made[0].id}", key="dtn_another_org")
    assert (status, body["message"]) == (404, "Sandbox not found")
    named = await client.create(CreateSandboxFromSnapshotParams(name="by-name"))
    assert (await client.get("by-name")).id == named.id


async def test_sessions_keep_shell_state(client: AsyncDaytona) -> None:
    sandbox = await client.create()
    process = sandbox.process
    await process.create_session("work")
    await process.execute_session_command(
        "work", SessionExecuteRequest(command="mkdir -p w && cd w && export X=kept")
    )
    split = await process.execute_session_command(
        "work", SessionExecuteRequest(command="pwd; echo $X; printf partial; echo bad >&2")
    )
    assert (split.stdout, split.stderr, split.exit_code) == (
        "/home/daytona/w\nkept\npartial",
        "bad\n",
        0,
    )
    assert demux(split.output or "") == (split.stdout, split.stderr)
    started = await process.execute_session_command(
        "work", SessionExecuteRequest(command="sleep 0.2; echo late; exit 5", run_async=True)
    )
    assert started.exit_code is None
    for _ in range(40):
        command = await process.get_session_command("work", started.cmd_id)
        if command.exit_code is not None:
            break
        await asyncio.sleep(0.05)
    assert command.exit_code == 5
    logs = await process.get_session_command_logs("work", started.cmd_id)
    assert (logs.stdout, logs.stderr) == ("late\n", "")
    assert [c.exit_code for c in (await process.get_session("work")).commands] == [0, 0, 5]
    await process.delete_session("work")
    with pytest.raises(DaytonaNotFoundError):
        await process.get_session("work")


async def test_files_round_trip_with_exact_names(client: AsyncDaytona) -> None:
    sandbox = await client.create()
    names = ["plain.txt", "with space.txt", "é-ü.bin", 'quote"d.txt', "semi;colon=x.txt"]
    await sandbox.fs.upload_files(
        [FileUpload(f"{i}:{name}".encode(), f"tricky/{name}") for i, name in enumerate(names)]
    )
    wanted = [f"tricky/{name}" for name in names] + ["/home/daytona/tricky/plain.txt", "nope"]
    results = await sandbox.fs.download_files([FileDownloadRequest(source=p) for p in wanted])
    assert [r.source for r in results] == wanted
    assert [r.result for r in results[:-1]] == [
        *(f"{i}:{name}".encode() for i, name in enumerate(names)),
        b"0:plain.txt",
    ]
    missing = results[-1]
    assert missing.error == "file not found: nope"
    assert missing.error_details is not None
    assert (missing.error_details.status_code, missing.error_details.code) == (
        404,
        "FILE_NOT_FOUND",
    )
    listed = await sandbox.fs.list_files("tricky")
    assert sorted(f.name for f in listed) == sorted(names)
    assert {f.path for f in listed} == {f"tricky/{name}" for name in names}
    with pytest.raises(DaytonaError, match="/etc/x: read-only file system"):
        await sandbox.fs.upload_file(b"x", "/etc/x")


async def test_commands_and_code(client: AsyncDaytona) -> None:
    sandbox = await client.create(CreateSandboxFromSnapshotParams(env_vars={"G": "g"}))
    await sandbox.process.exec("mkdir -p sub")
    ran = await sandbox.process.exec("pwd; echo $G $L", cwd="sub", env={"L": "l"})
    assert (ran.result, ran.exit_code) == ("/home/daytona/sub\ng l\n", 0)
    started = time.monotonic()
    with pytest.raises(DaytonaTimeoutError, match="timeout"):
        await sandbox.process.exec("sleep 30", timeout=1)
    assert time.monotonic() - started < 3
    code = await sandbox.process.code_run("import sys\nprint(6 * 7)\nsys.exit(2)")
    assert (code.result, code.exit_code) == ("42\n", 2)
    assert await sandbox.get_work_dir() == "/home/daytona"


async def test_image_sandboxes_build_then_start(emu: DaytonaEmulator, client: AsyncDaytona) -> None:
    states: list[str] = []
    emu.core.on_state = lambda box, old, new: states.append(new)
    image = CreateSandboxFromImageParams(
        image="python:3.12-slim", resources=Resources(cpu=2, memory=4)
    )
    sandbox = await client.create(image, timeout=10)
    assert states == ["building_snapshot", "started"]
    assert (sandbox.cpu, sandbox.memory, sandbox.disk, sandbox.snapshot) == (2, 4, 3, None)
    assert sandbox.build_info is not None
    assert sandbox.build_info.dockerfile_content.startswith("FROM python:3.12-slim")
    status, body = await api(emu, "POST", "/sandbox", json={"snapshot": "base", "cpu": 4})
    assert (status, "snapshot" in body["message"]) == (400, True)


async def test_lifecycle_intervals(emu: DaytonaEmulator, client: AsyncDaytona) -> None:
    emu.core.minute = 0.3
    kept = await client.create(
        CreateSandboxFromSnapshotParams(auto_stop_interval=1, auto_delete_interval=-1)
    )
    ephemeral = await client.create(
        CreateSandboxFromSnapshotParams(auto_stop_interval=1, ephemeral=True)
    )
    short = await client.create(
        CreateSandboxFromSnapshotParams(ttl_minutes=1, auto_stop_interval=0)
    )
    for _ in range(40):
        if {r.id for r in emu.alive()} == {kept.id}:
            break
        await asyncio.sleep(0.05)
    assert {r.id: r.ended_by for r in emu.records()} == {
        kept.id: None,
        ephemeral.id: "expired",
        short.id: "expired",
    }
    await kept.refresh_data()
    assert kept.state == "stopped"
    await kept.start(timeout=5)
    assert (await kept.process.exec("echo again")).result == "again\n"


async def test_faults_carry_the_api_shape(emu: DaytonaEmulator, client: AsyncDaytona) -> None:
    emu.inject("create", status=429, retry_after=7)
    with pytest.raises(DaytonaRateLimitError) as limited:
        await client.create()
    assert limited.value.headers["Retry-After"] == "7"
    emu.inject("create", status=403)
    with pytest.raises(DaytonaForbiddenError, match=r"Total CPU limit exceeded\. Maximum"):
        await client.create()
    emu.set_quota(max_concurrent=1)
    first = await client.create()
    with pytest.raises(DaytonaForbiddenError, match="Maximum allowed: 1"):
        await client.create()
    await first.delete()
    emu.inject("boot", status=500, message="no runner available")
    with pytest.raises(DaytonaError, match="entered error state"):
        await client.create()
    (failed,) = [box for box in emu.core.boxes.values() if box.state == "error"]
    status, body = await api(emu, "GET", f"/sandbox/{failed.id}")
    assert (status, body["errorReason"]) == (200, "no runner available")
    emu.core.accepted_keys = {"dtn_only_this_one"}
    with pytest.raises(DaytonaAuthenticationError):
        await client.get(failed.id)
    emu.core.accepted_keys = None


async def test_toolbox_answers_like_the_daemon(emu: DaytonaEmulator, client: AsyncDaytona) -> None:
    sandbox = await client.create()
    headers = {"Authorization": f"Bearer {TEST_API_KEY}"}
    base = f"{sandbox.toolbox_proxy_url}/{sandbox.id}"
    async with aiohttp.ClientSession(headers=headers) as http:
        async with http.post(f"{base}/files/bulk-download", json={"paths": ["a b"]}) as response:
            raw = await response.read()
            boundary = response.headers["Content-Type"].split("boundary=")[1]
        part = raw.split(f"--{boundary}".encode())[1]
        assert b'name="error"; filename="a b"' in part
        error = json.loads(part.split(b"\r\n\r\n", 1)[1].rstrip(b"\r\n"))
        assert (error["code"], error["source"]) == ("FILE_NOT_FOUND", "DAYTONA_DAEMON")
        form = aiohttp.FormData()
        form.add_field("files[0].file", b"named", filename="dir/by-name.txt")
        async with http.post(f"{base}/files/bulk-upload", data=form) as response:
            assert response.status == 200
        assert await sandbox.fs.download_file("dir/by-name.txt") == b"named"
        await sandbox.delete()
        async with http.get(f"{base}/files", params={"path": "."}) as response:
            body = await response.json()
        assert (response.status, body["source"]) == (404, "DAYTONA_PROXY")


async def test_the_whole_filesystem_and_unknown_routes(isolation: str) -> None:
    """/tmp and cwd="/" work as on Daytona, and a route Daytona lacks is the SDK's not-found."""
    with DaytonaEmulator(isolation=isolation) as emu:
        daytona = AsyncDaytona(DaytonaConfig(**emu.sdk_config()))
        try:
            sandbox = await daytona.create(timeout=10)
            await sandbox.fs.upload_file(b"tmp file", "/tmp/x")
            assert await sandbox.fs.download_file("/tmp/x") == b"tmp file"
            ran = await sandbox.process.exec("pwd; cat /tmp/x; echo; echo ~", cwd="/")
            assert ran.result == "/\ntmp file\n/home/daytona\n"
            assert {"home", "tmp", "usr"} <= {f.name for f in await sandbox.fs.list_files("/")}
            await sandbox.process.create_session("s")
            await sandbox.process.execute_session_command(
                "s", SessionExecuteRequest(command="cd /tmp")
            )
            here = await sandbox.process.execute_session_command(
                "s", SessionExecuteRequest(command="pwd")
            )
            assert here.stdout == "/tmp\n"
            with pytest.raises(
                DaytonaNotFoundError, match="Cannot DELETE /api/sandbox/"
            ) as missing:
                await sandbox.revoke_ssh_access("token")
            assert missing.value.status_code == 404
            await sandbox.delete()
        finally:
            await daytona.close()


async def test_session_logs_stream_over_the_websocket(client: AsyncDaytona) -> None:
    sandbox = await client.create(CreateSandboxFromSnapshotParams())
    process = sandbox.process
    await process.create_session("bg")
    started = await process.execute_session_command(
        "bg", SessionExecuteRequest(command="echo one; sleep 1; echo two >&2", run_async=True)
    )
    assert started.cmd_id
    seen: list[tuple[str, str, float]] = []
    begun = time.monotonic()
    await process.get_session_command_logs_async(
        "bg",
        started.cmd_id,
        lambda text: seen.append(("out", text, time.monotonic() - begun)),
        lambda text: seen.append(("err", text, time.monotonic() - begun)),
    )
    assert [(kind, text) for kind, text, _ in seen] == [("out", "one\n"), ("err", "two\n")]
    assert seen[0][2] < 0.9  # streamed while the command still ran
    assert (await process.get_session_command("bg", started.cmd_id)).exit_code == 0
    replay: list[str] = []
    await process.get_session_command_logs_async("bg", started.cmd_id, replay.append, replay.append)
    assert "".join(replay) == "one\ntwo\n"  # from the start again, for a reattach

    sleeper = await process.execute_session_command(
        "bg", SessionExecuteRequest(command="echo up; sleep 60", run_async=True)
    )
    assert sleeper.cmd_id
    follow = asyncio.ensure_future(
        process.get_session_command_logs_async("bg", sleeper.cmd_id, replay.append, replay.append)
    )
    await asyncio.sleep(0.3)
    await process.delete_session("bg")  # ends the command: the stream closes normally
    await asyncio.wait_for(follow, 5)
    assert await process.list_sessions() == []


async def test_pty_create_resize_input_and_kill(client: AsyncDaytona) -> None:
    from daytona.common.pty import PtySize

    sandbox = await client.create(CreateSandboxFromSnapshotParams())
    seen = bytearray()
    handle = await sandbox.process.create_pty_session(
        "tty", seen.extend, cwd="/tmp", envs={"MOOD": "calm"}, pty_size=PtySize(rows=24, cols=80)
    )

    await handle.send_input("echo mood=$MOOD; pwd; stty size\n")
    await until(lambda: b"24 80" in seen, 10)
    assert b"24 80" in seen
    assert b"mood=calm" in seen
    assert b"/tmp" in seen
    info = await handle.resize(PtySize(rows=30, cols=100))
    assert (info.rows, info.cols, info.active) == (30, 100, True)
    await handle.send_input("stty size\n")
    await until(lambda: b"30 100" in seen, 10)
    assert b"30 100" in seen
    assert [s.id for s in await sandbox.process.list_pty_sessions()] == ["tty"]
    await handle.send_input("exit 3\n")
    assert (await asyncio.wait_for(handle.wait(), 10)).exit_code == 3
    await handle.disconnect()

    again = await sandbox.process.create_pty_session("tty2", seen.extend)
    await sandbox.process.kill_pty_session("tty2")
    assert (await asyncio.wait_for(again.wait(), 10)).exit_code == 137
    await again.disconnect()
    with pytest.raises(DaytonaNotFoundError):
        await sandbox.process.get_pty_session_info("tty2")


async def test_a_terminal_whose_leader_died_is_killed_with_the_rest_of_its_group(
    tmp_path: Path,
) -> None:
    """A terminal whose bridge does not end it is SIGKILLed with its whole group, even
    once the group's leader is reaped (as a bwrap a signal ended while it set up, its
    sandbox's init left behind holding the relay's pipe): the kill never waits forever."""
    ready = tmp_path / "ready"
    script = f"sh -c 'trap \"\" TERM; touch {ready}; exec sleep 60' & head -c 1 >/dev/null"
    proc = await asyncio.create_subprocess_exec(
        "sh", "-c", script, stdin=PIPE, stdout=PIPE, start_new_session=True
    )
    terminal = Terminal("pty", LocalProcess(proc, 1024), rows=10, cols=40, cwd="/", envs={})
    await until(ready.exists, 10)
    await asyncio.wait_for(terminal.kill(), 10)
    assert terminal.exit_code == 137


async def test_interpreter_keeps_state_and_times_out(client: AsyncDaytona) -> None:
    sandbox = await client.create(CreateSandboxFromSnapshotParams())
    interpreter = sandbox.code_interpreter
    first = await interpreter.run_code(
        "import sys\nkept = 41\nprint('set'); print('e', file=sys.stderr)"
    )
    assert (first.stdout, first.stderr, first.error) == ("set\n", "e\n", None)
    again = await interpreter.run_code("print(kept + 1)")
    assert again.stdout == "42\n"
    failed = await interpreter.run_code("1 / 0")
    assert failed.error is not None
    assert (failed.error.name, failed.error.value) == ("ZeroDivisionError", "division by zero")
    with pytest.raises(DaytonaTimeoutError):
        await interpreter.run_code("import time\ntime.sleep(30)", timeout=1)
    assert (await interpreter.run_code("print(kept)")).stdout == "41\n"  # interrupted, not lost


async def test_files_stream_both_ways_without_holding_them(client: AsyncDaytona) -> None:
    block = os.urandom(1 << 20)

    async def chunks() -> AsyncIterator[bytes]:
        for _ in range(24):
            yield block

    sandbox = await client.create()
    tracemalloc.start()
    try:
        await sandbox.fs.upload_file_stream(chunks(), "data/big.bin")
        digest = hashlib.sha256()
        async for chunk in await sandbox.fs.download_file_stream("data/big.bin"):
            digest.update(chunk)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
        await client.delete(sandbox)
    assert digest.hexdigest() == hashlib.sha256(block * 24).hexdigest()
    assert peak < 12 * (1 << 20), f"the transfer held {peak} bytes"  # of 24 MiB: SDK + emulator


async def test_a_stopped_sandbox_kept_by_its_auto_delete_is_started_again(
    client: AsyncDaytona,
) -> None:
    sandbox = await client.create(CreateSandboxFromSnapshotParams(auto_delete_interval=0))
    try:
        await sandbox.fs.upload_file(b"kept", "notes.txt")
        await sandbox.set_auto_delete_interval(-1)  # else a stop deletes it
        await sandbox.stop()
        await sandbox.start()
        assert await sandbox.fs.download_file("notes.txt") == b"kept"
    finally:
        await client.delete(sandbox)


async def test_a_sandboxs_snapshot_is_a_source_for_creates_until_deleted(
    emu: DaytonaEmulator, client: AsyncDaytona, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(emu, "boot_seconds", 0.3)  # long enough to see "removing"
    sandbox = await client.create(timeout=10)
    await sandbox.fs.upload_file(b"baked in", "app/config.txt")
    await sandbox.create_snapshot("emu-snap", timeout=10)
    assert sandbox.state == "started"
    snap = await client.snapshot.get("emu-snap")
    assert (snap.state, snap.source_sandbox_id) == ("active", sandbox.id)
    await sandbox.delete()
    child = await client.create(CreateSandboxFromSnapshotParams(snapshot=snap.id), timeout=10)
    assert await child.fs.download_file("app/config.txt") == b"baked in"
    await child.delete()
    await client.snapshot.delete("emu-snap")
    assert (await client.snapshot.get(snap.id)).state == "removing"
    with pytest.raises(DaytonaError, match="Snapshot emu-snap is removing"):
        await client.create(CreateSandboxFromSnapshotParams(snapshot="emu-snap"))
    await until(lambda: snap.id not in emu.captured)
    with pytest.raises(DaytonaNotFoundError, match="Snapshot emu-snap not found"):
        await client.snapshot.delete("emu-snap")


async def test_a_warm_pool_serves_creates_of_its_snapshot_at_once(
    emu: DaytonaEmulator, client: AsyncDaytona, monkeypatch: pytest.MonkeyPatch
) -> None:
    from daytona_api_client_async.exceptions import ApiException, NotFoundException

    monkeypatch.setattr(emu.core, "latency", LatencyProfile(0.3, 0.4))
    pool = await client.warm_pool.create("warm-snap", pool=2)
    assert (pool.snapshot, pool.target, pool.pool, pool.os_user) == (
        "warm-snap",
        "us",
        2,
        "daytona",
    )
    with pytest.raises(ApiException) as twice:
        await client.warm_pool.create("warm-snap", pool=1)
    assert twice.value.status == 409

    async def ready(wanted: int) -> int:
        """The pool's ready count once it reaches ``wanted`` (or after 3 s)."""
        for _ in range(60):
            (listed,) = [p for p in await client.warm_pool.list() if p.id == pool.id]
            if listed.current_size == wanted:
                break
            await asyncio.sleep(0.05)
        return int(listed.current_size)

    assert await ready(2) == 2
    assert await api(emu, "GET", "/warm-pools", key="dtn_" + "0" * 64) == (200, [])

    served = await client.create(
        CreateSandboxFromSnapshotParams(snapshot="warm-snap", labels={"job": "w"}), timeout=10
    )
    cold = await client.create(CreateSandboxFromSnapshotParams(snapshot="cold-snap"), timeout=10)
    with_env = await client.create(
        CreateSandboxFromSnapshotParams(snapshot="warm-snap", env_vars={"A": "1"}), timeout=10
    )
    assert emu.core.boxes[served.id].from_pool == pool.id
    assert (emu.core.boxes[cold.id].from_pool, emu.core.boxes[with_env.id].from_pool) == (
        None,
        None,
    )
    assert (served.state, served.labels["job"], served.snapshot) == ("started", "w", "warm-snap")
    assert (await served.process.exec("echo warm")).result.strip() == "warm"
    assert [s.id async for s in client.list(ListSandboxesQuery(labels={"job": "w"}))] == [served.id]
    await until(lambda: len(emu.alive()) == 5)
    assert len(emu.alive()) == 5, "the pool made a sandbox in place of the one it served"

    drained = await client.warm_pool.update(pool.id, pool=0)
    assert (drained.pool, drained.current_size) == (0, 0)
    assert len(emu.alive()) == 3
    await client.warm_pool.update(pool.id, pool=1)
    assert await ready(1) == 1
    await client.warm_pool.delete(pool.id)
    assert len(emu.alive()) == 3
    with pytest.raises(NotFoundException) as gone:
        await client.warm_pool.delete(pool.id)
    assert json.loads(gone.value.body)["message"] == f"Warm pool {pool.id} not found"
    for sandbox in (served, cold, with_env):
        await sandbox.delete()


async def test_files_are_managed_like_the_daemon_does(client: AsyncDaytona) -> None:
    """Folders, info, moves, deletes, permissions, content search and replace (e2e suite)."""
    sandbox = await client.create()
    fs = sandbox.fs
    await fs.create_folder("work/deep", "750")
    await fs.upload_files([FileUpload(b"old one\nno\nold two\n", "work/a.txt")])
    await fs.upload_files([FileUpload(b"\x00old", "work/deep/b.bin")])
    info = await fs.get_file_info("work/a.txt")
    assert (info.name, info.size, info.is_dir) == ("a.txt", 19, False)
    assert (info.owner, info.group) == (str(os.getuid()), str(os.getgid()))  # ids, as the daemon
    await sandbox.process.exec("ln -s deep work/link && ln -s deep work/link2")
    assert (await fs.get_file_info("work/link")).is_dir  # a symlink shows what it points to
    await fs.delete_file("work/link", recursive=True)  # the link goes, not what it points to
    await fs.move_files("work/link2", "work/link3")
    assert sorted(f.name for f in await fs.list_files("work")) == ["a.txt", "deep", "link3"]
    assert [f.name for f in await fs.list_files("work/deep")] == ["b.bin"]
    assert (await fs.get_file_info("work/deep")).permissions == "0750"
    found = await fs.find_files("work", "old")
    assert [(m.file, m.line, m.content) for m in found] == [
        ("work/a.txt", 1, "old one"),
        ("work/a.txt", 3, "old two"),
    ]
    assert (await fs.search_files("work", "*.bin")).files == ["work/deep/b.bin"]
    assert await fs.find_files("nowhere", "old") == []  # the daemon's walk skips what is missing
    assert (await fs.search_files("nowhere", "*")).files == []
    replaced = await fs.replace_in_files(["work/a.txt", "work/none"], "old", "new")
    assert [(r.file, r.success) for r in replaced] == [("work/a.txt", True), ("work/none", False)]
    assert await fs.download_file("work/a.txt") == b"new one\nno\nnew two\n"
    await fs.set_file_permissions("work/a.txt", mode="600")
    assert (await fs.get_file_info("work/a.txt")).permissions == "0600"
    await fs.move_files("work/a.txt", "/tmp/moved.txt")
    assert await fs.download_file("/tmp/moved.txt") == b"new one\nno\nnew two\n"
    with pytest.raises(DaytonaError, match="directory"):
        await fs.delete_file("work")
    await fs.delete_file("work", recursive=True)
    with pytest.raises(DaytonaNotFoundError):
        await fs.get_file_info("work")


async def test_settings_labels_and_archive(emu: DaytonaEmulator, client: AsyncDaytona) -> None:
    """What a sandbox's owner changes after the create, and an archive the sandbox starts from."""
    sandbox = await client.create()
    assert await sandbox.set_labels({"suite": "e2e"}) == {"suite": "e2e"}
    await sandbox.set_autostop_interval(30)
    await sandbox.set_auto_archive_interval(60)
    await sandbox.set_public(True)
    fetched = await client.get(sandbox.id)
    assert (fetched.labels, fetched.auto_stop_interval, fetched.auto_archive_interval) == (
        {"suite": "e2e"},
        30,
        60,
    )
    assert fetched.public
    await sandbox.fs.upload_file(b"kept", "notes.txt")
    with pytest.raises(DaytonaError, match="stopped"):
        await sandbox.archive()
    await sandbox.stop()
    await sandbox.archive()
    assert sandbox.state == "archived"
    await sandbox.start()
    assert await sandbox.fs.download_file("notes.txt") == b"kept"


async def test_metrics_live_and_over_time(client: AsyncDaytona) -> None:
    """The daemon's live sample and the control plane's series hold the sandbox's sizes."""
    sandbox = await client.create()
    await sandbox.fs.upload_file(b"x" * 5000, "blob.bin")
    live = await sandbox.get_metrics_latest()
    assert (live.cpu_count, live.mem_total, live.disk_total) == (1, 1 << 30, 3 << 30)
    assert 5000 <= live.disk_used <= live.disk_total
    series = await sandbox.get_metrics()
    assert series
    assert (series[-1].cpu_count, series[-1].mem_total) == (1, 1 << 30)


async def test_interpreter_contexts_are_isolated(client: AsyncDaytona) -> None:
    """A context made by ``create_context`` has its own namespace and working directory."""
    sandbox = await client.create()
    interpreter = sandbox.code_interpreter
    await sandbox.fs.create_folder("/tmp/ctx", "755")
    ctx = await interpreter.create_context(cwd="/tmp/ctx")
    assert (ctx.cwd, ctx.language, ctx.active) == ("/tmp/ctx", "python", True)
    await interpreter.run_code("kept = 7", context=ctx)
    ran = await interpreter.run_code("import os\nprint(kept, os.getcwd())", context=ctx)
    assert ran.stdout == "7 /tmp/ctx\n"
    default = await interpreter.run_code("print(kept)")
    assert default.error is not None
    assert default.error.name == "NameError"
    assert [c.id for c in await interpreter.list_contexts()] == [ctx.id]
    await interpreter.delete_context(ctx)
    assert await interpreter.list_contexts() == []
    with pytest.raises(DaytonaError, match="context not found"):
        await interpreter.run_code("print(1)", context=ctx)


async def test_snapshots_list_the_general_ones_and_the_organizations(
    emu: DaytonaEmulator, client: AsyncDaytona
) -> None:
    """``snapshot.list`` pages the deployment's general snapshots and the organization's own."""
    general = await client.snapshot.list()
    assert [(s.name, s.general, s.state) for s in general.items] == [
        ("daytonaio/sandbox:0.5.0", True, "active")
    ]
    assert (general.total, general.page, general.total_pages) == (1, 1, 1)
    assert (await client.snapshot.get("daytonaio/sandbox:0.5.0")).general
    sandbox = await client.create()
    await sandbox.create_snapshot("mine", timeout=10)
    await until(lambda: len(emu.captured) == 1)
    first = await client.snapshot.list(page=1, limit=1)
    assert ([s.name for s in first.items], first.total, first.total_pages) == (["mine"], 2, 2)
    second = await client.snapshot.list(page=2, limit=1)
    assert [s.name for s in second.items] == ["daytonaio/sandbox:0.5.0"]
    by_source = await client.snapshot.list(source_sandbox_id=sandbox.id)
    assert [s.name for s in by_source.items] == ["mine"]
    await client.snapshot.delete("mine")
    await until(lambda: not emu.captured)


async def test_an_async_session_command_reads_the_input_sent_to_it(client: AsyncDaytona) -> None:
    """Async commands keep stdin open for ``send_session_command_input`` (echoed in the log);
    sync ones see EOF at once; input to an ended command is refused with 410."""
    sandbox = await client.create()
    process = sandbox.process
    await process.create_session("s")
    synced = await process.execute_session_command(
        "s", SessionExecuteRequest(command="cat; echo ok")
    )
    assert (synced.exit_code, synced.stdout) == (0, "ok\n")
    asked = await process.execute_session_command(
        "s",
        SessionExecuteRequest(command='read -r name; echo "hi $name"', run_async=True),
    )
    assert asked.cmd_id
    await process.send_session_command_input("s", asked.cmd_id, "Ada")
    seen: list[str] = []
    await asyncio.wait_for(
        process.get_session_command_logs_async("s", asked.cmd_id, seen.append, seen.append), 5
    )
    assert "".join(seen) == "Ada\nhi Ada\n"
    with pytest.raises(DaytonaError, match="already completed"):
        await process.send_session_command_input("s", asked.cmd_id, "late")


async def test_preview_links_bare_signed_and_by_api_key(client: AsyncDaytona) -> None:
    """The link as the SDK gives it (no trailing slash) works with its token or the API key;
    a signed URL works bare until it expires or is expired."""
    sandbox = await client.create()
    await sandbox.fs.upload_file(b"served", "site/index.html")
    await sandbox.process.create_session("web")
    await sandbox.process.execute_session_command(
        "web",
        SessionExecuteRequest(
            command="cd site && exec python3 -m http.server 3917", run_async=True
        ),
    )
    link = await sandbox.get_preview_link(3917)

    async def fetch(url: str, **headers: str) -> tuple[int, str]:
        async with aiohttp.ClientSession() as http, http.get(url, headers=headers) as response:
            return response.status, await response.text()

    for _ in range(50):
        if (await fetch(link.url, **{"X-Daytona-Preview-Token": link.token}))[0] == 200:
            break
        await asyncio.sleep(0.1)
    assert await fetch(link.url, **{"X-Daytona-Preview-Token": link.token}) == (200, "served")
    assert await fetch(link.url, Authorization=f"Bearer {TEST_API_KEY}") == (200, "served")
    assert (await fetch(link.url))[0] == 401
    signed = await sandbox.create_signed_preview_url(3917, expires_in_seconds=1)
    assert (signed.port, signed.sandbox_id) == (3917, sandbox.id)
    assert await fetch(signed.url) == (200, "served")
    await asyncio.sleep(1.2)
    assert (await fetch(signed.url))[0] == 401
    again = await sandbox.create_signed_preview_url(3917)
    await sandbox.expire_signed_preview_url(3917, again.token)
    assert (await fetch(again.url))[0] == 401


async def test_an_image_create_streams_its_build_logs(
    emu: DaytonaEmulator, client: AsyncDaytona, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``on_snapshot_create_logs`` follows the (emulated) build's log until the sandbox starts."""
    monkeypatch.setattr(emu, "boot_seconds", 0.3)
    logs: list[str] = []
    image = CreateSandboxFromImageParams(image="python:3.12-slim")
    sandbox = await client.create(image, on_snapshot_create_logs=logs.append, timeout=20)
    assert sandbox.state == "started"
    assert any("FROM python:3.12-slim" in line for line in logs)


async def test_resize_hot_and_stopped(client: AsyncDaytona) -> None:
    """A started sandbox only grows CPU and memory; a stopped one changes them, grows its disk."""
    sandbox = await client.create()
    await sandbox.resize(Resources(cpu=2, memory=2))
    assert (sandbox.cpu, sandbox.memory, sandbox.disk, sandbox.state) == (2, 2, 3, "started")
    with pytest.raises(DaytonaError, match="stopped"):
        await sandbox.resize(Resources(disk=5))
    with pytest.raises(DaytonaError, match="increase"):
        await sandbox.resize(Resources(cpu=1))
    await sandbox.stop()
    await sandbox.resize(Resources(cpu=1, disk=5))
    assert (sandbox.cpu, sandbox.memory, sandbox.disk, sandbox.state) == (1, 2, 5, "stopped")
    with pytest.raises(DaytonaError, match="disk"):
        await sandbox.resize(Resources(disk=4))


async def test_the_entrypoint_session_is_the_images_command(client: AsyncDaytona) -> None:
    """Every sandbox has the ``entrypoint`` session: the image's command, still running."""
    sandbox = await client.create()
    session = await sandbox.process.get_entrypoint_session()
    assert session.session_id == "entrypoint"
    assert session.commands is not None
    assert [(c.command, c.exit_code) for c in session.commands] == [("sleep infinity", None)]
    logs = await sandbox.process.get_entrypoint_logs()
    assert (logs.stdout, logs.stderr) == ("", "")


async def test_presigned_file_urls(client: AsyncDaytona) -> None:
    """``download_url`` / ``upload_url`` work with no credentials until they expire or the
    sandbox's signing key is rotated."""
    sandbox = await client.create()
    await sandbox.fs.upload_file(b"signed body", "docs/a.txt")
    download = await sandbox.download_url("docs/a.txt")
    upload = await sandbox.upload_url("docs/b.bin")
    async with aiohttp.ClientSession() as http:
        async with http.get(download) as got:
            assert (got.status, await got.read()) == (200, b"signed body")
        form = aiohttp.FormData()
        form.add_field("file", b"uploaded", filename="b.bin")
        async with http.post(upload, data=form) as put:
            assert (put.status, (await put.json())["name"]) == (200, "b.bin")
        assert await sandbox.fs.download_file("docs/b.bin") == b"uploaded"
        async with http.post(upload, data=b"raw", headers={"Content-Type": "text/plain"}) as raw:
            assert raw.status == 200
        assert await sandbox.fs.download_file("docs/b.bin") == b"raw"
        async with http.get(download.replace("a.txt", "b.bin", 1)) as forged:
            assert forged.status == 401
        await sandbox.rotate_signing_key()
        async with http.get(download) as rotated:
            assert rotated.status == 401
        async with http.get(await sandbox.download_url("docs/a.txt", ttl_seconds=0)) as forever:
            assert forever.status == 200


async def test_a_snapshot_made_from_an_image_is_a_source_for_creates(
    emu: DaytonaEmulator, client: AsyncDaytona
) -> None:
    """``snapshot.create`` from an image name goes ``pending`` -> ``pulling`` -> ``active``
    (nothing is pulled: its sandboxes have the default filesystem) with the sizes asked."""
    from daytona import CreateSnapshotParams

    logs: list[str] = []
    snap = await client.snapshot.create(
        CreateSnapshotParams(
            name="py312", image="python:3.12-slim", resources=Resources(cpu=2, memory=2)
        ),
        on_logs=logs.append,
    )
    assert (snap.state, snap.image_name, snap.cpu, snap.mem, snap.general) == (
        "active",
        "python:3.12-slim",
        2,
        2,
        False,
    )
    assert logs[-1].startswith("Created snapshot py312")
    with pytest.raises(DaytonaError, match="latest"):
        await client.snapshot.create(CreateSnapshotParams(name="bad", image="python:latest"))
    with pytest.raises(DaytonaError, match="already exists"):
        await client.snapshot.create(CreateSnapshotParams(name="py312", image="python:3.12"))
    assert (await api(emu, "POST", f"/snapshots/{snap.id}/deactivate"))[0] == 204
    with pytest.raises(DaytonaError, match="inactive"):
        await client.create(CreateSandboxFromSnapshotParams(snapshot="py312"))
    assert (await client.snapshot.activate(snap)).state == "active"
    sandbox = await client.create(CreateSandboxFromSnapshotParams(snapshot="py312"))
    assert (sandbox.snapshot, sandbox.cpu, sandbox.memory) == ("py312", 2, 2)
    await client.snapshot.delete(snap)
    await until(lambda: not emu.captured)


async def test_a_snapshot_built_from_a_declarative_image(
    emu: DaytonaEmulator, client: AsyncDaytona, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A build snapshot (``buildInfo``) goes through ``building`` (long enough here for the
    SDK, which polls each second, to follow it); its log shows the steps."""
    from daytona import CreateSnapshotParams, Image

    monkeypatch.setattr(emu, "boot_seconds", 0.8)
    logs: list[str] = []
    image = Image.debian_slim("3.12").pip_install(["requests"])
    snap = await client.snapshot.create(
        CreateSnapshotParams(name="built", image=image), on_logs=logs.append
    )
    assert snap.state == "active"
    assert snap.build_info is not None
    assert "requests" in snap.build_info.dockerfile_content
    assert any(line.startswith("Step 1/") for line in logs)
    await client.snapshot.delete(snap)


async def test_exec_without_a_timeout_runs_to_the_end(
    client: AsyncDaytona, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The daemon puts no limit on an exec that names no timeout (it had a default of 10 s)."""
    from emulators.daytona import processes

    monkeypatch.setattr(processes, "EXECUTE_DEFAULT_TIMEOUT", 0.2, raising=False)
    sandbox = await client.create()
    ran = await sandbox.process.exec("sleep 0.5; echo done")
    assert (ran.exit_code, ran.result) == (0, "done\n")
    with pytest.raises(DaytonaError, match="cannot be empty"):
        await sandbox.process.exec("  ")


async def test_a_toolbox_route_the_emulator_lacks_is_not_a_missing_sandbox(
    client: AsyncDaytona,
) -> None:
    """Git (not emulated) answers the daemon's 404 for the route, not the proxy's
    "sandbox not found", which would send a user looking for a deleted sandbox."""
    sandbox = await client.create()
    with pytest.raises(DaytonaNotFoundError, match="route not found: GET /git/status") as missing:
        await sandbox.git.status("repo")
    assert missing.value.status_code == 404


async def test_set_ttl_counts_from_now(emu: DaytonaEmulator, client: AsyncDaytona) -> None:
    """``set_ttl`` destroys the sandbox that many minutes after the call, whatever its state."""
    emu.core.minute = 0.3
    sandbox = await client.create(CreateSandboxFromSnapshotParams(auto_stop_interval=0))
    await asyncio.sleep(0.4)  # longer than the TTL: counted from the call, not the create
    await sandbox.set_ttl(1)
    await sandbox.refresh_data()
    assert sandbox.state == "started"
    await until(lambda: not emu.alive(), 2)
    assert {r.id: r.ended_by for r in emu.records()} == {sandbox.id: "expired"}


async def test_network_settings_are_kept_and_updated(client: AsyncDaytona) -> None:
    """The create's network settings show on the sandbox and ``update_network_settings`` changes
    them (the emulator records them; its sandboxes share the host's network)."""
    sandbox = await client.create(
        CreateSandboxFromSnapshotParams(network_allow_list="10.0.0.0/24,192.168.1.0/16")
    )
    assert (sandbox.network_block_all, sandbox.network_allow_list) == (
        False,
        "10.0.0.0/24,192.168.1.0/16",
    )
    await sandbox.update_network_settings(network_block_all=True)
    fetched = await client.get(sandbox.id)
    assert (fetched.network_block_all, fetched.network_allow_list) == (
        True,
        "10.0.0.0/24,192.168.1.0/16",
    )
    with pytest.raises(DaytonaError, match="CIDR"):
        await client.create(CreateSandboxFromSnapshotParams(network_allow_list="nope"))


async def test_concurrent_uploads_to_one_sandbox_all_land(client: AsyncDaytona) -> None:
    """Each upload stages its files apart: one ending does not sweep another's away."""
    sandbox = await client.create()
    blobs = [bytes([i]) * (3 << 20) for i in range(6)]
    await asyncio.gather(
        *(sandbox.fs.upload_file(blob, f"up/{i}.bin") for i, blob in enumerate(blobs)),
        *(sandbox.fs.upload_file(b"small", f"up/s{i}.txt") for i in range(6)),
    )
    listed = {f.name: f.size for f in await sandbox.fs.list_files("up")}
    assert listed == {
        **{f"{i}.bin": 3 << 20 for i in range(6)},
        **{f"s{i}.txt": 5 for i in range(6)},
    }


async def test_volumes_are_made_found_and_deleted_as_on_daytona(
    emu: DaytonaEmulator, client: AsyncDaytona
) -> None:
    """The volume service's flows: pending_create then ready, by name or id, get-or-create,
    no delete while a sandbox mounts it, and a deleted volume's name free again; the
    gateway announces each step."""
    events: list[tuple[str, str, str]] = []
    listener = socketio.AsyncClient()
    for event in ("volume.created", "volume.state.updated", "volume.lastUsedAt.updated"):
        listener.on(event, lambda data, event=event: events.append((event, *_volume_of(data))))
    await listener.connect(
        emu.url, socketio_path="/api/socket.io/", auth={"token": TEST_API_KEY}, wait=True
    )
    emu.inject("volume", status=503)
    with pytest.raises(DaytonaError, match="Service Unavailable"):
        await client.volume.list()
    made = await client.volume.create("data")
    assert (made.name, made.state) == ("data", "pending_create")
    found = await client.volume.get("data", create=True)
    assert (found.id, found.state, found.last_used_at) == (made.id, "ready", None)
    with pytest.raises(DaytonaBadRequestError, match="Volume with name data already exists"):
        await client.volume.create("data")
    assert (await api(emu, "GET", f"/volumes/{made.id}"))[1]["name"] == "data"
    assert (await api(emu, "GET", f"/volumes/{made.id}", key="dtn_other"))[0] == 404
    with pytest.raises(DaytonaNotFoundError, match="Volume with name nope not found"):
        await client.volume.get("nope")
    sandbox = await client.create(
        CreateSandboxFromSnapshotParams(volumes=[VolumeMount(volume_id="data", mount_path="/v")])
    )
    assert [(v.volume_id, v.mount_path) for v in sandbox.volumes] == [(made.id, "/v")]
    assert (await client.volume.get("data")).last_used_at is not None
    with pytest.raises(DaytonaConflictError, match=f"in use by .* sandboxes .e.g. {sandbox.name}"):
        await client.volume.delete(found)
    for bad, message in [
        (VolumeMount(volume_id="nope", mount_path="/v"), "Volume 'nope' not found"),
        (VolumeMount(volume_id=made.id, mount_path="v"), "Invalid mount path v .must be absolute"),
        (VolumeMount(volume_id=made.id, mount_path="/etc/x"), "cannot mount to system directory"),
        (VolumeMount(volume_id=made.id, mount_path="/v", subpath="../x"), "cannot contain .."),
    ]:
        with pytest.raises(DaytonaError, match=message):
            await client.create(CreateSandboxFromSnapshotParams(volumes=[bad]))
    await sandbox.delete()
    await client.volume.delete(found)
    await until(lambda: emu.volumes is not None and emu.volumes.volumes[made.id].state == "deleted")
    assert [v.name for v in await client.volume.list()] == []
    status, listed = await api(emu, "GET", "/volumes?includeDeleted=true")
    assert status == 200
    assert [(v["name"], v["state"]) for v in listed] == [("data-deleted", "deleted")]
    again = await client.volume.get("data", create=True)
    assert again.id != made.id
    await until(lambda: (again.id, "ready") in {(v, state) for _, v, state in events})
    await listener.disconnect()
    assert [(e, state) for e, volume_id, state in events if volume_id == made.id] == [
        ("volume.created", "pending_create"),
        ("volume.state.updated", "ready"),
        ("volume.lastUsedAt.updated", "ready"),
        ("volume.state.updated", "pending_delete"),
        ("volume.state.updated", "deleting"),
        ("volume.state.updated", "deleted"),
    ]


def _volume_of(data: dict[str, Any]) -> tuple[str, str]:
    """The volume an event is about, and its state then."""
    volume = data.get("volume", data)
    return volume["id"], volume["state"]


async def test_a_volume_is_shared_by_sandboxes_and_outlives_them(isolation: str) -> None:
    """Files written under a mount path, by a command or the file API, are the volume's:
    another sandbox sees them at its own mount path (or a subpath's), after the first is gone;
    a snapshot of a sandbox keeps none of its volumes' files."""
    with DaytonaEmulator(isolation=isolation) as emu:
        daytona = AsyncDaytona(DaytonaConfig(**emu.sdk_config()))
        try:
            volume = await daytona.volume.get("shared", create=True)
            writer = await daytona.create(
                CreateSandboxFromSnapshotParams(
                    volumes=[VolumeMount(volume_id=volume.id, mount_path="/home/daytona/vol")]
                )
            )
            ran = await writer.process.exec("echo by-command > vol/a.txt && cd vol && pwd")
            assert (ran.exit_code, ran.result) == (0, "/home/daytona/vol\n")
            await writer.fs.upload_file(b"by-upload", "/home/daytona/vol/users/bob/b.txt")
            here = await writer.process.exec("pwd; ls users/bob", cwd="/home/daytona/vol")
            assert here.result == "/home/daytona/vol\nb.txt\n"
            await writer.delete()
            reader = await daytona.create(
                CreateSandboxFromSnapshotParams(
                    volumes=[
                        VolumeMount(volume_id=volume.id, mount_path="/data"),
                        VolumeMount(volume_id="shared", mount_path="/bob", subpath="users/bob"),
                    ]
                )
            )
            assert sorted(f.name for f in await reader.fs.list_files("/data")) == ["a.txt", "users"]
            assert await reader.fs.download_file("/bob/b.txt") == b"by-upload"
            seen = await reader.process.exec("cat /data/a.txt /bob/b.txt")
            assert seen.result == "by-command\nby-upload"
            await reader.fs.upload_file(b"new", "/bob/c.txt")
            assert await reader.fs.download_file("/data/users/bob/c.txt") == b"new"
            await reader.create_snapshot("with-volumes", timeout=10)
            await reader.delete()
            child = await daytona.create(CreateSandboxFromSnapshotParams(snapshot="with-volumes"))
            assert await child.fs.list_files("/data") == await child.fs.list_files("/bob") == []
            await child.delete()
            assert (emu.core.local.root / ".volumes" / volume.id / "users/bob/c.txt").exists()
        finally:
            await daytona.close()
