"""Contract tests: the real e2b SDKs (async and sync) against the E2B emulator.

If E2B's wire protocol moves under a new SDK version, these fail first.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import time
import tracemalloc
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime, timedelta

import httpx
import pytest
from e2b import (
    AuthenticationException,
    CommandExitException,
    ConnectionConfig,
    FileNotFoundException,
    FilesystemEventType,
    FileType,
    InvalidArgumentException,
    NotFoundException,
    PtySize,
    RateLimitException,
    SandboxException,
    SandboxNotFoundException,
    SandboxNotRunningException,
    SandboxQuery,
    SandboxState,
    ServiceBusyException,
    TimeoutException,
)
from e2b.api import ApiClient, handle_api_exception
from e2b_code_interpreter import AsyncSandbox, Sandbox

from emulators.e2b import TEST_API_KEY, E2BEmulator
from emulators.harness import Emulator, free_port
from tests.polling import until


@pytest.fixture
def emu(e2b_emulator: Emulator) -> Iterator[E2BEmulator]:
    assert isinstance(e2b_emulator, E2BEmulator)
    yield e2b_emulator
    assert e2b_emulator.alive() == [], "a test left a sandbox alive"


async def test_create_run_and_exit_codes(emu: E2BEmulator) -> None:
    sbx = await AsyncSandbox.create(
        metadata={"team": "a"}, envs={"GLOBAL": "g"}, timeout=60, **emu.sdk_kwargs()
    )
    try:
        result = await sbx.commands.run(
            "echo out $GLOBAL $LOCAL; echo err >&2", envs={"LOCAL": "l"}
        )
        assert (result.stdout, result.stderr, result.exit_code) == ("out g l\n", "err\n", 0)
        with pytest.raises(CommandExitException) as failed:
            await sbx.commands.run("echo partial; exit 7")
        assert (failed.value.exit_code, failed.value.stdout) == (7, "partial\n")
        assert failed.value.error == "exit status 7"
        assert result.error is None
        await sbx.files.make_dir("work/sub")
        where = await sbx.commands.run("pwd", cwd="/home/user/work/sub")
        assert where.stdout.strip().endswith("/work/sub")
        record = emu.records()[0]
        assert (record.id, record.labels) == (sbx.sandbox_id, {"team": "a"})
    finally:
        assert await sbx.kill()
    assert await AsyncSandbox.kill(sbx.sandbox_id, **emu.sdk_kwargs()) is False


async def test_command_timeout_kills_the_process(emu: E2BEmulator) -> None:
    sbx = await AsyncSandbox.create(**emu.sdk_kwargs())
    try:
        started = time.monotonic()
        with pytest.raises(TimeoutException):
            await sbx.commands.run("echo begun; sleep 30", timeout=0.5)
        assert time.monotonic() - started < 3
        await until(lambda: not emu.core.e2b[sbx.sandbox_id].processes)
        assert emu.core.e2b[sbx.sandbox_id].processes == {}
    finally:
        await sbx.kill()


async def test_background_command_signal_and_stdin(emu: E2BEmulator) -> None:
    sbx = await AsyncSandbox.create(**emu.sdk_kwargs())
    try:
        reader = await sbx.commands.run("head -c 5", background=True, stdin=True)
        await sbx.commands.send_stdin(reader.pid, "hello world")
        assert (await reader.wait()).stdout == "hello"
        sleeper = await sbx.commands.run("sleep 30", background=True)
        assert [p.pid for p in await sbx.commands.list()] == [sleeper.pid]
        assert await sleeper.kill()
        with pytest.raises(CommandExitException) as killed:
            await sleeper.wait()
        # envd's Go: ProcessState.ExitCode() is -1 for a signal, cmd.Wait()'s error its text
        assert (killed.value.exit_code, killed.value.error) == (-1, "signal: killed")
        assert await sbx.commands.kill(sleeper.pid) is False
    finally:
        await sbx.kill()


async def test_processes_outlive_their_stream_and_reattach_by_pid(emu: E2BEmulator) -> None:
    sbx = await AsyncSandbox.create(**emu.sdk_kwargs())
    try:
        early: list[str] = []
        first = await sbx.commands.run(
            "echo early; read line; echo got $line",
            background=True,
            stdin=True,
            timeout=0,
            on_stdout=early.append,
        )
        await until(lambda: early == ["early\n"])
        listed = await sbx.commands.list()
        assert [(p.pid, p.cmd, p.args) for p in listed] == [
            (first.pid, "/bin/bash", ["-l", "-c", "echo early; read line; echo got $line"])
        ]
        await first.disconnect()  # as in envd, the process runs on
        other = await AsyncSandbox.connect(sbx.sandbox_id, **emu.sdk_kwargs())
        seen: list[str] = []
        again = await other.commands.connect(first.pid, timeout=0, on_stdout=seen.append)
        await other.commands.send_stdin(first.pid, "late\n")
        assert (await again.wait()).exit_code == 0
        assert seen == ["got late\n"]  # from the moment it connected
        assert await sbx.commands.list() == []
        with pytest.raises(NotFoundException):
            await other.commands.connect(first.pid)
    finally:
        await sbx.kill()


async def test_pty_is_a_real_terminal_with_size_input_and_resize(isolation: str) -> None:
    with E2BEmulator(isolation=isolation) as emu:
        sbx = await AsyncSandbox.create(**emu.sdk_kwargs())
        try:
            seen = bytearray()
            tty = await sbx.pty.create(
                PtySize(rows=24, cols=80), on_data=seen.extend, cwd="/tmp", envs={"M": "m1"}
            )
            await sbx.pty.send_stdin(tty.pid, b"tty -s && echo on-a-tty $M $(pwd); stty size\n")
            await until(lambda: b"24 80" in seen)
            await sbx.pty.resize(tty.pid, PtySize(rows=30, cols=100))
            await sbx.pty.send_stdin(tty.pid, b"stty size; exit 5\n")
            with pytest.raises(CommandExitException) as ended:
                await tty.wait()
            assert ended.value.exit_code == 5
            assert b"on-a-tty m1 /tmp" in seen
            assert b"30 100" in seen
            killed = await sbx.pty.create(PtySize(rows=5, cols=20), on_data=lambda _: None)
            assert [p.args for p in await sbx.commands.list()] == [["-i", "-l"]]
            assert await sbx.pty.kill(killed.pid)
            with pytest.raises(CommandExitException):
                await killed.wait()
        finally:
            await sbx.kill()


async def test_only_code_interpreter_templates_run_a_kernel(emu: E2BEmulator) -> None:
    sbx = await AsyncSandbox.create(template="base", **emu.sdk_kwargs())
    try:
        with pytest.raises(TimeoutException, match="port is not open"):
            await sbx.run_code("1")
    finally:
        await sbx.kill()


async def test_files_round_trip_binary(emu: E2BEmulator) -> None:
    sbx = await AsyncSandbox.create(**emu.sdk_kwargs())
    try:
        payload = bytes(range(256)) * 64
        info = await sbx.files.write("/home/user/data/blob.bin", payload)
        assert info.path == "/home/user/data/blob.bin"
        assert bytes(await sbx.files.read("data/blob.bin", format="bytes")) == payload
        await sbx.files.write("data/note.txt", "héllo")
        assert await sbx.files.read("data/note.txt") == "héllo"
        entries = {e.name: e for e in await sbx.files.list("/home/user/data")}
        assert sorted(entries) == ["blob.bin", "note.txt"]
        assert entries["blob.bin"].size == len(payload)
        assert await sbx.files.exists("data/note.txt")
        await sbx.files.rename("data/note.txt", "data/moved.txt")
        await sbx.files.remove("data/blob.bin")
        assert [e.name for e in await sbx.files.list("data")] == ["moved.txt"]
        assert (await sbx.commands.run("cat data/moved.txt")).stdout == "héllo"
        with pytest.raises(FileNotFoundException):
            await sbx.files.read("data/missing")
        with pytest.raises(InvalidArgumentException):
            await sbx.files.write("/etc/outside", b"x")
    finally:
        await sbx.kill()


async def test_files_stream_both_ways_without_holding_them(emu: E2BEmulator) -> None:
    block = os.urandom(1 << 20)

    async def chunks() -> AsyncIterator[bytes]:
        for _ in range(24):
            yield block

    sbx = await AsyncSandbox.create(**emu.sdk_kwargs())
    tracemalloc.start()
    try:
        await sbx.files.write("data/big.bin", chunks())  # an iterable goes as octet-stream
        digest = hashlib.sha256()
        async for chunk in await sbx.files.read("data/big.bin", format="stream"):
            digest.update(chunk)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
        await sbx.kill()
    assert digest.hexdigest() == hashlib.sha256(block * 24).hexdigest()
    assert peak < 8 * (1 << 20), f"the transfer held {peak} bytes"  # SDK and emulator both


async def test_pause_keeps_files_frees_the_slot_and_connect_resumes(emu: E2BEmulator) -> None:
    emu.set_quota(max_concurrent=1)
    sbx = await AsyncSandbox.create(**emu.sdk_kwargs())
    try:
        await sbx.files.write("notes.txt", "kept")
        assert await sbx.pause() is True
        assert await sbx.pause() is False  # already paused: 409
        [listed] = await AsyncSandbox.list(**emu.sdk_kwargs()).next_items()
        assert (listed.sandbox_id, listed.state.value) == (sbx.sandbox_id, "paused")
        other = await AsyncSandbox.create(**emu.sdk_kwargs())  # the paused one holds no slot
        await other.kill()
        woken = await AsyncSandbox.connect(sbx.sandbox_id, **emu.sdk_kwargs())
        assert await woken.files.read("notes.txt") == "kept"
        assert (await woken.commands.run("echo up")).stdout == "up\n"
    finally:
        emu.set_quota(max_concurrent=None)
        await sbx.kill()


async def test_a_port_is_served_at_its_host_and_restricted_traffic_wants_the_token(
    emu: E2BEmulator,
) -> None:
    port = free_port()
    sbx = await AsyncSandbox.create(network={"allow_public_traffic": False}, **emu.sdk_kwargs())
    try:
        await sbx.files.write("site/index.html", "hello")
        await sbx.commands.run(
            f"cd site && exec python3 -m http.server {port} --bind 127.0.0.1", background=True
        )
        host = sbx.get_host(port)
        edge = emu.resolve(host)
        assert edge is not None
        assert host == f"{port}-{sbx.sandbox_id}.e2b.emulator.test"
        url = f"http://{edge[0]}:{edge[1]}/index.html"
        token = sbx.traffic_access_token
        assert token
        async with httpx.AsyncClient() as client:
            for _ in range(100):  # until the server listens (the edge answers 502 before)
                answer = await client.get(
                    url, headers={"Host": host, "E2B-Traffic-Access-Token": token}
                )
                if answer.status_code == 200:
                    break
                await asyncio.sleep(0.05)
            assert answer.text == "hello"
            assert (await client.get(url, headers={"Host": host})).status_code == 403
    finally:
        await sbx.kill()


async def test_a_snapshot_is_a_template_until_it_is_deleted(emu: E2BEmulator) -> None:
    sbx = await AsyncSandbox.create(**emu.sdk_kwargs())
    try:
        await sbx.files.write("app/config.txt", "baked")
        made = await sbx.create_snapshot("base")
    finally:
        await sbx.kill()
    child = await AsyncSandbox.create(made.snapshot_id, **emu.sdk_kwargs())
    try:
        assert await child.files.read("app/config.txt") == "baked"
    finally:
        await child.kill()
    kwargs = emu.sdk_kwargs()
    assert await AsyncSandbox.delete_snapshot(made.snapshot_id, **kwargs) is True
    assert await AsyncSandbox.delete_snapshot(made.snapshot_id, **kwargs) is False


async def test_list_by_metadata_is_paged(emu: E2BEmulator) -> None:
    kw = emu.sdk_kwargs()
    wanted = [await AsyncSandbox.create(metadata={"pool": "x y/z"}, **kw) for _ in range(3)]
    other = await AsyncSandbox.create(metadata={"pool": "other"}, **kw)
    try:
        pages = AsyncSandbox.list(query=SandboxQuery(metadata={"pool": "x y/z"}), limit=2, **kw)
        seen = []
        while pages.has_next:
            seen.append([s.sandbox_id for s in await pages.next_items()])
        assert [len(page) for page in seen] == [2, 1]
        assert sorted(id_ for page in seen for id_ in page) == sorted(s.sandbox_id for s in wanted)
        other_key = AsyncSandbox.list(**emu.sdk_kwargs(api_key="e2b_someone_else"))
        assert await other_key.next_items() == []
    finally:
        for sbx in [*wanted, other]:
            await sbx.kill()


async def test_connect_info_timeout_and_kill(emu: E2BEmulator) -> None:
    kw = emu.sdk_kwargs()
    sbx = await AsyncSandbox.create(timeout=30, **kw)
    same = await AsyncSandbox.connect(sbx.sandbox_id, **kw)
    assert (await same.commands.run("echo via connect")).stdout == "via connect\n"
    before = (await sbx.get_info()).end_at
    await sbx.set_timeout(600)
    assert ((await sbx.get_info()).end_at - before).total_seconds() > 500
    assert await sbx.is_running()
    assert await same.kill()
    assert not await sbx.is_running()
    with pytest.raises(SandboxNotFoundException):
        await AsyncSandbox.connect(sbx.sandbox_id, **kw)
    with pytest.raises(SandboxNotFoundException):
        await sbx.get_info()
    with pytest.raises(TimeoutException, match="was not found"):
        await sbx.commands.run("true")


async def test_sandbox_expires_after_its_timeout(emu: E2BEmulator) -> None:
    sbx = await AsyncSandbox.create(timeout=1, **emu.sdk_kwargs())
    await sbx.commands.run("sleep 30", background=True)
    await until(lambda: not emu.alive())
    assert [r.ended_by for r in emu.records()] == ["expired"]
    assert emu.core.e2b[sbx.sandbox_id].processes == {}
    assert not await sbx.is_running()


async def test_run_code_keeps_state(emu: E2BEmulator) -> None:
    sbx = await AsyncSandbox.create(**emu.sdk_kwargs())
    try:
        code = "import os\nx = 20\nprint('hi', os.environ['V'])"
        first = await sbx.run_code(code, envs={"V": "1"})
        assert (first.logs.stdout, first.results, first.error) == (["hi 1\n"], [], None)
        second = await sbx.run_code("x * 2 + 2")
        assert second.text == "42"
        assert second.results[0].is_main_result
        failed = await sbx.run_code("print('before'); 1 / 0")
        assert failed.error is not None
        assert (failed.error.name, failed.error.value) == ("ZeroDivisionError", "division by zero")
        assert failed.logs.stdout == ["before\n"]
        shell = await sbx.run_code("echo from bash; exit 3", language="bash")
        assert shell.logs.stdout == ["from bash\n"]
        assert shell.error is not None
        with pytest.raises(TimeoutException):
            await sbx.run_code("import time; time.sleep(30)", timeout=0.5)
        # The client gone, the kernel is interrupted and keeps its state (E2B's #213).
        kept = await sbx.run_code("'x is ' + str(x)", timeout=10)
        assert (kept.text, kept.error) == ("x is 20", None)
    finally:
        await sbx.kill()


# E2B's own code-interpreter tests (python/tests/async: test_async_basic, _statefulness,
# _contexts, _kernels, _cwd, _execution_count, env_vars/test_python), against the emulator.


async def test_e2b_basic_statefulness_and_execution_count(emu: E2BEmulator) -> None:
    sbx = await AsyncSandbox.create(**emu.sdk_kwargs())
    try:
        assert (await sbx.run_code("x =1; x")).text == "1"
        await sbx.run_code("async_test_stateful = 1")
        counted = await sbx.run_code("async_test_stateful+=1; async_test_stateful")
        assert (counted.text, counted.execution_count) == ("2", 3)
        cwd = await sbx.run_code("from pathlib import Path; print(Path.cwd())")
        assert "".join(cwd.logs.stdout).strip() == "/home/user"
        text = await sbx.run_code("'a string'")
        assert (text.text, text.results[0].formats()) == ("a string", ["text"])
    finally:
        await sbx.kill()


async def test_e2b_env_vars_per_execution(emu: E2BEmulator) -> None:
    sbx = await AsyncSandbox.create(envs={"TEST_ENV_VAR": "supertest"}, **emu.sdk_kwargs())
    try:
        code = "import os; os.getenv('FOO', 'default')"
        assert (await sbx.run_code(code, envs={"FOO": "bar"})).text == "bar"
        assert (await sbx.run_code(code)).text == "default"
        over = "import os; os.getenv('TEST_ENV_VAR')"
        assert (await sbx.run_code(over, envs={"TEST_ENV_VAR": "overwrite"})).text == "overwrite"
        assert (await sbx.run_code(over)).text == "supertest"
        await sbx.run_code("import os; os.environ['SET_BY_CODE'] = 'kept'")
        assert (await sbx.run_code("os.environ['SET_BY_CODE']")).text == "kept"
    finally:
        await sbx.kill()


async def test_e2b_contexts(emu: E2BEmulator) -> None:
    sbx = await AsyncSandbox.create(**emu.sdk_kwargs())
    try:
        context = await sbx.create_code_context()
        last = (await sbx.list_code_contexts())[-1]
        assert (last.id, last.language, last.cwd) == (context.id, "python", "/home/user")
        assert "python" in [c.language for c in await sbx.list_code_contexts()]
        await sbx.run_code("x = 1")
        independent = await sbx.run_code("x", context=context)
        assert independent.error is not None
        assert independent.error.value == "name 'x' is not defined"
        await sbx.files.make_dir("/home/user/elsewhere")
        placed = await sbx.create_code_context(cwd="/home/user/elsewhere", language="python")
        where = await sbx.run_code("import os; os.getcwd()", context=placed)
        assert where.text == "/home/user/elsewhere"
        with pytest.raises(InvalidArgumentException):
            await sbx.run_code("1", language="js", context=placed)
        await sbx.run_code("y = 1", context=placed)
        await sbx.restart_code_context(placed.id)
        restarted = await sbx.run_code("y", context=placed)
        assert restarted.error is not None
        assert (restarted.error.name, restarted.error.value) == (
            "NameError",
            "name 'y' is not defined",
        )
        assert restarted.execution_count == 1
        await sbx.remove_code_context(placed.id)
        assert placed.id not in [c.id for c in await sbx.list_code_contexts()]
        with pytest.raises(NotFoundException):
            await sbx.run_code("1", context=placed)
    finally:
        await sbx.kill()


async def test_e2b_rich_results(emu: E2BEmulator) -> None:
    sbx = await AsyncSandbox.create(**emu.sdk_kwargs())
    try:
        code = (
            "class Table:\n"
            "    def _repr_html_(self):\n"
            "        return '<table></table>'\n"
            "    def __repr__(self):\n"
            "        return 'Table()'\n"
            "Table()"
        )
        shown = await sbx.run_code(code)
        assert (shown.text, shown.results[0].html) == ("Table()", "<table></table>")
        assert (await sbx.run_code("None")).results == []
        if (await sbx.commands.run("python3 -c 'import matplotlib' || true")).stderr:
            pytest.skip("the emulated sandbox's python3 has no matplotlib")
        plotted = await sbx.run_code(
            "import matplotlib.pyplot as plt\nplt.plot([1, 2])\nplt.show()"
        )
        (figure,) = plotted.results
        assert figure.png
        assert figure.text.startswith("<Figure size")
        assert not figure.is_main_result
    finally:
        await sbx.kill()


def test_sync_sdk(emu: E2BEmulator) -> None:
    sbx = Sandbox.create(metadata={"api": "sync"}, **emu.sdk_kwargs())
    try:
        assert sbx.commands.run("echo sync").stdout == "sync\n"
        with pytest.raises(CommandExitException):
            sbx.commands.run("exit 2")
        sbx.files.write("bin", b"\x00\x01\xfe\xff")
        assert bytes(sbx.files.read("bin", format="bytes")) == b"\x00\x01\xfe\xff"
        assert sbx.run_code("6 * 7").text == "42"
        listed = Sandbox.list(query=SandboxQuery(metadata={"api": "sync"}), **emu.sdk_kwargs())
        assert [s.sandbox_id for s in listed.next_items()] == [sbx.sandbox_id]
        assert Sandbox.connect(sbx.sandbox_id, **emu.sdk_kwargs()).is_running()
    finally:
        assert sbx.kill()


def test_errors_as_the_sdk_sees_them(emu: E2BEmulator) -> None:
    kw = emu.sdk_kwargs()
    emu.core.accepted_keys = {TEST_API_KEY}
    with pytest.raises(AuthenticationException):
        Sandbox.create(**emu.sdk_kwargs(api_key="e2b_wrong"))
    emu.inject("create", status=503)
    with pytest.raises(ServiceBusyException):
        Sandbox.create(**kw)
    emu.inject("create", status=500)
    with pytest.raises(SandboxException, match="500"):
        Sandbox.create(**kw)
    emu.set_quota(max_concurrent=1)
    first = Sandbox.create(**kw)
    try:
        with pytest.raises(RateLimitException, match=r"concurrent E2B sandboxes \(1\)"):
            Sandbox.create(**kw)
    finally:
        first.kill()
    emu.set_quota(max_created=0, api_key=TEST_API_KEY)
    with pytest.raises(SandboxException, match="team is blocked") as blocked:
        Sandbox.create(**kw)
    assert blocked.value.status_code == 403


def test_after_faults_make_the_sandbox_then_answer_late_or_drop_the_connection(
    emu: E2BEmulator,
) -> None:
    """The shared HTTP fault middleware: ``after`` does the work before the fault."""
    kw = emu.sdk_kwargs()
    emu.inject("create", after=True, drop=True)
    with pytest.raises(httpx.RemoteProtocolError):
        Sandbox.create(metadata={"fault": "dropped"}, **kw)
    [dropped] = emu.alive()
    assert dropped.labels == {"fault": "dropped"}
    emu.inject("create", after=True, delay=0.5)
    started = time.monotonic()
    late = Sandbox.create(metadata={"fault": "late"}, **kw)
    assert time.monotonic() - started >= 0.5
    assert {r.labels["fault"] for r in emu.alive()} == {"dropped", "late"}
    assert late.kill()
    assert Sandbox.kill(dropped.id, **kw)


def test_status_faults_carry_retry_after_on_the_wire(emu: E2BEmulator) -> None:
    emu.inject("list", status=429, retry_after=7, message="slow down")
    response = httpx.get(f"{emu.url}/v2/sandboxes", headers={"X-API-KEY": TEST_API_KEY})
    assert response.status_code == 429
    assert response.headers["Retry-After"] == "7"
    assert response.json() == {"code": 429, "message": "slow down"}
    assert httpx.get(f"{emu.url}/v2/sandboxes").status_code == 401


def test_emulator_listens_on_the_port_it_is_given() -> None:
    with E2BEmulator() as probe:
        port = probe.port
    with E2BEmulator(port=port) as emu:
        assert emu.url == f"http://127.0.0.1:{port}"
        assert emu.sdk_env()["E2B_API_URL"] == emu.url == emu.sdk_env()["E2B_SANDBOX_URL"]
        sbx = Sandbox.create(**emu.sdk_kwargs())
        sbx.kill()
        assert emu.alive() == []


async def test_the_whole_filesystem_and_unknown_routes(isolation: str) -> None:
    """/tmp and cwd="/" work as on E2B (code too), and a route it lacks is the SDK's not-found."""
    with E2BEmulator(isolation=isolation) as emu:
        sbx = await AsyncSandbox.create(**emu.sdk_kwargs())
        try:
            await sbx.files.write("/tmp/x", "t")
            assert await sbx.files.read("/tmp/x") == "t"
            ran = await sbx.commands.run("pwd; cat /tmp/x; echo; echo $HOME", cwd="/")
            assert ran.stdout == "/\nt\n/home/user\n"
            assert (await sbx.commands.run("pwd")).stdout == "/home/user\n"
            assert {"home", "tmp"} <= {e.name for e in await sbx.files.list("/")}
            code = await sbx.run_code(
                "import os; open('/tmp/y', 'w').write('y'); print(os.getcwd())"
            )
            assert (code.error, code.logs.stdout) == (None, ["/home/user\n"])
            assert await sbx.files.read("/tmp/y") == "y"
        finally:
            await sbx.kill()
        with ApiClient(ConnectionConfig(api_key=TEST_API_KEY, api_url=emu.url)) as api:
            response = api.get_httpx_client().get("/v2/nope")
        error = handle_api_exception(response)  # how the SDK reads an error answer
        assert isinstance(error, SandboxException)
        assert str(error) == "404: Cannot GET /v2/nope"


