"""Files beyond one read and one write: remove, make_dir, exists, rename, stat, and
large files and whole directories streamed both ways.

A provider that declares ``files.manage`` / ``files.stream`` does each; one that
does not refuses with `Unsupported`, naming the capability.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from providers.base import Sandbox
from providers.capabilities import Capability
from providers.errors import SandboxError, Unsupported
from tests.contract.conftest import Backend


def declares(backend: Backend, capability: Capability) -> bool:
    return capability in backend.provider.capabilities


async def test_remove_make_dir_exists_rename_stat(backend: Backend) -> None:
    sbx = await backend.create()
    try:
        if not declares(backend, Capability.FILES_MANAGE):
            for call in (sbx.remove("x"), sbx.make_dir("x"), sbx.exists("x"), sbx.stat("x")):
                with pytest.raises(Unsupported, match=r"files\.manage"):
                    await call
            return
        assert await sbx.make_dir("work/deep/er") is True
        assert await sbx.make_dir("work/deep/er") is False
        assert await sbx.exists("work/deep") is True
        await sbx.write_file("work/deep/a.txt", b"12345")
        info = await sbx.stat("work/deep/a.txt")
        assert (info.name, info.is_dir, info.size) == ("a.txt", False, 5)
        assert info.path.endswith("/work/deep/a.txt")
        assert (await sbx.stat("work/deep")).is_dir
        moved = await sbx.rename("work/deep/a.txt", "work/b.txt")
        assert (moved.name, moved.size) == ("b.txt", 5)
        assert await sbx.exists("work/deep/a.txt") is False
        assert await sbx.read_file("work/b.txt") == b"12345"
        await sbx.remove("work/b.txt")
        assert await sbx.exists("work/b.txt") is False
        await sbx.remove("work")  # a directory goes with what it holds
        assert await sbx.exists("work/deep/er") is False
        assert await sbx.exists(f"{backend.home}") is True  # absolute paths too
    finally:
        await sbx.kill()


async def test_remove_and_stat_of_a_missing_path_name_it(backend: Backend) -> None:
    if not declares(backend, Capability.FILES_MANAGE):
        pytest.skip(f"{backend.name} does not declare files.manage")
    sbx = await backend.create()
    try:
        for call in (sbx.remove("no/such"), sbx.stat("no/such"), sbx.rename("no/such", "x")):
            with pytest.raises(SandboxError, match="no/such") as missing:
                await call
            assert (missing.value.provider, missing.value.sandbox_id) == (backend.name, sbx.id)
    finally:
        await sbx.kill()


async def _chunks(total: int, size: int, digest: hashlib._Hash) -> AsyncIterator[bytes]:
    block = os.urandom(size)
    sent = 0
    while sent < total:
        chunk = block[: min(size, total - sent)]
        digest.update(chunk)
        sent += len(chunk)
        yield chunk


async def test_stream_a_large_file_both_ways(backend: Backend) -> None:
    sbx = await backend.create()
    try:
        if not declares(backend, Capability.FILES_STREAM):
            with pytest.raises(Unsupported, match=r"files\.stream"):
                await sbx.write_stream("big.bin", _chunks(10, 10, hashlib.sha256()))
            return
        sent = hashlib.sha256()
        total = 6 * 1024 * 1024 + 17
        await sbx.write_stream("data/big.bin", _chunks(total, 256 * 1024, sent))
        assert (
            (await sbx.stat("data/big.bin")).size == total
            if declares(backend, Capability.FILES_MANAGE)
            else True
        )
        got = hashlib.sha256()
        size = 0
        async for chunk in sbx.read_stream("data/big.bin"):
            got.update(chunk)
            size += len(chunk)
        assert (size, got.hexdigest()) == (total, sent.hexdigest())
    finally:
        await sbx.kill()


async def test_copy_a_local_file_up_and_down(backend: Backend, tmp_path: Path) -> None:
    """``upload_file``/``download_file``: parents made in the sandbox, the local file
    overwritten, a missing sandbox file named."""
    sbx = await backend.create()
    try:
        local = tmp_path / "up.bin"
        local.write_bytes(os.urandom(64 * 1024) * 40 + b"tail")
        if not declares(backend, Capability.FILES_STREAM):
            with pytest.raises(Unsupported, match=r"files\.stream"):
                await sbx.upload_file(local, "up.bin")
            return
        await sbx.upload_file(local, "copied/deep/up.bin")
        back = tmp_path / "back.bin"
        back.write_bytes(b"stale content, longer than nothing")
        await sbx.download_file("copied/deep/up.bin", back)
        assert back.read_bytes() == local.read_bytes()
        with pytest.raises(SandboxError, match="no/such/file"):
            await sbx.download_file("no/such/file", tmp_path / "missing.bin")
    finally:
        await sbx.kill()


def _tree(root: Path) -> dict[str, bytes | None]:
    return {
        str(p.relative_to(root)): None if p.is_dir() else p.read_bytes()
        for p in sorted(root.rglob("*"))
    }


async def test_stream_a_directory_up_and_down(backend: Backend, tmp_path: Path) -> None:
    sbx = await backend.create()
    try:
        source = tmp_path / "up"
        for i in range(40):
            target = source / f"d{i % 4}" / f"f{i}.txt"
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(f"file {i}\n".encode() * (i + 1))
        (source / "empty").mkdir()
        (source / "bin.dat").write_bytes(bytes(range(256)) * 300)
        if not declares(backend, Capability.FILES_STREAM):
            with pytest.raises(Unsupported, match=r"files\.stream"):
                await sbx.upload_dir(source, "proj")
            return
        await sbx.upload_dir(source, "proj")
        assert await sbx.read_file("proj/d1/f5.txt") == b"file 5\n" * 6
        back = tmp_path / "down"
        await sbx.download_dir("proj", back)
        assert _tree(back) == _tree(source)
        assert [
            f.name for f in await sbx.list_files(".") if f.name.startswith(".sandbox-router")
        ] == []
    finally:
        await sbx.kill()


async def test_stream_a_missing_directory_down_names_it(backend: Backend, tmp_path: Path) -> None:
    if not declares(backend, Capability.FILES_STREAM):
        pytest.skip(f"{backend.name} does not declare files.stream")
    sbx: Sandbox = await backend.create()
    try:
        with pytest.raises(SandboxError, match="no/such/dir"):
            await sbx.download_dir("no/such/dir", tmp_path / "x")
    finally:
        await sbx.kill()
