"""Pause and resume, and snapshots: a paused sandbox keeps its files and answers on
the same id once resumed; a snapshot is a template for creates on the same entry.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from providers.capabilities import Capability
from providers.errors import NotFound, Unsupported
from tests.contract.conftest import Backend
from tests.polling import until


async def test_pause_keeps_files_and_resume_answers_on_the_same_id(backend: Backend) -> None:
    sbx = await backend.create()
    try:
        if Capability.PAUSE not in backend.provider.capabilities:
            with pytest.raises(Unsupported, match="pause"):
                await sbx.pause()
            with pytest.raises(Unsupported, match="pause"):
                await backend.provider.resume(sbx.id, timeout=10)
            return
        await sbx.write_file("notes/state.txt", b"kept while paused")
        await sbx.pause()
        listed = {info.id: info.state for info in await backend.provider.list()}
        assert listed[sbx.id] == "paused"
        woken = await backend.provider.resume(sbx.id, timeout=20)
        assert woken.id == sbx.id
        assert await woken.read_file("notes/state.txt") == b"kept while paused"
        ran = await woken.run("echo awake")
        assert (ran.exit_code, ran.stdout) == (0, "awake\n")
        again = await backend.provider.resume(sbx.id, timeout=20)  # running: not an error
        assert again.id == sbx.id
    finally:
        await sbx.kill()


async def test_pause_resume_of_a_gone_sandbox_is_not_found(backend: Backend) -> None:
    if Capability.PAUSE not in backend.provider.capabilities:
        pytest.skip(f"{backend.name} does not declare pause")
    with pytest.raises(NotFound):
        await backend.provider.resume(backend.unknown_id, timeout=10)


async def test_snapshot_is_a_template_for_a_create(backend: Backend) -> None:
    sbx = await backend.create()
    try:
        if Capability.SNAPSHOT not in backend.provider.capabilities:
            with pytest.raises(Unsupported, match="snapshot"):
                await sbx.snapshot()
            return
        await sbx.write_file("app/config.txt", b"baked in")
        snap = await sbx.snapshot("contract-snap")
        assert snap.entry == backend.name
    finally:
        await sbx.kill()
    child = await backend.create(template=snap.id)
    try:
        assert await child.read_file("app/config.txt") == b"baked in"
    finally:
        await child.kill()
    assert await backend.provider.delete_snapshot(snap.id) is True
    assert await backend.provider.delete_snapshot(snap.id) is False


async def test_warm_server_keeps_sandboxes_of_a_template_ready(backend: Backend) -> None:
    """``keep_warm``: the vendor's own pool is sized and serves creates; 0 ends it."""
    if Capability.WARM_SERVER not in backend.provider.capabilities:
        with pytest.raises(Unsupported, match=r"warm\.server"):
            await backend.provider.keep_warm(backend.template, 1)
        return
    assert await backend.provider.keep_warm(backend.template, 1) in (0, 1)
    deadline = time.monotonic() + 20
    while await backend.provider.keep_warm(backend.template, 1) < 1:
        assert time.monotonic() < deadline, "the vendor's pool never held one"
        await asyncio.sleep(0.1)
    served = await backend.create(template=backend.template)
    try:
        assert (await served.run("echo warm")).stdout == "warm\n"
    finally:
        await served.kill()
    assert await backend.provider.keep_warm(backend.template, 0) == 0
    if backend.emulator is not None:  # the refill in flight when it ended is deleted on landing
        await until(lambda: backend.emulator.alive() == [])