async def test_get_info_of_a_symlink_describes_the_link(emu: E2BEmulator) -> None:
    """envd lstats the last path element: a symlink's entry is the link itself, with its
    resolved absolute target and the target's type (the SDK shows it as a symlink);
    permissions read as Go's ``FileMode.String``."""
    sbx = await AsyncSandbox.create(**emu.sdk_kwargs())
    try:
        await sbx.files.write("d/target.txt", "x")
        await sbx.commands.run("ln -s target.txt link.txt", cwd="/home/user/d")
        info = await sbx.files.get_info("d/link.txt")
        assert (info.name, info.path) == ("link.txt", "/home/user/d/link.txt")
        assert (info.type, info.symlink_target) == (FileType.SYMLINK, "/home/user/d/target.txt")
        listed = {e.name: e for e in await sbx.files.list("d")}
        assert listed["link.txt"].symlink_target == "/home/user/d/target.txt"
        assert listed["target.txt"].symlink_target is None
        await sbx.commands.run("chmod 4755 target.txt", cwd="/home/user/d")
        modes = {e.name: e.permissions for e in await sbx.files.list("/home/user")}
        assert modes["d"] == "drwxr-xr-x"
        modes = {e.name: e.permissions for e in await sbx.files.list("d")}
        assert modes == {"link.txt": "Lrwxrwxrwx", "target.txt": "urwxr-xr-x"}
    finally:
        await sbx.kill()


