"""The local provider: real processes in a private directory, limits, bubblewrap."""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import shutil
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from emulators.harness import free_port
from providers.base import SandboxSpec
from providers.capabilities import Capability
from providers.errors import NotFound, SandboxError, SandboxPathError, Unsupported
from providers.local import LocalOptions, LocalProvider, LocalSandbox
from tests.polling import until

needs_bwrap = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bwrap not installed")


@pytest.fixture(params=["bwrap", "none"])
def provider(request: pytest.FixtureRequest, tmp_path: Path) -> LocalProvider:
    if request.param == "bwrap" and shutil.which("bwrap") is None:
        pytest.skip("bwrap not installed")
    opts = LocalOptions(root=tmp_path / "sb", isolation=request.param, file_size_mb=1,
                        max_output_bytes=100_000)  # fmt: skip
    return LocalProvider("local", opts)


@pytest.fixture(params=[("bwrap", True), ("bwrap", False), ("none", True), ("none", False)],
                ids=["bwrap-cgroup", "bwrap", "cgroup", "marker"])  # fmt: skip
def reaper(request: pytest.FixtureRequest, tmp_path: Path) -> LocalProvider:
    """Each way a kill finds a sandbox's processes: pid namespace, cgroup, environment."""
    isolation, cgroup = request.param
    if isolation == "bwrap" and shutil.which("bwrap") is None:
        pytest.skip("bwrap not installed")
    provider = LocalProvider("local", LocalOptions(root=tmp_path / "sb", isolation=isolation,
                                                   cgroup=cgroup))  # fmt: skip
    if cgroup and provider.cgroup_base is None:
        pytest.skip("no cgroup v2 this process may create children in")
    return provider


@pytest.fixture
async def sandbox(provider: LocalProvider) -> AsyncIterator[LocalSandbox]:
    sb = await provider.create(SandboxSpec(labels={"team": "a"}, env={"GREETING": "hi"}))
    yield sb
    await sb.kill()


async def test_run_returns_streams_exit_code_and_duration(sandbox: LocalSandbox) -> None:
    r = await sandbox.run("echo $GREETING; echo oops >&2; exit 7")
    assert (r.stdout, r.stderr, r.exit_code, r.timed_out) == ("hi\n", "oops\n", 7, False)
    assert 0 < r.duration < 10
    assert not r.ok


async def test_a_command_a_signal_ends_exits_128_plus_the_signal(sandbox: LocalSandbox) -> None:
    """As a shell reports it, bubblewrap or not (the bare child's wait status is -15)."""
    assert (await sandbox.run("kill -TERM $$")).exit_code == 128 + signal.SIGTERM


async def test_argv_env_and_cwd(sandbox: LocalSandbox) -> None:
    await sandbox.write_file("sub/marker", "x")
    r = await sandbox.run(["/bin/sh", "-c", "echo $A; ls"], env={"A": "1"}, cwd="sub")
    assert r.stdout == "1\nmarker\n"


async def test_a_path_in_the_env_is_the_commands_not_the_launchers(
    provider: LocalProvider,
) -> None:
    """bubblewrap is started by its host path: a sandbox env PATH without /usr/bin made
    every command fail to start ("cannot start 'bwrap'")."""
    sb = await provider.create(SandboxSpec(env={"PATH": "/opt/nothing"}))
    try:
        ran = await sb.run("echo $PATH")
        assert (ran.exit_code, ran.stdout) == (0, "/opt/nothing\n")
    finally:
        await sb.kill()


