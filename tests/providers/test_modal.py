"""The modal adapter over the real SDK, against the Modal emulator: lifecycle and error mapping."""

from __future__ import annotations

import asyncio
import gc
import logging
import subprocess
import sys
import textwrap
import time
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import pytest
import structlog

from emulators.harness import Emulator, free_port
from emulators.modal import TEST_TOKEN_ID, TEST_TOKEN_SECRET, ModalEmulator
from emulators.modal.control import CONCURRENCY_MESSAGE, QUOTA_MESSAGE
from emulators.modal.tunnels import DOMAIN
from providers import provider_class
from providers.base import LABEL_LEASE, SandboxSpec
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
from providers.modal import ModalOptions, ModalProvider, ModalSandbox
from tests.polling import until


@pytest.fixture
def emu(modal_emulator: Emulator, monkeypatch: pytest.MonkeyPatch) -> Iterator[ModalEmulator]:
    assert isinstance(modal_emulator, ModalEmulator)
    for key, value in modal_emulator.sdk_env().items():
        monkeypatch.setenv(key, value)
    yield modal_emulator
    assert modal_emulator.alive() == [], "a test left a sandbox alive"


def options(emu: ModalEmulator, **kw: Any) -> ModalOptions:
    settings: dict[str, Any] = {
        "token_id": TEST_TOKEN_ID,
        "token_secret": TEST_TOKEN_SECRET,
        "server_url": emu.url,
        "request_timeout": 5,
        **kw,
    }
    return ModalOptions(**settings)


@pytest.fixture
async def provider(emu: ModalEmulator) -> AsyncIterator[ModalProvider]:
    adapter = ModalProvider("modal-a", options(emu))
    yield adapter
    await adapter.aclose()


@pytest.fixture
async def sandbox(provider: ModalProvider) -> AsyncIterator[ModalSandbox]:
    created = await provider.create(SandboxSpec(env={"GLOBAL": "g"}), timeout=5)
    yield created
    await created.kill()


def test_registered_with_validated_options() -> None:
    assert provider_class("modal") is ModalProvider
    assert "gpu" in ModalProvider.capabilities
    with pytest.raises(ValueError, match="extra"):
        ModalOptions(token_id="ak", unknown=1)  # type: ignore[call-arg]


async def test_lifecycle(emu: ModalEmulator, provider: ModalProvider) -> None:
    spec = SandboxSpec(
        labels={"sandbox_router": "1", "sandbox_router_entry": "modal-a"},
        env={"GLOBAL": "g"},
        lifetime=120,
        idle_timeout=60,
        cpu=0.5,
        memory_mb=512,
    )
    sbx = await provider.create(spec, timeout=5)
    (record,) = emu.records()
    assert (record.id, record.labels) == (sbx.id, dict(spec.labels))
    assert record.expires_at is not None
    assert record.expires_at - record.created_at == pytest.approx(120, abs=1)
    definition = emu.core.modal[sbx.id].definition
    assert (definition.workdir, definition.idle_timeout_secs) == ("/root", 60)
    assert (definition.resources.milli_cpu, definition.resources.memory_mb) == (500, 512)
    assert sbx.native.object_id == sbx.id

    ran = await sbx.run("echo $GLOBAL $LOCAL; echo oops >&2; exit 3", env={"LOCAL": "l"})
    assert (ran.stdout, ran.stderr, ran.exit_code, ran.ok) == ("g l\n", "oops\n", 3, False)
    assert (await sbx.run(["printf", "%s|", "a b", "c"])).stdout == "a b|c|"
    await sbx.run("mkdir -p sub/dir && touch sub/dir/here")
    assert (await sbx.run("ls", cwd="sub/dir")).stdout == "here\n"
    assert (await sbx.run("ls", cwd="/root/sub/dir")).stdout == "here\n"

    assert [s.id for s in await provider.list({"sandbox_router_entry": "modal-a"})] == [sbx.id]
    (info,) = await provider.list()
    assert info.labels == dict(spec.labels)
    assert await provider.list({"sandbox_router_entry": "other"}) == []
    again = await provider.connect(sbx.id)
    assert (await again.run("echo $GLOBAL")).stdout == "g\n"

    await sbx.kill()
    await sbx.kill()
    assert await provider.kill(sbx.id) is False
    with pytest.raises(NotFound) as gone:
        await provider.connect(sbx.id)
    assert gone.value.sandbox_id == sbx.id
    with pytest.raises(NotFound):
        await again.run("true")
    assert [r.ended_by for r in emu.records()] == ["kill"]