async def test_remove_of_a_symlink_removes_the_link(emu: E2BEmulator) -> None:
    """Remove and rename act on a symlink itself, never on what it points to."""
    sbx = await AsyncSandbox.create(**emu.sdk_kwargs())
    try:
        await sbx.files.write("real/x.txt", "x")
        await sbx.commands.run("ln -s real alias && ln -s real other")
        await sbx.files.remove("alias")
        await sbx.files.rename("other", "renamed")
        assert await sbx.files.read("real/x.txt") == "x"
        names = {e.name: e.type for e in await sbx.files.list(".")}
        assert names == {"real": FileType.DIR, "renamed": FileType.SYMLINK}
    finally:
        await sbx.kill()


async def test_remove_of_a_missing_path_is_no_error(emu: E2BEmulator) -> None:
    """envd removes with Go's os.RemoveAll: a path that is not there is already removed
    (the adapter asks get_info first to say NotFound, as every provider does)."""
    sbx = await AsyncSandbox.create(**emu.sdk_kwargs())
    try:
        await sbx.files.remove("never/was.txt")
        assert not await sbx.files.exists("never/was.txt")
    finally:
        await sbx.kill()


async def test_file_metadata_is_kept_as_xattrs(emu: E2BEmulator) -> None:
    """``X-Metadata-*`` upload headers become ``user.e2b.*`` xattrs, shown by write, Stat,
    ListDir and Move; an upload replaces them all and bad bytes answer 400."""
    sbx = await AsyncSandbox.create(**emu.sdk_kwargs())
    try:
        written = await sbx.files.write("m/a.txt", "a", metadata={"Author": "mish"})
        assert written.metadata == {"author": "mish"}
        octet = await sbx.files.write("m/b.txt", "b", metadata={"k": "v"}, use_octet_stream=True)
        assert octet.metadata == {"k": "v"}
        assert (await sbx.files.get_info("m/b.txt")).metadata == {"k": "v"}
        assert {e.name: e.metadata for e in await sbx.files.list("m")} == {
            "a.txt": {"author": "mish"},
            "b.txt": {"k": "v"},
        }
        assert (await sbx.files.rename("m/a.txt", "m/c.txt")).metadata == {"author": "mish"}
        assert (await sbx.files.write("m/c.txt", "again")).metadata is None
        assert (await sbx.files.get_info("m/c.txt")).metadata is None
        host = emu.core.e2b[sbx.sandbox_id].host("m/c.txt")
        os.setxattr(host, "user.e2b.origin", b"outside")
        assert (await sbx.files.get_info("m/c.txt")).metadata == {"origin": "outside"}
        async with httpx.AsyncClient() as client:
            response = await client.post(
                f"{emu.url}/files",
                params={"path": "m/bad.txt"},
                content=b"x",
                headers=[
                    (b"E2b-Sandbox-Id", sbx.sandbox_id.encode()),
                    (b"X-Access-Token", emu.core.e2b[sbx.sandbox_id].token.encode()),
                    (b"Content-Type", b"application/octet-stream"),
                    (b"X-Metadata-Key", b"caf\xe9"),
                ],
            )
        assert response.status_code == 400
        assert not await sbx.files.exists("m/bad.txt")
    finally:
        await sbx.kill()


