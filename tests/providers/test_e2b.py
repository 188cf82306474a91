"""The e2b adapter over the real SDK, against the E2B emulator: lifecycle and error mapping."""

from __future__ import annotations

import logging
import subprocess
import sys
import textwrap
import time
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import pytest
import structlog

from emulators.e2b import TEST_API_KEY, E2BEmulator
from emulators.harness import Emulator, free_port
from providers import provider_class
from providers.base import RichResult, SandboxSpec
from providers.capabilities import Capability
from providers.e2b import E2BOptions, E2BProvider, E2BSandbox
from providers.errors import (
    AuthError,
    CapacityExceeded,
    NotFound,
    ProviderError,
    QuotaExceeded,
    RateLimited,
    SandboxError,
    Unavailable,
)
from tests.polling import until


@pytest.fixture
def emu(e2b_emulator: Emulator) -> Iterator[E2BEmulator]:
    assert isinstance(e2b_emulator, E2BEmulator)
    yield e2b_emulator
    assert e2b_emulator.alive() == [], "a test left a sandbox alive"


def options(emu: E2BEmulator, **kw: Any) -> E2BOptions:
    settings: dict[str, Any] = {
        "api_key": TEST_API_KEY,
        "api_url": emu.url,
        "sandbox_url": emu.url,
        "request_timeout": 5,
        **kw,
    }
    return E2BOptions(**settings)


@pytest.fixture
async def provider(emu: E2BEmulator) -> AsyncIterator[E2BProvider]:
    adapter = E2BProvider("e2b-a", options(emu))
    yield adapter
    await adapter.aclose()


@pytest.fixture
async def sandbox(provider: E2BProvider) -> AsyncIterator[E2BSandbox]:
    created = await provider.create(SandboxSpec(env={"GLOBAL": "g"}), timeout=5)
    yield created
    await created.kill()


def test_registered_with_validated_options() -> None:
    assert provider_class("e2b") is E2BProvider
    with pytest.raises(ValueError, match="extra"):
        E2BOptions(api_key="k", unknown=1)  # type: ignore[call-arg]


async def test_lifecycle(emu: E2BEmulator, provider: E2BProvider) -> None:
    spec = SandboxSpec(
        labels={"sandbox_router": "1", "sandbox_router_entry": "e2b-a"},
        env={"GLOBAL": "g"},
        lifetime=120,
        workdir="/home/user",
    )
    sbx = await provider.create(spec, timeout=5)
    assert (emu.records()[0].id, emu.records()[0].labels) == (sbx.id, dict(spec.labels))
    assert sbx.native.sandbox_id == sbx.id

    ran = await sbx.run("echo $GLOBAL $LOCAL; echo oops >&2; exit 3", env={"LOCAL": "l"})
    assert (ran.stdout, ran.stderr, ran.exit_code, ran.ok) == ("g l\n", "oops\n", 3, False)
    assert (await sbx.run(["printf", "%s|", "a b", "c"])).stdout == "a b|c|"
    await sbx.run("mkdir -p sub/dir")
    assert (await sbx.run("pwd", cwd="sub/dir")).stdout.strip().endswith("/sub/dir")

    payload = bytes(range(256)) * 16
    await sbx.write_file("data/blob.bin", payload)
    await sbx.write_file("/home/user/data/note.txt", "text")
    assert await sbx.read_file("data/blob.bin") == payload
    listed = {f.name: f for f in await sbx.list_files("data")}
    assert sorted(listed) == ["blob.bin", "note.txt"]
    assert (listed["blob.bin"].size, listed["blob.bin"].is_dir) == (len(payload), False)
    assert listed["note.txt"].path == "/home/user/data/note.txt"
    assert [f.is_dir for f in await sbx.list_files(".") if f.name == "data"] == [True]

    code = await sbx.run_code("import os\nprint(os.environ['GLOBAL'])\n21 * 2")
    assert (code.stdout, code.error, code.exit_code) == ("g\n", None, 0)
    assert code.results == (RichResult(text="42", is_main_result=True),)
    broken = await sbx.run_code("undefined_name")
    assert broken.exit_code == 1
    assert broken.error == "NameError: name 'undefined_name' is not defined"

    assert [s.id for s in await provider.list({"sandbox_router_entry": "e2b-a"})] == [sbx.id]
    assert await provider.list({"sandbox_router_entry": "other"}) == []
    again = await provider.connect(sbx.id)
    assert (await again.run("cat data/note.txt")).stdout == "text"

    before = emu.core.records[sbx.id].expires_at
    await again.keepalive(900)
    after = emu.core.records[sbx.id].expires_at
    assert before is not None
    assert after is not None
    assert after - before > 700

    await sbx.kill()
    await sbx.kill()
    assert await provider.kill(sbx.id) is False
    assert [r.ended_by for r in emu.records()] == ["kill"]


