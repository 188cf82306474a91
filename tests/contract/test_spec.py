"""`SandboxSpec` refuses what no provider could take, by name, before any create."""

from __future__ import annotations

import pytest

from providers.base import SandboxSpec
from providers.errors import InvalidArgument, SandboxRouterError


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"A=B": "x"}, "SandboxSpec(env=...): 'A=B' is not an environment variable name"),
        ({"A\nB": "x"}, "SandboxSpec(env=...): 'A\\nB' is not an environment variable name"),
        ({"1A": "x"}, "SandboxSpec(env=...): '1A' is not an environment variable name"),
        ({"KEY": "s3cr\x00t"}, "SandboxSpec(env=...): the value of 'KEY' contains a NUL byte"),
    ],
)
def test_bad_env_is_refused_by_name(env: dict[str, str], message: str) -> None:
    with pytest.raises(InvalidArgument) as refused:
        SandboxSpec(env=env)
    assert str(refused.value).startswith(message)
    assert isinstance(refused.value, SandboxRouterError)
    assert isinstance(refused.value, ValueError)
    assert "s3cr" not in str(refused.value)


def test_ordinary_env_is_kept() -> None:
    env = {"PATH_2": "/x:/y", "_u": "a=b\nc", "lower": ""}
    assert SandboxSpec(env=env).env == env
