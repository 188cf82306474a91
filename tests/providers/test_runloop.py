"""The runloop adapter on the real SDK, against the Runloop emulator: lifecycle and errors."""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import subprocess
import sys
import textwrap
import time
import tracemalloc
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import pytest
import structlog
from pydantic import SecretStr

from emulators.harness import Emulator, free_port
from emulators.runloop import TEST_API_KEY, RunloopEmulator
from providers import provider_class
from providers.base import SandboxSpec
from providers.errors import (
    AuthError,
    CapacityExceeded,
    InvalidArgument,
    NotFound,
    ProviderError,
    QuotaExceeded,
    RateLimited,
    SandboxError,
    Unavailable,
)
from providers.runloop import RunloopOptions, RunloopProvider, RunloopSandbox
from tests.polling import until


@pytest.fixture
def emu(runloop_emulator: Emulator) -> Iterator[RunloopEmulator]:
    assert isinstance(runloop_emulator, RunloopEmulator)
    yield runloop_emulator
    assert runloop_emulator.alive() == [], "a test left a devbox alive"


def options(emu: RunloopEmulator, **kw: Any) -> RunloopOptions:
    settings: dict[str, Any] = {
        "api_key": TEST_API_KEY,
        "base_url": emu.url,
        "request_timeout": 1,
        "pool_shards": 1,
        **kw,
    }
    return RunloopOptions(**settings)


@pytest.fixture
async def provider(emu: RunloopEmulator) -> AsyncIterator[RunloopProvider]:
    adapter = RunloopProvider("runloop-a", options(emu))
    yield adapter
    emu.clear_faults()
    for info in await adapter.list():
        await adapter.kill(info.id)
    await adapter.aclose()


@pytest.fixture
async def sandbox(provider: RunloopProvider) -> AsyncIterator[RunloopSandbox]:
    created = await provider.create(SandboxSpec(env={"GLOBAL": "g"}), timeout=5)
    yield created
    await created.kill()


def test_registered_with_validated_options() -> None:
    assert provider_class("runloop") is RunloopProvider
    with pytest.raises(ValueError, match="extra"):
        RunloopOptions(api_key="k", unknown=1)  # type: ignore[arg-type, call-arg]
    with pytest.raises(ValueError, match="at most one"):
        RunloopOptions(blueprint_id="bpt_1", snapshot_id="snp_1")