async def test_command_timeout_is_a_result(emu: E2BEmulator, sandbox: E2BSandbox) -> None:
    started = time.monotonic()
    result = await sandbox.run("echo begun; sleep 30", timeout=0.5)
    assert result.timed_out
    assert not result.ok
    assert time.monotonic() - started < 3
    await until(lambda: not emu.core.e2b[sandbox.id].processes)
    assert emu.core.e2b[sandbox.id].processes == {}
    slow = await sandbox.run_code("import time; time.sleep(30)", timeout=0.5)
    assert slow.timed_out
    assert slow.error is not None


async def test_a_command_timeout_counts_from_its_start(
    emu: E2BEmulator, sandbox: E2BSandbox
) -> None:
    """envd slow to start a command (a loaded machine) does not eat the command's timeout: it
    runs its full timeout once started and ends timed out, not Unavailable."""
    emu.inject("exec", delay=1.0)
    result = await sandbox.run("echo begun; sleep 30", timeout=0.5)
    assert (result.timed_out, result.stdout) == (True, "begun\n")
    assert 1.4 < result.duration < 5
    await until(lambda: not emu.core.e2b[sandbox.id].processes)


async def test_a_cell_the_kernel_is_slow_to_answer_times_out_and_keeps_the_state(
    emu: E2BEmulator, sandbox: E2BSandbox
) -> None:
    """The execution's deadline holds while the kernel's answer has not begun, and the cell
    cut short leaves the kernel's variables as they were."""
    assert (await sandbox.run_code("kept = 41")).ok
    emu.inject("run_code", hang=True)
    started = time.monotonic()
    slow = await sandbox.run_code("kept = 0", timeout=0.5)
    assert (slow.timed_out, slow.error is not None) == (True, True)
    assert time.monotonic() - started < 3
    assert (await sandbox.run_code("kept + 1")).results[0].text == "42"


async def test_a_large_result_and_output_come_back_whole(sandbox: E2BSandbox) -> None:
    """The kernel answers one JSON line per message: a line longer than one read (a figure's
    PNG; the emulator's kernel sends lines up to 64 KiB) is parsed whole, and so is a cell's
    output split over many messages."""
    ran = await sandbox.run_code(
        "for i in range(3000): print(i, 'é' * 20, flush=True)\n'x' * 60_000"
    )
    assert ran.ok
    assert ran.results[0].text.strip("'") == "x" * 60_000
    assert ran.stdout == "".join(f"{i} {'é' * 20}\n" for i in range(3000))


async def test_a_cell_cut_off_by_the_sandbox_end_says_the_sandbox_is_gone(
    emu: E2BEmulator, provider: E2BProvider
) -> None:
    """A cell's connection lost is told apart as the SDK does: with the sandbox no longer
    running, Unavailable says it was killed; with it running, it is the lost connection."""
    sbx = await provider.create(SandboxSpec(), timeout=5)
    emu.inject("run_code", drop=True)
    with pytest.raises(Unavailable) as running:
        await sbx.run_code("1")
    assert "killed" not in running.value.message
    await sbx.kill()
    emu.inject("run_code", drop=True)
    with pytest.raises(Unavailable, match="killed while the request was in progress"):
        await sbx.run_code("1")


