"""The emulator harness's own lifecycle: what stopping an emulator leaves behind."""

from __future__ import annotations

import asyncio
import gc
import logging

import pytest

from emulators.e2b import E2BEmulator


def test_stopping_lets_every_task_on_its_loop_unwind(caplog: pytest.LogCaptureFixture) -> None:
    unwound: list[str] = []

    async def forever() -> None:
        try:
            await asyncio.Event().wait()
        finally:
            unwound.append("forever")

    async def spawn() -> None:
        asyncio.get_running_loop().create_task(forever())  # a pump no handler awaits

    with caplog.at_level(logging.ERROR, logger="asyncio"), E2BEmulator(isolation="none") as emu:
        emu.call(spawn())
    gc.collect()
    assert unwound == ["forever"]
    assert "Task was destroyed but it is pending" not in caplog.text
