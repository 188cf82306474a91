"""What every adapter promises (providers/base.py's `Provider` and `Sandbox`), one test run
over every provider. A vendor's own quirks stay in tests/providers/test_<vendor>.py."""

from __future__ import annotations

import time
from typing import Any

import pytest

from providers.errors import (
    AuthError,
    InvalidArgument,
    NotFound,
    ProviderError,
    RateLimited,
    SandboxError,
    SandboxRouterError,
    Unavailable,
)
from router import Router
from tests.contract.conftest import Backend


async def test_create_with_labels_env_and_template(backend: Backend) -> None:
    sbx = await backend.create(template=backend.template, labels={"team": "a"}, env={"G": "g 1"})
    assert (sbx.provider, bool(sbx.id)) == (backend.name, True)
    assert (await sbx.run("echo $G")).stdout == "g 1\n"
    (info,) = await backend.provider.list({"team": "a"})
    assert (info.id, info.labels["team"]) == (sbx.id, "a")
    await sbx.kill()


async def test_unknown_template_is_not_found(vendor: Backend) -> None:
    vendor.only_templates({str(vendor.template)})
    with pytest.raises(NotFound) as missing:
        await vendor.create(template="no-such-template")
    assert missing.value.provider == vendor.name


async def test_run_output_exit_code_env_and_cwd(backend: Backend) -> None:
    sbx = await backend.create(env={"GLOBAL": "g"})
    try:
        ran = await sbx.run("echo $GLOBAL $LOCAL; echo oops >&2; exit 3", env={"LOCAL": "l v"})
        assert (ran.stdout, ran.stderr, ran.exit_code, ran.ok) == ("g l v\n", "oops\n", 3, False)
        assert ran.timed_out is False
        assert ran.duration >= 0
        assert (await sbx.run(["printf", "%s|", "a b", "c"])).stdout == "a b|c|"
        assert (await sbx.run("echo $GLOBAL", env={"GLOBAL": "mine"})).stdout == "mine\n"
        assert (await sbx.run("echo ${LOCAL:-unset}")).stdout == "unset\n", "runs share no env"
        await sbx.run("mkdir -p sub/dir")
        assert (await sbx.run("pwd", cwd="sub/dir")).stdout.rstrip().endswith("/sub/dir")
        assert (await sbx.run("ls -d sub", cwd=backend.home)).stdout == "sub\n"
        missing = await sbx.run("true", cwd="no/such/dir")
        assert (missing.ok, "no/such/dir" in missing.stderr) == (False, True)
        long = await sbx.run("seq 1 3000; seq 1 200 >&2")
        assert long.stdout == "".join(f"{i}\n" for i in range(1, 3001))
        assert long.stderr == "".join(f"{i}\n" for i in range(1, 201))
    finally:
        await sbx.kill()


async def test_run_timeout_is_a_result(backend: Backend) -> None:
    sbx = await backend.create()
    try:
        started = time.monotonic()
        slow = await sbx.run("echo begun; sleep 30", timeout=1)
        assert (slow.timed_out, slow.ok) == (True, False)
        assert time.monotonic() - started < 5
        assert (await sbx.run("echo after", timeout=5)).stdout == "after\n"
        code = await sbx.run_code("import time; time.sleep(30)", timeout=1)
        assert (code.timed_out, code.ok, code.error is not None) == (True, False, True)
    finally:
        await sbx.kill()


async def test_files_round_trip_binary_and_list(backend: Backend) -> None:
    sbx = await backend.create()
    try:
        payload = bytes(range(256)) * 16
        await sbx.write_file("data/blob.bin", payload)
        await sbx.write_file(f"{backend.home}/data/note.txt", "text é")
        assert await sbx.read_file("data/blob.bin") == payload
        assert await sbx.read_file(f"{backend.home}/data/note.txt") == "text é".encode()
        assert (await sbx.run("wc -c < data/blob.bin")).stdout.strip() == str(len(payload))
        listed = {f.name: f for f in await sbx.list_files("data")}
        assert sorted(listed) == ["blob.bin", "note.txt"]
        assert (listed["blob.bin"].size, listed["blob.bin"].is_dir) == (len(payload), False)
        assert listed["note.txt"].path == f"{backend.home}/data/note.txt"
        assert [f.is_dir for f in await sbx.list_files() if f.name == "data"] == [True]
    finally:
        await sbx.kill()


async def test_file_errors_are_sandbox_errors(backend: Backend) -> None:
    sbx = await backend.create()
    try:
        with pytest.raises(SandboxError) as missing:
            await sbx.read_file("no/such/file")
        assert (missing.value.provider, missing.value.sandbox_id) == (backend.name, sbx.id)
        with pytest.raises(SandboxError):
            await sbx.list_files("no/such/dir")
        with pytest.raises(SandboxError):
            await sbx.read_file(".")
        with pytest.raises(SandboxError):
            await sbx.write_file("/etc/passwd", b"x")
    finally:
        await sbx.kill()


async def test_run_code(backend: Backend) -> None:
    sbx = await backend.create(env={"GLOBAL": "g"})
    try:
        code = await sbx.run_code("import os\nprint(os.environ['GLOBAL'], 21 * 2)\n")
        assert (code.stdout, code.error, code.exit_code, code.ok) == ("g 42\n", None, 0, True)
        broken = await sbx.run_code("undefined_name")
        assert (broken.exit_code, broken.ok) == (1, False)
        assert broken.error == "NameError: name 'undefined_name' is not defined"
        shell = await sbx.run_code('echo "it\'s $GLOBAL"; echo warn >&2', language="bash")
        assert (shell.stdout, shell.stderr, shell.error) == ("it's g\n", "warn\n", None)
        with pytest.raises(SandboxError, match="not supported"):
            await sbx.run_code("1", language="cobol")
    finally:
        await sbx.kill()