async def test_a_plain_template_runs_python_in_the_router_kernel(
    emu: E2BEmulator, provider: E2BProvider
) -> None:
    """No Jupyter server on a template but the code interpreter's: the router's kernel
    (an envd process of the sandbox) keeps the state, per handle."""
    base = E2BProvider("e2b-base", options(emu, template="base"))
    assert Capability.STATEFUL_CODE in base.capabilities
    sbx = await base.create(SandboxSpec(), timeout=5)
    try:
        again = await provider.connect(sbx.id)  # learns the template from the sandbox's info
        await sbx.run_code("kept = 41")
        ran = await sbx.run_code("print(kept + 1)\nkept")
        assert (ran.stdout, ran.text, ran.stateful) == ("42\n", "41", True)
        assert len(emu.core.e2b[sbx.id].processes) == 1  # the kernel, one envd process
        other = await again.run_code("kept")  # another handle: a kernel of its own
        assert other.error == "NameError: name 'kept' is not defined"
        assert (await again.run_code("echo $((6 * 7))", language="bash")).stdout == "42\n"
        with pytest.raises(SandboxError, match="javascript"):
            await again.run_code("1", language="javascript")
    finally:
        await sbx.kill()
        await base.aclose()


async def test_attach_to_what_is_no_process_is_not_found(sandbox: E2BSandbox) -> None:
    for process_id in ("abc", "-1", str(2**40), "424242"):
        with pytest.raises(NotFound, match="no process"):
            await sandbox.attach(process_id)


async def test_gone_sandbox_is_not_found(emu: E2BEmulator, provider: E2BProvider) -> None:
    sbx = await provider.create(SandboxSpec(lifetime=1), timeout=5)
    await until(lambda: not emu.alive())
    assert [r.ended_by for r in emu.records()] == ["expired"]
    with pytest.raises(NotFound) as gone:
        await sbx.run("true")
    assert gone.value.sandbox_id == sbx.id
    with pytest.raises(NotFound):
        await sbx.keepalive(60)
    with pytest.raises(NotFound):
        await provider.connect(sbx.id)
    await sbx.kill()


CONCURRENCY = "you have reached the maximum number of concurrent E2B sandboxes (20)"


@pytest.mark.parametrize(
    ("fault", "error", "status"),
    [
        ({"status": 401}, AuthError, 401),
        ({"status": 429, "retry_after": 9}, RateLimited, 429),
        ({"status": 429, "message": CONCURRENCY}, CapacityExceeded, 429),
        ({"status": 403, "message": "team is blocked: out of credits"}, QuotaExceeded, 403),
        ({"status": 403, "message": "access to template denied"}, AuthError, 403),
        ({"status": 503}, Unavailable, 503),
        ({"status": 500}, Unavailable, 500),
        ({"status": 502}, Unavailable, 502),
        ({"status": 404, "message": "template 'x' not found"}, NotFound, 404),
        ({"status": 409, "message": "conflicting request"}, ProviderError, 409),
        ({"drop": True}, Unavailable, None),
        ({"hang": True}, Unavailable, None),
        ({"delay": 3}, Unavailable, None),
    ],
)
async def test_create_faults_map_to_router_errors(
    emu: E2BEmulator,
    fault: dict[str, Any],
    error: type[ProviderError],
    status: int | None,
) -> None:
    """The create request is bounded by ``request_timeout`` (1 s here), not by the
    create's ``timeout``; one that got no answer says so (``unanswered``)."""
    provider = E2BProvider("e2b-a", options(emu, request_timeout=1))
    emu.inject("create", **fault)
    started = time.monotonic()
    with pytest.raises(error) as raised:
        await provider.create(SandboxSpec(), timeout=1)
    assert type(raised.value) is error
    if isinstance(raised.value, Unavailable):
        assert raised.value.unanswered == any(key in fault for key in ("drop", "hang", "delay"))
    assert time.monotonic() - started < 2.5
    assert (raised.value.provider, raised.value.status) == ("e2b-a", status)
    if fault.get("message"):
        assert fault["message"] in raised.value.message
    assert TEST_API_KEY not in str(raised.value)
    sbx = await provider.create(SandboxSpec(), timeout=5)
    await sbx.kill()
    await provider.aclose()