async def test_command_timeout_is_a_result(emu: ModalEmulator, sandbox: ModalSandbox) -> None:
    started = time.monotonic()
    result = await sandbox.run("echo begun; sleep 30", timeout=1)
    assert (result.timed_out, result.ok, result.exit_code) == (True, False, -1)
    assert time.monotonic() - started < 3
    execs = emu.core.modal[sandbox.id].execs
    await until(lambda: all(e.done for e in execs.values()))
    assert all(e.done for e in execs.values())
    quick = await sandbox.run("exit 0", timeout=1)
    assert (quick.timed_out, quick.exit_code) == (False, 0)


async def test_process_kill_by_exec_ends_its_whole_group(sandbox: ModalSandbox) -> None:
    """Modal has no kill RPC: the kill is an exec of ``kill`` on the group `start` recorded,
    in time even when it comes before the process recorded it."""
    at_once = await sandbox.start("sleep 60")
    assert await at_once.kill() is True
    ended = await at_once.wait(timeout=10)
    assert (ended.exit_code, ended.stderr) == (128 + 9, "")

    parent = await sandbox.start(["bash", "-c", "sleep 60 & echo $!; wait"])
    child = (await anext(parent.output())).data.strip()
    assert await parent.kill() is True
    await parent.wait(timeout=10)
    # Gone, or a zombie its killed parent left (without bwrap no pid 1 of the sandbox reaps it).
    dead = f's=$(cut -d\' \' -f3 /proc/{child}/stat 2>/dev/null); [ -z "$s" ] || [ "$s" = Z ]'
    assert (await sandbox.run(dead)).exit_code == 0


async def test_process_output_keeps_a_character_split_across_chunks(
    sandbox: ModalSandbox,
) -> None:
    proc = await sandbox.start(r"printf '\xc3'; sleep 0.3; printf '\xa9\n'")
    chunks = [chunk.data async for chunk in proc.output()]
    assert "".join(chunks) == "\u00e9\n"


async def test_terminal_has_no_resize_and_is_killed_by_exec(sandbox: ModalSandbox) -> None:
    tty = await sandbox.open_terminal(rows=10, cols=40)
    with pytest.raises(Unsupported, match=r"modal-a.*pty\.resize"):
        await tty.resize(30, 100)
    assert await tty.kill() is True
    assert await tty.wait(10) == 128 + 9
    assert await tty.kill() is False


async def test_secrets_and_lifetime(provider: ModalProvider) -> None:
    emu = ModalEmulator(secrets={"db": {"DB_PASSWORD": "hunter2"}})
    with emu:
        adapter = ModalProvider("modal-s", options(emu, secrets=("db",)))
        sbx = await adapter.create(SandboxSpec(lifetime=1), timeout=5)
        assert (await sbx.run("echo $DB_PASSWORD")).stdout == "hunter2\n"
        await until(lambda: not emu.alive())
        assert [r.ended_by for r in emu.records()] == ["expired"]
        with pytest.raises(NotFound):
            await sbx.run("true")
        with pytest.raises(NotFound):
            await adapter.connect(sbx.id)
        missing = ModalProvider("modal-m", options(emu, secrets=("nope",)))
        with pytest.raises(NotFound, match="nope"):
            await missing.create(SandboxSpec(), timeout=5)
        await adapter.aclose()
        await missing.aclose()


async def test_idle_timeout_ends_the_sandbox(emu: ModalEmulator, provider: ModalProvider) -> None:
    sbx = await provider.create(SandboxSpec(idle_timeout=1), timeout=5)
    await sbx.run("true")
    await until(lambda: not emu.alive())
    assert [r.ended_by for r in emu.records()] == ["idle"]
    with pytest.raises(NotFound):
        await provider.connect(sbx.id)


