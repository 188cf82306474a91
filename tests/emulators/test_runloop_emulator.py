"""Contract tests: the real runloop-api-client SDK (sync, async, object API) against the emulator.

If Runloop's wire protocol moves under a new SDK version, these fail first.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import shutil
import time
import tracemalloc
from collections.abc import AsyncIterator, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from runloop_api_client import (
    APIConnectionError,
    APIStatusError,
    AsyncRunloop,
    AsyncRunloopSDK,
    AuthenticationError,
    BadRequestError,
    InternalServerError,
    NotFoundError,
    PermissionDeniedError,
    RateLimitError,
    Runloop,
    RunloopError,
    RunloopSDK,
)
from runloop_api_client.lib.polling import PollingConfig, PollingTimeout
from runloop_api_client.sdk import AsyncDevbox, AsyncExecution
from runloop_api_client.types import DevboxView

from emulators.harness import Emulator, free_port
from emulators.runloop import TEST_API_KEY, RunloopEmulator, api
from tests.polling import until
from tests.warned import warns

ONE_SHARD = {"api_pool_shards": 1, "background_pool_shards": 1, "transfer_pool_shards": 1}


@pytest.fixture
def emu(runloop_emulator: Emulator) -> Iterator[RunloopEmulator]:
    assert isinstance(runloop_emulator, RunloopEmulator)
    yield runloop_emulator
    assert runloop_emulator.alive() == [], "a test left a devbox alive"


def kwargs(emu: RunloopEmulator, **kw: Any) -> dict[str, Any]:
    return {**emu.sdk_kwargs(), **ONE_SHARD, **kw}


@pytest.fixture
async def client(emu: RunloopEmulator) -> AsyncIterator[AsyncRunloop]:
    api = AsyncRunloop(**kwargs(emu))
    yield api
    emu.clear_faults()
    async for view in api.devboxes.list():
        if view.status not in ("shutdown", "failure"):
            await api.devboxes.shutdown(view.id)
    await api.close()


def test_sync_object_sdk_smoke(emu: RunloopEmulator) -> None:
    with RunloopSDK(**kwargs(emu)) as sdk:
        box = sdk.devbox.create(metadata={"team": "a"}, environment_variables={"G": "g"})
        try:
            assert box.get_info().status == "running"
            result = box.cmd.exec("echo out $G; pwd; echo err >&2; exit 3")
            assert (result.stdout(), result.stderr(), result.exit_code) == (
                "out g\n/home/user\n",
                "err\n",
                3,
            )
            box.file.write(file_path="notes/a.txt", contents="héllo")
            assert box.file.read(file_path="/home/user/notes/a.txt") == "héllo"
            blob = bytes(range(256)) * 64
            box.file.upload(path="bin/blob", file=blob)
            assert box.file.download(path="/home/user/bin/blob") == blob
            assert [d.id for d in sdk.devbox.list()] == [box.id]
        finally:
            box.shutdown()
        info = box.get_info()
        assert (info.status, info.shutdown_reason) == ("shutdown", "api_shutdown")
    (record,) = emu.records()
    assert (record.id, record.labels, record.ended_by) == (box.id, {"team": "a"}, "kill")


def test_sync_client_execute_and_await_completion(emu: RunloopEmulator) -> None:
    with Runloop(**kwargs(emu)) as api:
        view = api.devboxes.create_and_await_running(
            polling_config=PollingConfig(timeout_seconds=5)
        )
        try:
            done = api.devboxes.execute_and_await_completion(
                view.id, command="sleep 1.2; echo slow", optimistic_timeout=1
            )
            assert (done.status, done.exit_status, done.stdout) == ("completed", 0, "slow\n")
        finally:
            api.devboxes.shutdown(view.id)


async def test_async_object_sdk(emu: RunloopEmulator) -> None:
    async with AsyncRunloopSDK(**kwargs(emu)) as sdk:
        box = await sdk.devbox.create(metadata={"k": "v"})
        try:
            long = await box.cmd.exec("seq 1 1000")
            assert long.result.stdout_truncated
            assert (await long.stdout()).splitlines() == [str(i) for i in range(1, 1001)]
            assert await long.stdout(num_lines=2) == "999\n1000"
            running = await box.cmd.exec_async("echo started; sleep 30")
            assert (await running.get_state()).status == "running"
            execution = emu.core.devboxes[box.id].executions[running.execution_id]
            for _ in range(100):
                if execution.stdout:
                    break
                await asyncio.sleep(0.02)
            await running.kill()
            killed = await running.result()
            assert (killed.exit_code, await killed.stdout()) == (137, "started\n")
            assert [b.id for b in await sdk.devbox.list()] == [box.id]
            assert (await box.get_info()).metadata == {"k": "v"}
        finally:
            await box.shutdown()


async def test_list_pages_and_filters(emu: RunloopEmulator, client: AsyncRunloop) -> None:
    ids = [(await client.devboxes.create(metadata={"n": str(i)})).id for i in range(5)]
    await client.devboxes.await_running(ids[-1], polling_config=PollingConfig(timeout_seconds=5))
    first = await client.devboxes.list(limit=2)
    assert [d.id for d in first.devboxes] == ids[::-1][:2]
    assert (first.has_more, first.total_count) == (True, 5)
    assert [d.id async for d in client.devboxes.list(limit=2)] == ids[::-1]
    # The spec sets no minimum (the SDK's generated tests send 0): the default page.
    assert len((await client.devboxes.list(limit=0)).devboxes) == 5
    await client.devboxes.shutdown(ids[0])
    shut = await client.devboxes.list(status="shutdown")
    assert ([d.id for d in shut.devboxes], shut.devboxes[0].metadata) == ([ids[0]], {"n": "0"})
    async with AsyncRunloop(**kwargs(emu, bearer_token="ak_other")) as other:
        assert (await other.devboxes.list()).devboxes == []
        with pytest.raises(NotFoundError):
            await other.devboxes.retrieve(ids[1])


async def test_create_is_idempotent_per_request_id(
    emu: RunloopEmulator, client: AsyncRunloop
) -> None:
    first = await client.devboxes.create(idempotency_key="req-1")
    again = await client.devboxes.create(idempotency_key="req-1")
    other = await client.devboxes.create(idempotency_key="req-2")
    assert first.id == again.id != other.id
    assert len(emu.records()) == 2


async def test_sdk_retries_carry_one_request_id(emu: RunloopEmulator) -> None:
    emu.inject("create", status=503)
    async with AsyncRunloop(**kwargs(emu, max_retries=1)) as api:
        view = await api.devboxes.create()
        await api.devboxes.shutdown(view.id)
    assert emu.core.faults.hits["create"] == 1
    assert len(emu.core.created_by_request) == 1
    assert len(emu.records()) == 1


async def test_execute_dedups_command_ids(emu: RunloopEmulator, client: AsyncRunloop) -> None:
    view = await client.devboxes.create_and_await_running()
    command = "echo once >> log.txt; cat log.txt"
    first = await client.devboxes.execute(view.id, command=command, command_id="cmd-1")
    again = await client.devboxes.execute(view.id, command=command, command_id="cmd-1")
    assert first.execution_id == again.execution_id
    assert again.stdout == "once\n"
    contents = await client.devboxes.read_file_contents(view.id, file_path="log.txt")
    assert contents == "once\n"


async def test_execute_sync_holds_until_the_command_ends(client: AsyncRunloop) -> None:
    """The deprecated ``execute_sync`` is still served: the SDK's own tests call it."""
    view = await client.devboxes.create_and_await_running()
    with warns(DeprecationWarning, match="deprecated"):
        done = await client.devboxes.execute_sync(
            view.id, command="sleep 0.3; echo out; echo err >&2; exit 4"
        )
    assert (done.devbox_id, done.exit_status, done.stdout, done.stderr) == (
        view.id,
        4,
        "out\n",
        "err\n",
    )
    with (
        warns(DeprecationWarning, match="deprecated"),
        pytest.raises(BadRequestError, match="attach_stdin"),
    ):
        await client.devboxes.execute_sync(view.id, command="cat", attach_stdin=True)