async def test_slow_create_within_the_timeout_succeeds(
    emu: E2BEmulator, provider: E2BProvider
) -> None:
    emu.inject("create", delay=0.3)
    sbx = await provider.create(SandboxSpec(), timeout=3)
    await sbx.kill()


async def test_5xx_burst_then_recovery(emu: E2BEmulator, provider: E2BProvider) -> None:
    emu.inject("create", status=503, times=3)
    for _ in range(3):
        with pytest.raises(Unavailable):
            await provider.create(SandboxSpec(), timeout=2)
    sbx = await provider.create(SandboxSpec(), timeout=2)
    await sbx.kill()
    assert emu.core.faults.hits["create"] == 3


async def test_account_limits(emu: E2BEmulator, provider: E2BProvider) -> None:
    emu.set_quota(max_concurrent=1, api_key=TEST_API_KEY)
    first = await provider.create(SandboxSpec(), timeout=2)
    with pytest.raises(CapacityExceeded, match=r"concurrent E2B sandboxes \(1\)"):
        await provider.create(SandboxSpec(), timeout=2)
    await first.kill()
    emu.set_quota(max_created=1, api_key=TEST_API_KEY)
    second = await provider.create(SandboxSpec(), timeout=2)
    await second.kill()
    with pytest.raises(QuotaExceeded, match="team is blocked") as spent:
        await provider.create(SandboxSpec(), timeout=2)
    assert spent.value.status == 403


async def test_refused_key(emu: E2BEmulator) -> None:
    emu.core.accepted_keys = {TEST_API_KEY}
    stranger = E2BProvider("e2b-b", options(emu, api_key="e2b_unknown_key"))
    with pytest.raises(AuthError) as refused:
        await stranger.create(SandboxSpec(), timeout=2)
    assert refused.value.status == 401
    with pytest.raises(AuthError):
        await stranger.list()


