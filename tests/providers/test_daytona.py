"""The daytona adapter on Daytona's generated API clients (the SDK for ``.native``), against
the Daytona emulator: lifecycle and errors."""

from __future__ import annotations

import asyncio
import logging
import subprocess
import sys
import textwrap
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import structlog

from emulators.daytona import TEST_API_KEY, DaytonaEmulator
from emulators.daytona.api import DEFAULT_SNAPSHOT
from emulators.daytona.sandboxes import Box
from emulators.daytona.warm_pools import WarmPool
from emulators.harness import Emulator, free_port
from providers import provider_class
from providers.base import SandboxSpec
from providers.capabilities import Capability
from providers.daytona import DaytonaOptions, DaytonaProvider, DaytonaSandbox
from providers.daytona.processes import KILLED, SESSION_PREFIX
from providers.daytona.sandbox import SNAPSHOT_PREFIX
from providers.errors import (
    AuthError,
    CapacityExceeded,
    NotFound,
    ProviderError,
    QuotaExceeded,
    RateLimited,
    SandboxError,
    Unavailable,
    Unsupported,
)
from providers.processes import ProcessInfo
from tests.polling import until

LANGUAGE_LABEL = "code-toolbox-language"


@pytest.fixture
def emu(daytona_emulator: Emulator) -> Iterator[DaytonaEmulator]:
    assert isinstance(daytona_emulator, DaytonaEmulator)
    daytona_emulator.reap_interval = 0.1
    yield daytona_emulator
    assert daytona_emulator.alive() == [], "a test left a sandbox alive"


def options(emu: DaytonaEmulator, **kw: Any) -> DaytonaOptions:
    settings: dict[str, Any] = {
        "api_key": TEST_API_KEY,
        "api_url": emu.api_url,
        "request_timeout": 2,
        **kw,
    }
    return DaytonaOptions(**settings)


@pytest.fixture
async def provider(emu: DaytonaEmulator) -> AsyncIterator[DaytonaProvider]:
    adapter = DaytonaProvider("daytona-a", options(emu))
    yield adapter
    emu.clear_faults()
    for info in await adapter.list():
        await adapter.kill(info.id)
    await adapter.aclose()


@pytest.fixture
async def sandbox(provider: DaytonaProvider) -> AsyncIterator[DaytonaSandbox]:
    created = await provider.create(SandboxSpec(env={"GLOBAL": "g"}), timeout=5)
    yield created
    await created.kill()


def box(emu: DaytonaEmulator, sandbox_id: str) -> Box:
    return emu.core.boxes[sandbox_id]


def test_registered_with_validated_options() -> None:
    assert provider_class("daytona") is DaytonaProvider
    with pytest.raises(ValueError, match="extra"):
        DaytonaOptions(api_key="k", unknown=1)  # type: ignore[arg-type, call-arg]
    with pytest.raises(ValueError, match="at most one"):
        DaytonaOptions(snapshot="base", image="python:3.12")


