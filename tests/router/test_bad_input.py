"""Hostile or mistaken arguments get a clear error naming the argument; nothing leaks."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from providers.base import SandboxSpec
from providers.errors import SandboxError, SandboxPathError
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
        ({"requires": [1]}, TypeError, "capabilities are non-empty strings"),
        ({"labels": {"team": 7}}, TypeError, "labels=...): keys and values are strings"),
        ({"labels": {"sandbox_router_entry": "x"}}, ValueError, "set by the router itself"),
        ({"session": "  "}, ValueError, "session='  '"),
        ({"timeout": 0}, ValueError, "timeout=0"),
        ({"timeout": -5}, ValueError, "timeout=-5"),
        ({"spec": {"template": "x"}}, TypeError, "expected a SandboxSpec"),
    ],
)
def test_bad_acquire_arguments(router: Router, kwargs: dict, error: type, message: str) -> None:
    with pytest.raises(error, match=re.escape(message)):
        router.acquire(**kwargs)
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
