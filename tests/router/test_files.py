"""The sandbox handle's file, port and snapshot calls through a lease, sync and async:
arguments checked the same for every provider, streams relayed chunk by chunk."""

from __future__ import annotations

import io
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from providers.base import SandboxSpec
from providers.capabilities import Capability
from providers.errors import InvalidArgument, NoProviderAvailable, SandboxError, Unsupported
from router import Router
from router.testing import ScriptedProvider


@pytest.fixture
def scripted_provider(tmp_path: Path) -> ScriptedProvider:
    return ScriptedProvider("files", tmp_path / "sandboxes")


@pytest.fixture
def router(scripted_provider: ScriptedProvider) -> Iterator[Router]:
    config = {"state_url": "memory://", "chain": [{"name": "files", "provider": "local"}]}
    with Router.from_config(config, providers={"files": scripted_provider}, hooks=[]) as made:
        yield made


def test_sync_files_streams_and_dirs(router: Router, tmp_path: Path) -> None:
    with router.acquire(requires=("files.manage", "files.stream")) as lease:
        sbx = lease.sandbox
        assert sbx.make_dir("work/deep") is True
        assert sbx.make_dir("work/deep") is False
        assert sbx.exists("work/deep")
        sbx.write_file("work/a.txt", "12345")
        assert (sbx.stat("work/a.txt").size, sbx.stat("work").is_dir) == (5, True)
        assert sbx.rename("work/a.txt", "work/b.txt").name == "b.txt"
        assert not sbx.exists("work/a.txt")
        with pytest.raises(SandboxError, match="no/such"):
            sbx.stat("no/such")

        block = bytes(range(256)) * 8192  # 2 MiB: more than one chunk each way
        sbx.write_stream("big.bin", io.BytesIO(block))  # a binary file, read in chunks
        chunks = sbx.read_stream("big.bin")
        first = next(chunks)
        assert 0 < len(first) < len(block)  # a chunk, not the whole file
        assert first + b"".join(chunks) == block
        sbx.write_stream("parts.txt", iter([b"a", bytearray(b"b"), b"c"]))
        assert sbx.read_file("parts.txt") == b"abc"

        local = tmp_path / "up"
        (local / "sub").mkdir(parents=True)
        (local / "sub" / "x.txt").write_text("x")
        sbx.upload_dir(local, "tree")
        sbx.download_dir("tree", tmp_path / "down")
        assert (tmp_path / "down" / "sub" / "x.txt").read_text() == "x"
        sbx.upload_file(local / "sub" / "x.txt", "one.txt")
        sbx.download_file("one.txt", tmp_path / "one.txt")
        assert (tmp_path / "one.txt").read_text() == "x"
        sbx.remove("tree")
        assert not sbx.exists("tree/sub/x.txt")


async def test_async_files_and_streams(router: Router, tmp_path: Path) -> None:
    async def parts() -> AsyncIterator[bytes]:
        for part in (b"one ", b"two ", b"three"):
            yield part

    async with await router.aacquire() as lease:
        sbx = lease.sandbox
        await sbx.write_stream("s.txt", parts())  # made on this loop, pulled by the router's
        assert b"".join([c async for c in sbx.read_stream("s.txt")]) == b"one two three"
        assert await sbx.make_dir("d")
        assert (await sbx.rename("s.txt", "d/t.txt")).size == 13
        assert await sbx.exists("d/t.txt")
        await sbx.download_file("d/t.txt", tmp_path / "t.txt")
        assert (tmp_path / "t.txt").read_bytes() == b"one two three"
        await sbx.remove("d")
        assert not await sbx.exists("d")


def test_arguments_are_checked_before_any_provider_call(router: Router, tmp_path: Path) -> None:
    with router.acquire() as lease:
        sbx = lease.sandbox
        with pytest.raises(InvalidArgument, match=r"remove\(path\)"):
            sbx.remove("a\x00b")
        with pytest.raises(InvalidArgument, match=r"rename\(dst\)"):
            sbx.rename("a", "")
        with pytest.raises(InvalidArgument, match=r"stat\(path\)"):
            sbx.stat(3)  # type: ignore[arg-type]
        with pytest.raises(InvalidArgument, match=r"upload_file\(local\)"):
            sbx.upload_file(tmp_path / "missing", "x")
        with pytest.raises(InvalidArgument, match=r"upload_dir\(local\)"):
            sbx.upload_dir(tmp_path / "missing", "x")
        with pytest.raises(InvalidArgument, match=r"expose\(port\)"):
            sbx.expose(70000)
        with pytest.raises(InvalidArgument, match=r"write_stream\(chunks\)"):
            sbx.write_stream("x", b"whole bytes")  # type: ignore[arg-type]
        with pytest.raises(InvalidArgument, match=r"write_stream\(chunks\)"):
            sbx.write_stream("x", io.StringIO("text"))
        with pytest.raises(InvalidArgument, match=r"read_stream\(path\)"):
            sbx.read_stream("")


def test_snapshot_is_a_template_on_the_same_entry(router: Router) -> None:
    with router.acquire() as lease:
        lease.sandbox.write_file("kept.txt", "from the snapshot")
        snap = lease.sandbox.snapshot("base")
    assert (snap.entry, snap.name) == ("files", "base")
    with router.acquire(SandboxSpec(template=snap.id)) as child:
        assert child.sandbox.read_file("kept.txt") == b"from the snapshot"
    assert router.delete_snapshot(snap) is True
    assert router.delete_snapshot(snap) is False


def test_a_capability_the_entry_lacks_is_refused_by_name(tmp_path: Path) -> None:
    provider = ScriptedProvider("plain", tmp_path, capabilities={"run_code"})
    config = {"state_url": "memory://", "chain": [{"name": "plain", "provider": "local"}]}
    with Router.from_config(config, providers={"plain": provider}, hooks=[]) as router:
        with router.acquire() as lease, pytest.raises(Unsupported, match="port"):
            lease.sandbox.expose(8080)
        with pytest.raises(NoProviderAvailable, match=Capability.PAUSE.value):
            router.acquire(requires=(Capability.PAUSE,))
