"""How a ``local`` sandbox's commands are confined and found again.

bubblewrap gives a command new namespaces (pid, net, ipc, uts) with the
system directories read-only and the sandbox's directory as its home,
`HOME`; `preexec` applies the rlimits and moves the command into the
sandbox's cgroup v2 before exec. Everything a sandbox runs carries `MARKER`
in its environment and, where this process may make one, the sandbox's
cgroup: the kill (`cgroup_kill`, or a sweep by `carries`) and the pause
(`cgroup_freeze`) find every process by them (`providers.local` tells why
both are needed).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
import functools
import logging
import os
import posixpath
import resource
import shutil
import sys
import termios
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from providers.local.options import LocalOptions

__all__ = [
    "COMMAND_PATH",
    "HOME",
    "MARKER",
    "REAP_SECONDS",
    "bwrap_available",
    "bwrap_command",
    "carries",
    "cgroup_base",
    "cgroup_freeze",
    "cgroup_kill",
    "cgroup_remove",
    "preexec",
    "scratch_dir",
    "system_dirs",
]

_log = logging.getLogger(__name__)

HOME = "/home/sandbox"
MARKER = "SANDBOX_ROUTER_SANDBOX"
REAP_SECONDS = 5.0  # a process stuck in the kernel (state D) may take this long to die
_SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc")
COMMAND_PATH = "/usr/local/bin:/usr/bin:/bin"


def bwrap_available() -> bool:
    return shutil.which("bwrap") is not None


def bwrap_command() -> str:
    """bubblewrap by its host path: a command's env (a sandbox's PATH) must not decide
    whether the launcher itself is found."""
    return shutil.which("bwrap") or "bwrap"


def scratch_dir(cwd: str | None) -> str | None:
    """``cwd`` normalized when it is ``/tmp`` or below, else None."""
    if cwd is None or not cwd.startswith("/"):
        return None
    path = posixpath.normpath(cwd)
    return path if path == "/tmp" or path.startswith("/tmp/") else None


def system_dirs() -> list[str]:
    dirs = [d for d in _SYSTEM_DIRS if os.path.exists(d)]
    prefix = sys.base_prefix
    if not any(prefix == d or prefix.startswith(d + "/") for d in dirs):
        dirs.append(prefix)
    return dirs


def preexec(
    opts: LocalOptions,
    cgroup: str | None,
    *,
    tty: bool = False,
    enter: Callable[[], None] | None = None,
) -> Any:
    """A preexec_fn: in the child before exec, join the sandbox's cgroup, apply the
    rlimits, for a terminal make its stdin (after the setsid) the controlling one, and
    last run ``enter`` (an emulated sandbox's namespace: `emulators.confinement`).

    A failed join raises (the start fails): a command outside the cgroup
    would outlive the kill.
    """
    procs = os.path.join(cgroup, "cgroup.procs") if cgroup else None
    limits = [
        (resource.RLIMIT_CPU, opts.cpu_seconds),
        (resource.RLIMIT_AS, opts.memory_mb * 1024 * 1024),
        (resource.RLIMIT_FSIZE, opts.file_size_mb * 1024 * 1024),
        (resource.RLIMIT_NPROC, opts.max_processes),
    ]

    def apply() -> None:
        if procs is not None:
            fd = os.open(procs, os.O_WRONLY)
            try:
                os.write(fd, b"0")
            finally:
                os.close(fd)
        for which, value in limits:
            with contextlib.suppress(ValueError, OSError):
                resource.setrlimit(which, (value, value))
        if tty:
            fcntl.ioctl(0, termios.TIOCSCTTY, 0)
        if enter is not None:
            enter()

    return apply


@functools.cache
def cgroup_base() -> str | None:
    """This process's cgroup v2 directory, if it may make children and move processes in."""
    try:
        with open("/proc/self/cgroup") as f:
            path = next((ln[3:] for ln in f.read().splitlines() if ln.startswith("0::/")), None)
        with open("/proc/self/mountinfo") as f:
            mounts = [ln.split() for ln in f]
    except OSError:
        return None
    for fields in mounts:
        if path is None or "-" not in fields or fields[fields.index("-") + 1] != "cgroup2":
            continue
        root, mountpoint = fields[3], fields[4]
        if path != root and not path.startswith(root.rstrip("/") + "/"):
            continue
        base = os.path.normpath(mountpoint + "/" + path[len(root) :])
        if os.access(base, os.W_OK) and os.access(base + "/cgroup.procs", os.W_OK):
            return base
    return None


def cgroup_kill(cgroup: str) -> bool:
    """SIGKILL every member of ``cgroup`` (the kernel does, forks in flight included)."""
    try:
        fd = os.open(os.path.join(cgroup, "cgroup.kill"), os.O_WRONLY)
    except OSError:  # never made (no command ran, or no cgroup here), or not ours
        return False
    try:
        os.write(fd, b"1")
    except OSError:
        return False
    finally:
        os.close(fd)
    return True


async def cgroup_remove(cgroup: str) -> None:
    """Remove ``cgroup`` once its killed members have exited (EBUSY until then)."""
    deadline = time.monotonic() + REAP_SECONDS
    delay = 0.0005
    while True:
        try:
            os.rmdir(cgroup)
            return
        except FileNotFoundError:
            return
        except OSError as exc:
            if exc.errno != errno.EBUSY or time.monotonic() > deadline:
                _log.warning("cannot remove cgroup %s: %s", cgroup, exc.strerror)
                return
        await asyncio.sleep(delay)
        delay = min(delay * 2, 0.05)


async def cgroup_freeze(cgroup: str, frozen: bool) -> bool:
    """Freeze or thaw ``cgroup`` and wait until the kernel says it is done; False when
    there is no such cgroup (no command ran, or it could not be made)."""
    try:
        fd = os.open(os.path.join(cgroup, "cgroup.freeze"), os.O_WRONLY)
    except OSError:
        return False
    try:
        os.write(fd, b"1" if frozen else b"0")
    except OSError:
        return False
    finally:
        os.close(fd)
    want = f"frozen {int(frozen)}"
    deadline = time.monotonic() + REAP_SECONDS
    delay = 0.0005
    while time.monotonic() < deadline:
        if _cgroup_event(cgroup, want):
            return True
        await asyncio.sleep(delay)
        delay = min(delay * 2, 0.05)
    _log.warning("cgroup %s not %s after %ss", cgroup, want, REAP_SECONDS)
    return True


def _cgroup_event(cgroup: str, line: str) -> bool:
    """Whether ``cgroup.events`` says ``line`` (or the cgroup is gone: a kill ended it)."""
    try:
        with open(os.path.join(cgroup, "cgroup.events")) as f:
            return line in f.read().splitlines()
    except OSError:
        return True


def carries(pid: int, marker: bytes) -> bool:
    """Whether ``pid`` is alive with ``marker`` in its environment (a zombie has none)."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return marker in b"\0" + f.read()
    except OSError:
        return False