async def test_base_url_from_the_environment(
    emu: RunloopEmulator, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in emu.sdk_env().items():
        monkeypatch.setenv(name, value)
    adapter = RunloopProvider("runloop-env")
    sbx = await adapter.create(SandboxSpec(), timeout=5)
    assert (await sbx.run("echo via env")).stdout == "via env\n"
    await sbx.kill()
    await adapter.aclose()


def test_one_provider_on_two_event_loops(emu: RunloopEmulator) -> None:
    adapter = RunloopProvider("runloop-loops", options(emu))

    async def round_trip() -> str:
        sbx = await adapter.create(SandboxSpec(), timeout=5)
        try:
            return (await sbx.run("echo ok")).stdout
        finally:
            await sbx.kill()

    assert asyncio.run(round_trip()) == "ok\n"
    assert asyncio.run(round_trip()) == "ok\n"
    asyncio.run(adapter.aclose())


async def test_lifecycle(emu: RunloopEmulator, provider: RunloopProvider) -> None:
    spec = SandboxSpec(
        labels={"sandbox_router": "1", "sandbox_router_entry": "runloop-a"},
        env={"GLOBAL": "g"},
        lifetime=120,
    )
    sbx = await provider.create(spec, timeout=5)
    assert (emu.records()[0].id, emu.records()[0].labels) == (sbx.id, dict(spec.labels))
    devbox = emu.core.devboxes[sbx.id]
    assert devbox.launch_parameters == {"keep_alive_time_seconds": 120}
    assert sbx.native.id == sbx.id

    ran = await sbx.run("echo $GLOBAL $LOCAL; echo oops >&2; exit 3", env={"LOCAL": "l v"})
    assert (ran.stdout, ran.stderr, ran.exit_code, ran.ok) == ("g l v\n", "oops\n", 3, False)
    assert (await sbx.run(["printf", "%s|", "a b", "c"])).stdout == "a b|c|"
    await sbx.run("mkdir -p sub/dir")
    assert (await sbx.run("pwd", cwd="sub/dir")).stdout == "/home/user/sub/dir\n"
    missing = await sbx.run("true", cwd="no/such/dir")
    assert missing.exit_code == 1
    assert "no/such/dir" in missing.stderr

    payload = bytes(range(256)) * 16
    await sbx.write_file("data/blob.bin", payload)
    await sbx.write_file("/home/user/data/note.txt", "text é")
    assert await sbx.read_file("data/blob.bin") == payload
    assert await sbx.read_file("/home/user/data/note.txt") == "text é".encode()
    listed = {f.name: f for f in await sbx.list_files("data")}
    assert sorted(listed) == ["blob.bin", "note.txt"]
    assert (listed["blob.bin"].size, listed["blob.bin"].is_dir) == (len(payload), False)
    assert listed["note.txt"].path == "/home/user/data/note.txt"
    assert [f.is_dir for f in await sbx.list_files(".") if f.name == "data"] == [True]

    code = await sbx.run_code("import os\nprint(os.environ['GLOBAL'], 21 * 2)")
    assert (code.stdout, code.error, code.exit_code) == ("g 42\n", None, 0)
    broken = await sbx.run_code("undefined_name")
    assert broken.exit_code == 1
    assert broken.error == "NameError: name 'undefined_name' is not defined"
    shell = await sbx.run_code('echo "it\'s $GLOBAL"', language="bash")
    assert shell.stdout == "it's g\n"
    with pytest.raises(SandboxError, match="not supported"):
        await sbx.run_code("1", language="cobol")

    assert [s.id for s in await provider.list({"sandbox_router_entry": "runloop-a"})] == [sbx.id]
    assert await provider.list({"sandbox_router_entry": "other"}) == []
    again = await provider.connect(sbx.id)
    assert (await again.run("cat data/note.txt")).stdout == "text é"

    await sbx.kill()
    await sbx.kill()
    assert await provider.kill(sbx.id) is False
    assert [r.ended_by for r in emu.records()] == ["kill"]
    assert devbox.view()["shutdown_reason"] == "api_shutdown"
    with pytest.raises(NotFound):
        await provider.connect(sbx.id)


CREATE_PARAMETERS: list[tuple[SandboxSpec, dict[str, Any], dict[str, str], dict[str, Any]]] = [
    (SandboxSpec(template="bpt_123"), {}, {"blueprint_id": "bpt_123"}, {}),
    (SandboxSpec(template="snp_9"), {"blueprint_id": "bpt_1"}, {"snapshot_id": "snp_9"}, {}),
    (SandboxSpec(template="py-3.12"), {}, {"blueprint_name": "py-3.12"}, {}),
    (SandboxSpec(), {"blueprint_name": "base"}, {"blueprint_name": "base"}, {}),
    (SandboxSpec(), {"snapshot_id": "snp_2"}, {"snapshot_id": "snp_2"}, {}),
    (
        SandboxSpec(cpu=2, memory_mb=3000, disk_gb=20),
        {"resource_size": "LARGE"},
        {},
        {
            "resource_size_request": "CUSTOM_SIZE",
            "custom_cpu_cores": 2,
            "custom_gb_memory": 4,
            "custom_disk_size": 20,
        },
    ),
    (
        SandboxSpec(idle_timeout=30, memory_mb=512),
        {"keep_alive_time_seconds": 600},
        {},
        {
            "resource_size_request": "CUSTOM_SIZE",
            "custom_gb_memory": 1,
            "keep_alive_time_seconds": 600,
            "after_idle": {"idle_time_seconds": 30, "on_idle": "shutdown"},
        },
    ),
    (SandboxSpec(), {"resource_size": "SMALL"}, {}, {"resource_size_request": "SMALL"}),
]


async def test_create_parameters(emu: RunloopEmulator) -> None:
    """Template, entry options and spec resources become Runloop's create fields."""
    for spec, entry, source, launch in CREATE_PARAMETERS:
        adapter = RunloopProvider("runloop-p", options(emu, **entry))
        sbx = await adapter.create(spec, timeout=5)
        try:
            devbox = emu.core.devboxes[sbx.id]
            assert (devbox.source, devbox.launch_parameters) == (source, launch), (spec, entry)
            info = await sbx.native.get_info()
            assert (info.blueprint_id, info.snapshot_id) == (
                source.get("blueprint_id"),
                source.get("snapshot_id"),
            )
        finally:
            await sbx.kill()
            await adapter.aclose()


async def test_unknown_blueprint_is_not_found(emu: RunloopEmulator) -> None:
    emu.blueprints = {"base"}
    adapter = RunloopProvider("runloop-b", options(emu, blueprint_name="nope"))
    with pytest.raises(NotFound, match="Blueprint nope not found") as missing:
        await adapter.create(SandboxSpec(), timeout=5)
    assert missing.value.status == 404
    sbx = await adapter.create(SandboxSpec(template="base"), timeout=5)
    await sbx.kill()
    await adapter.aclose()


async def test_slow_command_waits_past_the_first_hold(sandbox: RunloopSandbox) -> None:
    started = time.monotonic()
    done = await sandbox.run("sleep 1.5; echo late", timeout=10)
    assert (done.stdout, done.exit_code, done.timed_out) == ("late\n", 0, False)
    assert time.monotonic() - started < 4


async def test_command_timeout_is_a_result(emu: RunloopEmulator, sandbox: RunloopSandbox) -> None:
    started = time.monotonic()
    result = await sandbox.run("echo begun; sleep 30", timeout=1)
    assert result.timed_out
    assert not result.ok
    assert result.stdout == "begun\n"
    assert time.monotonic() - started < 3.5
    executions = emu.core.devboxes[sandbox.id].executions.values()
    assert [e.exit_status for e in executions] == [137]
    slow = await sandbox.run_code("import time; time.sleep(30)", timeout=1.2)
    assert slow.timed_out
    assert slow.error is not None
    # The cell was interrupted; its kernel (one execution) runs on, keeping its state.
    assert [e.exit_status for e in executions] == [137, None]
    assert (await sandbox.run_code("time.sleep(0)\n'kept'")).text == "kept"


async def test_gone_devbox_is_not_found(emu: RunloopEmulator, provider: RunloopProvider) -> None:
    emu.reap_interval = 0.1
    sbx = await provider.create(SandboxSpec(lifetime=1), timeout=5)
    await until(lambda: not emu.alive())
    assert [r.ended_by for r in emu.records()] == ["expired"]
    assert emu.core.devboxes[sbx.id].view()["shutdown_reason"] == "keep_alive_timeout"
    with pytest.raises(NotFound) as gone:
        await sbx.run("true")
    assert gone.value.sandbox_id == sbx.id
    with pytest.raises(NotFound):
        await sbx.keepalive(60)
    with pytest.raises(NotFound):
        await provider.connect(sbx.id)
    await sbx.kill()
    assert await provider.kill(sbx.id) is False
    assert await provider.kill("dbx_never_existed") is False


async def test_keepalive_resets_the_idle_timer(
    emu: RunloopEmulator, provider: RunloopProvider
) -> None:
    emu.reap_interval = 0.1
    sbx = await provider.create(SandboxSpec(idle_timeout=1), timeout=5)
    for _ in range(5):
        await asyncio.sleep(0.3)
        await sbx.keepalive(1)
    assert [r.id for r in emu.alive()] == [sbx.id]
    await until(lambda: not emu.alive())
    assert [r.ended_by for r in emu.records()] == ["expired"]
    assert emu.core.devboxes[sbx.id].view()["shutdown_reason"] == "idle"


CONCURRENCY = "Too many concurrent devboxes: this account may run at most 20 devboxes at once."
QUOTA = "Usage limit exceeded: this account's quota of 100 devboxes is spent."


@pytest.mark.parametrize(
    ("fault", "error", "status"),
    [
        ({"status": 401}, AuthError, 401),
        ({"status": 429, "retry_after": 9}, RateLimited, 429),
        ({"status": 429, "message": CONCURRENCY}, CapacityExceeded, 429),
        ({"status": 403, "message": QUOTA}, QuotaExceeded, 403),
        ({"status": 403, "message": "API key lacks the devbox:write scope"}, AuthError, 403),
        ({"status": 503}, Unavailable, 503),
        ({"status": 500}, Unavailable, 500),
        ({"status": 502}, Unavailable, 502),
        ({"status": 404, "message": "Blueprint x not found"}, NotFound, 404),
        ({"status": 409, "message": "conflicting request"}, ProviderError, 409),
        ({"drop": True}, Unavailable, None),
        ({"hang": True}, Unavailable, None),
        ({"delay": 3}, Unavailable, None),
    ],
)
async def test_create_faults_map_to_router_errors(
    emu: RunloopEmulator,
    fault: dict[str, Any],
    error: type[ProviderError],
    status: int | None,
) -> None:
    """The create request is bounded by ``request_timeout`` (1 s here), not by the
    create's ``timeout``; one that got no answer says so (``unanswered``)."""
    provider = RunloopProvider("runloop-a", options(emu, request_timeout=1))
    emu.inject("create", **fault)
    started = time.monotonic()
    with pytest.raises(error) as raised:
        await provider.create(SandboxSpec(), timeout=1)
    assert type(raised.value) is error
    if isinstance(raised.value, Unavailable):
        assert raised.value.unanswered == any(key in fault for key in ("drop", "hang", "delay"))
    assert time.monotonic() - started < 2.5
    assert (raised.value.provider, raised.value.status) == ("runloop-a", status)
    if fault.get("message"):
        assert fault["message"] in raised.value.message
    if fault.get("retry_after"):
        assert isinstance(raised.value, RateLimited)
        assert raised.value.retry_after == 9
    assert TEST_API_KEY not in str(raised.value)
    sbx = await provider.create(SandboxSpec(), timeout=5)
    await sbx.kill()
    assert len(emu.records()) == 1
    await provider.aclose()


async def test_quota_reset_from_retry_after(
    emu: RunloopEmulator, provider: RunloopProvider
) -> None:
    emu.inject("create", status=403, message=QUOTA, retry_after=3600)
    with pytest.raises(QuotaExceeded) as spent:
        await provider.create(SandboxSpec(), timeout=2)
    assert spent.value.reset_at is not None
    assert 3500 < spent.value.reset_at.timestamp() - time.time() <= 3600


@pytest.mark.parametrize(
    ("op", "fault", "ended_by"),
    [
        ("boot", {"hang": True}, "kill"),
        ("boot", {"delay": 5}, "kill"),
        ("boot", {"status": 500}, "failure"),
        ("wait", {"status": 503}, "kill"),
        ("wait", {"hang": True}, "kill"),
        ("wait", {"drop": True, "times": None}, "kill"),
    ],
)
async def test_devbox_not_running_in_time_is_shut_down(
    emu: RunloopEmulator,
    provider: RunloopProvider,
    op: str,
    fault: dict[str, Any],
    ended_by: str,
) -> None:
    emu.inject(op, **fault)
    started = time.monotonic()
    with pytest.raises(Unavailable) as raised:
        await provider.create(SandboxSpec(), timeout=1)
    assert time.monotonic() - started < 2.5
    (record,) = emu.records()
    assert raised.value.sandbox_id == record.id
    assert (record.alive, record.ended_by) == (False, ended_by)


async def test_slow_boot_within_the_timeout_succeeds(
    emu: RunloopEmulator, provider: RunloopProvider
) -> None:
    emu.inject("boot", delay=0.5)
    emu.inject("create", delay=0.3)
    sbx = await provider.create(SandboxSpec(), timeout=3)
    assert emu.core.devboxes[sbx.id].status == "running"
    await sbx.kill()


async def test_cancelled_create_shuts_the_devbox_down(
    emu: RunloopEmulator, provider: RunloopProvider
) -> None:
    emu.inject("boot", hang=True)
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(provider.create(SandboxSpec(), timeout=30), 3)
    await provider.aclose()
    assert [(r.alive, r.ended_by) for r in emu.records()] == [(False, "kill")]


async def test_5xx_burst_then_recovery(emu: RunloopEmulator, provider: RunloopProvider) -> None:
    emu.inject("create", status=503, times=3)
    for _ in range(3):
        with pytest.raises(Unavailable):
            await provider.create(SandboxSpec(), timeout=2)
    sbx = await provider.create(SandboxSpec(), timeout=2)
    await sbx.kill()
    assert emu.core.faults.hits["create"] == 3


async def test_account_limits(emu: RunloopEmulator, provider: RunloopProvider) -> None:
    emu.set_quota(max_concurrent=1, api_key=TEST_API_KEY)
    first = await provider.create(SandboxSpec(), timeout=2)
    with pytest.raises(CapacityExceeded, match="at most 1 devboxes") as capped:
        await provider.create(SandboxSpec(), timeout=2)
    assert capped.value.status == 429
    await first.kill()
    emu.set_quota(max_created=1, api_key=TEST_API_KEY)
    second = await provider.create(SandboxSpec(), timeout=2)
    await second.kill()
    with pytest.raises(QuotaExceeded, match="quota of 1 devboxes") as spent:
        await provider.create(SandboxSpec(), timeout=2)
    assert spent.value.status == 403


async def test_refused_key(emu: RunloopEmulator) -> None:
    emu.core.accepted_keys = {TEST_API_KEY}
    stranger = RunloopProvider("runloop-b", options(emu, api_key="ak_unknown_key"))
    with pytest.raises(AuthError) as refused:
        await stranger.create(SandboxSpec(), timeout=2)
    assert refused.value.status == 401
    with pytest.raises(AuthError):
        await stranger.list()
    await stranger.aclose()


async def test_devboxes_of_another_account_are_not_found(
    emu: RunloopEmulator, sandbox: RunloopSandbox
) -> None:
    other = RunloopProvider("runloop-other", options(emu, api_key="ak_other_account"))
    assert await other.list() == []
    with pytest.raises(NotFound):
        await other.connect(sandbox.id)
    assert await other.kill(sandbox.id) is False
    await other.aclose()


@pytest.mark.parametrize(
    ("op", "fault", "call", "error"),
    [
        ("exec", {"hang": True}, "run", Unavailable),
        ("exec", {"drop": True}, "run", Unavailable),
        ("exec", {"status": 502, "message": "upstream connect error"}, "run", Unavailable),
        ("exec", {"status": 429}, "run", RateLimited),
        ("exec", {"status": 401}, "run", AuthError),
        ("files", {"status": 503}, "read", Unavailable),
        ("files", {"drop": True}, "write", Unavailable),
        ("exec", {"status": 500}, "code", Unavailable),
        ("keepalive", {"status": 500}, "keepalive", Unavailable),
        ("list", {"status": 429, "retry_after": 3}, "list", RateLimited),
        ("get", {"status": 503}, "connect", Unavailable),
        ("kill", {"status": 500}, "kill", Unavailable),
        ("kill", {"hang": True}, "kill", Unavailable),
    ],
)
async def test_operation_faults_map_to_router_errors(
    emu: RunloopEmulator,
    provider: RunloopProvider,
    op: str,
    fault: dict[str, Any],
    call: str,
    error: type[ProviderError],
) -> None:
    sbx = await provider.create(SandboxSpec(), timeout=5)
    provider_calls: dict[str, Callable[[], Any]] = {
        "run": lambda: sbx.run("echo hi", timeout=1),
        "read": lambda: sbx.read_file("x"),
        "write": lambda: sbx.write_file("x", b"\x00"),
        "list": provider.list,
        "code": lambda: sbx.run_code("1"),
        "keepalive": lambda: sbx.keepalive(60),
        "connect": lambda: provider.connect(sbx.id),
        "kill": lambda: provider.kill(sbx.id),
    }
    emu.inject(op, **fault)
    try:
        with pytest.raises(error) as raised:
            await provider_calls[call]()
        assert type(raised.value) is error
        assert raised.value.provider == "runloop-a"
    finally:
        emu.clear_faults()
        await sbx.kill()


async def test_dead_endpoint_is_unavailable_at_once() -> None:
    dead = RunloopProvider(
        "runloop-dead",
        RunloopOptions(api_key=SecretStr(TEST_API_KEY), base_url=f"http://127.0.0.1:{free_port()}"),
    )
    started = time.monotonic()
    with pytest.raises(Unavailable) as refused:
        await dead.create(SandboxSpec(), timeout=10)
    assert time.monotonic() - started < 5  # the SDK's 5 default retries take ~26 s
    assert "APIConnectionError" in refused.value.message
    with pytest.raises(Unavailable):
        await dead.list()
    await dead.aclose()


def test_no_sdk_import() -> None:
    """Importing (and configuring) the adapter imports no SDK."""
    script = textwrap.dedent(
        """
        import sys
        from providers.runloop import RunloopOptions, RunloopProvider
        assert RunloopProvider("rl", RunloopOptions(api_key="k")).configured()
        assert "runloop_api_client" not in sys.modules
        """
    )
    subprocess.run([sys.executable, "-c", script], timeout=60, check=True)


async def test_secrets_never_leak(
    emu: RunloopEmulator, caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]
) -> None:
    secret = "ak_secret_" + "7" * 30
    emu.core.accepted_keys = {secret}
    opts = options(emu, api_key=secret)
    adapter = RunloopProvider("runloop-secret", opts)
    caplog.set_level(logging.DEBUG)
    seen: list[str] = [repr(opts), str(opts), opts.model_dump_json(), repr(adapter)]
    with structlog.testing.capture_logs() as events:
        sbx = await adapter.create(SandboxSpec(labels={"k": "v"}), timeout=5)
        await sbx.run("echo hi")
        await sbx.kill()
        emu.inject("boot", hang=True)
        with pytest.raises(Unavailable) as slow:
            await adapter.create(SandboxSpec(), timeout=1)
        emu.core.accepted_keys = {"ak_another"}
        with pytest.raises(AuthError) as refused:
            await adapter.create(SandboxSpec(), timeout=5)
        emu.inject("create", status=500, message="boom")
        emu.core.accepted_keys = None
        with pytest.raises(Unavailable) as failed:
            await adapter.create(SandboxSpec(), timeout=5)
    await adapter.aclose()
    assert {e["event"] for e in events} >= {
        "sandbox_router.runloop.created",
        "sandbox_router.runloop.discarded",
    }
    for err in (slow.value, refused.value, failed.value):
        seen += [str(err), repr(err), str(err.__cause__), repr(err.__cause__)]
    seen += [repr(e) for e in events] + [caplog.text] + list(capsys.readouterr())
    assert [text for text in seen if secret in text] == []