async def test_gpu_sandboxes_use_the_v1_backend(
    emu: ModalEmulator, provider: ModalProvider
) -> None:
    sbx = await provider.create(SandboxSpec(gpu="T4", labels={"kind": "gpu"}), timeout=5)
    assert len(sbx.id) == len("sb-") + 22  # the SDK's V1 id shape
    sandbox = emu.core.modal[sbx.id]
    assert (sandbox.v2, sandbox.definition.resources.gpu_config.gpu_type) == (False, "T4")
    assert (await sbx.run("echo on gpu")).stdout == "on gpu\n"
    await sbx.write_file("w.txt", "gpu file")
    assert await (await provider.connect(sbx.id)).read_file("w.txt") == b"gpu file"
    assert [s.id for s in await provider.list({"kind": "gpu"})] == [sbx.id]
    assert await provider.kill(sbx.id) is True


async def test_ports_are_declared_at_create_and_exposed_as_their_tunnels(
    emu: ModalEmulator, provider: ModalProvider
) -> None:
    port, other = free_port(), free_port()
    sbx = await provider.create(SandboxSpec(ports=(port,)), timeout=5)
    try:
        assert list(emu.core.modal[sbx.id].tunnels) == [port]
        exposed = await sbx.expose(port)
        assert exposed.url.startswith("https://")
        assert exposed.url.endswith(f".{DOMAIN}")
        assert exposed.headers == {}
        assert await (await provider.connect(sbx.id)).expose(port) == exposed
        with pytest.raises(SandboxError, match=rf"ports=\({other},\)") as refused:
            await sbx.expose(other)
        assert f"opened: {port}" in refused.value.message
    finally:
        await sbx.kill()


async def test_snapshots_are_images_kept_for_the_entrys_ttl(emu: ModalEmulator) -> None:
    adapter = ModalProvider("modal-a", options(emu, snapshot_ttl=None))
    sbx = await adapter.create(SandboxSpec(), timeout=5)
    try:
        kept = await sbx.snapshot("named")
    finally:
        await sbx.kill()
    assert (kept.entry, kept.name, kept.id[:3]) == ("modal-a", "named", "im-")
    assert emu.core.kept[kept.id].expires_at is None
    assert await adapter.delete_snapshot(kept.id) is True
    with pytest.raises(NotFound, match="not found"):
        await adapter.create(SandboxSpec(template=kept.id), timeout=5)
    assert await adapter.delete_snapshot("base") is False  # no Image id: no call
    with pytest.raises(ValueError, match="snapshot_ttl"):
        options(emu, snapshot_ttl=0)
    await adapter.aclose()


CONCURRENCY = CONCURRENCY_MESSAGE.format(limit=10)
QUOTA = QUOTA_MESSAGE.format(limit=100)


@pytest.mark.parametrize(
    ("fault", "error", "status"),
    [
        ({"status": 401}, AuthError, 401),
        ({"status": 403}, AuthError, 403),
        ({"status": 429, "retry_after": 9}, RateLimited, 429),
        ({"status": 429, "message": "Sandbox creation rate limit exceeded"}, RateLimited, 429),
        ({"status": 429, "message": CONCURRENCY}, CapacityExceeded, 429),
        ({"status": 429, "message": QUOTA}, QuotaExceeded, 429),
        ({"status": 503}, Unavailable, None),
        ({"status": 500}, Unavailable, None),
        ({"status": 504}, Unavailable, None),
        ({"status": 404, "message": "App not found"}, NotFound, 404),
        ({"status": 400, "message": "bad definition"}, SandboxError, 400),
        ({"drop": True}, Unavailable, None),
        ({"hang": True}, Unavailable, None),
        ({"delay": 3}, Unavailable, None),
    ],
)
async def test_create_faults_map_to_router_errors(
    emu: ModalEmulator,
    fault: dict[str, Any],
    error: type[ProviderError],
    status: int | None,
) -> None:
    """The create request is bounded by ``request_timeout`` (1 s for a create that gets no
    answer here), not by the create's ``timeout``; one that got no answer says so
    (``unanswered``). An answered fault has 5 s: the image lookup before it can take over
    1 s on a loaded machine."""
    unanswered = any(key in fault for key in ("drop", "hang", "delay"))
    bound = 1 if unanswered else 5
    provider = ModalProvider("modal-a", options(emu, request_timeout=bound))
    await provider.list()  # the client's handshake, outside the create's bound
    emu.inject("create", times=None, **fault)
    started = time.monotonic()
    with pytest.raises(error) as raised:
        await provider.create(SandboxSpec(), timeout=1)
    assert type(raised.value) is error
    if isinstance(raised.value, Unavailable):
        assert raised.value.unanswered == unanswered
    assert time.monotonic() - started < bound + 1
    assert (raised.value.provider, raised.value.status) == ("modal-a", status)
    if fault.get("message"):
        assert fault["message"] in raised.value.message
    if fault.get("retry_after"):
        assert isinstance(raised.value, RateLimited)
        assert raised.value.retry_after == 9
    assert TEST_TOKEN_SECRET not in str(raised.value)
    emu.clear_faults()
    sbx = await provider.create(SandboxSpec(), timeout=5)
    await provider.aclose()
    await kill_unhurried(emu, sbx.id)