async def test_host_environment_is_scrubbed(
    sandbox: LocalSandbox, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOST_SECRET_TOKEN", "s3cret")
    r = await sandbox.run("env")
    assert "s3cret" not in r.stdout
    assert "HOME=" in r.stdout


async def test_timeout_kills_the_whole_process_group(sandbox: LocalSandbox) -> None:
    r = await sandbox.run("(sleep 30; echo late > late.txt) & echo started; sleep 30", timeout=0.5)
    assert r.timed_out
    assert r.stdout == "started\n"
    assert r.duration < 5
    check = await sandbox.run("sleep 1; ls")
    assert "late.txt" not in check.stdout


def _processes() -> dict[int, tuple[int, int, str, str]]:
    """Every process on the host: parent, process group, state and command name."""
    found = {}
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:  # it ended meanwhile
            continue
        name = stat[stat.index("(") + 1 : stat.rindex(")")]
        state, ppid, pgid = stat[stat.rindex(")") + 2 :].split()[:3]
        found[int(entry)] = (int(ppid), int(pgid), state, name)
    return found


def _tree(pid: int) -> dict[int, tuple[int, int, str, str]]:
    """``pid`` and every process below it."""
    everything = _processes()
    tree, todo = {}, [pid]
    while todo:
        parent = todo.pop()
        if parent in everything:
            tree[parent] = everything[parent]
            todo += [p for p, (ppid, *_) in everything.items() if ppid == parent]
    return tree


async def test_a_kill_reaches_every_process_of_a_command(sandbox: LocalSandbox) -> None:
    """Every process a command starts stays in its process group, bwrap's pid 1 too, so
    a kill that lands while bwrap is still setting up cannot leave the command running."""
    process = await sandbox.spawn("sleep 30")
    pid = process.proc.pid
    await until(lambda: any(name == "sleep" for *_, name in _tree(pid).values()))
    tree = _tree(pid)
    assert {pgid for _, pgid, *_ in tree.values()} == {pid}, tree
    process.kill()
    await process.proc.wait()

    def running() -> set[int]:
        now = _processes()
        return {p for p in tree if p in now and now[p][2] != "Z" and now[p][3] == tree[p][3]}

    await until(lambda: not running())
    assert not running()


def _sleepers(durations: list[str]) -> set[int]:
    """Live (not zombie) ``sleep`` processes of the host running one of ``durations``."""
    wanted = {f"sleep\0{d}\0".encode() for d in durations}
    found = set()
    for pid, (_, _, state, name) in _processes().items():
        if name != "sleep" or state == "Z":
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if f.read() in wanted:
                    found.add(pid)
        except OSError:
            continue
    return found


async def _start_escapees(
    provider: LocalProvider, sandbox: LocalSandbox
) -> tuple[list[str], asyncio.subprocess.Process]:
    """A command still running that left a background child, a double-forked one and a
    ``setsid`` one behind (and, where the pid namespace or a cgroup can catch it, one that
    cleared its environment too): durations unique to this test name them on the host."""
    nonce = f"{secrets.randbelow(10**6):06d}"
    sleeps = [f"{300 + i}.{nonce}" for i in range(5)]
    cmd = [
        f"sleep {sleeps[0]} &",
        f"( setsid sleep {sleeps[1]} & ) &",
        f"setsid sleep {sleeps[2]} &",
        f"( env -i setsid sleep {sleeps[3]} & ) &",
        f"exec sleep {sleeps[4]}",
    ]
    if not provider.use_bwrap and provider.cgroup_base is None:
        del sleeps[3], cmd[3]  # the environment marker alone cannot find it (module docstring)
    process = await sandbox.spawn(" ".join(cmd))
    await until(lambda: len(_sleepers(sleeps)) == len(sleeps))
    assert len(_sleepers(sleeps)) == len(sleeps)
    return sleeps, process.proc


async def _all_gone(sleeps: list[str], proc: asyncio.subprocess.Process) -> None:
    await until(lambda: not _sleepers(sleeps))
    assert not _sleepers(sleeps)
    await asyncio.wait_for(proc.wait(), 5)


async def test_release_ends_every_process_the_sandbox_started(reaper: LocalProvider) -> None:
    sandbox = await reaper.create(SandboxSpec())
    sleeps, proc = await _start_escapees(reaper, sandbox)
    await sandbox.kill()
    await _all_gone(sleeps, proc)


async def test_release_ends_the_processes_even_when_the_sandbox_files_are_gone(
    reaper: LocalProvider,
) -> None:
    """The handle that started them still ends them (an emulator removing its root first)."""
    sandbox = await reaper.create(SandboxSpec())
    sleeps, proc = await _start_escapees(reaper, sandbox)
    shutil.rmtree(reaper.root)
    await sandbox.kill()
    await _all_gone(sleeps, proc)


@pytest.mark.parametrize("head_start", [0, 1])
async def test_a_command_starting_while_the_sandbox_is_killed_does_not_outlive_it(
    reaper: LocalProvider, head_start: int
) -> None:
    """A start racing the kill: either it is refused or its process ends with the sandbox."""
    sandbox = await reaper.create(SandboxSpec())
    await sandbox.run("true")  # the kill knows commands ran here: only the new one is late
    sleeps = [f"300.{secrets.randbelow(10**6):06d}"]
    start = asyncio.create_task(sandbox.spawn(f"sleep {sleeps[0]}"))
    for _ in range(head_start):
        await asyncio.sleep(0)
    await sandbox.kill()
    try:
        proc = (await start).proc
    except NotFound:
        assert not _sleepers(sleeps)
    else:
        await _all_gone(sleeps, proc)


_JANITOR = """
import asyncio, sys
from pathlib import Path
from providers.local import LocalOptions, LocalProvider

async def reap() -> None:
    options = LocalOptions(root=Path(sys.argv[1]), isolation=sys.argv[2], cgroup=sys.argv[3] == "1")
    provider = LocalProvider("local", options)
    for info in await provider.list():
        assert await provider.kill(info.id)

asyncio.run(reap())
"""


async def test_a_kill_by_id_from_another_process_ends_every_process(
    reaper: LocalProvider,
) -> None:
    """The janitor's reap: ``list`` and ``kill(id)`` in a process that started nothing."""
    sandbox = await reaper.create(SandboxSpec())
    sleeps, proc = await _start_escapees(reaper, sandbox)
    janitor = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        _JANITOR,
        str(reaper.root),
        reaper.opts.isolation,
        str(int(reaper.opts.cgroup)),
    )
    assert await asyncio.wait_for(janitor.wait(), 60) == 0
    assert not sandbox.alive
    await _all_gone(sleeps, proc)


