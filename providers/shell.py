"""Commands as shell text, for the SDKs that take one string (Daytona, Runloop).

Neither API takes env or cwd per command (Daytona's sessions would keep
them), so they become a prelude of the command; code for `Sandbox.run_code`
is piped, base64-encoded, into an interpreter so no quoting can break it.
"""

from __future__ import annotations

import base64
import re
import shlex
from collections.abc import Mapping, Sequence

from providers.errors import SandboxError
from providers.mapping import Where

__all__ = ["piped", "script"]

_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def script(
    cmd: str | Sequence[str], env: Mapping[str, str] | None, cwd: str | None, where: Where
) -> str:
    """``cmd`` (a shell string, or an argv to quote) after its exports and ``cd``, as lines.

    Raises:
        SandboxError: an env name the shell cannot export.
    """
    lines = []
    for name, value in (env or {}).items():
        if not _ENV_NAME.fullmatch(name):
            raise where.error(SandboxError, f"invalid environment variable name {name!r}")
        lines.append(f"export {name}={shlex.quote(value)}")
    if cwd:
        lines.append(f"cd -- {shlex.quote(cwd)} || exit 1")
    lines.append(cmd if isinstance(cmd, str) else shlex.join(cmd))
    return "\n".join(lines)


def piped(code: str, interpreter: str) -> str:
    """A command that feeds ``code`` to ``interpreter`` (e.g. ``python3 -``) on stdin."""
    encoded = base64.b64encode(code.encode()).decode()
    return f"printf %s {encoded} | base64 -d | {interpreter}"