@pytest.mark.parametrize("op", ["lookup", "image", "auth"])
async def test_faults_before_the_create_map_too(emu: ModalEmulator, op: str) -> None:
    """A hang before ``SandboxCreate`` went out is no create left unanswered."""
    provider = ModalProvider("modal-a", options(emu, request_timeout=1))
    emu.inject(op, status=401)
    with pytest.raises(AuthError):
        await provider.create(SandboxSpec(), timeout=2)
    emu.inject(op, hang=True)
    with pytest.raises(Unavailable) as raised:
        await provider.create(SandboxSpec(labels={LABEL_LEASE: f"l-{op}"}), timeout=1)
    assert raised.value.unanswered is False
    assert emu.alive() == []
    await provider.aclose()


async def test_slow_image_build_within_the_timeout_succeeds(
    emu: ModalEmulator, provider: ModalProvider
) -> None:
    emu.images.build_seconds = 0.5
    started = time.monotonic()
    sbx = await provider.create(SandboxSpec(template="python:3.11-slim"), timeout=5)
    assert time.monotonic() - started >= 0.5
    await sbx.kill()
    emu.images.allowed = {"python:3.12-slim"}
    with pytest.raises(NotFound, match="image build failed"):
        await provider.create(SandboxSpec(template="no/such:image"), timeout=5)


async def test_account_limits(emu: ModalEmulator, provider: ModalProvider) -> None:
    emu.set_quota(max_concurrent=1, api_key=TEST_TOKEN_ID)
    first = await provider.create(SandboxSpec(), timeout=2)
    with pytest.raises(CapacityExceeded, match="1 concurrently running sandboxes"):
        await provider.create(SandboxSpec(), timeout=2)
    await first.kill()
    emu.set_quota(max_created=1, api_key=TEST_TOKEN_ID)
    second = await provider.create(SandboxSpec(), timeout=2)
    await second.kill()
    with pytest.raises(QuotaExceeded, match="billing limit") as spent:
        await provider.create(SandboxSpec(), timeout=2)
    assert spent.value.status == 429


async def test_workspaces_side_by_side() -> None:
    other = ("ak-other-workspace", "as-other-secret")
    with ModalEmulator(tokens={TEST_TOKEN_ID: TEST_TOKEN_SECRET, other[0]: other[1]}) as emu:
        first = ModalProvider("modal-1", options(emu))
        second = ModalProvider("modal-2", options(emu, token_id=other[0], token_secret=other[1]))
        a = await first.create(SandboxSpec(labels={"team": "x"}), timeout=5)
        b = await second.create(SandboxSpec(labels={"team": "x"}), timeout=5)
        assert [s.id for s in await first.list({"team": "x"})] == [a.id]
        assert [s.id for s in await second.list({"team": "x"})] == [b.id]
        with pytest.raises(NotFound):
            await second.connect(a.id)
        assert await first.kill(b.id) is False
        stranger = ModalProvider("modal-3", options(emu, token_secret="as-wrong"))
        with pytest.raises(AuthError) as refused:
            await stranger.create(SandboxSpec(), timeout=2)
        assert refused.value.status == 401
        with pytest.raises(AuthError):
            await stranger.list()
        await a.kill()
        await b.kill()
        assert emu.alive() == []
        for adapter in (first, second, stranger):
            await adapter.aclose()


