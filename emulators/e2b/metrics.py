"""A sandbox's metrics as E2B's ``GET /sandboxes/{id}/metrics`` answers them.

E2B samples every sandbox on a schedule; the emulator samples when asked and
keeps what it sampled, so a later range query finds earlier samples. A sample
is stamped to the whole second (E2B aligns them to its collection buckets), so
an ``end`` the client took just before asking still covers it. CPU and memory
are those of the processes started through envd and their descendants (from
``/proc``), disk the bytes of the sandbox's own files.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

__all__ = ["DISK_TOTAL", "Metrics"]

DISK_TOTAL = 10240 * 1024 * 1024
_PAGE = os.sysconf("SC_PAGE_SIZE")
_TICKS = os.sysconf("SC_CLK_TCK")


def _tree(pids: Iterable[int]) -> set[int]:
    """``pids`` and every descendant of theirs still running."""
    seen: set[int] = set()
    todo = list(pids)
    while todo:
        pid = todo.pop()
        if pid in seen:
            continue
        seen.add(pid)
        try:
            for task in os.listdir(f"/proc/{pid}/task"):
                children = Path(f"/proc/{pid}/task/{task}/children").read_text().split()
                todo.extend(int(c) for c in children)
        except OSError:
            continue
    return seen


def _usage(pids: set[int]) -> tuple[float, int]:
    """CPU seconds used so far and resident bytes of ``pids``."""
    cpu, rss = 0.0, 0
    for pid in pids:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
            statm = Path(f"/proc/{pid}/statm").read_text().split()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        cpu += (int(fields[11]) + int(fields[12])) / _TICKS
        rss += int(statm[1]) * _PAGE
    return cpu, rss


def _disk_used(root: Path) -> int:
    used = 0
    for directory, _, files in os.walk(root):
        for name in files:
            try:
                used += os.lstat(os.path.join(directory, name)).st_size
            except OSError:
                continue
    return used


@dataclass
class Metrics:
    """The samples of one sandbox, and what the next CPU percentage is measured from."""

    samples: list[dict[str, Any]] = field(default_factory=list)
    _last: tuple[float, float] | None = None  # (wall time, CPU seconds) of the last sample

    def sample(self, root: Path, pids: Iterable[int], cpu_count: int, memory_mb: int) -> None:
        """Take a sample now (the same second's sample is replaced)."""
        now = time.time()
        cpu, rss = _usage(_tree(pids))
        pct = 0.0
        if self._last is not None and now > self._last[0]:
            pct = max(0.0, (cpu - self._last[1]) / (now - self._last[0]) / cpu_count * 100)
        self._last = (now, cpu)
        second = int(now)
        if self.samples and self.samples[-1]["timestampUnix"] == second:
            self.samples.pop()
        self.samples.append(
            {
                "timestamp": datetime.fromtimestamp(second, UTC).isoformat().replace("+00:00", "Z"),
                "timestampUnix": second,
                "cpuCount": cpu_count,
                "cpuUsedPct": round(min(pct, 100.0), 2),
                "memUsed": rss,
                "memTotal": memory_mb * 1024 * 1024,
                "memCache": 0,
                "diskUsed": _disk_used(root),
                "diskTotal": DISK_TOTAL,
            }
        )

    def between(self, start: int | None, end: int | None) -> list[dict[str, Any]]:
        return [
            s
            for s in self.samples
            if (start is None or s["timestampUnix"] >= start)
            and (end is None or s["timestampUnix"] <= end)
        ]
