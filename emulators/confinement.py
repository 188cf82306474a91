"""How an emulated sandbox's commands are kept to its filesystem: bubblewrap, a mount
namespace of their own, or, where neither can be had, path rewriting.

A vendor's sandbox is a machine of its own, so a command there may build a path at
run time (LangChain Deep Agents' file tools send theirs base64-encoded) and write
it. Rewriting the vendor's paths in a command's text cannot catch that: such a
command wrote the host's ``/home/user``. So without bubblewrap each command enters,
between fork and exec, a user, mount, UTS and IPC namespace of its own (Linux's
unprivileged user namespaces, what ``unshare -Urm`` makes; the caller may be root
or not), in which the sandbox's directory is ``/`` as under bubblewrap: the host's
system directories bound read-only at their paths, the sandbox's mounts (volumes)
at theirs, the host's ``/proc`` (its ``sys``, ``sysrq-trigger``, ``irq`` and ``bus``
read-only), a ``/dev`` of its own (a tmpfs with ``null``, ``zero``, ``full``,
``random``, ``urandom`` and ``tty`` bound from the host, a ``devpts`` of its own),
the host name ``sandbox``, then ``chroot``. Commands see exactly the vendor's
paths, and their output needs no rewriting. What differs from bubblewrap: no PID
namespace (a command sees the host's processes, as a Modal container's execs see
each other's; the kill is the process group's, as before), and the command is
itself the forked child, so its exit status is its own (128 + a signal, as a
shell reports it). Entering costs a few dozen syscalls in the child, no exec.

Where no namespace can be made (macOS, a container whose seccomp profile forbids
``unshare``, ``user.max_user_namespaces`` at 0) commands run on the host with
their paths rewritten (`emulators.filesystem`); the emulator says so once, naming
what differs, at its start.
"""

from __future__ import annotations

import ctypes
import errno
import functools
import logging
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from providers.errors import ConfigError
from providers.local.isolation import bwrap_available, system_dirs

__all__ = ["Confinement", "MountNamespace", "choose", "unavailable"]

_log = logging.getLogger("emulators")

Confinement = Literal["bwrap", "namespace", "none"]
"""bubblewrap; a mount namespace of each command's own; nothing (paths rewritten)."""

_CLONE_NEWNS = 0x00020000
_CLONE_NEWUTS = 0x04000000
_CLONE_NEWIPC = 0x08000000
_CLONE_NEWUSER = 0x10000000
_MS_RDONLY = 1
_MS_NOSUID = 2
_MS_NODEV = 4
_MS_NOEXEC = 8
_MS_REMOUNT = 32
_MS_BIND = 4096
_MS_REC = 16384
_MS_PRIVATE = 1 << 18
# The flags a remount in a user namespace must keep as they are (the kernel locks them).
_LOCKED = {
    "nosuid": _MS_NOSUID,
    "nodev": _MS_NODEV,
    "noexec": _MS_NOEXEC,
    "noatime": 1024,
    "nodiratime": 2048,
    "relatime": 1 << 21,
    "strictatime": 1 << 24,
}
_DEVICES = ("null", "zero", "full", "random", "urandom", "tty")
_DEV_LINKS = {
    "ptmx": "pts/ptmx",
    "fd": "/proc/self/fd",
    "stdin": "/proc/self/fd/0",
    "stdout": "/proc/self/fd/1",
    "stderr": "/proc/self/fd/2",
    "core": "/proc/kcore",
}
_PROC_READ_ONLY = ("sys", "sysrq-trigger", "irq", "bus")
_SETUP_FAILED = 126  # the command could not be started, as a shell says
_HINTS = {
    errno.ENOSPC: "user.max_user_namespaces or user.max_mnt_namespaces is reached",
    errno.EPERM: "unprivileged user namespaces are off here (kernel.unprivileged_userns_clone,"
    " an AppArmor restriction or a seccomp profile)",
    errno.EINVAL: "the kernel has no user namespaces",
    errno.ENOSYS: "the kernel has no user namespaces",
}


class _Refused(Exception):
    """A step of entering the namespace failed: what, and the kernel's errno."""

    def __init__(self, what: str, code: int) -> None:
        super().__init__(what, code)
        self.what = what
        self.code = code

    def __str__(self) -> str:
        hint = _HINTS.get(self.code) if self.what.startswith("unshare") else None
        return f"{self.what}: {os.strerror(self.code)}" + (f" ({hint})" if hint else "")


@functools.cache
def _libc() -> ctypes.CDLL:
    libc = ctypes.CDLL(None, use_errno=True)
    text, flags = ctypes.c_char_p, ctypes.c_ulong
    libc.mount.argtypes = [text, text, text, flags, text]
    libc.unshare.argtypes = [ctypes.c_int]
    libc.sethostname.argtypes = [text, ctypes.c_size_t]
    return libc