@pytest.mark.parametrize(
    ("op", "fault", "call", "error"),
    [
        ("exec", {"hang": True}, "run", Unavailable),
        ("exec", {"drop": True}, "run", Unavailable),
        ("exec", {"status": 503}, "run", Unavailable),
        ("exec", {"status": 401}, "run", AuthError),
        ("files", {"status": 500}, "read", Unavailable),
        ("files", {"hang": True}, "write", Unavailable),
        ("list", {"status": 429, "retry_after": 3}, "list", RateLimited),
        ("list", {"status": 503}, "list", Unavailable),
        ("get", {"status": 503}, "connect", Unavailable),
        ("get", {"status": 401}, "connect", AuthError),
        ("connect", {"status": 500}, "connect_run", Unavailable),
        ("kill", {"status": 500}, "kill", Unavailable),
        ("kill", {"hang": True}, "kill", Unavailable),
        ("port", {"status": 503}, "expose", Unavailable),
        ("snapshot", {"status": 403}, "snapshot", AuthError),
        ("snapshot", {"status": 503}, "delete_snapshot", Unavailable),
    ],
)
async def test_operation_faults_map_to_router_errors(
    emu: ModalEmulator,
    op: str,
    fault: dict[str, Any],
    call: str,
    error: type[ProviderError],
) -> None:
    adapter = ModalProvider("modal-a", options(emu, request_timeout=1))
    sbx = await adapter.create(SandboxSpec(), timeout=5)

    async def connect_run() -> Any:
        return await (await adapter.connect(sbx.id)).run("true", timeout=1)

    calls: dict[str, Callable[[], Any]] = {
        "run": lambda: sbx.run("echo hi", timeout=1),
        "read": lambda: sbx.read_file("x"),
        "write": lambda: sbx.write_file("x", b"x"),
        "list": adapter.list,
        "connect": lambda: adapter.connect(sbx.id),
        "connect_run": connect_run,
        "kill": lambda: adapter.kill(sbx.id),
        "expose": lambda: sbx.expose(8000),
        "snapshot": sbx.snapshot,
        "delete_snapshot": lambda: adapter.delete_snapshot("im-" + "0" * 22),
    }
    emu.inject(op, times=None, **fault)
    started = time.monotonic()
    try:
        with pytest.raises(error) as raised:
            await calls[call]()
        assert type(raised.value) is error
        assert raised.value.provider == "modal-a"
        assert time.monotonic() - started < 3
    finally:
        emu.clear_faults()
        await adapter.aclose()
        await kill_unhurried(emu, sbx.id)


async def kill_unhurried(emu: ModalEmulator, sandbox_id: str) -> None:
    """A test's cleanup, by an adapter without the 1 s bound its faults are measured by
    (a terminate can take longer on a loaded machine: seen at six workers)."""
    cleaner = ModalProvider("modal-cleanup", options(emu))
    await cleaner.kill(sandbox_id)
    await cleaner.aclose()


async def test_dead_endpoint_is_unavailable_within_the_deadline() -> None:
    """Within the request timeout, and the create says it never went out."""
    url = f"http://127.0.0.1:{free_port()}"
    token = {"token_id": TEST_TOKEN_ID, "token_secret": TEST_TOKEN_SECRET}
    dead = ModalProvider("modal-dead", ModalOptions(**token, server_url=url, request_timeout=1.5))
    started = time.monotonic()
    with pytest.raises(Unavailable) as raised:
        await dead.create(SandboxSpec(labels={LABEL_LEASE: "l-dead"}), timeout=0.5)
    assert time.monotonic() - started < 3  # the SDK alone reconnects for about a minute
    assert raised.value.unanswered is False  # no SandboxCreate went out: nothing to look up
    await dead.aclose()
    # The client the create gave up on is closed: its SDK connect task would otherwise retry
    # for a minute, fail, and be logged by the collector as an exception never retrieved.
    await until(lambda: sdk_connects() == [], seconds=5)


