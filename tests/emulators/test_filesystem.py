"""The emulated sandboxes' whole filesystem, with bubblewrap and without it.

Every emulator runs its sandboxes through `GuestSandbox`, so what these
prove holds for all four; the vendor test files prove it again through
each unmodified SDK.
"""

from __future__ import annotations

import asyncio
import os
import shutil
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from emulators.confinement import unavailable
from emulators.filesystem import GuestSandbox, PathRefused
from providers.base import SandboxSpec
from providers.errors import SandboxError
from providers.local import LocalOptions, LocalProvider

HOME = "/home/daytona"


@pytest.fixture(params=["bwrap", "namespace", "none"])
async def guest(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[GuestSandbox]:
    """A guest sandbox under each confinement (``none``: what a host without bubblewrap
    or user namespaces, a Mac, gets)."""
    if request.param == "bwrap" and shutil.which("bwrap") is None:
        pytest.skip("bubblewrap (bwrap) not installed")
    if request.param == "namespace" and (why := unavailable()) is not None:
        pytest.skip(f"no user and mount namespace here: {why}")
    provider = LocalProvider("emu", LocalOptions(root=tmp_path / "sb", isolation="none"))
    local = await provider.create(SandboxSpec(env={"WHERE": "/tmp/w"}))
    sandbox = GuestSandbox(local, HOME, confinement=request.param, dirs=["/app/src"])
    yield sandbox
    await sandbox.kill()


async def run(guest: GuestSandbox, command: str, cwd: str | None = None) -> str:
    result = await guest.run(command, cwd=cwd)
    assert result.exit_code == 0, result.stderr
    return result.stdout


async def test_commands_see_the_vendor_paths(guest: GuestSandbox) -> None:
    assert await run(guest, "pwd; echo $HOME; cd ~ && pwd") == f"{HOME}\n{HOME}\n{HOME}\n"
    assert await run(guest, "pwd", cwd="/") == "/\n"
    assert await run(guest, "pwd", cwd="/app/src") == "/app/src\n"
    assert await run(guest, "cd /tmp && pwd && cd .. && pwd") == "/tmp\n/\n"
    assert await run(guest, "echo $WHERE") == "/tmp/w\n"


async def test_python_is_on_the_path_as_in_every_vendor_image(guest: GuestSandbox) -> None:
    """Vendor images have ``python``; a host may have only ``python3``, and the host's venv
    (on the local provider's PATH) is not inside the sandbox."""
    assert await run(guest, "python -c 'print(6 * 7)'") == "42\n"
    assert await run(guest, "python3 -c 'print(6 * 7)'") == "42\n"


async def test_files_written_by_commands_are_the_file_apis(guest: GuestSandbox) -> None:
    await run(guest, "echo hi > /tmp/x && mkdir -p /root/d && echo there > /root/d/y && echo h > z")
    assert guest.host("/tmp/x").read_text() == "hi\n"
    assert guest.host("/root/d/y").read_text() == "there\n"
    assert guest.host("z") == guest.host(f"{HOME}/z") == guest.host("~/z")
    guest.host("/opt/from-api", write=True).write_text("api")
    assert await run(guest, "cat /opt/from-api") == "api"
    assert guest.vendor(guest.host("/tmp/x")) == "/tmp/x"
    assert guest.vendor(guest.host("/")) == "/"


async def test_symlinks_resolve_inside_the_sandbox(guest: GuestSandbox) -> None:
    await run(guest, "echo mine > /tmp/t && ln -s /tmp/t abs && ln -s ../../tmp/t rel")
    assert guest.host("abs").read_text() == guest.host("rel").read_text() == "mine\n"
    assert guest.host("abs").is_relative_to(guest.root)
    await run(guest, "ln -s / up")
    assert guest.host("up/tmp/t") == guest.host("/tmp/t")


def test_nothing_is_above_the_root(guest: GuestSandbox) -> None:
    assert guest.host("/../../..") == guest.root
    assert guest.host("../../../../tmp") == guest.root / "tmp"


async def test_system_directories_are_the_hosts_read_only(guest: GuestSandbox) -> None:
    assert guest.host("/etc/passwd") == Path("/etc/passwd")
    assert guest.host("/bin/sh").is_relative_to("/usr") or guest.host("/bin/sh") == Path("/bin/sh")
    with pytest.raises(PathRefused, match="/etc/x: read-only file system"):
        guest.host("/etc/x", write=True)
    with pytest.raises(PathRefused, match="read-only"):
        guest.host("/tmp/../usr/lib/x", write=True)
    assert "bin" in os.listdir(guest.host("/"))


async def test_output_split_across_writes_is_still_mapped(guest: GuestSandbox) -> None:
    """A path the command prints in two writes comes back whole (a tail that may begin
    the host directory's path waits up to 50 ms for the rest)."""
    where = guest.inside("/tmp")
    # octal escapes, so the command's own text holds no path to rewrite
    first, second = (
        "".join(f"\\{ord(c):03o}" for c in part)
        for part in (where[: len(where) // 2], where[len(where) // 2 :])
    )
    assert await run(guest, f"printf '{first}'; sleep 0.01; printf '{second}\\n'") == "/tmp\n"


async def test_a_missing_working_directory_is_an_error(guest: GuestSandbox) -> None:
    with pytest.raises(SandboxError, match="no such directory '/nope'"):
        await guest.run("true", cwd="/nope")


async def test_many_commands_at_once(guest: GuestSandbox) -> None:
    outs = await asyncio.gather(*(run(guest, f"cd /tmp && echo {i} $PWD") for i in range(8)))
    assert outs == [f"{i} /tmp\n" for i in range(8)]


async def test_a_mount_is_its_host_directory(guest: GuestSandbox, tmp_path: Path) -> None:
    """A mount (a Daytona volume) is the host directory at its path, for commands and the
    file APIs alike, and it outlives the sandbox; none goes on the host's system ones."""
    shared = tmp_path / "volume"
    shared.mkdir()
    local = await guest._provider.create(SandboxSpec())
    other = GuestSandbox(local, HOME, confinement=guest.confinement, mounts={"/data/": shared})
    try:
        await run(other, "echo hi > /data/x && mkdir /data/d && cd /data/d && pwd")
        assert (shared / "x").read_text() == "hi\n"
        assert other.host("/data/x") == shared / "x"
        assert other.vendor(shared / "d") == "/data/d"
        assert await run(other, "pwd", cwd="/data/d") == "/data/d\n"
        other.host("/data/d/y", write=True).write_text("api")
        assert await run(other, "cat d/y", cwd="/data") == "api"
    finally:
        await other.kill()
    assert (shared / "d" / "y").read_text() == "api"
    with pytest.raises(PathRefused, match="cannot mount on a system directory"):
        GuestSandbox(guest, HOME, confinement=guest.confinement, mounts={"/usr/data": shared})


async def test_a_read_only_mount(guest: GuestSandbox, tmp_path: Path) -> None:
    """A ``read_only`` mount: read through it, the file APIs refuse to write in it (and
    under bubblewrap its commands too), a writable mount inside it stays writable."""
    (tmp_path / "ro").mkdir()
    (tmp_path / "ro" / "x").write_text("x")
    (tmp_path / "rw").mkdir()
    mounts = {"/data": tmp_path / "ro", "/data/rw": tmp_path / "rw"}
    local = await guest._provider.create(SandboxSpec())
    other = GuestSandbox(
        local, HOME, confinement=guest.confinement, mounts=mounts, read_only=["/data"]
    )
    try:
        assert await run(other, "cat /data/x") == "x"
        with pytest.raises(PathRefused, match="read-only file system"):
            other.host("/data/y", write=True)
        other.host("/data/rw/y", write=True).write_text("y")
        if not other.bare:
            assert (await other.run("touch /data/z")).exit_code != 0
    finally:
        await other.kill()
    assert sorted(p.name for p in (tmp_path / "ro").iterdir()) == ["rw", "x"]  # a mount point