def _call(what: str, result: int) -> None:
    if result != 0:
        raise _Refused(what, ctypes.get_errno())


def _mount(source: bytes | None, target: bytes, fstype: bytes | None, flags: int,
           data: bytes | None = None) -> None:  # fmt: skip
    _call(f"mount {os.fsdecode(target)}", _libc().mount(source, target, fstype, flags, data))


@dataclass(frozen=True, slots=True)
class _Step:
    """One mount, or a file or symlink made in the new ``/dev``, run in the child."""

    target: bytes
    source: bytes | None = None
    fstype: bytes | None = None
    flags: int = 0
    data: bytes | None = None
    point: Literal["dir", "file", "link", ""] = "dir"  # the mount point to make if missing

    def run(self) -> None:
        try:
            if self.point == "link":
                assert self.source is not None
                if not os.path.lexists(self.target):
                    os.symlink(self.source, self.target)
                return
            if self.point and not os.path.lexists(self.target):
                if self.point == "dir":
                    os.makedirs(self.target)
                else:
                    os.close(os.open(self.target, os.O_WRONLY | os.O_CREAT, 0o644))
        except OSError as exc:
            raise _Refused(f"make {os.fsdecode(self.target)}", exc.errno or errno.EIO) from None
        _mount(self.source, self.target, self.fstype, self.flags, self.data)


def _mounts() -> list[tuple[str, int]]:
    """This namespace's mount points and the locked flags of each (``/proc/self/mountinfo``)."""
    found = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            fields = line.split()
            point = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m[1], 8)), fields[4])  # \040...
            flags = sum(_LOCKED.get(option, 0) for option in fields[5].split(","))
            found.append((point, flags))
    return found


def _within(path: str, directory: str) -> bool:
    return path == directory or path.startswith(directory.rstrip("/") + "/")


class MountNamespace:
    """The namespace an emulated sandbox's commands enter: its directory as ``/``.

    Args:
        root: the sandbox's directory on the host.
        system: host directories bound read-only at the same path; one that is a
            symlink (``/bin -> usr/bin``) is the same symlink in the sandbox.
        mounts: host directories bound at sandbox paths (a sandbox's volumes).
        read_only: the paths of ``mounts`` bound read-only.
    """

    def __init__(
        self,
        root: Path,
        system: Sequence[str],
        mounts: Mapping[str, Path] | None = None,
        read_only: Collection[str] = (),
    ) -> None:
        self._root = os.fsencode(root)
        self._uid, self._gid = os.geteuid(), os.getegid()
        table = _mounts()
        links = [_Step(self._at(d), os.fsencode(os.readlink(d)), point="link")
                 for d in system if os.path.islink(d)]  # fmt: skip
        binds = [(d, d, True) for d in system if not os.path.islink(d)]
        binds += [(str(h), p, p in read_only) for p, h in sorted((mounts or {}).items())]
        steps = [*links, *(self._bind(source, path) for source, path, _ in binds)]
        kept = [f"/proc/{p}" for p in _PROC_READ_ONLY if os.path.exists(f"/proc/{p}")]
        steps.append(self._bind("/proc", "/proc"))
        steps += [self._bind(p, p) for p in kept]
        steps.append(_Step(self._at("/dev"), b"tmpfs", b"tmpfs", _MS_NOSUID, b"mode=0755"))
        for device in _DEVICES:
            if os.path.exists(f"/dev/{device}"):
                steps.append(self._bind(f"/dev/{device}", f"/dev/{device}", point="file"))
        plain = _MS_NOSUID | _MS_NODEV
        steps.append(_Step(self._at("/dev/shm"), b"tmpfs", b"tmpfs", plain, b"mode=1777"))
        pts = b"newinstance,ptmxmode=0666,mode=620"
        devices = _MS_NOSUID | _MS_NOEXEC  # not nodev: ptmx is one
        steps.append(_Step(self._at("/dev/pts"), b"devpts", b"devpts", devices, pts))
        steps += [
            _Step(self._at(f"/dev/{name}"), os.fsencode(to), point="link")
            for name, to in _DEV_LINKS.items()
        ]
        # Read-only last, so a mount point made inside a read-only bind (a writable volume
        # in a read-only one) is made first; each mount under a bound tree too.
        read_only_binds = [(s, p) for s, p, ro in binds if ro]
        read_only_binds += [(p, p) for p in kept]
        for source, path in read_only_binds:
            real = os.path.realpath(source)
            below = [(p, f) for p, f in table if _within(p, real)]
            covering = max(
                (m for m in table if _within(real, m[0])), key=lambda m: len(m[0]), default=("/", 0)
            )
            for point, locked in [(real, covering[1]), *(m for m in below if m[0] != real)]:
                inside = self._at(path + point[len(real) :])
                flags = locked | _MS_REMOUNT | _MS_BIND | _MS_RDONLY
                steps.append(_Step(inside, flags=flags, point=""))
        self._steps = tuple(steps)

    def _at(self, path: str) -> bytes:
        return self._root + os.fsencode(path)

    def _bind(self, source: str, path: str, point: Literal["dir", "file"] = "dir") -> _Step:
        return _Step(self._at(path), os.fsencode(source), None, _MS_BIND | _MS_REC, point=point)

    def entering(self, cwd: str) -> Callable[[], None]:
        """What a command's child runs between fork and exec to start in sandbox path
        ``cwd`` inside a fresh namespace; a failure ends the child (status 126), saying why
        on its stderr, as a bubblewrap that cannot set up says on its own."""
        return functools.partial(self._enter, os.fsencode(cwd))

    def _enter(self, cwd: bytes) -> None:
        try:
            self._make()
            os.chroot(self._root)
            os.chdir(cwd)
        except (_Refused, OSError) as exc:
            os.write(2, f"sandbox-router: cannot enter the sandbox's namespace: {exc}\n".encode())
            os._exit(_SETUP_FAILED)

    def _make(self) -> None:
        flags = _CLONE_NEWUSER | _CLONE_NEWNS | _CLONE_NEWUTS | _CLONE_NEWIPC
        _call("unshare", _libc().unshare(flags))
        for name, line in (
            ("setgroups", "deny"),
            ("uid_map", f"{self._uid} {self._uid} 1"),
            ("gid_map", f"{self._gid} {self._gid} 1"),
        ):
            fd = os.open(f"/proc/self/{name}", os.O_WRONLY)
            try:
                os.write(fd, line.encode())
            finally:
                os.close(fd)
        _mount(None, b"/", None, _MS_REC | _MS_PRIVATE)
        _call("sethostname", _libc().sethostname(b"sandbox", 7))
        for step in self._steps:
            step.run()