def sdk_connects() -> list[asyncio.Task[Any]]:
    """The Modal SDK's connect tasks still trying (they run on the SDK's own loop)."""
    return [
        task
        for task in gc.get_objects()
        if isinstance(task, asyncio.Task)
        and not task.done()
        and "create_channel_with_fallbacks" in task.get_coro().__qualname__
    ]


async def test_client_from_the_environment(emu: ModalEmulator) -> None:
    """No options: the token and the server come from MODAL_* (as ``sdk_env`` sets them)."""
    adapter = ModalProvider("modal-env")
    assert adapter.configured()
    sbx = await adapter.create(SandboxSpec(), timeout=5)
    assert (await sbx.run("echo env")).stdout == "env\n"
    await sbx.kill()
    await adapter.aclose()


def test_no_sdk_import_until_used() -> None:
    script = textwrap.dedent(
        """
        import os, sys
        import providers.modal
        from providers.modal import ModalProvider
        ModalProvider("m").configured()
        assert not [m for m in sys.modules if m.split(".")[0] in ("modal", "modal_proto")]
        assert "MODAL_MAX_THROTTLE_WAIT" not in os.environ
        providers.modal._sdk()
        assert "MODAL_MAX_THROTTLE_WAIT" not in os.environ
        """
    )
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": ":".join(sys.path)}
    subprocess.run([sys.executable, "-c", script], env=env, timeout=60, check=True)


async def test_secrets_never_leak(
    emu: ModalEmulator, caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]
) -> None:
    opts = options(emu)
    adapter = ModalProvider("modal-secret", opts)
    for logger in ("sandbox_router", "modal-client", "grpclib"):
        caplog.set_level(logging.DEBUG, logger)  # hpack's own DEBUG log prints every header
    seen: list[str] = [repr(opts), str(opts), opts.model_dump_json(), repr(adapter)]
    with structlog.testing.capture_logs() as events:
        sbx = await adapter.create(SandboxSpec(labels={"k": "v"}), timeout=5)
        await sbx.run("echo hi")
        await sbx.kill()
        emu.inject("create", status=401)
        with pytest.raises(AuthError) as refused:
            await adapter.create(SandboxSpec(), timeout=5)
        emu.inject("create", status=500, message="boom", times=None)
        with pytest.raises(Unavailable) as failed:
            await adapter.create(SandboxSpec(), timeout=5)
        emu.clear_faults()
    await adapter.aclose()
    assert events, "the adapter logs its lifecycle events"
    for err in (refused.value, failed.value):
        seen += [str(err), repr(err), str(err.__cause__), repr(err.__cause__)]
    seen += [repr(e) for e in events] + [caplog.text] + list(capsys.readouterr())
    assert [text for text in seen if TEST_TOKEN_SECRET in text] == []


@pytest.mark.parametrize(
    ("fault", "error"),
    [
        ({"status": 503}, Unavailable),
        ({"status": 500}, Unavailable),
        ({"drop": True}, Unavailable),
        ({"status": 429, "retry_after": 9}, RateLimited),
    ],
)
async def test_one_create_is_one_request(
    emu: ModalEmulator, provider: ModalProvider, fault: dict[str, Any], error: type[ProviderError]
) -> None:
    """The SDK's own retries (and throttle sleeps) are stopped: the router owns retries."""
    emu.inject("create", times=None, **fault)
    with pytest.raises(error):
        await provider.create(SandboxSpec(), timeout=5)
    assert emu.core.faults.hits["create"] == 1


async def test_debug_logging_never_shows_the_token(
    emu: ModalEmulator, provider: ModalProvider, caplog: pytest.LogCaptureFixture
) -> None:
    """An app logging everything at DEBUG sees no token in the HTTP/2 header log (hpack)."""
    caplog.set_level(logging.DEBUG)
    sbx = await provider.create(SandboxSpec(), timeout=5)
    await sbx.run("echo hi")
    await sbx.kill()
    assert "x-modal-token-secret" in caplog.text, "the header log is on"
    assert TEST_TOKEN_SECRET not in caplog.text
    assert TEST_TOKEN_ID not in caplog.text