async def test_files_round_trip_binary_and_list(sandbox: LocalSandbox) -> None:
    blob = bytes(range(256)) * 10
    await sandbox.write_file("data/blob.bin", blob)
    assert await sandbox.read_file("data/blob.bin") == blob
    assert await sandbox.read_file("/home/sandbox/data/blob.bin") == blob
    [info] = await sandbox.list_files("data")
    assert (info.name, info.size, info.is_dir) == ("blob.bin", 2560, False)
    r = await sandbox.run("wc -c < data/blob.bin")
    assert r.stdout.strip() == "2560"


@pytest.mark.parametrize("path", ["../outside", "/etc/passwd", "a/../../x", "/home/sandbox/../x"])
async def test_paths_escaping_the_sandbox_are_refused(sandbox: LocalSandbox, path: str) -> None:
    with pytest.raises(SandboxPathError, match="sandbox"):
        await sandbox.write_file(path, b"x")


async def test_symlink_escape_is_refused(sandbox: LocalSandbox) -> None:
    os.symlink("/etc", sandbox.dir / "etc-link")
    with pytest.raises(SandboxPathError, match="escapes"):
        await sandbox.read_file("etc-link/passwd")


async def test_missing_file_is_a_sandbox_error(sandbox: LocalSandbox) -> None:
    with pytest.raises(SandboxError, match="no such file"):
        await sandbox.read_file("nope.txt")


async def test_run_code_python_bash_and_errors(sandbox: LocalSandbox) -> None:
    ok = await sandbox.run_code("print(sum(range(10)))")
    assert (ok.stdout, ok.error) == ("45\n", None)
    bad = await sandbox.run_code("raise ValueError('no')")
    assert bad.error == "ValueError: no"
    sh = await sandbox.run_code("echo $((6 * 7))", language="bash")
    assert sh.stdout == "42\n"
    with pytest.raises(SandboxError, match="language 'cobol' is not supported"):
        await sandbox.run_code("x", language="cobol")