async def test_devbox_logs_hold_each_command_and_its_output(client: AsyncRunloop) -> None:
    """``devboxes.logs.list`` (the object SDK's ``logs()``): commands, output lines, exits."""
    view = await client.devboxes.create_and_await_running()
    first = await client.devboxes.execute(view.id, command="echo one; echo two >&2; exit 3")
    second = await client.devboxes.execute(view.id, command="echo three")
    logs = (await client.devboxes.logs.list(view.id)).logs
    assert [(log.cmd_id, log.source) for log in logs if log.cmd and log.exit_code is None] == [
        (first.execution_id, "exec"),
        (second.execution_id, "exec"),
    ]
    mine = (await client.devboxes.logs.list(view.id, execution_id=first.execution_id)).logs
    lines = [(log.level, log.message) for log in mine if log.message]
    assert sorted(lines) == [("error", "two"), ("info", "one")]
    assert [log.exit_code for log in mine if log.exit_code is not None] == [3]
    assert {log.cmd_id for log in mine} == {first.execution_id}
    # runloop-examples' snapshots agent reads ``shell_name``, which the 3.0 SDK no longer models.
    assert {getattr(log, "shell_name", "missing") for log in mine} == {None}


async def test_execution_long_poll_answers_408(client: AsyncRunloop) -> None:
    view = await client.devboxes.create_and_await_running()
    started = await client.devboxes.execute(view.id, command="sleep 30", optimistic_timeout=0)
    assert started.status == "running"
    with pytest.raises(APIStatusError) as held:
        await client.devboxes.wait_for_command(
            started.execution_id, devbox_id=view.id, statuses=["completed"], timeout_seconds=1
        )
    assert held.value.status_code == 408
    killed = await client.devboxes.executions.kill(started.execution_id, devbox_id=view.id)
    assert (killed.status, killed.exit_status) == ("completed", 137)
    chunks = await client.devboxes.executions.stream_stdout_updates(
        started.execution_id, devbox_id=view.id
    )
    assert [c.output async for c in chunks] == []


async def test_await_running_times_out_on_a_stuck_boot(
    emu: RunloopEmulator, client: AsyncRunloop
) -> None:
    emu.inject("boot", hang=True)
    view = await client.devboxes.create()
    assert view.status == "provisioning"
    with pytest.raises(BadRequestError, match="not running yet"):
        await client.devboxes.execute(view.id, command="true")
    started = time.monotonic()
    with pytest.raises(PollingTimeout) as stuck:
        await client.devboxes.await_running(
            view.id, polling_config=PollingConfig(timeout_seconds=0.6)
        )
    assert time.monotonic() - started < 1.5
    assert stuck.value.last_value.id == view.id
    await client.devboxes.shutdown(view.id)


async def test_launch_commands_run_while_the_devbox_initializes(client: AsyncRunloop) -> None:
    """Runloop runs them before ``running``: a slow one holds the boot, a failing one fails it."""
    commands = ["echo ready > boot.txt", "sleep 0.6"]
    view = await client.devboxes.create(launch_parameters={"launch_commands": commands})
    with pytest.raises(PollingTimeout):
        await client.devboxes.await_running(
            view.id, polling_config=PollingConfig(timeout_seconds=0.3)
        )
    await client.devboxes.await_running(view.id, polling_config=PollingConfig(timeout_seconds=5))
    assert await client.devboxes.read_file_contents(view.id, file_path="boot.txt") == "ready\n"
    logs = (await client.devboxes.logs.list(view.id)).logs
    assert [log.cmd for log in logs if log.cmd and log.exit_code == 0] == commands
    assert {log.source for log in logs} == {"setup_commands"}
    with pytest.raises(RunloopError, match="terminal state: failure"):
        await client.devboxes.create_and_await_running(
            launch_parameters={"launch_commands": ["exit 7"]}
        )