async def test_signed_file_urls_need_no_token(emu: E2BEmulator) -> None:
    """``download_url``/``upload_url`` carry a signature of the path, operation, user and
    envd token (and expiry) instead of headers; envd checks the signature, then the expiry."""
    sbx = await AsyncSandbox.create(**emu.sdk_kwargs())
    try:
        await sbx.files.write("signed.txt", "content")
        async with httpx.AsyncClient() as client:
            assert (await client.get(sbx.download_url("signed.txt"))).text == "content"
            assert (await client.get(sbx.download_url("signed.txt", "user", 60))).status_code == 200
            upload = sbx.upload_url("up.txt", use_signature_expiration=60)
            assert (await client.post(upload, files={"file": b"up"})).status_code == 200
            refused = await client.post(sbx.download_url("up.txt"), files={"file": b"no"})
            expired = await client.get(sbx.download_url("signed.txt", use_signature_expiration=-5))
            forged = await client.get(
                sbx.download_url("signed.txt").replace("signature=v1_", "signature=v1_x")
            )
        assert await sbx.files.read("up.txt") == "up"
        assert refused.status_code == 401
        assert (expired.status_code, expired.json()) == (
            401,
            {"code": 401, "message": "signature is already expired"},
        )
        assert forged.status_code == 401
    finally:
        await sbx.kill()