async def test_non_utf8_and_enormous_output_are_safe(sandbox: LocalSandbox) -> None:
    r = await sandbox.run(r"printf 'ok\377\n'")
    assert r.stdout == "ok\ufffd\n"
    big = await sandbox.run("head -c 5000000 /dev/zero | tr '\\0' a")
    assert len(big.stdout) < 200_000
    assert "bytes of output dropped" in big.stdout


async def test_file_size_limit_applies(sandbox: LocalSandbox) -> None:
    r = await sandbox.run("head -c 3000000 /dev/zero > big; echo $?")
    assert r.stdout.strip() != "0"


async def test_list_connect_and_kill(provider: LocalProvider, sandbox: LocalSandbox) -> None:
    assert [s.id for s in await provider.list({"team": "a"})] == [sandbox.id]
    assert await provider.list({"team": "b"}) == []
    again = await provider.connect(sandbox.id)
    assert (await again.run("echo $GREETING")).stdout == "hi\n"
    assert await provider.kill(sandbox.id)
    assert not sandbox.dir.exists()
    assert not await provider.kill(sandbox.id)
    with pytest.raises(NotFound):
        await provider.connect(sandbox.id)
    with pytest.raises(NotFound):
        await sandbox.run("true")


@needs_bwrap
async def test_bwrap_isolates_network_pids_and_system_dirs(tmp_path: Path) -> None:
    provider = LocalProvider("local", LocalOptions(root=tmp_path, isolation="bwrap"))
    sb = await provider.create(SandboxSpec())
    try:
        r = await sb.run(
            "cat /proc/net/dev | grep -c ':' ; ls /proc | grep -cE '^[0-9]+$'; "
            "touch /usr/evil 2>/dev/null && echo writable || echo readonly; "
            "touch ~/mine && echo home-ok; pwd; hostname; ls /work 2>&1 | head -1"
        )
        lines = r.stdout.splitlines()
        assert lines[0] == "1"  # only the loopback device of a fresh net namespace
        assert int(lines[1]) <= 5  # a fresh pid namespace sees only its own processes
        assert lines[2:6] == ["readonly", "home-ok", "/home/sandbox", "sandbox"]
        assert "No such file" in lines[6]  # the host's project tree is not visible
        tty = await sb.run("exec 3</dev/tty && echo has-tty || echo no-tty")
        assert tty.stdout == "no-tty\n"  # nothing to inject keystrokes into (TIOCSTI)
    finally:
        await sb.kill()