async def test_create_and_await_running_answers_a_slow_boot_in_time(
    client: AsyncRunloop, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its hold stays under the SDK's 30 s read timeout; the SDK polls the rest of the boot."""
    monkeypatch.setattr(api, "CREATE_HOLD_MAX", 0.3)
    params: Any = {"launch_commands": ["sleep 30"]}
    held = await client.post(
        "/v1/devboxes/create_and_await_running",
        body={"launch_parameters": params},
        cast_to=DevboxView,
    )
    assert held.status == "initializing"
    with pytest.raises(PollingTimeout):
        await client.devboxes.create_and_await_running(
            launch_parameters=params,
            polling_config=PollingConfig(max_attempts=1, interval_seconds=0.1),
        )


async def test_entrypoint_ends_the_devbox_when_it_exits(
    emu: RunloopEmulator, client: AsyncRunloop
) -> None:
    """A create's ``entrypoint`` is the devbox's main process: its end shuts the devbox down."""
    view = await client.devboxes.create_and_await_running(entrypoint="echo served; sleep 0.4")
    await until(lambda: emu.core.devboxes[view.id].status == "shutdown")
    ended = await client.devboxes.retrieve(view.id)
    assert ended.shutdown_reason == "entrypoint_exit"
    logs = (await client.devboxes.logs.list(view.id)).logs
    assert [(log.source, log.message) for log in logs if log.message] == [("entrypoint", "served")]


async def test_failed_boot_is_a_terminal_state(emu: RunloopEmulator, client: AsyncRunloop) -> None:
    emu.inject("boot", status=500)
    with pytest.raises(RunloopError, match="non-running terminal state: failure"):
        await client.devboxes.create_and_await_running()
    (record,) = emu.records()
    assert (record.alive, record.ended_by) == (False, "failure")
    view = await client.devboxes.retrieve(record.id)
    assert (view.status, view.failure_reason) == ("failure", "execution_failed")


async def test_keep_alive_time_ends_the_devbox(emu: RunloopEmulator, client: AsyncRunloop) -> None:
    emu.reap_interval = 0.1
    view = await client.devboxes.create_and_await_running(
        launch_parameters={"keep_alive_time_seconds": 1}
    )
    for _ in range(60):
        if (await client.devboxes.retrieve(view.id)).status == "shutdown":
            break
        await asyncio.sleep(0.05)
    ended = await client.devboxes.retrieve(view.id)
    assert (ended.status, ended.shutdown_reason) == ("shutdown", "keep_alive_timeout")
    with pytest.raises(NotFoundError):
        await client.devboxes.execute(view.id, command="true")
    with pytest.raises(BadRequestError, match="keep_alive_time_seconds"):
        await client.devboxes.create(launch_parameters={"keep_alive_time_seconds": 10**6})


async def test_file_errors(client: AsyncRunloop) -> None:
    view = await client.devboxes.create_and_await_running()
    # ``file`` is optional in the API (the SDK's generated tests omit it): an empty file.
    await client.devboxes.upload_file(view.id, path="empty.txt")
    assert await client.devboxes.read_file_contents(view.id, file_path="empty.txt") == ""
    with pytest.raises(BadRequestError, match="No such file"):
        await client.devboxes.download_file(view.id, path="missing.bin")
    with pytest.raises(BadRequestError, match="/etc/x: read-only file system"):
        await client.devboxes.write_file_contents(view.id, file_path="/etc/x", contents="x")
    # Above the home is the rest of the devbox's filesystem, and nothing is above its root.
    await client.devboxes.write_file_contents(view.id, file_path="../../../../x", contents="up")
    assert await client.devboxes.read_file_contents(view.id, file_path="/x") == "up"


@pytest.mark.parametrize(
    ("fault", "error"),
    [
        ({"status": 401}, AuthenticationError),
        ({"status": 403, "message": "Usage limit exceeded"}, PermissionDeniedError),
        ({"status": 429, "retry_after": 7}, RateLimitError),
        ({"status": 503}, InternalServerError),
        ({"drop": True}, APIConnectionError),
    ],
)
async def test_faults_reach_the_sdk_as_its_own_errors(
    emu: RunloopEmulator, client: AsyncRunloop, fault: dict[str, Any], error: type[Exception]
) -> None:
    emu.inject("create", **fault)
    with pytest.raises(error) as raised:
        await client.devboxes.create()
    if isinstance(raised.value, APIStatusError):
        assert raised.value.status_code == fault["status"]
        assert isinstance(raised.value.body, dict)
        assert raised.value.body["status"] == fault["status"]
        if "retry_after" in fault:
            assert raised.value.response.headers["retry-after"] == "7"
    assert emu.records() == []


async def test_account_limits_answer_with_a_message(
    emu: RunloopEmulator, client: AsyncRunloop
) -> None:
    emu.set_quota(max_concurrent=1)
    first = await client.devboxes.create()
    with pytest.raises(RateLimitError, match="at most 1 devboxes at once"):
        await client.devboxes.create()
    await client.devboxes.shutdown(first.id)
    emu.set_quota(max_created=0)
    with pytest.raises(PermissionDeniedError, match="quota of 0 devboxes is spent"):
        await client.devboxes.create()


async def test_refused_key(emu: RunloopEmulator) -> None:
    emu.core.accepted_keys = {TEST_API_KEY}
    async with AsyncRunloop(**kwargs(emu, bearer_token="ak_wrong")) as api:
        with pytest.raises(AuthenticationError, match="invalid"):
            await api.devboxes.list()


async def test_an_interrupt_that_ends_the_shell_ends_what_it_left_behind() -> None:
    """Under bubblewrap, bwrap dying of the Ctrl-C ends the whole sandbox, and so must the
    kill without it: once the leader died of the signal, the rest of its group is
    SIGKILLed. A signal that reached bwrap while it set up left its sandbox's init (which
    ignores it) running the command, which held the execution open to its end."""
    with RunloopEmulator(isolation="none") as emu:
        async with AsyncRunloop(**kwargs(emu)) as client:
            view = await client.devboxes.create_and_await_running()
            executions = client.devboxes.executions
            shell = await client.devboxes.execute_async(
                view.id, command="sleep 60 & echo started; wait", attach_stdin=True
            )  # a background job ignores SIGINT
            output = await executions.stream_stdout_updates(shell.execution_id, devbox_id=view.id)
            async for chunk in output:  # the job is running: the interrupt cannot beat it
                assert chunk.output == "started\n"
                break
            await executions.send_std_in(shell.execution_id, devbox_id=view.id, signal="INTERRUPT")
            done = await asyncio.wait_for(
                executions.await_completed(shell.execution_id, devbox_id=view.id), 10
            )
            assert done.exit_status == 130


async def test_the_whole_filesystem_and_unknown_routes(isolation: str) -> None:
    """/tmp and / work as on Runloop, and a route it lacks is the SDK's NotFoundError."""
    with RunloopEmulator(isolation=isolation) as emu:
        client = AsyncRunloop(**kwargs(emu))
        try:
            view = await client.devboxes.create_and_await_running()
            await client.devboxes.write_file_contents(view.id, file_path="/tmp/x", contents="t")
            assert await client.devboxes.read_file_contents(view.id, file_path="/tmp/x") == "t"
            ran = await client.devboxes.execute_and_await_completion(
                view.id, command="pwd; cd / && pwd && cat /tmp/x && ls -d /tmp"
            )
            assert ran.stdout == "/home/user\n/\nt/tmp\n"
            await client.devboxes.shutdown(view.id)
            with pytest.raises(NotFoundError) as missing:
                await client.network_policies.list()
            assert missing.value.body == {
                "status": 404,
                "message": "Cannot GET /v1/network-policies",
            }
        finally:
            await client.close()


async def test_exec_callbacks_and_streams_resume_by_offset(emu: RunloopEmulator) -> None:
    """Output reaches the SDK's callbacks while the command runs; a chunk's offset is where
    the stream resumes, so the SDK's reconnect after a timeout (1 s here) repeats nothing."""
    async with AsyncRunloopSDK(**kwargs(emu, timeout=1)) as sdk:
        box = await sdk.devbox.create()
        try:
            seen: list[str] = []
            running = await box.cmd.exec_async("echo one; sleep 2; echo two", stdout=seen.append)
            await until(lambda: seen == ["one\n"])
            assert (await running.get_state()).status == "running"
            result = await running.result(timeout=10)
            assert (result.exit_code, "".join(seen)) == (0, "one\ntwo\n")
            executions, eid = sdk.api.devboxes.executions, running.execution_id
            whole = await executions.stream_stdout_updates(eid, devbox_id=box.id)
            assert [(c.output, c.offset) async for c in whole] == [("one\ntwo\n", 8)]
            tail = await executions.stream_stdout_updates(eid, devbox_id=box.id, offset="4")
            assert [c.output async for c in tail] == ["two\n"]
        finally:
            await box.shutdown()


async def test_stdin_of_an_attached_execution(client: AsyncRunloop) -> None:
    view = await client.devboxes.create_and_await_running()
    executions = client.devboxes.executions
    cat = await client.devboxes.execute_async(view.id, command="cat", attach_stdin=True)
    sent = await executions.send_std_in(cat.execution_id, devbox_id=view.id, text="héllo\n")
    assert (sent.execution_id, sent.success) == (cat.execution_id, True)
    await executions.send_std_in(cat.execution_id, devbox_id=view.id, signal="EOF")
    done = await executions.await_completed(cat.execution_id, devbox_id=view.id)
    assert (done.stdout, done.exit_status) == ("héllo\n", 0)
    with pytest.raises(BadRequestError, match="not running"):
        await executions.send_std_in(cat.execution_id, devbox_id=view.id, text="late")
    sleeper = await client.devboxes.execute_async(view.id, command="sleep 30", attach_stdin=True)
    await executions.send_std_in(sleeper.execution_id, devbox_id=view.id, signal="INTERRUPT")
    interrupted = await executions.await_completed(sleeper.execution_id, devbox_id=view.id)
    assert interrupted.exit_status == 130
    closed = await client.devboxes.execute_async(view.id, command="sleep 30")
    with pytest.raises(BadRequestError, match="attach_stdin"):
        await executions.send_std_in(closed.execution_id, devbox_id=view.id, text="x")
    with pytest.raises(BadRequestError, match="exactly one"):
        await executions.send_std_in(closed.execution_id, devbox_id=view.id)
    await executions.kill(closed.execution_id, devbox_id=view.id, kill_process_group=True)


async def test_reattach_to_an_execution_by_id(emu: RunloopEmulator, client: AsyncRunloop) -> None:
    """Another client finds an execution by its id and reads its output from the start."""
    view = await client.devboxes.create_and_await_running()
    started = await client.devboxes.execute_async(view.id, command="echo early; sleep 1")
    async with AsyncRunloop(**kwargs(emu)) as other:
        found = await other.devboxes.executions.retrieve(started.execution_id, devbox_id=view.id)
        again = AsyncExecution(other, view.id, found)
        result = await again.result()
        assert (result.exit_code, await result.stdout()) == (0, "early\n")
        with pytest.raises(NotFoundError):
            await other.devboxes.executions.retrieve("exn_none", devbox_id=view.id)


async def test_suspend_ends_processes_keeps_the_disk_and_frees_the_cap(
    emu: RunloopEmulator, client: AsyncRunloop
) -> None:
    emu.set_quota(max_concurrent=1)
    box = await client.devboxes.create_and_await_running()
    await client.devboxes.write_file_contents(box.id, file_path="kept.txt", contents="disk")
    sleeper = await client.devboxes.execute_async(box.id, command="sleep 300")
    suspended = await client.devboxes.suspend(box.id)
    assert suspended.status == "suspended"
    await client.devboxes.await_suspended(box.id)
    gone = await client.devboxes.executions.retrieve(sleeper.execution_id, devbox_id=box.id)
    assert gone.status == "completed"
    with pytest.raises(BadRequestError, match="not running"):
        await client.devboxes.execute(box.id, command="true")
    assert [d.id async for d in client.devboxes.list(status="suspended")] == [box.id]
    other = await client.devboxes.create()  # a suspended devbox is not counted
    with pytest.raises(RateLimitError, match="at once"):  # waking counts again
        await client.devboxes.resume(box.id)
    await client.devboxes.shutdown(other.id)
    resumed = await client.devboxes.resume(box.id)
    assert resumed.status == "resuming"
    await client.devboxes.await_running(box.id)
    read = await client.devboxes.read_file_contents(box.id, file_path="kept.txt")
    assert read == "disk"
    with pytest.raises(BadRequestError, match="cannot be resumed from running"):
        await client.devboxes.resume(box.id)


async def test_disk_snapshot_is_a_source_for_a_create(emu: RunloopEmulator) -> None:
    emu.snapshots = set()  # only the snapshots it made
    async with AsyncRunloopSDK(**kwargs(emu)) as sdk:
        box = await sdk.devbox.create()
        try:
            await box.file.write(file_path="app/config.txt", contents="baked in")
            snap = await box.snapshot_disk(name="base-image", metadata={"v": "1"})
            assert snap.id.startswith("snp_")
            info = await snap.get_info()
            assert (info.status, info.snapshot and info.snapshot.name) == ("complete", "base-image")
        finally:
            await box.shutdown()
        child = await sdk.devbox.create_from_snapshot(snap.id)
        try:
            assert await child.file.read(file_path="app/config.txt") == "baked in"
            assert (await child.get_info()).snapshot_id == snap.id
        finally:
            await child.shutdown()
        api = sdk.api
        assert [s.id async for s in api.devboxes.disk_snapshots.list()] == [snap.id]
        await snap.delete()
        with pytest.raises(NotFoundError):
            await api.devboxes.disk_snapshots.delete(snap.id)
        with pytest.raises(NotFoundError, match="Snapshot"):
            await sdk.devbox.create_from_snapshot(snap.id)


async def test_updates_replace_the_fields_given(client: AsyncRunloop) -> None:
    """``devboxes.update`` and ``disk_snapshots.update``: given fields replace, the rest stay."""
    view = await client.devboxes.create_and_await_running(name="a", metadata={"k": "v"})
    renamed = await client.devboxes.update(view.id, name="b")
    assert (renamed.name, renamed.metadata) == ("b", {"k": "v"})
    await client.devboxes.update(view.id, name="", metadata={})
    cleared = await client.devboxes.retrieve(view.id)
    assert (cleared.name, cleared.metadata) == (None, {})
    snap = await client.devboxes.snapshot_disk(view.id, name="s", commit_message="m")
    updated = await client.devboxes.disk_snapshots.update(snap.id, metadata={"b": "2"})
    assert (updated.id, updated.name, updated.commit_message) == (snap.id, "s", "m")
    assert updated.metadata == {"b": "2"}


async def test_snapshot_list_pages_and_filters(client: AsyncRunloop) -> None:
    """``disk_snapshots.list`` honours ``limit`` and ``starting_after`` (the SDK smoke tests'
    ``snapshot.list(limit=2)``) and filters by devbox."""
    one = await client.devboxes.create_and_await_running()
    two = await client.devboxes.create_and_await_running()
    ids = [(await client.devboxes.snapshot_disk(one.id)).id for _ in range(3)]
    other = (await client.devboxes.snapshot_disk(two.id)).id
    first = await client.devboxes.disk_snapshots.list(limit=2, devbox_id=one.id)
    assert ([s.id for s in first.snapshots], first.has_more) == (ids[::-1][:2], True)
    assert first.total_count == 3
    assert [s.id async for s in client.devboxes.disk_snapshots.list(limit=2)] == [other, *ids[::-1]]


async def test_a_deleted_snapshot_reports_deleted(client: AsyncRunloop) -> None:
    """Its status says ``deleted`` (the SDK's smoke tests check it); deleting it again is a 404."""
    view = await client.devboxes.create_and_await_running()
    snap = await client.devboxes.snapshot_disk(view.id)
    await client.devboxes.disk_snapshots.delete(snap.id)
    status = await client.devboxes.disk_snapshots.query_status(snap.id)
    assert (status.status, status.snapshot) == ("deleted", None)
    assert [s.id async for s in client.devboxes.disk_snapshots.list()] == []
    with pytest.raises(NotFoundError):
        await client.devboxes.disk_snapshots.delete(snap.id)


async def test_large_files_stream_both_ways(
    emu: RunloopEmulator, client: AsyncRunloop, tmp_path: Path
) -> None:
    """A file far larger than the memory the transfer may use goes up and down whole."""
    box = await client.devboxes.create_and_await_running()
    source = tmp_path / "big.bin"
    block = os.urandom(1 << 20)
    with source.open("wb") as out:
        for _ in range(24):
            out.write(block)
    tracemalloc.start()
    try:
        with source.open("rb") as handle:
            await client.devboxes.upload_file(box.id, path="data/big.bin", file=handle)
        digest = hashlib.sha256()
        async with client.devboxes.with_streaming_response.download_file(
            box.id, path="data/big.bin"
        ) as response:
            async for chunk in response.iter_bytes(1 << 16):
                digest.update(chunk)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert digest.hexdigest() == hashlib.sha256(block * 24).hexdigest()
    assert peak < 8 * (1 << 20), f"the transfer held {peak} bytes"
    assert list((emu.core.local.root / ".uploads").iterdir()) == []


async def test_resource_usage_bills_the_size_over_time(client: AsyncRunloop) -> None:
    """``retrieve_resource_usage``: vCPU and memory over active time, disk over elapsed time."""
    params: Any = {"resource_size_request": "MEDIUM"}
    view = await client.devboxes.create_and_await_running(launch_parameters=params)
    await asyncio.sleep(1.1)
    await client.devboxes.shutdown(view.id)
    usage = await client.devboxes.retrieve_resource_usage(view.id)
    assert (usage.id, usage.status, usage.start_time_ms) == (
        view.id,
        "shutdown",
        view.create_time_ms,
    )
    assert usage.end_time_ms is not None
    assert usage.end_time_ms >= view.create_time_ms + 1000
    active = usage.total_active_seconds
    assert active >= 1
    assert usage.total_elapsed_seconds >= active
    assert (usage.vcpu_seconds, usage.memory_gb_seconds) == (2 * active, 4 * active)
    assert usage.disk_gb_seconds == 8 * usage.total_elapsed_seconds
    params = {"resource_size_request": "CUSTOM_SIZE", "custom_gb_memory": "lots"}
    with pytest.raises(BadRequestError, match="custom_gb_memory"):
        await client.devboxes.create(launch_parameters=params)


@pytest.mark.skipif(
    shutil.which("ssh-keygen") is None, reason="ssh-keygen (openssh-client) not installed"
)
async def test_ssh_key_is_authorized_in_the_devbox(client: AsyncRunloop) -> None:
    """``create_ssh_key`` (the SDK's ``net.create_ssh_key``) hands out a key the devbox trusts."""
    box = await client.devboxes.create_and_await_running()
    key = await client.devboxes.create_ssh_key(box.id)
    assert (key.id, key.ssh_user) == (box.id, "user")
    assert key.ssh_private_key.startswith("-----BEGIN OPENSSH PRIVATE KEY-----")
    assert key.url.startswith(box.id)
    trusted = await client.devboxes.read_file_contents(
        box.id, file_path="/home/user/.ssh/authorized_keys"
    )
    assert trusted.startswith("ssh-ed25519 ")


async def test_tunnel_reaches_a_server_with_its_token(
    emu: RunloopEmulator, client: AsyncRunloop
) -> None:
    box = await client.devboxes.create_and_await_running()
    port = free_port()
    await client.devboxes.write_file_contents(box.id, file_path="site/hi.txt", contents="hi\n")
    await client.devboxes.execute_async(
        box.id, command=f"cd site && exec python3 -m http.server {port} --bind 127.0.0.1"
    )
    tunnel = await client.devboxes.enable_tunnel(box.id, auth_mode="authenticated")
    assert tunnel.auth_token
    again = await client.devboxes.enable_tunnel(box.id, auth_mode="authenticated")
    assert again.tunnel_key == tunnel.tunnel_key
    url = await AsyncDevbox(client, box.id).get_tunnel_url(port)
    assert url == f"https://{port}-{tunnel.tunnel_key}.tunnel.127.0.0.1"
    target = emu.resolve(httpx.URL(url).host)
    assert target is not None
    edge = f"http://{target[0]}:{target[1]}/hi.txt"
    host = {"Host": httpx.URL(url).host}
    auth = {"X-Runloop-Tunnel-Authorization": f"Bearer {tunnel.auth_token}"}
    async with httpx.AsyncClient(timeout=5) as web:
        answer = await web.get(edge, headers={**host, **auth})
        for _ in range(100):  # the server may not listen yet
            if answer.status_code == 200:
                break
            await asyncio.sleep(0.1)
            answer = await web.get(edge, headers={**host, **auth})
        assert (answer.status_code, answer.text) == (200, "hi\n")
        assert (await web.get(edge, headers=host)).status_code == 401
        await client.devboxes.suspend(box.id)
        assert (await web.get(edge, headers={**host, **auth})).status_code == 503
    opened = await client.devboxes.create(tunnel={"auth_mode": "open"})
    assert opened.tunnel is not None
    assert (opened.tunnel.auth_mode, opened.tunnel.auth_token) == ("open", None)


QUICK = PollingConfig(interval_seconds=0.05, max_attempts=200)


async def test_a_blueprint_builds_and_its_devboxes_start_from_it(isolation: str) -> None:
    """The Dockerfile's ENV and WORKDIR, the file mounts and what the setup commands wrote
    (at build time: the package installs only logged) are in every devbox made from it."""
    with RunloopEmulator(isolation=isolation) as emu:
        client = AsyncRunloop(**kwargs(emu))
        try:
            built = await client.blueprints.create_and_await_build_complete(
                name="tools",
                dockerfile=(
                    "FROM ubuntu:22.04\nARG V=1\n"
                    "ENV GREETING=hi-$V PATH=/opt/tools/bin:$PATH\n"
                    "WORKDIR /app\nRUN apt-get update && apt-get install -y curl"
                ),
                file_mounts={"/app/config.txt": "k=v\n", "notes/n.txt": "n\n"},
                system_setup_commands=[
                    "sudo -E DEBIAN_FRONTEND=noninteractive apt-get install -y wget",
                    "basename $(pwd) > marker && echo $GREETING >> marker",
                    "mkdir -p /opt/tools/bin",
                    "printf '#!/bin/sh\\necho tool\\n' > /opt/tools/bin/t",
                    "chmod +x /opt/tools/bin/t",
                ],
                launch_parameters={"launch_commands": ["echo launched > ~/launched"]},
                metadata={"team": "a"},
                polling_config=QUICK,
            )
            assert (built.status, built.state, built.failure_reason) == (
                "build_complete",
                "created",
                None,
            )
            assert built.build_finish_time_ms is not None
            assert built.metadata == {"team": "a"}
            assert built.parameters.system_setup_commands is not None
            messages = [line.message for line in (await client.blueprints.logs(built.id)).logs]
            assert "RUN sudo -E DEBIAN_FRONTEND=noninteractive apt-get install -y wget" in messages
            assert any("apt-get install -y wget' skipped" in m for m in messages)
            assert any(m.startswith("Step 5/5 : RUN apt-get update") for m in messages)
            assert messages[-1] == "Build complete"

            by_id = await client.devboxes.create_and_await_running(
                blueprint_id=built.id, environment_variables={"GREETING": "own"}
            )
            by_name = await client.devboxes.create_and_await_running(blueprint_name="tools")
            assert (by_id.blueprint_id, by_name.blueprint_id) == (built.id, built.id)
            assert by_name.launch_parameters.launch_commands == ["echo launched > ~/launched"]
            ran = await client.devboxes.execute_and_await_completion(
                by_id.id, command="pwd; echo $GREETING; cat marker config.txt ~/notes/n.txt; t"
            )
            assert ran.stdout == "/app\nown\napp\nhi-1\nk=v\nn\ntool\n"
            ran = await client.devboxes.execute_and_await_completion(
                by_name.id, command="echo $GREETING; cat ~/launched; echo x > marker"
            )
            assert ran.stdout == "hi-1\nlaunched\n"
            again = await client.devboxes.create_and_await_running(blueprint_id=built.id)
            ran = await client.devboxes.execute_and_await_completion(again.id, command="cat marker")
            assert ran.stdout == "app\nhi-1\n"  # a devbox's writes stay its own
            for view in (by_id, by_name, again):
                await client.devboxes.shutdown(view.id)
        finally:
            await client.close()


def test_object_sdk_builds_on_a_base_blueprint(emu: RunloopEmulator) -> None:
    """``sdk.blueprint.create`` awaits the build; a derived blueprint starts from its base's
    disk and image."""
    with RunloopSDK(**kwargs(emu)) as sdk:
        base = sdk.blueprint.create(
            name="base",
            dockerfile="FROM ubuntu:22.04\nENV LAYER=base\nWORKDIR /srv/app",
            system_setup_commands=["echo from-base > base.txt"],
            polling_config=QUICK,
        )
        derived = sdk.blueprint.create(
            name="derived",
            base_blueprint_name="base",
            system_setup_commands=["cat base.txt > derived.txt", "echo $LAYER >> derived.txt"],
            polling_config=QUICK,
        )
        info = derived.get_info()
        assert (info.status, info.base_blueprint_id) == ("build_complete", base.id)
        box = derived.create_devbox()
        try:
            result = box.cmd.exec("pwd; cat derived.txt")
            assert result.stdout() == "/srv/app\nfrom-base\nbase\n"
        finally:
            box.shutdown()
        assert [b.id for b in sdk.blueprint.list(name="base")] == [base.id]
        derived.delete()
        base.delete()
        assert sdk.api.blueprints.retrieve(base.id).state == "deleted"


async def test_blueprints_list_page_and_delete(client: AsyncRunloop) -> None:
    """Newest first, paged by cursor, filtered by name and status; a deleted one is still
    retrievable (``state`` deleted) but gone from lists and devbox creates; one with a disk
    snapshot of its devboxes cannot be deleted."""
    made = [
        await client.blueprints.create_and_await_build_complete(
            name=name, dockerfile="FROM ubuntu:22.04", polling_config=QUICK
        )
        for name in ("a", "b", "a")
    ]
    first = await client.blueprints.list(limit=2)
    assert ([b.id for b in first.blueprints], first.has_more, first.total_count) == (
        [made[2].id, made[1].id],
        True,
        3,
    )
    assert [b.id async for b in client.blueprints.list(limit=2)] == [m.id for m in made[::-1]]
    named = await client.blueprints.list(name="a", status="build_complete")
    assert [b.id for b in named.blueprints] == [made[2].id, made[0].id]
    assert (await client.blueprints.list_public()).blueprints == []
    with warns(DeprecationWarning, match="deprecated"):
        preview = await client.blueprints.preview(
            name="p", dockerfile="FROM ubuntu:22.04\nENV A=1\n", system_setup_commands=["make"]
        )
    assert preview.dockerfile == "FROM ubuntu:22.04\nENV A=1\nRUN make\n"

    devbox = await client.devboxes.create_and_await_running(blueprint_name="a")
    assert devbox.blueprint_id == made[2].id
    snap = await client.devboxes.snapshot_disk(devbox.id)
    assert snap.source_blueprint_id == made[2].id
    with pytest.raises(BadRequestError, match="dependent snapshots"):
        await client.blueprints.delete(made[2].id)
    await client.devboxes.disk_snapshots.delete(snap.id)
    await client.devboxes.shutdown(devbox.id)

    await client.blueprints.delete(made[2].id)
    assert (await client.blueprints.retrieve(made[2].id)).state == "deleted"
    assert [b.id async for b in client.blueprints.list()] == [made[1].id, made[0].id]
    with pytest.raises(NotFoundError):
        await client.blueprints.delete(made[2].id)
    with pytest.raises(NotFoundError, match=f"Blueprint {made[2].id} not found"):
        await client.devboxes.create(blueprint_id=made[2].id)
    devbox = await client.devboxes.create_and_await_running(blueprint_name="a")
    assert devbox.blueprint_id == made[0].id  # the newest built one of that name left
    await client.devboxes.shutdown(devbox.id)


async def test_a_failed_build_says_why(client: AsyncRunloop) -> None:
    """A Dockerfile Docker would refuse, or a setup command that fails, fails the build
    (``build_failed``, the logs saying why); a devbox cannot start from it."""
    bad_dockerfile = await client.blueprints.create(
        name="bad", dockerfile="FROM ubuntu:22.04\nFROBNICATE now"
    )
    with pytest.raises(RunloopError, match="non-built terminal state: failed"):
        await client.blueprints.await_build_complete(bad_dockerfile.id, polling_config=QUICK)
    view = await client.blueprints.retrieve(bad_dockerfile.id)
    assert (view.status, view.failure_reason) == ("failed", "build_failed")
    logs = (await client.blueprints.logs(bad_dockerfile.id)).logs
    assert (logs[-1].level, logs[-1].message) == (
        "error",
        "Build failed: Step 2/2 : FROBNICATE now: unknown instruction: FROBNICATE",
    )
    with pytest.raises(RunloopError):
        await client.blueprints.create_and_await_build_complete(
            name="bad",
            system_setup_commands=["echo starting", "no-such-tool --go"],
            polling_config=QUICK,
        )
    failed = (await client.blueprints.list(name="bad", status="failed")).blueprints
    assert len(failed) == 2
    messages = [line.message for line in (await client.blueprints.logs(failed[0].id)).logs]
    assert "starting" in messages
    assert any("no-such-tool: command not found" in m for m in messages)
    assert messages[-1] == (
        "Build failed: system setup command 'no-such-tool --go' exited with code 127"
    )
    with pytest.raises(BadRequestError, match="is not built"):
        await client.devboxes.create(blueprint_id=bad_dockerfile.id)
    with pytest.raises(BadRequestError, match="is not built"):
        await client.devboxes.create(blueprint_name="bad")


async def test_a_devbox_from_a_missing_blueprint_is_not_found(
    emu: RunloopEmulator, client: AsyncRunloop
) -> None:
    """With the emulator's own blueprints only (an empty ``blueprints``), an unknown id or
    name is the SDK's NotFoundError, as on Runloop; a listed one is played as built elsewhere."""
    emu.blueprints = {"elsewhere"}
    with pytest.raises(NotFoundError) as missing:
        await client.devboxes.create(blueprint_id="bpt_missing")
    assert missing.value.body == {"status": 404, "message": "Blueprint bpt_missing not found"}
    with pytest.raises(NotFoundError):
        await client.devboxes.create_and_await_running(blueprint_name="nope")
    with pytest.raises(NotFoundError):
        await client.blueprints.create(name="d", base_blueprint_id="bpt_missing")
    with pytest.raises(NotFoundError):
        await client.blueprints.retrieve("bpt_missing")
    view = await client.devboxes.create_and_await_running(blueprint_name="elsewhere")
    assert (view.status, view.blueprint_id) == ("running", None)
    await client.devboxes.shutdown(view.id)


async def test_a_blueprint_create_retried_after_a_fault_makes_one(emu: RunloopEmulator) -> None:
    """The ``blueprint`` fault covers ``/v1/blueprints``; the SDK's retry carries the same
    ``x-request-id``, which answers the blueprint the first create made."""
    emu.inject("blueprint", status=503)
    async with AsyncRunloop(**kwargs(emu, max_retries=1)) as api:
        view = await api.blueprints.create(name="once", idempotency_key="bp-1")
        again = await api.blueprints.create(name="once", idempotency_key="bp-1")
        assert view.id == again.id
        assert [b.id async for b in api.blueprints.list()] == [view.id]
    assert emu.core.faults.hits["blueprint"] == 1


def test_storage_objects_up_and_down_through_presigned_urls(emu: RunloopEmulator) -> None:
    """The object SDK's uploads PUT to the create's ``upload_url`` and its downloads GET the
    ``download_url``, both served by the emulator; ``complete`` makes an object READ_ONLY."""
    with RunloopSDK(**kwargs(emu)) as sdk:
        text = sdk.storage_object.upload_from_text(
            "héllo", name="greeting.txt", metadata={"k": "v"}
        )
        blob = sdk.storage_object.upload_from_bytes(
            bytes(range(256)), name="blob.bin", content_type="binary"
        )
        empty = sdk.storage_object.upload_from_text("", name="empty.txt")
        assert text.download_as_text() == "héllo"
        assert blob.download_as_bytes(duration_seconds=60) == bytes(range(256))
        assert empty.download_as_bytes() == b""
        info = text.refresh()
        assert (info.state, info.content_type, info.size_bytes, info.metadata) == (
            "READ_ONLY",
            "text",
            len("héllo".encode()),
            {"k": "v"},
        )
        assert info.upload_url is None
        url = text.get_download_url().download_url
        assert url.startswith(emu.url + "/storage/")
        forged = url[: url.index("signature=") + 10] + "0" * 64
        refused = httpx.get(forged)
        assert refused.status_code == 403
        assert "<Code>SignatureDoesNotMatch</Code>" in refused.text

        draft = sdk.storage_object.create(name="draft", content_type="text")
        assert draft.upload_url is not None
        with pytest.raises(BadRequestError, match="has no content"):
            draft.complete()
        with pytest.raises(BadRequestError, match="UPLOADING"):
            draft.get_download_url()
        draft.upload_content("first")
        draft.upload_content(iter([b"sec", b"ond"]))  # a second PUT replaces the first
        put_url = draft.upload_url
        assert draft.complete().state == "READ_ONLY"
        assert draft.download_as_text() == "second"
        assert httpx.put(put_url, content=b"late").status_code == 403  # READ_ONLY now

        assert [o.id for o in sdk.storage_object.list()] == [draft.id, empty.id, blob.id, text.id]
        assert [o.id for o in sdk.storage_object.list(content_type="binary")] == [blob.id]
        assert [o.id for o in sdk.storage_object.list(search="greet")] == [text.id]
        page = sdk.api.objects.list(limit=2, name=".")
        assert ([o.id for o in page.objects], page.has_more, page.total_count) == (
            [empty.id, blob.id],
            True,
            3,
        )
        assert [o.id for o in sdk.api.objects.list(limit=1, name=".")] == [
            empty.id,
            blob.id,
            text.id,
        ]
        assert sdk.api.objects.list_public().objects == []

        blob_url = blob.get_download_url().download_url
        assert blob.delete().state == "DELETED"
        assert sdk.api.objects.retrieve(blob.id).state == "DELETED"
        assert httpx.get(blob_url).status_code == 404
        with pytest.raises(NotFoundError):
            blob.delete()
        with pytest.raises(NotFoundError):
            blob.get_download_url()
        assert [o.id for o in sdk.storage_object.list(state="DELETED")] == [blob.id]
        assert not (emu.core.object_root / blob.id).exists()


async def test_a_storage_object_ends_with_its_ttl(emu: RunloopEmulator) -> None:
    """``ttl`` sets ``delete_after_time_ms``; past it the object is DELETED, its bytes gone."""
    async with AsyncRunloopSDK(**kwargs(emu)) as sdk:
        obj = await sdk.storage_object.upload_from_text(
            "short-lived", name="ttl.txt", ttl=timedelta(seconds=60)
        )
        info = await obj.refresh()
        assert info.delete_after_time_ms == info.create_time_ms + 60_000
        url = (await obj.get_download_url(duration_seconds=3600)).download_url
        assert await obj.download_as_text() == "short-lived"
        # Its lifetime is over (the download URL's own expiry, capped at the object's
        # end, is not: with a 1 s TTL it lapsed first under load, a 403 for the 404).
        emu.core.objects[obj.id].delete_after_ms = info.create_time_ms
        assert (await obj.refresh()).state == "DELETED"
        async with httpx.AsyncClient() as web:
            assert (await web.get(url)).status_code == 404
        assert await sdk.storage_object.list() == []
        assert not (emu.core.object_root / obj.id).exists()


async def test_a_large_storage_object_streams_both_ways(
    emu: RunloopEmulator, tmp_path: Path
) -> None:
    """An object far larger than the memory the transfer may use goes up and down whole."""
    block = os.urandom(1 << 20)
    async with AsyncRunloopSDK(**kwargs(emu)) as sdk:
        obj = await sdk.storage_object.create(name="big.bin", content_type="binary")
        tracemalloc.start()
        try:

            async def chunks() -> AsyncIterator[bytes]:
                for _ in range(16):
                    yield block

            await obj.upload_content(chunks())
            await obj.complete()
            url = (await obj.get_download_url()).download_url
            digest = hashlib.sha256()
            async with httpx.AsyncClient() as web, web.stream("GET", url) as response:
                async for chunk in response.aiter_bytes(1 << 16):
                    digest.update(chunk)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert (await sdk.api.objects.retrieve(obj.id)).size_bytes == 16 << 20
    assert digest.hexdigest() == hashlib.sha256(block * 16).hexdigest()
    assert peak < 8 * (1 << 20), f"the transfer held {peak} bytes"
    assert [p.name for p in emu.core.object_root.iterdir()] == [obj.id]


def test_a_devbox_mounts_storage_objects(isolation: str, tmp_path: Path) -> None:
    """An ``object_mount`` places the object at its path before the devbox boots, an archive
    unpacked into that directory; a ``file_mount`` and ``file_mounts`` write their text."""
    (tmp_path / "sub").mkdir()
    (tmp_path / "a.txt").write_text("a\n")
    (tmp_path / "sub" / "b.txt").write_text("b\n")
    with RunloopEmulator(isolation=isolation) as emu, RunloopSDK(**kwargs(emu)) as sdk:
        text = sdk.storage_object.upload_from_text("mounted\n", name="m.txt")
        tree = sdk.storage_object.upload_from_dir(tmp_path, name="tree.tgz")
        box = sdk.devbox.create(
            mounts=[
                {"type": "object_mount", "object_id": text.id, "object_path": "/home/user/m"},
                {"type": "object_mount", "object_id": tree.id, "object_path": "/data/tree"},
                {"type": "file_mount", "target": "notes/n.txt", "content": "n\n"},
            ],
            file_mounts={"/srv/legacy.txt": "l\n"},
        )
        try:
            text.delete()  # the devbox holds a copy
            assert box.file.read(file_path="/home/user/m") == "mounted\n"
            result = box.cmd.exec(
                "cat ~/m /data/tree/a.txt /data/tree/sub/b.txt notes/n.txt /srv/legacy.txt"
            )
            assert result.stdout() == "mounted\na\nb\nn\nl\n"
        finally:
            box.shutdown()
        draft = sdk.storage_object.create(name="draft", content_type="text")
        with pytest.raises(BadRequestError, match="UPLOADING"):
            sdk.api.devboxes.create(
                mounts=[{"type": "object_mount", "object_id": draft.id, "object_path": "/x"}]
            )
        with pytest.raises(NotFoundError, match=f"Object {text.id} not found"):
            sdk.api.devboxes.create(
                mounts=[{"type": "object_mount", "object_id": text.id, "object_path": "/x"}]
            )
        with pytest.raises(BadRequestError, match="read-only file system"):
            sdk.api.devboxes.create(
                mounts=[{"type": "object_mount", "object_id": tree.id, "object_path": "/usr/t"}]
            )
        assert [r.id for r in emu.records()] == [box.id]


def test_a_blueprint_copies_from_its_build_context(isolation: str, tmp_path: Path) -> None:
    """``COPY`` and ``ADD`` take their files from the ``build_context`` object (a tgz of a
    directory, as ``upload_from_dir`` makes it) into the image, as Docker places them."""
    inner = tmp_path / "inner"
    inner.mkdir()
    (inner / "inner.txt").write_text("inner\n")
    ctx = tmp_path / "ctx"
    (ctx / "sub").mkdir(parents=True)
    (ctx / "app.py").write_text('print("app")\n')
    (ctx / "config.txt").write_text("k=v\n")
    (ctx / ".hidden.txt").write_text("hidden\n")
    (ctx / "sub" / "x.txt").write_text("x\n")
    shutil.make_archive(str(ctx / "data"), "gztar", inner)
    dockerfile = (
        "FROM ubuntu:22.04\nWORKDIR /app\nCOPY . .\n"
        "COPY sub /srv/from-sub\n"
        "COPY config.txt app.py /etc2/\n"
        "COPY *.txt /opt/txt/\n"
        "COPY --chown=user:user --chmod=600 config.txt /opt/secret.txt\n"
        "ADD data.tar.gz /opt/data\n"
        'ENV NAME=renamed\nCOPY ["config.txt", "/opt/$NAME.txt"]\n'
    )
    with RunloopEmulator(isolation=isolation) as emu, RunloopSDK(**kwargs(emu)) as sdk:
        context = sdk.storage_object.upload_from_dir(ctx, ttl=timedelta(hours=1))
        built = sdk.blueprint.create(
            name="ctx",
            dockerfile=dockerfile,
            build_context=context.as_build_context(),
            system_setup_commands=["cat sub/x.txt > from-setup.txt"],
            polling_config=QUICK,
        )
        params = built.get_info().parameters
        assert params.build_context is not None
        assert params.build_context.object_id == context.id
        context.delete()  # the image keeps its copies
        box = built.create_devbox()
        try:
            listing = box.cmd.exec("ls -A; ls -A /srv/from-sub /etc2 /opt/txt /opt/data")
            assert listing.stdout().split() == [
                *[".hidden.txt", "app.py", "config.txt", "data.tar.gz", "from-setup.txt", "sub"],
                *["/etc2:", "app.py", "config.txt"],
                *["/opt/data:", "inner.txt"],
                *["/opt/txt:", ".hidden.txt", "config.txt"],
                *["/srv/from-sub:", "x.txt"],
            ]
            read = box.cmd.exec("cat from-setup.txt /opt/renamed.txt; stat -c %a /opt/secret.txt")
            assert read.stdout() == "x\nk=v\n600\n"
        finally:
            box.shutdown()


async def test_a_build_context_copy_that_cannot_be_made_fails_the_build(
    emu: RunloopEmulator, client: AsyncRunloop, tmp_path: Path
) -> None:
    """A missing source, several sources to a file, ``ADD`` of a URL, ``COPY --from`` or a
    ``COPY`` with no build context fail the build, the log saying why; a context that is not
    an uploaded object is refused at the create."""
    (tmp_path / "a.txt").write_text("a\n")
    async with AsyncRunloopSDK(**kwargs(emu)) as sdk:
        context = await sdk.storage_object.upload_from_dir(tmp_path)
    build_context: Any = {"type": "object", "object_id": context.id}
    failures = {
        "COPY missing.txt /x": "COPY failed: file not found in build context: missing.txt",
        "COPY a.txt a.txt /x": "the destination must be a directory and end with a /",
        "ADD https://example.com/x.tgz /x": "is not modelled",
        "COPY --from=builder /x /x": "COPY --from is not modelled",
        "COPY a.txt /usr/local/a.txt": "read-only file system",
    }
    for line, reason in failures.items():
        view = await client.blueprints.create(
            name="bad", dockerfile=f"FROM ubuntu:22.04\n{line}", build_context=build_context
        )
        with pytest.raises(RunloopError, match="non-built terminal state: failed"):
            await client.blueprints.await_build_complete(view.id, polling_config=QUICK)
        logs = (await client.blueprints.logs(view.id)).logs
        assert reason in logs[-1].message, (line, logs[-1].message)
    view = await client.blueprints.create(name="bad", dockerfile="FROM ubuntu:22.04\nCOPY . .")
    with pytest.raises(RunloopError, match="non-built terminal state: failed"):
        await client.blueprints.await_build_complete(view.id, polling_config=QUICK)
    logs = (await client.blueprints.logs(view.id)).logs
    assert "no build context to copy from" in logs[-1].message
    draft = await client.objects.create(name="draft", content_type="tgz")
    with pytest.raises(BadRequestError, match="UPLOADING"):
        await client.blueprints.create(
            name="d", build_context={"type": "object", "object_id": draft.id}
        )
    with pytest.raises(NotFoundError):
        await client.blueprints.create(
            name="d", build_context={"type": "object", "object_id": "obj_missing"}
        )