async def test_a_quiet_process_streams_across_reconnects_without_repeats(
    sandbox: RunloopSandbox,
) -> None:
    """A stream idle past the 1 s request timeout is reopened from its last chunk's offset."""
    proc = await sandbox.start("echo one; sleep 2.5; echo two; echo err >&2")
    done = await proc.wait(timeout=10)
    assert (done.stdout, done.stderr, done.exit_code) == ("one\ntwo\n", "err\n", 0)


async def test_stdin_takes_text_decoded_across_writes(sandbox: RunloopSandbox) -> None:
    cat = await sandbox.start("cat")
    accented = "é€\n".encode()
    await cat.write_stdin(accented[:1])  # a character split between two writes
    await cat.write_stdin(accented[1:])
    with pytest.raises(InvalidArgument, match="UTF-8"):
        await cat.write_stdin(b"\xff")
    await cat.close_stdin()
    assert (await cat.wait(timeout=10)).stdout == "é€\n"


async def test_a_stream_error_ends_the_process_handle(
    emu: RunloopEmulator, sandbox: RunloopSandbox
) -> None:
    """The handle reads the streams itself: a failure is the waiter's, never swallowed."""
    proc = await sandbox.start("echo up; sleep 0.5")
    assert (await anext(proc.output())).data == "up\n"
    emu.inject("exec", status=500, times=None)
    with pytest.raises(Unavailable):
        await proc.wait(timeout=10)
    assert proc.finished