@pytest.mark.parametrize(
    ("op", "fault", "call", "error"),
    [
        ("exec", {"hang": True}, "run", Unavailable),
        ("exec", {"drop": True}, "run", Unavailable),
        ("exec", {"status": 502, "message": "upstream connect error"}, "run", Unavailable),
        ("exec", {"status": 429}, "run", RateLimited),
        ("files", {"status": 503}, "read", Unavailable),
        ("files", {"drop": True}, "list", Unavailable),
        ("run_code", {"status": 500}, "code", Unavailable),
        ("run_code", {"status": 502, "message": "upstream connect error"}, "code", Unavailable),
        ("run_code", {"status": 429}, "code", RateLimited),
        ("run_code", {"drop": True}, "code", Unavailable),
        ("timeout", {"status": 500}, "keepalive", Unavailable),
        ("list", {"status": 429, "retry_after": 3}, "list", RateLimited),
        ("connect", {"status": 503}, "connect", Unavailable),
        ("kill", {"status": 500}, "kill", Unavailable),
    ],
)
async def test_operation_faults_map_to_router_errors(
    emu: E2BEmulator,
    provider: E2BProvider,
    op: str,
    fault: dict[str, Any],
    call: str,
    error: type[ProviderError],
) -> None:
    sbx = await provider.create(SandboxSpec(), timeout=5)
    provider_calls: dict[str, Callable[[], Any]] = {
        "run": lambda: sbx.run("echo hi", timeout=1),
        "read": lambda: sbx.read_file("x"),
        "list": lambda: provider.list() if op == "list" else sbx.list_files("."),
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
        assert raised.value.provider == "e2b-a"
    finally:
        emu.clear_faults()
        await sbx.kill()


async def test_dead_endpoint_is_unavailable() -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    dead = E2BProvider("e2b-dead", E2BOptions(api_key=TEST_API_KEY, api_url=url, sandbox_url=url))
    with pytest.raises(Unavailable) as refused:
        await dead.create(SandboxSpec(), timeout=5)
    assert "ConnectError" in refused.value.message


def test_no_sdk_import_until_used() -> None:
    """Importing the adapter imports no SDK; a dead endpoint is Unavailable within the timeout.

    The SDK's connect retries (a refused connection, never a repeated
    request) are left on: their switch is process-wide.
    """
    script = textwrap.dedent(
        """
        import asyncio, sys, time
        from emulators.harness import free_port
        from providers.base import SandboxSpec
        from providers.e2b import E2BOptions, E2BProvider
        from providers.errors import Unavailable
        assert not [m for m in sys.modules if m.split(".")[0] in ("e2b", "e2b_code_interpreter")]
        url = f"http://127.0.0.1:{free_port()}"
        dead = E2BProvider("dead", E2BOptions(api_key="k", api_url=url, sandbox_url=url))
        async def attempt():
            started = time.monotonic()
            try:
                await dead.create(SandboxSpec(), timeout=10)
            except Unavailable:
                return time.monotonic() - started
        print(round(asyncio.run(attempt()), 3), flush=True)
        # The SDK's pyqwest transport, after its own connection retries against a dead
        # endpoint, aborts the interpreter's shutdown about 1 time in 2 (SIGABRT, no
        # Python frame; the SDK's bug, not measured here): leave without the shutdown.
        import os; os._exit(0)
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True
    )
    assert float(done.stdout.strip()) < 10, done.stdout + done.stderr


async def test_secrets_never_leak(
    emu: E2BEmulator, caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]
) -> None:
    secret = "e2b_secret_" + "7" * 30
    emu.core.accepted_keys = {secret}
    opts = options(emu, api_key=secret)
    adapter = E2BProvider("e2b-secret", opts)
    caplog.set_level(logging.DEBUG)
    seen: list[str] = [repr(opts), str(opts), opts.model_dump_json(), repr(adapter)]
    with structlog.testing.capture_logs() as events:
        sbx = await adapter.create(SandboxSpec(labels={"k": "v"}), timeout=5)
        await sbx.run("echo hi")
        await sbx.kill()
        emu.core.accepted_keys = {"e2b_another"}
        with pytest.raises(AuthError) as refused:
            await adapter.create(SandboxSpec(), timeout=5)
        emu.inject("create", status=500, message="boom")
        emu.core.accepted_keys = None
        with pytest.raises(Unavailable) as failed:
            await adapter.create(SandboxSpec(), timeout=5)
    assert events, "the adapter logs its lifecycle events"
    for err in (refused.value, failed.value):
        seen += [str(err), repr(err), str(err.__cause__), repr(err.__cause__)]
    seen += [repr(e) for e in events] + [caplog.text] + list(capsys.readouterr())
    assert [text for text in seen if secret in text] == []


async def test_a_command_cut_off_says_whether_the_sandbox_is_gone(
    emu: E2BEmulator, provider: E2BProvider
) -> None:
    """A command's stream lost is told apart as the SDK does: the sandbox running, it is a
    lost connection; the sandbox gone, it is gone."""
    sbx = await provider.create(SandboxSpec(), timeout=5)
    emu.inject("exec", drop=True, times=1)
    with pytest.raises(Unavailable):
        await sbx.run("echo hi")
    assert (await sbx.run("echo hi")).stdout == "hi\n"
    await sbx.kill()
    emu.inject("exec", drop=True)
    with pytest.raises(NotFound):
        await sbx.run("echo hi")


@pytest.mark.parametrize(("status", "error"), [(502, Unavailable), (429, RateLimited)])
async def test_a_command_refused_by_a_proxy_is_mapped_as_the_sdk_maps_it(
    emu: E2BEmulator, sandbox: E2BSandbox, status: int, error: type[Exception]
) -> None:
    emu.inject("exec", status=status, times=1)
    with pytest.raises(error):
        await sandbox.run("true")
    assert (await sandbox.run("echo after")).stdout == "after\n"


async def test_command_output_is_decoded_across_chunks_and_bad_bytes_replaced(
    sandbox: E2BSandbox,
) -> None:
    """UTF-8 split over two writes comes back whole; bytes that are not UTF-8 are replaced,
    on both streams."""
    ran = await sandbox.run(
        "printf 'a\\303'; sleep 0.2; printf '\\251b\\377'; printf '\\377e' >&2; exit 3"
    )
    assert (ran.stdout, ran.stderr, ran.exit_code) == ("aéb\ufffd", "\ufffde", 3)
