"""Emulated sandboxes without bubblewrap: a path a command builds at run time is the
sandbox's, never the host's."""

from __future__ import annotations

import asyncio
import base64
import os
import secrets
import shlex
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from emulators import emulator_class
from emulators.confinement import unavailable
from tests.contract.conftest import VENDORS, build


def _made_on_the_host(path: str) -> Iterator[str]:
    """The directories above ``path`` that the host lacks now (what a test that fails may
    make, to remove after it)."""
    parent = os.path.dirname(path)
    while not os.path.exists(parent):
        yield parent
        parent = os.path.dirname(parent)


@pytest.mark.parametrize("vendor", VENDORS)
async def test_a_path_built_at_run_time_lands_in_the_sandbox(
    vendor: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The command's text names no path (Deep Agents' file tools send theirs encoded), so
    no rewriting of the command can catch it: only the sandbox's own mounts can."""
    if (why := unavailable()) is not None:
        pytest.skip(f"no user and mount namespace here: {why}")
    with emulator_class(vendor)(isolation="none") as emu:
        for key, value in emu.sdk_env().items():
            monkeypatch.setenv(key, value)
        backend = build(vendor, emu, tmp_path)
        target = f"{backend.home}/notes-{secrets.token_hex(4)}/todo.txt"
        made = list(_made_on_the_host(target))
        encoded = base64.b64encode(target.encode()).decode()
        script = (
            f"import base64, os; p = base64.b64decode('{encoded}').decode(); "
            "os.makedirs(os.path.dirname(p)); open(p, 'w').write('kept')"
        )
        sbx = await backend.create()
        try:
            ran = await sbx.run(f"python3 -c {shlex.quote(script)}")
            assert ran.exit_code == 0, ran.stderr
            on_host = await asyncio.to_thread(os.path.lexists, target)
            assert not on_host, f"{target} was written on the host"
            assert await sbx.read_file(target) == b"kept"
        finally:
            await sbx.kill()
            await backend.provider.aclose()
            _unmake(target, made)


def _unmake(target: str, made: list[str]) -> None:
    """Remove what a failing run wrote on the host: the file, the directories it made."""
    if os.path.lexists(target):
        os.unlink(target)
    for directory in made:
        if os.path.isdir(directory):
            os.rmdir(directory)


_BARE_SCRIPT = """
import asyncio, os, sys, tempfile
from pathlib import Path
from emulators.daytona import DaytonaEmulator
from emulators.e2b import E2BEmulator
from tests.contract.conftest import build

async def use(name, emu):
    backend = build(name, emu, Path(tempfile.mkdtemp()))
    sbx = await backend.create()
    try:
        await sbx.write_file(f"{backend.home}/api.txt", "from the api")
        ran = await sbx.run(f"echo hi > {backend.home}/cmd.txt && pwd && cat api.txt")
        back = await sbx.read_file(f"{backend.home}/cmd.txt")
        print(name, emu.core.confinement, repr(ran.stdout), repr(back), flush=True)
    finally:
        await sbx.kill()
        await backend.provider.aclose()

with E2BEmulator(isolation="none") as e2b, DaytonaEmulator(isolation="none") as daytona:
    asyncio.run(use("e2b", e2b))
    asyncio.run(use("daytona", daytona))
"""


def test_without_a_namespace_the_emulator_says_so_once_and_keeps_off_the_hosts_paths(
    tmp_path: Path,
) -> None:
    """Where no namespace can be made (macOS; here the kernel is made to refuse one, in
    a user namespace of the test's own whose namespace limits are 0) commands run on the
    host with their paths rewritten: one warning says what differs, and the emulator
    makes none of the vendor's paths on the host."""
    command = [sys.executable, "-c", _BARE_SCRIPT]
    if unavailable() is None:
        unshare = shutil.which("unshare")
        if unshare is None:
            pytest.skip("util-linux unshare is not installed (to make the kernel refuse)")
        refuse = (
            "echo 0 > /proc/sys/user/max_user_namespaces && "
            'echo 0 > /proc/sys/user/max_mnt_namespaces && exec "$@"'
        )
        command = [unshare, "--user", "--map-root-user", "/bin/sh", "-c", refuse, "sh", *command]
    homes = ["/home/user", "/home/daytona"]
    before = {home: os.path.lexists(home) for home in homes}
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[2]), "TMPDIR": str(tmp_path)}
    ran = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120, check=False)
    assert ran.returncode == 0, ran.stderr
    said = [line for line in ran.stderr.splitlines() if "run their commands on the host" in line]
    assert len(said) == 1, ran.stderr
    assert "a path a program builds at run time" in said[0]
    assert "no mount namespace (" in said[0]
    assert ran.stdout.splitlines() == [
        "e2b none '/home/user\\nfrom the api' b'hi\\n'",
        "daytona none '/home/daytona\\nfrom the api' b'hi\\n'",
    ]
    assert {home: os.path.lexists(home) for home in homes} == before
