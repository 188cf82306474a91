"""The error tree's messages: what a user reads, and may paste."""

from __future__ import annotations

import ast

import pytest

from providers.capabilities import Capability
from providers.errors import Unsupported


@pytest.mark.parametrize("capability", [Capability.PAUSE, Capability.PTY_RESIZE, "port"])
def test_unsupported_hints_at_requires_as_code_to_paste(capability: str) -> None:
    error = Unsupported("modal-a", capability)
    hint = str(error).split("acquire with ", 1)[1].split(" to route", 1)[0]
    assert hint == f'requires=("{capability}",)'
    assert ast.literal_eval(hint.removeprefix("requires=")) == (str(capability),)
    assert error.capability == capability