async def test_list_filters_by_every_label(backend: Backend) -> None:
    a = await backend.create(labels={"team": "a", "tier": "x"})
    b = await backend.create(labels={"team": "b", "tier": "x"})
    provider = backend.provider
    assert [s.id for s in await provider.list({"team": "a"})] == [a.id]
    assert sorted(s.id for s in await provider.list({"tier": "x"})) == sorted([a.id, b.id])
    assert await provider.list({"team": "a", "tier": "y"}) == []
    assert {a.id, b.id} <= {s.id for s in await provider.list()}
    for sbx in (a, b):
        await sbx.kill()


async def test_connect_by_id(backend: Backend) -> None:
    sbx = await backend.create(env={"GLOBAL": "g"})
    await sbx.write_file("note.txt", "kept")
    again = await backend.provider.connect(sbx.id)
    assert (again.id, again.provider) == (sbx.id, backend.name)
    assert (await again.run("cat note.txt; echo $GLOBAL")).stdout == "keptg\n"
    await again.kill()


async def test_detach_lets_go_of_a_handle_and_leaves_the_sandbox_running(
    backend: Backend,
) -> None:
    sbx = await backend.create()
    other = await backend.provider.connect(sbx.id)  # what a replica connects ahead of a claim
    await other.detach()
    assert (await sbx.run("echo still")).stdout == "still\n"
    assert [info.id for info in await backend.provider.list()] == [sbx.id]
    await sbx.kill()


async def test_kill_by_handle_and_by_id(backend: Backend) -> None:
    provider = backend.provider
    first, second = await backend.create(), await backend.create()
    await first.kill()
    await first.kill()  # killing a dead sandbox is not an error
    assert await provider.kill(first.id) is False
    assert await provider.kill(second.id) is True
    assert await provider.kill(backend.unknown_id) is False
    assert await provider.list() == []
    with pytest.raises(NotFound) as gone:
        await provider.connect(first.id)
    assert isinstance(gone.value, SandboxRouterError)
    assert gone.value.provider == backend.name
    with pytest.raises(NotFound):
        await provider.connect(backend.unknown_id)
    with pytest.raises(NotFound):
        await second.run("true")


async def test_keepalive(backend: Backend) -> None:
    sbx = await backend.create(idle_timeout=60, lifetime=120)
    await sbx.keepalive(300)
    assert (await sbx.run("echo alive")).stdout == "alive\n"
    await sbx.kill()


@pytest.mark.parametrize(
    ("fault", "error"),
    [
        ({"status": 401}, AuthError),
        pytest.param({"status": 429, "retry_after": 9}, RateLimited, id="429"),
        ({"status": 503}, Unavailable),
        ({"drop": True}, Unavailable),
    ],
)
async def test_create_faults_map_into_the_error_tree(
    vendor: Backend,
    fault: dict[str, Any],
    error: type[ProviderError],
) -> None:
    assert vendor.emulator is not None
    vendor.emulator.inject("create", times=None, **fault)  # modal's SDK retries some itself
    with pytest.raises(error) as raised:
        await vendor.create()
    assert (type(raised.value), raised.value.provider) == (error, vendor.name)
    if isinstance(raised.value, RateLimited):
        assert raised.value.retry_after == 9
    vendor.emulator.clear_faults()
    await (await vendor.create()).kill()


HOSTILE: list[tuple[dict[str, Any], str]] = [
    ({"cmd": "echo a\x00b"}, "run(cmd=...): contains a NUL byte"),
    ({"cmd": ["echo", "a\x00b"]}, "run(cmd=...): argument 1 contains a NUL byte"),
    ({"cmd": []}, "run(cmd=...): an empty argv"),
    ({"cmd": "true", "env": {"A=B": "x"}}, "run(env=...): 'A=B' is not"),
    ({"cmd": "true", "env": {"A\nB": "x"}}, "run(env=...): 'A\\nB' is not"),
    ({"cmd": "true", "env": {"": "x"}}, "run(env=...): '' is not"),
    ({"cmd": "true", "env": {"TOKEN": "s3cr\x00t"}}, "run(env=...): the value of 'TOKEN' contains"),
    ({"cmd": "true", "cwd": "a\x00b"}, "run(cwd=...): contains a NUL byte"),
]


async def test_hostile_run_arguments_are_refused_by_name(backend: Backend) -> None:
    """Refused by the router's handle, the same on every provider, before any SDK sees them."""
    config = {"state_url": "memory://", "chain": [{"name": backend.name, "provider": backend.kind}]}
    router = Router.from_config(config, providers={backend.name: backend.provider}, hooks=[])
    async with router, router.aacquire() as lease:
        for kwargs, message in HOSTILE:
            with pytest.raises(InvalidArgument) as refused:
                await lease.sandbox.run(**kwargs)
            assert str(refused.value).startswith(message), kwargs
            assert isinstance(refused.value, ValueError | SandboxRouterError)
            assert "s3cr" not in str(refused.value)
        assert (await lease.sandbox.run("echo still fine")).stdout == "still fine\n"
        assert (await router.astatus()).entries[0].state == "closed"
