"""Fixtures of the emulator tests."""

from __future__ import annotations

import shutil

import pytest


@pytest.fixture(params=["bwrap", "none"])
def isolation(request: pytest.FixtureRequest) -> str:
    """Each isolation an emulator runs its sandboxes' commands under."""
    if request.param == "bwrap" and shutil.which("bwrap") is None:
        pytest.skip("bubblewrap (bwrap) not installed")
    value: str = request.param
    return value