async def test_attach_finds_executions_by_id_only(
    provider: RunloopProvider, sandbox: RunloopSandbox
) -> None:
    proc = await sandbox.start("echo before; sleep 1; echo after")
    other = await provider.connect(sandbox.id)
    again = await other.attach(proc.id)
    assert (await again.wait(timeout=10)).stdout == "before\nafter\n"
    assert await again.kill() is False
    for unknown in ("", "exn_never_started"):
        with pytest.raises(NotFound):
            await other.attach(unknown)


async def test_files_stream_through_bounded_memory(sandbox: RunloopSandbox) -> None:
    """24 MiB up and down (adapter and emulator in this process) within a few MiB."""
    block = os.urandom(1 << 20)

    async def chunks() -> AsyncIterator[bytes]:
        for _ in range(24):
            yield block

    tracemalloc.start()
    try:
        await sandbox.write_stream("deep/big.bin", chunks())
        digest = hashlib.sha256()
        async for chunk in sandbox.read_stream("deep/big.bin"):
            digest.update(chunk)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert digest.hexdigest() == hashlib.sha256(block * 24).hexdigest()
    assert peak < 10 * (1 << 20), f"the transfer held {peak} bytes"
    with pytest.raises(SandboxError, match="no/such") as missing:
        async for _ in sandbox.read_stream("no/such"):
            pass
    assert missing.value.sandbox_id == sandbox.id