async def test_watch_dir_streams_filesystem_events(emu: E2BEmulator) -> None:
    """WatchDir streams create/write/rename/remove with names relative to the watched
    directory (every level when recursive); a missing directory is not found."""
    sbx = await AsyncSandbox.create(**emu.sdk_kwargs())
    try:
        await sbx.files.write("w/a.txt", "a")
        seen: list[tuple[str, FilesystemEventType]] = []
        handle = await sbx.files.watch_dir(
            "w", on_event=lambda e: seen.append((e.name, e.type)), recursive=True
        )
        await sbx.files.write("w/a.txt", "changed")
        await until(lambda: ("a.txt", FilesystemEventType.WRITE) in seen)
        await sbx.files.make_dir("w/sub")
        await sbx.files.write("w/sub/b.txt", "b")
        await until(lambda: ("sub/b.txt", FilesystemEventType.CREATE) in seen)
        await sbx.files.rename("w/a.txt", "w/c.txt")
        await sbx.files.remove("w/sub/b.txt")
        last = {
            ("a.txt", FilesystemEventType.RENAME),
            ("sub/b.txt", FilesystemEventType.REMOVE),
            ("c.txt", FilesystemEventType.CREATE),  # one look may see all three, sent in turn
        }
        await until(lambda: last <= set(seen))
        await handle.stop()
        assert ("sub", FilesystemEventType.CREATE) in seen
        assert last <= set(seen)
        with pytest.raises(FileNotFoundException):
            await sbx.files.watch_dir("nowhere", on_event=lambda e: None)
    finally:
        await sbx.kill()


