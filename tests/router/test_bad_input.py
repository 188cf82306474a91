"""Hostile or mistaken arguments get a clear error naming the argument; nothing leaks."""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from providers.base import SandboxSpec
from providers.capabilities import Capability
from providers.errors import InvalidArgument, RouterClosed, SandboxError, SandboxPathError
from router import Router


@pytest.fixture
def router(tmp_path: Path) -> Router:
    r = Router.from_config(
        {
            "state_url": "memory://",
            "chain": [
                {
                    "name": "local",
                    "provider": "local",
                    "quota": {"sessions": 100},
                    "options": {"root": str(tmp_path), "max_output_bytes": 50_000},
                }
            ],
        },
        hooks=[],
    )
    yield r
    r.close()


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"requires": "gpu"}, TypeError, "requires='gpu'"),
        (
            {"requires": Capability.PAUSE},
            TypeError,
            "acquire(requires='pause'): give a sequence of capabilities, e.g. requires=('pause',)",
        ),
        ({"requires": [1]}, TypeError, "capabilities are non-empty strings"),
        ({"labels": {"team": 7}}, TypeError, "labels=...): keys and values are strings"),
        ({"labels": {"sandbox_router_entry": "x"}}, ValueError, "set by the router itself"),
        ({"session": "  "}, ValueError, "session='  '"),
        ({"timeout": 0}, ValueError, "timeout=0"),
        ({"timeout": -5}, ValueError, "timeout=-5"),
        ({"timeout": math.nan}, ValueError, "timeout=nan"),
        ({"timeout": "5"}, TypeError, "timeout='5'"),
        ({"timeout": True}, TypeError, "timeout=True"),
        ({"spec": {"template": "x"}}, TypeError, "expected a SandboxSpec"),
    ],
)
def test_bad_acquire_arguments(router: Router, kwargs: dict, error: type, message: str) -> None:
    """Python's own error class (TypeError, ValueError) and the router's tree, both."""
    with pytest.raises(error, match=re.escape(message)) as info:
        router.acquire(**kwargs)
    assert isinstance(info.value, InvalidArgument)
    view = router.status().entries[0]
    assert (view.used["sessions"], view.live_leases) == (0, 0)  # nothing reserved


@pytest.mark.parametrize("path", ["../../etc/shadow", "/etc/passwd", "a/../../b", "x\x00y"])
def test_paths_escaping_the_sandbox(router: Router, path: str) -> None:
    with router.acquire() as lease:
        with pytest.raises(SandboxPathError) as info:
            lease.sandbox.write_file(path, b"x")
        assert lease.sandbox_id in str(info.value)
        assert lease.sandbox.run("echo still fine").stdout == "still fine\n"


def test_non_utf8_and_enormous_output(router: Router) -> None:
    with router.acquire() as lease:
        odd = lease.sandbox.run(r"printf '\xff\xfe ok'")
        assert odd.stdout.endswith(" ok")
        huge = lease.sandbox.run("yes 0123456789 | head -c 20000000")
        assert len(huge.stdout) < 60_000
        assert "bytes of output dropped" in huge.stdout
        with pytest.raises(SandboxError, match="no such file"):
            lease.sandbox.read_file("missing.bin")


def test_spec_env_reaches_commands(router: Router) -> None:
    with router.acquire(SandboxSpec(env={"A": "1"})) as lease:
        assert lease.sandbox.run("echo $A").stdout == "1\n"


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda r: r.close_session(None), "close_session(session=None)"),
        (lambda r: r.close_session(""), "close_session(session='')"),
        (lambda r: r.set_usage("nowhere", "sessions", 1), "set_usage(pool='nowhere')"),
        (lambda r: r.set_usage("local", "hours", 1), "set_usage(unit='hours')"),
        (lambda r: r.set_usage("local", "sessions", math.nan), "set_usage(value=nan)"),
        (lambda r: r.set_usage("local", "sessions", -1), "set_usage(value=-1)"),
        (lambda r: r.set_usage("local", "sessions", "9"), "set_usage(value='9')"),
        (lambda r: r.set_warm("nowhere", 1), "set_warm(entry='nowhere')"),
        (lambda r: r.set_warm("local", -1), "set_warm(size=...)"),
        (lambda r: r.set_warm("local", 1, max_idle=math.nan), "set_warm(max_idle=...)"),
    ],
)
def test_bad_router_call_arguments(
    router: Router, call: Callable[[Router], Any], message: str
) -> None:
    with pytest.raises(InvalidArgument, match=re.escape(message)):
        call(router)
    view = router.status().entries[0]
    assert (view.used["sessions"], view.live_leases) == (0, 0)