async def test_expose_reuses_the_devbox_tunnel(
    emu: RunloopEmulator, sandbox: RunloopSandbox
) -> None:
    first = await sandbox.expose(8080)
    second = await sandbox.expose(9090)
    key = emu.core.devboxes[sandbox.id].tunnel.key  # type: ignore[union-attr]
    assert first.url == f"https://8080-{key}.tunnel.127.0.0.1"
    assert second.url == f"https://9090-{key}.tunnel.127.0.0.1"
    token = first.headers["X-Runloop-Tunnel-Authorization"]
    assert token.startswith("Bearer ")
    assert token[7:] not in repr(first)
    with pytest.raises(InvalidArgument, match="expose"):
        await sandbox.expose(0)


async def test_pause_ends_processes_and_resume_waits_for_the_cap(
    emu: RunloopEmulator, provider: RunloopProvider, sandbox: RunloopSandbox
) -> None:
    sleeper = await sandbox.start("sleep 300")
    await sandbox.pause()
    assert await sleeper.wait(timeout=5) != 0
    emu.set_quota(max_concurrent=1)
    other = await provider.create(SandboxSpec(), timeout=5)  # the paused devbox frees its slot
    with pytest.raises(CapacityExceeded):
        await provider.resume(sandbox.id, timeout=5)
    await other.kill()
    woken = await provider.resume(sandbox.id, timeout=5)
    assert (await woken.run("echo up")).stdout == "up\n"
    assert await provider.delete_snapshot("snp_never_made") is False