async def test_api_url_from_the_environment(
    emu: DaytonaEmulator, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in emu.sdk_env().items():
        monkeypatch.setenv(name, value)
    adapter = DaytonaProvider("daytona-env")
    sbx = await adapter.create(SandboxSpec(), timeout=5)
    assert (await sbx.run("echo via env")).stdout == "via env\n"
    await sbx.kill()
    await adapter.aclose()


def test_one_provider_on_two_event_loops(emu: DaytonaEmulator) -> None:
    """Closed on each loop (its connection pool lives on it), an entry serves the next."""
    adapter = DaytonaProvider("daytona-loops", options(emu))

    async def round_trip() -> str:
        sbx = await adapter.create(SandboxSpec(), timeout=5)
        try:
            return (await sbx.run("echo ok")).stdout
        finally:
            await sbx.kill()
            await adapter.aclose()

    for _ in range(2):
        started = time.monotonic()
        assert asyncio.run(round_trip()) == "ok\n"
        assert time.monotonic() - started < 5


CREATE_PARAMETERS: list[tuple[SandboxSpec, dict[str, Any], dict[str, Any]]] = [
    (SandboxSpec(), {}, {"snapshot": "daytonaio/sandbox:0.5.0", "auto_stop": 15, "ttl": 0}),
    (SandboxSpec(template="base"), {"snapshot": "other"}, {"snapshot": "base"}),
    (SandboxSpec(), {"snapshot": "base", "target": "eu"}, {"snapshot": "base", "target": "eu"}),
    (
        SandboxSpec(idle_timeout=90, lifetime=30, language="javascript"),
        {"auto_delete_interval": -1, "auto_archive_interval": 60},
        {"auto_stop": 2, "ttl": 1, "auto_delete": -1, "auto_archive": 60},
    ),
    (SandboxSpec(), {"auto_stop_interval": 0}, {"auto_stop": 0}),
    (
        SandboxSpec(cpu=2, memory_mb=3000, disk_gb=20),
        {"image": "python:3.12-slim"},
        {"snapshot": None, "cpu": 2, "memory": 3, "disk": 20},
    ),
    (
        SandboxSpec(template="node:22"),
        {"template_source": "image"},
        {"snapshot": None, "cpu": 1, "memory": 1, "disk": 3},
    ),
]


async def test_create_parameters(emu: DaytonaEmulator) -> None:
    """Template, entry options and spec resources become Daytona's create fields."""
    for spec, entry, expected in CREATE_PARAMETERS:
        adapter = DaytonaProvider("daytona-p", options(emu, **entry))
        sbx = await adapter.create(spec, timeout=5)
        try:
            made = box(emu, sbx.id)
            seen = {key: getattr(made, key) for key in expected}
            assert seen == expected, (spec, entry)
            if "image" in entry or "template_source" in entry:
                image = entry.get("image") or spec.template
                assert made.build_info is not None
                assert made.build_info["dockerfileContent"].startswith(f"FROM {image}")
            assert made.labels[LANGUAGE_LABEL] == (spec.language or "python")
        finally:
            await sbx.kill()
            await adapter.aclose()


async def test_python_runs_in_the_interpreter_whatever_the_language(
    provider: DaytonaProvider,
) -> None:
    sbx = await provider.create(SandboxSpec(language="javascript"), timeout=5)
    try:
        assert sbx.language == "javascript"
        ran = await sbx.run_code("import sys\nprint('out')\nprint('err', file=sys.stderr)")
        assert (ran.stdout, ran.stderr, ran.exit_code, ran.error) == ("out\n", "err\n", 0, None)
        assert ran.stateful
        failed = await sbx.run_code("1 / 0")
        assert (failed.exit_code, failed.error) == (1, "ZeroDivisionError: division by zero")
        bash = await sbx.run_code("echo $((6 * 7))", "bash")
        assert (bash.stdout, bash.stateful) == ("42\n", False)
    finally:
        await sbx.kill()


async def test_a_process_is_a_session_whose_deletion_ends_all_it_started(
    emu: DaytonaEmulator, sandbox: DaytonaSandbox
) -> None:
    beats = "(while :; do date +%s%N > beat; sleep 0.05; done) &"
    proc = await sandbox.start(f"date +%s%N > beat; {beats} echo up; wait")  # up: beat exists
    session, _, command = proc.id.partition(":")
    assert session.startswith(SESSION_PREFIX)
    assert command in {c.id for c in box(emu, sandbox.id).sessions[session].commands.values()}
    assert (await anext(proc.output())).data == "up\n"
    watcher = await sandbox.attach(proc.id)
    assert await proc.kill()
    assert (await proc.wait(5)).exit_code == KILLED
    assert (await watcher.wait(5)).exit_code == KILLED  # its session is gone: killed
    assert session not in box(emu, sandbox.id).sessions
    before = await sandbox.read_file("beat")
    await asyncio.sleep(0.3)
    assert await sandbox.read_file("beat") == before, "the background child outlived the kill"


async def test_processes_show_the_callers_command_and_attach_checks_ids(
    sandbox: DaytonaSandbox,
) -> None:
    await sandbox.run("true")  # a pooled session of `run`: not a background process
    proc = await sandbox.start("echo $TOKEN >/dev/null; sleep 0.2", env={"TOKEN": "s3cret"})
    assert await proc.wait(5)
    listed = await sandbox.processes()
    assert listed == [ProcessInfo(proc.id, "echo $TOKEN >/dev/null; sleep 0.2", False, 0)]
    again = await sandbox.attach(proc.id)
    assert (await again.wait(5)).exit_code == 0  # a finished process is still there
    for unknown in ("1", proc.id.split(":")[0] + ":nope", "sandbox-router-1a2b:"):
        with pytest.raises(NotFound):
            await sandbox.attach(unknown)
    with pytest.raises(Unsupported, match="stdin"):
        await proc.write_stdin("x")


async def test_terminal_kill_ends_it_with_sigkill(sandbox: DaytonaSandbox) -> None:
    tty = await sandbox.open_terminal(rows=10, cols=40)
    assert await tty.kill()
    assert await tty.wait(5) == KILLED
    assert await tty.kill() is False


async def test_a_toolbox_call_daytona_never_answers_is_unavailable(
    emu: DaytonaEmulator, sandbox: DaytonaSandbox
) -> None:
    tty = await sandbox.open_terminal(rows=10, cols=40)
    emu.inject("exec", hang=True, times=None)
    for call in (lambda: tty.resize(20, 80), tty.kill):
        with pytest.raises(Unavailable, match="did not answer in time"):
            await asyncio.wait_for(call(), 10)  # request_timeout is 2 s
    with pytest.raises(Unavailable, match="did not answer in time"):
        await asyncio.wait_for(sandbox.open_terminal(), 10)
    with pytest.raises(Unavailable, match="did not answer in time"):  # its websocket's upgrade
        await asyncio.wait_for(sandbox.run_code("1", timeout=None), 10)
    emu.clear_faults()
    assert await tty.kill()


async def test_a_sandbox_whose_view_has_no_toolbox_url_asks_the_api_once(
    emu: DaytonaEmulator, provider: DaytonaProvider
) -> None:
    emu.toolbox_in_views = False
    try:
        made = await provider.create(SandboxSpec(), timeout=5)
        again = await provider.connect(made.id)
        for sbx in (made, again):
            assert (await sbx.run("echo $((6 * 7))", timeout=5)).stdout == "42\n"
            await sbx.write_file("f.txt", b"kept")
            assert await sbx.read_file("f.txt") == b"kept"
        emu.inject("toolbox_url", status=500, times=None)  # asked once per handle
        assert (await made.run("true", timeout=5)).exit_code == 0
        with pytest.raises(Unavailable):
            await (await provider.connect(made.id)).run("true", timeout=5)
    finally:
        emu.clear_faults()
        emu.toolbox_in_views = True
    await made.kill()


async def test_unknown_snapshot_is_not_found(emu: DaytonaEmulator) -> None:
    emu.snapshots = {"base"}
    adapter = DaytonaProvider("daytona-s", options(emu, snapshot="nope"))
    with pytest.raises(NotFound, match="Snapshot nope not found") as missing:
        await adapter.create(SandboxSpec(), timeout=5)
    assert missing.value.status == 400
    sbx = await adapter.create(SandboxSpec(template="base"), timeout=5)
    await sbx.kill()
    await adapter.aclose()


async def test_snapshot_names_and_an_image_entry(
    emu: DaytonaEmulator,
    provider: DaytonaProvider,
    sandbox: DaytonaSandbox,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A made name is unique, a taken one is refused (Daytona would keep the old one
    silently), and a snapshot's id names a snapshot on an entry whose templates are images."""
    await sandbox.write_file("kept.txt", b"kept")
    made = await sandbox.snapshot()
    assert (made.name or "").startswith(SNAPSHOT_PREFIX)
    with pytest.raises(SandboxError, match="already has a snapshot named"):
        await sandbox.snapshot(made.name)
    images = DaytonaProvider("daytona-i", options(emu, template_source="image"))
    child = await images.create(SandboxSpec(template=made.id), timeout=5)
    try:
        assert box(emu, child.id).build_info is None
        assert await child.read_file("kept.txt") == b"kept"
    finally:
        await child.kill()
        await images.aclose()
    monkeypatch.setattr(emu, "boot_seconds", 0.5)  # Daytona's removal takes a while
    assert await provider.delete_snapshot(made.id) is True
    with pytest.raises(NotFound, match="is removing"):
        await provider.create(SandboxSpec(template=made.id), timeout=5)
    assert await provider.delete_snapshot("never-made") is False


async def test_runs_in_flight_do_not_wait_for_each_other(sandbox: DaytonaSandbox) -> None:
    started = time.monotonic()
    slow, quick = await asyncio.gather(sandbox.run("sleep 2; echo slow"), sandbox.run("echo quick"))
    assert (slow.stdout, quick.stdout) == ("slow\n", "quick\n")
    assert quick.duration < 1.5  # well before the slow one ends (0.41 s seen under load)
    assert time.monotonic() - started < 3.5
    lines = await sandbox.run("seq 1 3000; seq 1 200 >&2; exit 4")
    assert lines.stdout == "".join(f"{i}\n" for i in range(1, 3001))
    assert lines.stderr == "".join(f"{i}\n" for i in range(1, 201))
    assert lines.exit_code == 4


async def test_command_timeout_is_a_result(emu: DaytonaEmulator, sandbox: DaytonaSandbox) -> None:
    started = time.monotonic()
    result = await sandbox.run("echo begun; sleep 30", timeout=0.5)
    assert (result.timed_out, result.ok, result.stdout) == (True, False, "begun\n")
    assert time.monotonic() - started < 2
    assert box(emu, sandbox.id).sessions == {}, "the timed-out command's session is dropped"
    assert (await sandbox.run("echo after")).stdout == "after\n"
    slow = await sandbox.run_code("import time; time.sleep(30)", timeout=0.5)
    assert slow.timed_out
    assert slow.error is not None


async def test_gone_sandbox_is_not_found(emu: DaytonaEmulator, provider: DaytonaProvider) -> None:
    emu.core.minute = 0.3
    sbx = await provider.create(SandboxSpec(lifetime=1), timeout=5)
    await until(lambda: emu.core.boxes[sbx.id].state == "destroyed")  # not just destroying
    assert [r.ended_by for r in emu.records()] == ["expired"]
    with pytest.raises(NotFound) as gone:
        await sbx.run("true")
    assert gone.value.sandbox_id == sbx.id
    with pytest.raises(NotFound):
        await sbx.read_file("x")
    with pytest.raises(NotFound):
        await sbx.keepalive(60)
    with pytest.raises(NotFound):
        await provider.connect(sbx.id)
    await sbx.kill()
    assert await provider.kill(sbx.id) is False
    assert await provider.kill("00000000-0000-0000-0000-000000000000") is False


async def test_idle_sandbox_stops_unless_kept_alive(
    emu: DaytonaEmulator, provider: DaytonaProvider
) -> None:
    emu.core.minute = 0.5
    sbx = await provider.create(SandboxSpec(idle_timeout=30), timeout=5)
    for _ in range(4):
        await asyncio.sleep(0.2)
        await sbx.keepalive(30)
    assert box(emu, sbx.id).state == "started"
    await until(lambda: not emu.alive())
    assert [r.ended_by for r in emu.records()] == ["expired"]
    await until(lambda: box(emu, sbx.id).state == "destroyed")  # "destroying" first, under load
    assert box(emu, sbx.id).state == "destroyed", "auto-delete 0: deleted once stopped"


async def test_stopped_sandbox_is_started_on_connect(emu: DaytonaEmulator) -> None:
    emu.core.minute = 0.3
    adapter = DaytonaProvider("daytona-keep", options(emu, auto_delete_interval=-1))
    sbx = await adapter.create(SandboxSpec(idle_timeout=1), timeout=5)
    await sbx.write_file("kept.txt", "still here")
    await until(lambda: box(emu, sbx.id).state == "stopped")
    with pytest.raises(NotFound, match="not running"):
        await sbx.run("true")
    assert [i.state for i in await adapter.list()] == [
        "paused"
    ]  # stopped: resumable, as a paused sandbox is
    emu.core.minute = 60  # started again, it must not stop idle before the read under load
    again = await adapter.connect(sbx.id)
    assert (await again.run("cat kept.txt")).stdout == "still here"
    await again.kill()
    await adapter.aclose()


LIMIT = "Total CPU limit exceeded. Maximum allowed: 10."


@pytest.mark.parametrize(
    ("fault", "error", "status"),
    [
        ({"status": 401}, AuthError, 401),
        ({"status": 429, "retry_after": 9}, RateLimited, 429),
        ({"status": 403}, CapacityExceeded, 403),
        ({"status": 400, "message": LIMIT}, CapacityExceeded, 400),
        ({"status": 400, "message": "Sandbox quota exceeded"}, QuotaExceeded, 400),
        ({"status": 403, "message": "Forbidden resource"}, AuthError, 403),
        ({"status": 503}, Unavailable, 503),
        ({"status": 500}, Unavailable, 500),
        ({"status": 502}, Unavailable, 502),
        ({"status": 504}, Unavailable, 504),
        ({"status": 408}, Unavailable, 408),
        ({"status": 409, "message": "Sandbox with name x already exists"}, ProviderError, 409),
        ({"drop": True}, Unavailable, None),
        ({"hang": True}, Unavailable, None),
        ({"delay": 3}, Unavailable, None),
    ],
)
async def test_create_faults_map_to_router_errors(
    emu: DaytonaEmulator,
    fault: dict[str, Any],
    error: type[ProviderError],
    status: int | None,
) -> None:
    """The create request is bounded by ``request_timeout`` (1 s here), not by the
    create's ``timeout``; one that got no answer says so (``unanswered``)."""
    provider = DaytonaProvider("daytona-a", options(emu, request_timeout=1))
    emu.inject("create", **fault)
    started = time.monotonic()
    with pytest.raises(error) as raised:
        await provider.create(SandboxSpec(), timeout=1)
    assert type(raised.value) is error
    if isinstance(raised.value, Unavailable):
        assert raised.value.unanswered == any(key in fault for key in ("drop", "hang", "delay"))
    assert time.monotonic() - started < 2.5
    assert (raised.value.provider, raised.value.status) == ("daytona-a", status)
    if fault.get("message"):
        assert fault["message"] in raised.value.message
    if "retry_after" in fault:
        assert isinstance(raised.value, RateLimited)
        assert raised.value.retry_after == fault["retry_after"]
    assert TEST_API_KEY not in str(raised.value)
    sbx = await provider.create(SandboxSpec(), timeout=5)
    await sbx.kill()
    await provider.aclose()


@pytest.mark.parametrize(
    "boot",
    [{"status": 500, "message": "no runner available"}, {"hang": True}, {"delay": 3}],
    ids=["error-state", "never-starts", "slow-start"],
)
async def test_a_sandbox_that_does_not_start_is_deleted(
    emu: DaytonaEmulator, provider: DaytonaProvider, boot: dict[str, Any]
) -> None:
    emu.inject("boot", **boot)
    with pytest.raises(Unavailable) as failed:
        await provider.create(SandboxSpec(), timeout=1)
    (record,) = emu.records()
    assert failed.value.sandbox_id == record.id
    if "message" in boot:
        assert "no runner available" in failed.value.message
    assert record.ended_by == "kill"


async def test_a_failed_sandbox_left_behind_can_be_reaped(
    emu: DaytonaEmulator, provider: DaytonaProvider
) -> None:
    emu.inject("boot", status=500, message="no runner available")
    emu.inject("kill", status=500)
    entry = {"sandbox_router_entry": "daytona-a"}
    with pytest.raises(Unavailable):
        await provider.create(SandboxSpec(labels=entry), timeout=1)
    (left,) = await provider.list(entry)
    assert (left.state, left.labels["sandbox_router_entry"]) == ("error", "daytona-a")
    with pytest.raises(NotFound, match="error"):
        await provider.connect(left.id)
    assert await provider.kill(left.id) is True
    assert await provider.list(entry) == []


async def test_cancelled_create_deletes_its_sandbox(
    emu: DaytonaEmulator, provider: DaytonaProvider
) -> None:
    emu.inject("boot", delay=1)
    creating = asyncio.create_task(provider.create(SandboxSpec(), timeout=5))
    await until(emu.records)
    creating.cancel()
    with pytest.raises(asyncio.CancelledError):
        await creating
    await until(lambda: not emu.alive())
    assert [r.ended_by for r in emu.records()] == ["kill"]


async def test_5xx_burst_then_recovery(emu: DaytonaEmulator, provider: DaytonaProvider) -> None:
    emu.inject("create", status=503, times=3)
    for _ in range(3):
        with pytest.raises(Unavailable):
            await provider.create(SandboxSpec(), timeout=2)
    sbx = await provider.create(SandboxSpec(), timeout=2)
    await sbx.kill()
    assert emu.core.faults.hits["create"] == 3


async def test_account_limits(emu: DaytonaEmulator, provider: DaytonaProvider) -> None:
    emu.set_quota(max_concurrent=1, api_key=TEST_API_KEY)
    first = await provider.create(SandboxSpec(), timeout=2)
    with pytest.raises(CapacityExceeded, match=r"CPU limit exceeded\. Maximum allowed: 1\.") as cap:
        await provider.create(SandboxSpec(), timeout=2)
    assert cap.value.status == 403
    await first.kill()
    emu.set_quota(max_created=1, api_key=TEST_API_KEY)
    second = await provider.create(SandboxSpec(), timeout=2)
    await second.kill()
    with pytest.raises(QuotaExceeded, match="limit exceeded") as spent:
        await provider.create(SandboxSpec(), timeout=2)
    assert spent.value.status == 403


async def test_refused_key(emu: DaytonaEmulator) -> None:
    emu.core.accepted_keys = {TEST_API_KEY}
    stranger = DaytonaProvider("daytona-b", options(emu, api_key="dtn_unknown_key"))
    with pytest.raises(AuthError) as refused:
        await stranger.create(SandboxSpec(), timeout=2)
    assert refused.value.status == 401
    with pytest.raises(AuthError):
        await stranger.list()
    await stranger.aclose()


@pytest.mark.parametrize(
    ("op", "fault", "call", "error"),
    [
        ("exec", {"hang": True}, "run", Unavailable),
        ("exec", {"drop": True}, "run", Unavailable),
        ("exec", {"status": 502, "message": "upstream connect error"}, "run", Unavailable),
        ("exec", {"status": 429}, "run", RateLimited),
        ("exec", {"status": 500}, "code", Unavailable),
        ("files", {"status": 503}, "read", Unavailable),
        ("files", {"status": 503}, "write", Unavailable),
        ("files", {"drop": True}, "write", Unavailable),
        ("files", {"drop": True, "times": None}, "list", Unavailable),  # a GET is retried
        ("keepalive", {"status": 500}, "keepalive", Unavailable),
        ("list", {"status": 429, "retry_after": 3}, "list", RateLimited),
        ("get", {"status": 503}, "connect", Unavailable),
        ("kill", {"status": 500}, "kill", Unavailable),
    ],
)
async def test_operation_faults_map_to_router_errors(
    emu: DaytonaEmulator,
    provider: DaytonaProvider,
    op: str,
    fault: dict[str, Any],
    call: str,
    error: type[ProviderError],
) -> None:
    sbx = await provider.create(SandboxSpec(), timeout=5)
    provider_calls: dict[str, Callable[[], Any]] = {
        "run": lambda: sbx.run("echo hi", timeout=1),
        "code": lambda: sbx.run_code("1"),
        "read": lambda: sbx.read_file("x"),
        "write": lambda: sbx.write_file("x", b"x"),
        "list": lambda: provider.list() if op == "list" else sbx.list_files("."),
        "keepalive": lambda: sbx.keepalive(60),
        "connect": lambda: provider.connect(sbx.id),
        "kill": lambda: provider.kill(sbx.id),
    }
    emu.inject(op, **fault)
    try:
        with pytest.raises(error) as raised:
            await provider_calls[call]()
        assert type(raised.value) is error
        assert raised.value.provider == "daytona-a"
    finally:
        emu.clear_faults()
        await sbx.kill()


async def test_dead_endpoint_is_unavailable() -> None:
    url = f"http://127.0.0.1:{free_port()}/api"
    dead = DaytonaProvider("daytona-dead", DaytonaOptions(api_key=TEST_API_KEY, api_url=url))
    started = time.monotonic()
    with pytest.raises(Unavailable) as refused:
        await dead.create(SandboxSpec(), timeout=5)
    assert "Cannot connect" in refused.value.message
    assert time.monotonic() - started < 3, "refused: retried twice, no more"
    await dead.aclose()


def test_importing_the_adapter_imports_no_sdk() -> None:
    script = textwrap.dedent(
        """
        import sys
        from providers.daytona import DaytonaOptions, DaytonaProvider
        DaytonaProvider("d", DaytonaOptions(api_key="k")).configured()
        print(sorted(m for m in sys.modules if m.split(".")[0].startswith("daytona")))
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True
    )
    assert done.stdout.strip() == "[]", done.stdout + done.stderr


def test_a_create_run_and_files_cycle_imports_no_sdk(emu: DaytonaEmulator) -> None:
    """The adapter speaks the generated API clients: ``daytona`` (its Socket.IO client,
    OpenTelemetry, the sync clients) is imported only by a caller of ``.native``."""
    script = textwrap.dedent(
        f"""
        import asyncio, sys
        from providers.base import SandboxSpec
        from providers.daytona import DaytonaOptions, DaytonaProvider

        async def cycle():
            opts = DaytonaOptions(api_key={TEST_API_KEY!r}, api_url={emu.api_url!r})
            adapter = DaytonaProvider("d", opts)
            sbx = await adapter.create(SandboxSpec(), timeout=5)
            ran = await sbx.run("echo ran")
            await sbx.write_file("dir/a.txt", b"written")
            async def chunks():
                yield b"stre"
                yield b"amed"
            await sbx.write_stream("dir/b.txt", chunks())
            read = await sbx.read_file("dir/a.txt")
            streamed = b"".join([c async for c in sbx.read_stream("dir/b.txt")])
            listed = [f.name for f in await sbx.list_files("dir")]
            await sbx.kill()
            await adapter.aclose()
            print(ran.stdout.strip(), read.decode(), streamed.decode(), listed)

        asyncio.run(cycle())
        print(sorted(m for m in sys.modules if m.split(".")[0] == "daytona"))
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["ran written streamed ['a.txt', 'b.txt']", "[]"], (
        done.stdout
    )


async def test_an_empty_file_streams_as_nothing(sandbox: DaytonaSandbox) -> None:
    """The bulk download's file part is empty (the SDK's stream took that for no file)."""
    await sandbox.write_file("empty.txt", b"")
    assert [chunk async for chunk in sandbox.read_stream("empty.txt")] == []
    assert await sandbox.read_file("empty.txt") == b""
    with pytest.raises(SandboxError, match="no-such"):
        await anext(aiter(sandbox.read_stream("no-such")))


async def test_native_is_the_sdks_sandbox_on_the_adapters_connection(
    sandbox: DaytonaSandbox,
) -> None:
    from daytona import AsyncSandbox

    native = sandbox.native
    assert isinstance(native, AsyncSandbox)
    assert sandbox.native is native, "built once"
    ran = await native.process.exec("echo via the sdk; echo $GLOBAL")
    assert (ran.exit_code, ran.result) == (0, "via the sdk\ng\n")
    await native.fs.upload_file(b"from the sdk", "native.txt")
    assert await sandbox.read_file("native.txt") == b"from the sdk"
    await native.refresh_data()
    assert (native.id, native.state) == (sandbox.id, "started")


async def test_secrets_never_leak(
    emu: DaytonaEmulator, caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]
) -> None:
    secret = "dtn_secret_" + "7" * 30
    emu.core.accepted_keys = {secret}
    opts = options(emu, api_key=secret)
    adapter = DaytonaProvider("daytona-secret", opts)
    caplog.set_level(logging.DEBUG)
    seen: list[str] = [repr(opts), str(opts), opts.model_dump_json(), repr(adapter)]
    with structlog.testing.capture_logs() as events:
        sbx = await adapter.create(SandboxSpec(labels={"k": "v"}), timeout=5)
        await sbx.run("echo hi")
        with pytest.raises(SandboxError) as missing:
            await sbx.read_file("nope")
        await sbx.kill()
        emu.core.accepted_keys = {"dtn_another"}
        with pytest.raises(AuthError) as refused:
            await adapter.create(SandboxSpec(), timeout=5)
        emu.inject("create", status=500, message="boom")
        emu.core.accepted_keys = None
        with pytest.raises(Unavailable) as failed:
            await adapter.create(SandboxSpec(), timeout=5)
    await adapter.aclose()
    assert events, "the adapter logs its lifecycle events"
    for err in (missing.value, refused.value, failed.value):
        seen += [str(err), repr(err), str(err.__cause__), repr(err.__cause__)]
    seen += [repr(e) for e in events] + [caplog.text] + list(capsys.readouterr())
    assert [text for text in seen if secret in text] == []


async def test_a_refused_websocket_is_an_error_answer_that_names_no_key(
    emu: DaytonaEmulator, sandbox: DaytonaSandbox
) -> None:
    """aiohttp's handshake error holds the request, its headers (the key) in its repr."""
    emu.inject("exec", status=503, times=None)
    try:
        with pytest.raises(Unavailable) as refused:
            await sandbox.open_terminal()
        with pytest.raises(Unavailable):
            await sandbox.run_code("1")  # the interpreter's websocket
    finally:
        emu.clear_faults()
    assert refused.value.status == 503
    chain: list[BaseException] = []
    link: BaseException | None = refused.value
    while link is not None:
        chain.append(link)
        link = link.__cause__ or link.__context__
    assert len(chain) > 1
    assert [e for e in chain if TEST_API_KEY in f"{e!s} {e!r}"] == []


def test_log_marks_split_across_messages() -> None:
    from providers.daytona.processes import _Demux

    seen: list[tuple[str, str]] = []
    demux = _Demux(lambda stream, text: seen.append((stream, text)))
    for piece in (b"\x01\x01", b"\x01out\xc3", b"\xa9\x02", b"\x02\x02err\x01", b"\x01\x01o"):
        demux.write(piece)
    demux.close()
    joined: dict[str, str] = {}
    for stream, text in seen:
        joined[stream] = joined.get(stream, "") + text
    assert joined == {"stdout": "out\u00e9o", "stderr": "err"}


def test_a_released_sandbox_frees_the_cpu_limit_for_the_next_acquire(
    emu: DaytonaEmulator, redis_url: str, key_prefix: str, tmp_path: Path, new_router: Any
) -> None:
    """Daytona's CPU limit is a cap on live sandboxes, not a quota spent until a reset."""
    emu.set_quota(max_concurrent=1, api_key=TEST_API_KEY)
    router = new_router(
        {
            "state_url": redis_url,
            "key_prefix": key_prefix,
            "create_timeout": 5,
            "chain": [
                {
                    "name": "daytona",
                    "provider": "daytona",
                    "options": {"api_key": TEST_API_KEY, "api_url": emu.api_url},
                },
                {"name": "local", "provider": "local", "options": {"root": str(tmp_path)}},
            ],
        },
        hooks=[],
    )
    first = router.acquire()
    assert first.entry == "daytona"
    with router.acquire() as second:
        assert (second.entry, second.failovers) == ("local", ["daytona"])
    first.release()
    with router.acquire() as third:
        assert third.entry == "daytona"


@pytest.fixture
async def pools(emu: DaytonaEmulator) -> AsyncIterator[dict[str, WarmPool]]:
    """The emulator's warm pools, all deleted (through the SDK) after the test."""
    from daytona import AsyncDaytona, DaytonaConfig

    assert emu.warm_pools is not None
    yield emu.warm_pools.pools
    daytona = AsyncDaytona(DaytonaConfig(**emu.sdk_config()))
    for pool in await daytona.warm_pool.list():
        await daytona.warm_pool.delete(pool.id)
    await daytona.close()


async def test_keep_warm_sizes_daytonas_pool_of_the_entrys_snapshot(
    emu: DaytonaEmulator, provider: DaytonaProvider, pools: dict[str, WarmPool]
) -> None:
    assert Capability.WARM_SERVER in provider.capabilities
    assert await provider.keep_warm(None, 0) == 0
    assert pools == {}, "size 0 makes no pool"
    assert await provider.keep_warm(None, 2) == 0
    (pool,) = pools.values()
    assert (pool.snapshot, pool.target, pool.size) == (DEFAULT_SNAPSHOT, "us", 2)
    await until(lambda: len(pool.ready) == 2)
    assert await provider.keep_warm(None, 2) == 2, "a second call changes nothing"
    assert (list(pools.values()), pool.size) == ([pool], 2)

    served = await provider.create(SandboxSpec(labels={"job": "warm"}), timeout=5)
    assert box(emu, served.id).from_pool == pool.id
    assert box(emu, served.id).labels["job"] == "warm"
    with_env = await provider.create(SandboxSpec(env={"A": "1"}), timeout=5)
    assert box(emu, with_env.id).from_pool is None, "Daytona serves no custom env from a pool"
    for sandbox in (served, with_env):
        await sandbox.kill()

    await until(lambda: len(pool.ready) == 2)
    assert await provider.keep_warm(None, 1) == 1
    assert await provider.keep_warm(None, 0) == 0
    assert (list(pools.values()), pool.size, emu.alive()) == ([pool], 0, [])


async def test_keep_warm_names_a_template_snapshot_and_refuses_an_image(
    emu: DaytonaEmulator, pools: dict[str, WarmPool]
) -> None:
    adapter = DaytonaProvider("daytona-w", options(emu, snapshot="entry-snap"))
    imaged = DaytonaProvider("daytona-i", options(emu, image="python:3.12"))
    try:
        assert await adapter.keep_warm("other-snap", 1) == 0
        assert await adapter.keep_warm(None, 1) == 0
        assert sorted(pool.snapshot for pool in pools.values()) == ["entry-snap", "other-snap"]
        with pytest.raises(ProviderError, match="warm pools of snapshots only"):
            await imaged.keep_warm(None, 1)
    finally:
        await adapter.aclose()
        await imaged.aclose()