_SANDBOX_CALLS: list[tuple[Callable[[Any], Any], str]] = [
    (lambda s: s.run(5), "run(cmd=...)"),
    (lambda s: s.run(["echo", 5]), "run(cmd=...): argument 1"),
    (lambda s: s.run("true", timeout=math.nan), "run(timeout=nan)"),
    (lambda s: s.run("true", timeout=-1), "run(timeout=-1)"),
    (lambda s: s.run("true", timeout="5"), "run(timeout='5')"),
    (lambda s: s.run("true", cwd=5), "run(cwd=...)"),
    (lambda s: s.read_file(5), "read_file(path)"),
    (lambda s: s.write_file(5, b"x"), "write_file(path)"),
    (lambda s: s.write_file("a", 5), "write_file(data)"),
    (lambda s: s.list_files(None), "list_files(path)"),
    (lambda s: s.run_code(5), "run_code(code)"),
    (lambda s: s.run_code("1", language=None), "run_code(language=None)"),
    (lambda s: s.run_code("1", timeout=0), "run_code(timeout=0)"),
    (lambda s: s.run_code("1", context="ctx"), "run_code(context=...): a CodeContext"),
    (lambda s: s.run_code("1", env={"A=B": "x"}), "run_code(env=...): 'A=B'"),
    (lambda s: s.run_code("1", env={"A": "x\x00"}), "run_code(env=...): the value of 'A'"),
    (
        lambda s: s.run_code("echo", language="bash", context=s.code_context()),
        "context runs python, not 'bash'",
    ),
    (lambda s: s.code_context(cwd=""), "code_context(cwd='')"),
    (lambda s: s.remove_code_context("ctx"), "remove_code_context(context): a CodeContext"),
    (lambda s: s.start("sleep 1", cwd=b"/tmp"), "start(cwd=...)"),
    (lambda s: s.attach(None), "attach(process_id=None)"),
    (lambda s: s.attach(""), "attach(process_id='')"),
    (lambda s: s.open_terminal(rows="24"), "open_terminal(rows='24')"),
    (lambda s: s.open_terminal(cols=70_000), "open_terminal(cols=70000)"),
    (lambda s: s.start("cat").wait(timeout=math.nan), "wait(timeout=nan)"),
    (lambda s: s.start("cat").wait(timeout=-1), "wait(timeout=-1)"),
    (lambda s: s.start("cat").write_stdin(5), "write_stdin(data)"),
    (lambda s: s.open_terminal().resize(-1, 80), "resize(rows=-1)"),
    (lambda s: s.open_terminal().resize(24, "80"), "resize(cols='80')"),
    (lambda s: s.open_terminal().write(5), "write(data)"),
    (lambda s: s.open_terminal().wait(timeout=0), "wait(timeout=0)"),
]


@pytest.mark.parametrize(("call", "message"), _SANDBOX_CALLS)
def test_bad_sandbox_call_arguments(
    router: Router, call: Callable[[Any], Any], message: str
) -> None:
    """Refused before any provider sees it, inside the router's tree; the lease lives on."""
    with router.acquire() as lease:
        with pytest.raises(InvalidArgument, match=re.escape(message)):
            call(lease.sandbox)
        assert lease.sandbox.run("echo alive").stdout == "alive\n"


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"cpu": -1}, "SandboxSpec(cpu=-1)"),
        ({"cpu": math.inf}, "SandboxSpec(cpu=inf)"),
        ({"memory_mb": 0}, "SandboxSpec(memory_mb=0)"),
        ({"disk_gb": -2}, "SandboxSpec(disk_gb=-2)"),
        ({"lifetime": math.nan}, "SandboxSpec(lifetime=nan)"),
        ({"idle_timeout": -1}, "SandboxSpec(idle_timeout=-1)"),
        ({"memory_mb": "512"}, "SandboxSpec(memory_mb='512')"),
        ({"template": ""}, "SandboxSpec(template='')"),
        ({"template": 5}, "SandboxSpec(template=5)"),
        ({"gpu": ""}, "SandboxSpec(gpu='')"),
        ({"workdir": "a\x00b"}, "SandboxSpec(workdir=...)"),
    ],
)
def test_bad_spec_fields(fields: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidArgument, match=re.escape(message)):
        SandboxSpec(**fields)


def test_a_download_onto_a_directory_is_refused_by_name(router: Router, tmp_path: Path) -> None:
    with router.acquire() as lease:
        lease.sandbox.write_file("a.txt", b"x")
        with pytest.raises(InvalidArgument, match=re.escape("download_file(local)")):
            lease.sandbox.download_file("a.txt", tmp_path)


async def test_a_closed_router_refuses_calls_and_its_leases_by_name(tmp_path: Path) -> None:
    """A call after close used to start a new loop and hand out a lease no one would
    release; now it is refused, and close stays safe to call again."""
    config = {"state_url": "memory://", "chain": [{"name": "local", "provider": "local",
              "options": {"root": str(tmp_path)}}]}  # fmt: skip
    sync = Router.from_config(config, hooks=[])
    lease = sync.acquire()
    sync.close()
    for call in (sync.acquire, sync.status, lambda: lease.sandbox.run("true")):
        with pytest.raises(RouterClosed, match="closed"):
            call()
    sync.close()
    async_router = Router.from_config(config, hooks=[])
    await async_router.aclose()
    with pytest.raises(RouterClosed, match="closed"):
        await async_router.aacquire()
    await async_router.aclose()