def test_sync_watcher_polls_events(emu: E2BEmulator) -> None:
    """The sync SDK's watcher is CreateWatcher, GetWatcherEvents and RemoveWatcher; as with
    envd's inotify, a change made before GetWatcherEvents is in its answer, and an upload
    is envd's create, chown and write."""
    sbx = Sandbox.create(**emu.sdk_kwargs())
    try:
        sbx.files.make_dir("w")
        watcher = sbx.files.watch_dir("w", include_entry=True)
        sbx.files.write("w/x.txt", "x")
        events = watcher.get_new_events()
        assert [(e.name, e.type) for e in events] == [
            ("x.txt", FilesystemEventType.CREATE),
            ("x.txt", FilesystemEventType.CHMOD),
            ("x.txt", FilesystemEventType.WRITE),
        ]
        assert events[0].entry is not None
        assert events[0].entry.path == "/home/user/w/x.txt"
        watcher.stop()
    finally:
        sbx.kill()


async def test_killing_the_sandbox_breaks_its_command_streams(emu: E2BEmulator) -> None:
    """A killed sandbox's command streams end ``unavailable`` (the proxy lost the sandbox),
    not with an exit: the SDK's health probe then says the sandbox is gone."""
    sbx = await AsyncSandbox.create(**emu.sdk_kwargs())
    command = await sbx.commands.run("sleep 30", background=True)
    await sbx.kill()
    with pytest.raises(SandboxNotRunningException, match="killed or reached its end of life"):
        await command.wait()


