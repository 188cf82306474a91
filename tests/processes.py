"""Finding host processes by what their command line holds (a marker, a directory)."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path


def processes_with(marker: str) -> list[int]:
    """Host processes whose command line holds ``marker`` (this test's own excepted)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        with contextlib.suppress(OSError):
            if marker.encode() in (entry / "cmdline").read_bytes():
                found.append(int(entry.name))
    return found


def command_line(pid: int) -> str:
    """``pid``'s command line, its arguments joined by spaces ("" once it is gone)."""
    try:
        argv = (Path("/proc") / str(pid) / "cmdline").read_bytes().rstrip(b"\0")
    except OSError:
        return ""
    return argv.replace(b"\0", b" ").decode(errors="replace")