@functools.cache
def unavailable() -> str | None:
    """Why no command here can have a mount namespace of its own (None: it can), found
    by entering one once, as a command does, in a scratch sandbox directory."""
    if sys.platform != "linux":
        return f"{sys.platform} has no mount namespaces"
    true = os.path.realpath(shutil.which("true") or "/bin/true")
    with tempfile.TemporaryDirectory(prefix="sandbox-router-probe-") as root:
        namespace = MountNamespace(Path(root), system_dirs())
        try:
            ran = subprocess.run(
                [true],
                preexec_fn=namespace.entering("/"),
                capture_output=True,
                timeout=30,
                check=False,
            )
        except (OSError, subprocess.SubprocessError) as exc:
            return str(exc)
    if ran.returncode == 0:
        return None
    said = ran.stderr.decode(errors="replace").strip()
    return said.removeprefix("sandbox-router: cannot enter the sandbox's namespace: ") or (
        f"{true} exited {ran.returncode} in the namespace"
    )


def choose(isolation: str) -> Confinement:
    """The confinement of an emulator's sandboxes for its ``isolation`` option.

    ``auto``: bubblewrap when it is on PATH; ``none``: never; ``bwrap``: it or an error.
    Without it, a mount namespace where this host can make one, else nothing (said
    once per process, naming what differs).

    Raises:
        ConfigError: ``bwrap`` asked for and not on PATH, or an unknown value.
    """
    if isolation not in ("auto", "bwrap", "none"):
        raise ConfigError(f"isolation {isolation!r}: expected 'auto', 'bwrap' or 'none'")
    if isolation != "none" and bwrap_available():
        return "bwrap"
    if isolation == "bwrap":
        raise ConfigError("isolation 'bwrap' requested but bwrap is not on PATH")
    reason = unavailable()
    if reason is None:
        return "namespace"
    _warn_bare(reason)
    return "none"


@functools.cache
def _warn_bare(reason: str) -> None:
    """Said once per process, through the standard ``logging`` module."""
    _log.warning(
        "emulated sandboxes run their commands on the host: no bubblewrap, and no mount "
        "namespace (%s). Vendor paths in a command's text (/home/user, /home/daytona, "
        "/root, /tmp, ...) and in its environment are rewritten onto the sandbox's "
        "directory, and its output shows them back; a path a program builds at run time "
        "or reads from a file is the host's own, volumes are symlinks, read-only volumes "
        "are read-only to the file APIs only, and nothing is isolated",
        reason,
    )