async def test_list_is_newest_first_and_filters_by_start_and_template(emu: E2BEmulator) -> None:
    """E2B lists the newest sandbox first unless ``order="asc"``; ``started_after`` keeps
    sandboxes started at or after it and ``template`` those of that template."""
    kw = emu.sdk_kwargs()
    first = await AsyncSandbox.create("base", **kw)
    second = await AsyncSandbox.create("other", **kw)
    try:
        ids = [first.sandbox_id, second.sandbox_id]
        newest = await AsyncSandbox.list(**kw).next_items()
        assert [s.sandbox_id for s in newest] == ids[::-1]
        oldest = await AsyncSandbox.list(order="asc", **kw).next_items()
        assert [s.sandbox_id for s in oldest] == ids
        started = (await second.get_info()).started_at
        later = SandboxQuery(started_after=started)
        assert [s.sandbox_id for s in await AsyncSandbox.list(query=later, **kw).next_items()] == [
            second.sandbox_id
        ]
        after = SandboxQuery(started_after=started + timedelta(seconds=1))
        assert await AsyncSandbox.list(query=after, **kw).next_items() == []
        base = await AsyncSandbox.list(query=SandboxQuery(template="base"), **kw).next_items()
        assert [s.sandbox_id for s in base] == [first.sandbox_id]
    finally:
        await first.kill()
        await second.kill()


async def _boot_id(sbx: AsyncSandbox) -> str:
    return str(await sbx.files.read("/proc/sys/kernel/random/boot_id")).strip()


async def test_a_timeout_pauses_when_the_lifecycle_says_so(emu: E2BEmulator) -> None:
    """``lifecycle.on_timeout="pause"`` (``autoPause``) pauses at the timeout instead of
    killing: a full pause keeps memory (same boot id, processes go on), a filesystem-only
    one keeps the files and cold-boots on connect (a new boot id, no processes)."""
    kw = emu.sdk_kwargs()
    full = await AsyncSandbox.create(lifecycle={"on_timeout": "pause"}, **kw)
    cold = await AsyncSandbox.create(
        lifecycle={"on_timeout": {"action": "pause", "keep_memory": False}}, **kw
    )
    try:
        sleeper = await full.commands.run("sleep 30", background=True)
        await cold.commands.run("sleep 30", background=True)
        await cold.files.write("kept.txt", "kept")
        boots = [await _boot_id(full), await _boot_id(cold)]
        await full.set_timeout(0)
        await cold.set_timeout(0)
        await emu.core.expire()
        for sbx in (full, cold):
            assert (await sbx.get_info()).state == SandboxState.PAUSED
            await sbx.connect()
        assert [await _boot_id(full), await _boot_id(cold)] != boots
        assert await _boot_id(full) == boots[0]
        assert [p.pid for p in await full.commands.list()] == [sleeper.pid]
        assert await cold.commands.list() == []
        assert await cold.files.read("kept.txt") == "kept"
    finally:
        await full.kill()
        await cold.kill()


async def test_a_filesystem_only_pause_cold_boots_on_connect(emu: E2BEmulator) -> None:
    """``pause(keep_memory=False)`` (``memory: false``) keeps only the files."""
    sbx = await AsyncSandbox.create(**emu.sdk_kwargs())
    try:
        await sbx.commands.run("sleep 30", background=True)
        boot = await _boot_id(sbx)
        assert await sbx.pause(keep_memory=False)
        await sbx.connect()
        assert await _boot_id(sbx) != boot
        assert await sbx.commands.list() == []
    finally:
        await sbx.kill()


async def test_snapshots_are_listed_by_sandbox_and_name(emu: E2BEmulator) -> None:
    """``GET /snapshots`` lists the key's snapshots, newest first, filtered by the sandbox
    they came from or their name, paged; a deleted one is gone."""
    kw = emu.sdk_kwargs()
    one = await AsyncSandbox.create(**kw)
    two = await AsyncSandbox.create(**kw)
    try:
        first = await one.create_snapshot()
        named = await one.create_snapshot(name="nightly")
        other = await two.create_snapshot()
        pages = AsyncSandbox.list_snapshots(limit=2, **kw)
        seen = [s.snapshot_id for s in await pages.next_items()]
        seen += [s.snapshot_id for s in await pages.next_items()]
        assert (seen, pages.has_next) == (
            [other.snapshot_id, named.snapshot_id, first.snapshot_id],
            False,
        )
        of_one = await AsyncSandbox.list_snapshots(sandbox_id=one.sandbox_id, **kw).next_items()
        assert {s.snapshot_id for s in of_one} == {first.snapshot_id, named.snapshot_id}
        [by_name] = await AsyncSandbox.list_snapshots(name="nightly", **kw).next_items()
        assert (by_name.snapshot_id, by_name.names) == (named.snapshot_id, named.names)
        assert (
            await AsyncSandbox.list_snapshots(**emu.sdk_kwargs(api_key="e2b_other")).next_items()
            == []
        )
        for snapshot in (first, named, other):
            await AsyncSandbox.delete_snapshot(snapshot.snapshot_id, **kw)
        assert await AsyncSandbox.list_snapshots(**kw).next_items() == []
    finally:
        await one.kill()
        await two.kill()