def test_missing_bwrap_is_one_plain_line_once_per_process(tmp_path: Path) -> None:
    """Two providers, one warning, through the standard ``logging`` module unconfigured."""
    script = (
        "from providers.local import LocalOptions, LocalProvider\n"
        f"for name in ('a', 'b'): LocalProvider(name, LocalOptions(root={str(tmp_path)!r}))\n"
    )
    env = {"PATH": str(tmp_path)}  # no bwrap on it
    r = subprocess.run(
        [sys.executable, "-c", script],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout == ""
    [line] = r.stderr.splitlines()
    assert line.startswith("bubblewrap (bwrap) is not on PATH"), line


async def test_cwd_may_be_hidden_or_tmp(sandbox: LocalSandbox) -> None:
    await sandbox.run("mkdir .hidden")
    assert (await sandbox.run("pwd", cwd=".hidden")).stdout.endswith("/.hidden\n")
    assert (await sandbox.run("pwd", cwd="/tmp/")).stdout == "/tmp\n"
    with pytest.raises(SandboxPathError, match="outside the sandbox"):
        await sandbox.run("pwd", cwd="/tmpfoo")


_STARTER = """
import asyncio, sys
from pathlib import Path
from providers.local import LocalOptions, LocalProvider

async def start() -> None:
    options = LocalOptions(root=Path(sys.argv[1]), isolation=sys.argv[2])
    sandbox = await LocalProvider("local", options).connect(sys.argv[3])
    process = await sandbox.start(sys.argv[4])
    print(process.id)

asyncio.run(start())
"""


async def test_a_process_outlives_its_starter_and_another_process_attaches(
    provider: LocalProvider, sandbox: LocalSandbox
) -> None:
    """Another OS process starts it and exits; this one lists, follows from the start, waits."""
    command = "echo early; until [ -e go ]; do sleep 0.02; done; echo late >&2; exit 5"
    where = [str(provider.root), provider.opts.isolation, sandbox.id]
    starter = await asyncio.create_subprocess_exec(
        sys.executable, "-c", _STARTER, *where, command, stdout=subprocess.PIPE
    )
    out, _ = await asyncio.wait_for(starter.communicate(), 60)
    process_id = out.decode().strip()
    [info] = await sandbox.processes()
    assert (info.id, info.command, info.running) == (process_id, command, True)
    await sandbox.write_file("go", "")
    attached = await sandbox.attach(process_id)
    done = await attached.wait(timeout=10)
    assert (done.stdout, done.stderr, done.exit_code) == ("early\n", "late\n", 5)
    with pytest.raises(SandboxError, match="started by another handle"):
        await attached.write_stdin("x")
    assert await attached.kill() is False
    [ended] = await sandbox.processes()
    assert (ended.running, ended.exit_code) == (False, 5)
    for unknown in ("2", "../1", "", "1/.."):
        with pytest.raises(NotFound, match="no process"):
            await sandbox.attach(unknown)


async def test_a_process_kill_ends_its_group_and_with_bwrap_its_namespace(
    provider: LocalProvider, sandbox: LocalSandbox
) -> None:
    nonce = f"{secrets.randbelow(10**6):06d}"
    grouped, alone, leader = (f"{300 + i}.{nonce}" for i in range(3))
    process = await sandbox.start(f"sleep {grouped} & setsid sleep {alone} & exec sleep {leader}")
    await until(lambda: len(_sleepers([grouped, alone, leader])) == 3)
    assert await process.kill() is True
    assert (await process.wait(timeout=10)).exit_code == 137
    # The one that left the group by setsid dies with the pid namespace, else with the sandbox.
    ended = [grouped, alone, leader] if provider.use_bwrap else [grouped, leader]
    await until(lambda: not _sleepers(ended))
    assert not _sleepers(ended)
    await sandbox.kill()
    await until(lambda: not _sleepers([alone]))
    assert not _sleepers([alone])


async def test_the_sandbox_kill_ends_background_processes_and_their_records(
    provider: LocalProvider, sandbox: LocalSandbox
) -> None:
    process = await sandbox.start("echo up; sleep 60")
    assert (await anext(process.output())).data == "up\n"
    await sandbox.kill()
    assert (await process.wait(timeout=10)).exit_code == 137
    assert not (provider.root / f"{sandbox.id}.procs").exists()


async def _read_until(output: AsyncIterator[bytes], needle: bytes, seen: bytearray) -> None:
    async for data in output:
        seen.extend(data)
        if needle in seen:
            return


async def test_a_terminal_is_the_shells_controlling_tty_and_its_kill_ends_its_jobs(
    sandbox: LocalSandbox,
) -> None:
    nonce = f"{secrets.randbelow(10**6):06d}"
    sleeps = [f"300.{nonce}", f"301.{nonce}"]
    tty = await sandbox.open_terminal(rows=10, cols=50)
    seen = bytearray()
    output = tty.output()
    await tty.write(
        f"exec 3</dev/tty && echo tty-$((6*7)); sleep {sleeps[0]} & sleep {sleeps[1]}\n"
    )
    await asyncio.wait_for(_read_until(output, b"tty-42", seen), 10)
    await until(lambda: len(_sleepers(sleeps)) == 2)
    assert await tty.kill() is True
    assert await tty.wait(10) == 137
    await until(lambda: not _sleepers(sleeps))
    assert not _sleepers(sleeps)
    with pytest.raises(SandboxError, match="exited"):
        await tty.write("x")


@pytest.mark.parametrize(
    "call",
    [
        lambda sb, p: sb.remove(p),
        lambda sb, p: sb.make_dir(p),
        lambda sb, p: sb.exists(p),
        lambda sb, p: sb.stat(p),
        lambda sb, p: sb.rename("a", p),
        lambda sb, p: sb.write_stream(p, _one_chunk()),
        lambda sb, p: _drain(sb.read_stream(p)),
    ],
    ids=["remove", "make_dir", "exists", "stat", "rename", "write_stream", "read_stream"],
)
async def test_file_calls_refuse_paths_escaping_the_sandbox(
    sandbox: LocalSandbox, call: Any
) -> None:
    await sandbox.write_file("a", b"x")
    for path in ("../outside", "/etc/passwd", "/home/sandbox/../x"):
        with pytest.raises(SandboxPathError):
            await call(sandbox, path)


async def _one_chunk() -> AsyncIterator[bytes]:
    yield b"x"


async def _drain(chunks: AsyncIterator[bytes]) -> bytes:
    return b"".join([c async for c in chunks])


async def test_remove_and_rename_act_on_a_symlink_not_its_target(
    sandbox: LocalSandbox, tmp_path: Path
) -> None:
    outside = tmp_path / "host.txt"
    outside.write_text("host")
    await sandbox.run(f"ln -s {outside} out; ln -s out twice")
    assert (await sandbox.stat("out")).size == len(str(outside))  # the link itself
    await sandbox.rename("twice", "again")
    assert await sandbox.exists("again")
    assert not await sandbox.exists("twice")
    await sandbox.remove("out")
    assert not await sandbox.exists("out")
    assert outside.read_text() == "host"
    with pytest.raises(SandboxError, match="home cannot be removed"):
        await sandbox.remove("/home/sandbox")
    assert (await sandbox.stat(".")).path == "/home/sandbox"


async def test_read_stream_refuses_a_fifo_rather_than_wait_on_it(sandbox: LocalSandbox) -> None:
    await sandbox.run("mkfifo pipe")
    with pytest.raises(SandboxError, match="pipe"):
        await asyncio.wait_for(_drain(sandbox.read_stream("pipe")), 5)


def _size(sandbox: LocalSandbox, name: str) -> int:
    path = sandbox.dir / name
    return path.stat().st_size if path.exists() else 0


async def test_pause_stops_every_process_and_another_provider_resumes_them(
    reaper: LocalProvider,
) -> None:
    """Frozen (cgroup) or stopped (SIGSTOP): the ticker's file stops growing while paused;
    another provider on the same root (another replica) sees it paused and thaws it."""
    sandbox = await reaper.create(SandboxSpec())
    try:
        await sandbox.start("while :; do echo tick >> ticks; sleep 0.01; done")
        await until(lambda: _size(sandbox, "ticks") > 0)
        await sandbox.pause()
        frozen = _size(sandbox, "ticks")
        await asyncio.sleep(0.2)
        assert _size(sandbox, "ticks") == frozen
        with pytest.raises(SandboxError, match="paused"):
            await sandbox.run("true")
        replica = LocalProvider("local", reaper.opts)
        assert [i.state for i in await replica.list()] == ["paused"]
        woken = await replica.resume(sandbox.id, timeout=10)
        await until(lambda: _size(sandbox, "ticks") > frozen)
        assert _size(sandbox, "ticks") > frozen
        assert [i.state for i in await reaper.list()] == ["running"]
        assert (await woken.run("echo up")).stdout == "up\n"
    finally:
        await sandbox.kill()


async def test_a_paused_sandbox_is_killed_with_every_process(reaper: LocalProvider) -> None:
    sandbox = await reaper.create(SandboxSpec())
    sleeps, proc = await _start_escapees(reaper, sandbox)
    await sandbox.pause()
    await sandbox.kill()
    await _all_gone(sleeps, proc)
    assert await reaper.list() == []
    with pytest.raises(NotFound):
        await reaper.resume(sandbox.id, timeout=10)


async def test_a_snapshot_keeps_files_and_links_and_leaves_out_fifos(
    provider: LocalProvider,
) -> None:
    sandbox = await provider.create(SandboxSpec())
    try:
        await sandbox.run("mkdir -p app && echo v1 > app/conf && ln -s conf app/link && mkfifo p")
        snap = await sandbox.snapshot()
        await sandbox.write_file("app/conf", b"v2")  # the snapshot is a copy
    finally:
        await sandbox.kill()
    child = await provider.create(SandboxSpec(template=snap.id))
    try:
        assert (
            await child.run("cat app/link; test -e p || echo no-fifo")
        ).stdout == "v1\nno-fifo\n"
    finally:
        await child.kill()
    assert await provider.delete_snapshot(snap.id)
    with pytest.raises(NotFound, match=snap.id):
        await provider.create(SandboxSpec(template=snap.id))
    assert await provider.list() == []
    assert not await provider.delete_snapshot("../local")


def test_port_is_declared_when_the_sandbox_shares_the_hosts_network(tmp_path: Path) -> None:
    def declares(isolation: str, network: bool) -> bool:
        opts = LocalOptions(root=tmp_path, isolation=isolation, network=network)  # type: ignore[arg-type]
        return Capability.PORT in LocalProvider("local", opts).capabilities

    assert declares("none", False)
    assert declares("none", True)
    if shutil.which("bwrap") is not None:
        assert declares("bwrap", True)
        assert not declares("bwrap", False)


async def _get(port: int) -> str:
    def get() -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/hello.txt", timeout=2) as answer:
            return str(answer.read().decode())

    return await asyncio.to_thread(get)


@needs_bwrap
@pytest.mark.parametrize("network", [True, False])
async def test_bwrap_network_option_decides_whether_a_server_is_reachable(
    tmp_path: Path, network: bool
) -> None:
    opts = LocalOptions(root=tmp_path, isolation="bwrap", network=network)
    sandbox = await LocalProvider("local", opts).create(SandboxSpec())
    port = free_port()
    try:
        await sandbox.write_file("hello.txt", b"hi\n")
        server = await sandbox.start(
            ["python3", "-m", "http.server", str(port), "--bind", "127.0.0.1"]
        )
        async for chunk in server.output():  # listening once it says so
            if "Serving HTTP" in chunk.data:
                break
        if network:
            exposed = await sandbox.expose(port)
            assert exposed.url == f"http://127.0.0.1:{port}"
            assert await _get(port) == "hi\n"
        else:
            with pytest.raises(Unsupported, match="port"):
                await sandbox.expose(port)
            with pytest.raises(urllib.error.URLError, match="refused"):
                await _get(port)
    finally:
        await sandbox.kill()


async def test_a_directory_transfer_failure_is_a_sandbox_error_naming_the_path(
    sandbox: LocalSandbox, tmp_path: Path
) -> None:
    (tmp_path / "up").mkdir()
    (tmp_path / "up" / "f").write_text("x")
    await sandbox.write_file("taken", b"a file, not a directory")
    with pytest.raises(SandboxError, match="upload_dir 'taken'") as failed:
        await sandbox.upload_dir(tmp_path / "up", "taken")
    assert failed.value.sandbox_id == sandbox.id
    (tmp_path / "down").write_text("a local file")
    with pytest.raises(SandboxError, match=r"download_dir '\.'"):
        await sandbox.download_dir(".", tmp_path / "down")


_EXCHANGE = """
import ctypes, sys
renameat2 = ctypes.CDLL(None, use_errno=True).renameat2
a, b = (name.encode() for name in sys.argv[1:])
while renameat2(-100, a, -100, b, 2) == 0:  # AT_FDCWD, RENAME_EXCHANGE
    pass
"""


async def test_a_directory_swapped_for_a_symlink_mid_call_never_leads_outside(
    sandbox: LocalSandbox, tmp_path: Path
) -> None:
    """A command swaps ``d`` between a directory and a symlink to a host directory
    (atomically, as fast as it can) while the file calls run: no call reads or writes
    outside, and each failure is a SandboxError. (Path checks made before the call let
    about 1 read in 300 through.)"""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_bytes(b"host secret")
    await sandbox.run(f"mkdir d && echo inside > d/secret.txt && ln -s {outside} link")
    swapper = await sandbox.start(["python3", "-c", _EXCHANGE, "d", "link"])
    read: list[bytes] = []
    try:
        for _ in range(1500):
            for call in (
                sandbox.read_file("d/secret.txt"),
                _drain(sandbox.read_stream("d/secret.txt")),
                sandbox.write_file("d/secret.txt", b"inside\n"),
                sandbox.make_dir("d/made"),
                sandbox.rename("d/made", "d/moved"),
                sandbox.remove("d/moved"),
            ):
                with contextlib.suppress(SandboxError):
                    if isinstance(got := await call, bytes):
                        read.append(got)
    finally:
        await swapper.kill()
    assert sorted(p.name for p in outside.iterdir()) == ["secret.txt"]
    assert (outside / "secret.txt").read_bytes() == b"host secret"
    assert b"inside\n" in read
    assert b"host secret" not in read


_REUSED_PID = """
import asyncio, os, subprocess, sys, time
from providers.local import LocalProcess

async def main() -> None:
    call, told = sys.argv[1], sys.argv[2] == "told"
    started = await asyncio.create_subprocess_exec("sleep", "0.05", start_new_session=True)
    old = LocalProcess(started, 1)
    if told:
        await old.proc.wait()
    else:  # the child watcher reaps it, the loop is not told yet: no returncode
        while os.path.exists(f"/proc/{old.pid}"):
            time.sleep(0.01)
        assert old.proc.returncode is None
    with open("/proc/sys/kernel/ns_last_pid", "w") as f:
        f.write(str(old.pid - 1))
    newcomer = subprocess.Popen(["sleep", "30"], start_new_session=True)
    assert newcomer.pid == old.pid, (newcomer.pid, old.pid)
    getattr(old, call)()
    try:
        newcomer.wait(0.5)
    except subprocess.TimeoutExpired:
        newcomer.kill()
        sys.exit(0)
    sys.exit(f"a late kill of a reaped command killed pid {newcomer.pid}'s newcomer")

asyncio.run(main())
"""


@pytest.mark.parametrize("told", ["told", "not-told"])
@pytest.mark.parametrize("call", ["kill", "end_group"])
def test_a_late_kill_never_reaches_a_newcomer_with_the_reaped_commands_pid(
    call: str, told: str
) -> None:
    """pid_max can be 32768: an emulator killing a command it reaped minutes ago (the end of
    its sandbox) once SIGKILLed another sandbox's fresh command that had drawn the number,
    and so can the sweep of a group after its leader's reap (``end_group``), where the
    counter had come round to the leader's number, also while the child watcher has reaped
    the leader and the loop is not told yet (no ``returncode``): Modal emulator commands
    exited 137 in CI. A private PID namespace sets the next pid so the newcomer draws it."""
    if shutil.which("unshare") is None:
        pytest.skip("util-linux unshare not installed (a private PID namespace picks the pid)")
    unshare = ["unshare", "-U", "-r", "-p", "-f", "--mount-proc"]
    probe = subprocess.run([*unshare, "true"], check=False, capture_output=True)
    if probe.returncode:
        pytest.skip(f"unshare cannot make a user and PID namespace here: {probe.stderr!r}")
    ran = subprocess.run(
        [*unshare, sys.executable, "-c", _REUSED_PID, call, told],
        check=False, capture_output=True, text=True, timeout=30, cwd=Path(__file__).parents[2],
    )  # fmt: skip
    assert ran.returncode == 0, ran.stderr