async def test_fork_starts_copies_of_the_files(emu: E2BEmulator) -> None:
    """``fork`` starts ``count`` new sandboxes from one copy of the source's files (its
    memory is not emulated); the source runs on and each fork is independent."""
    kw = emu.sdk_kwargs()
    source = await AsyncSandbox.create(metadata={"team": "a"}, **kw)
    forks: list[AsyncSandbox] = []
    try:
        await source.files.write("state.txt", "before")
        results = await source.fork(count=2, timeout=60)
        forks = [f for f in results if isinstance(f, AsyncSandbox)]
        assert len(forks) == 2
        assert len({source.sandbox_id, *(f.sandbox_id for f in forks)}) == 3
        await forks[0].files.write("state.txt", "changed")
        assert await forks[1].files.read("state.txt") == "before"
        assert await source.files.read("state.txt") == "before"
        assert (await forks[1].get_info()).metadata == {"team": "a"}
        with pytest.raises(SandboxNotFoundException):
            await AsyncSandbox.fork("inowhere", **kw)
    finally:
        for sbx in [source, *forks]:
            await sbx.kill()


async def test_metrics_are_sampled_within_the_asked_range(emu: E2BEmulator) -> None:
    """``GET /sandboxes/{id}/metrics`` answers samples of the sandbox's CPU, memory and
    disk use (taken when asked, stamped to the second), within ``start``..``end``."""
    begun = datetime.now(UTC)
    sbx = await AsyncSandbox.create(**emu.sdk_kwargs())
    try:
        await sbx.files.write("blob.bin", b"x" * 100_000)
        [metric] = await sbx.get_metrics()
        assert (metric.cpu_count, metric.mem_total) == (2, 512 * 1024 * 1024)
        assert metric.disk_used >= 100_000
        assert metric.disk_total > metric.disk_used
        assert 0 <= metric.cpu_used_pct <= 100
        assert begun.timestamp() - 1 <= metric.timestamp.timestamp() <= time.time()
        earlier = await sbx.get_metrics(
            start=begun - timedelta(hours=1), end=begun - timedelta(minutes=30)
        )
        assert earlier == []
    finally:
        await sbx.kill()


async def test_auto_resume_wakes_a_paused_sandbox_on_traffic(emu: E2BEmulator) -> None:
    """With ``lifecycle.auto_resume`` a request to the paused sandbox resumes it (for its
    timeout again); without, E2B's proxy answers that it is not found until a connect."""
    kw = emu.sdk_kwargs()
    waking = await AsyncSandbox.create(
        timeout=120, lifecycle={"on_timeout": "pause", "auto_resume": True}, **kw
    )
    sleeping = await AsyncSandbox.create(lifecycle={"on_timeout": "pause"}, **kw)
    try:
        await waking.files.write("kept.txt", "kept")
        assert await waking.pause()
        assert await sleeping.pause()
        assert await waking.files.read("kept.txt") == "kept"
        info = await waking.get_info()
        assert info.state == SandboxState.RUNNING
        assert (info.end_at - datetime.now(UTC)).total_seconds() > 100
        assert not await sleeping.is_running()
        assert (await sleeping.get_info()).state == SandboxState.PAUSED
    finally:
        await waking.kill()
        await sleeping.kill()


async def test_info_carries_the_lifecycle(emu: E2BEmulator) -> None:
    """``GET /sandboxes/{id}`` answers the lifecycle policy the create asked for."""
    kw = emu.sdk_kwargs()
    plain = await AsyncSandbox.create(**kw)
    pausing = await AsyncSandbox.create(
        lifecycle={"on_timeout": "pause", "auto_resume": True}, **kw
    )
    try:
        assert (await plain.get_info()).lifecycle == {"on_timeout": "kill", "auto_resume": False}
        assert (await pausing.get_info()).lifecycle == {"on_timeout": "pause", "auto_resume": True}
    finally:
        await plain.kill()
        await pausing.kill()


async def test_filesystem_errors_name_the_path_as_envd_does(emu: E2BEmulator) -> None:
    """envd's errors read ``file not found: <path>...``, not the request's fields."""
    sbx = await AsyncSandbox.create(**emu.sdk_kwargs())
    try:
        with pytest.raises(FileNotFoundException, match=r"^file not found: /home/user/gone\b"):
            await sbx.files.get_info("gone")
        with pytest.raises(FileNotFoundException, match=r"^file not found: /home/user/gone\b"):
            await sbx.files.rename("gone", "there")
    finally:
        await sbx.kill()


async def test_one_upload_writes_a_path_once(emu: E2BEmulator) -> None:
    """envd refuses a multipart upload naming one path twice (400), keeping the first."""
    sbx = await AsyncSandbox.create(**emu.sdk_kwargs())
    try:
        with pytest.raises(InvalidArgumentException, match=r"same path '/home/user/twice\.txt'"):
            await sbx.files.write_files(
                [{"path": "twice.txt", "data": "one"}, {"path": "./twice.txt", "data": "two"}]
            )
        assert await sbx.files.read("twice.txt") == "one"
    finally:
        await sbx.kill()
