"""An emulated sandbox's whole filesystem, and its commands run inside it.

A cloud sandbox is a machine of its own: ``/tmp``, the user's home
(``/home/daytona``, ``/home/user``, ``/root``) and ``cwd="/"`` all work, and
the file APIs take any absolute path. `GuestSandbox` models that on one host
directory, the sandbox's root: its own directories (the home, ``/root``,
``/tmp``, ...) are real directories in it, and the system directories
(``/usr``, ``/etc``, ...) are the host's, read-only.

Each command runs with that directory as ``/`` (the system directories bound
read-only over it), so paths are the vendor's exactly: under bubblewrap, or
without it in a mount namespace of the command's own (`emulators.confinement`).
It shares the host's network, as a vendor's sandbox has network: a server it
starts on a port is reachable on 127.0.0.1, where the emulator's port ingress
forwards to. Where no namespace can be made (``confinement="none"``: macOS)
commands run on the host, and the emulator makes them look the same as far as
text allows: vendor paths of the sandbox's own directories in a command (and
in its environment) are rewritten onto the sandbox's host directory, the
command starts in the host directory of its working directory with ``HOME``
and ``TMPDIR`` there, and the host directory is written back as ``/`` in its
output. So ``pwd`` prints ``/home/daytona``; what a program computes from a
path at run time (or reads from a file) is not rewritten, and nothing is
isolated. The file APIs map paths the same way whatever the confinement, and
never write into the host's system directories, nor anywhere on the host
outside the sandbox's directory and its mounts.

A sandbox may mount host directories (`GuestSandbox` ``mounts``: a Daytona
volume), shared with other sandboxes and outliving it: each is bound at its
path; without a namespace the path is a symlink to the host directory, so the
rewritten paths of a command reach it. The file APIs map a mounted path
straight onto its host directory either way. A ``read_only`` mount is bound
read-only and the file APIs refuse to write in it; without a namespace its
commands can still write there (a symlink cannot be read-only).
"""

from __future__ import annotations

import asyncio
import os
import posixpath
import re
import shutil
from collections.abc import Collection, Mapping, Sequence
from pathlib import Path
from typing import Any

from emulators.confinement import Confinement, MountNamespace
from providers.base import Snapshot
from providers.errors import SandboxError
from providers.local import LocalProcess, LocalProvider, LocalSandbox
from providers.local.isolation import COMMAND_PATH, bwrap_command, system_dirs

__all__ = ["GUEST_BIN", "GuestSandbox", "PathRefused", "mountable"]

_OWN_DIRS = ("root", "tmp", "var/tmp", "opt", "mnt", "srv", "proc", "dev")
_SYMLINK_HOPS = 40
_CHUNK = 65536
_HOLD_SECONDS = 0.05


class PathRefused(Exception):
    """A path the sandbox cannot use that way (a write into a read-only system directory)."""


GUEST_BIN = "/__emulator/bin"
"""Last on a command's default PATH: a ``python`` (to ``python3``), which every vendor's
image has and a host may not."""


def mountable(path: str) -> bool:
    """Whether a host directory may be mounted at sandbox path ``path``: an absolute path
    neither in a system directory nor over one (they are the host's, read-only)."""
    path = posixpath.normpath(path)
    return path.startswith("/") and not any(
        path == d or path.startswith(d + "/") or d.startswith(path.rstrip("/") + "/")
        for d in system_dirs()
    )


def _within(path: str, directory: str) -> bool:
    return path == directory or path.startswith(directory.rstrip("/") + "/")


class GuestSandbox(LocalSandbox):
    """A local sandbox whose directory is the root of a vendor sandbox's filesystem.

    Args:
        local: the sandbox the emulator's `LocalProvider` made (its directory
            becomes the root; the provider runs commands without isolation of
            its own, `GuestSandbox` adds it).
        home: the vendor's home (``HOME``, where relative paths and commands start).
        confinement: how commands are kept to the root (`emulators.confinement.choose`):
            bubblewrap, a mount namespace, or ``none`` (their paths rewritten).
        dirs: further directories the image has (a Modal workdir).
        mounts: host directories mounted at sandbox paths (absolute, outside the
            system directories), by path.
        read_only: the paths of ``mounts`` mounted read-only.

    Raises:
        PathRefused: a mount on, in or over a system directory (they are the host's).
    """

    def __init__(
        self,
        local: LocalSandbox,
        home: str,
        *,
        confinement: Confinement,
        dirs: Sequence[str] = (),
        mounts: Mapping[str, Path] | None = None,
        read_only: Collection[str] = (),
    ) -> None:
        provider: LocalProvider = local._provider
        super().__init__(provider, local.id, local.meta)
        self.home = posixpath.normpath(home)
        self.confinement: Confinement = confinement
        self.bare = confinement == "none"  # commands on the host, their paths rewritten
        self.dirs = tuple(dirs)
        self.root = self.dir.resolve()
        self._system = system_dirs()
        self.system_dirs = [d for d in self._system if not os.path.islink(d)]
        self.mounts = {posixpath.normpath(p): Path(h) for p, h in (mounts or {}).items()}
        for path in self.mounts:
            if not mountable(path):
                raise PathRefused(f"{path}: cannot mount on a system directory")
        self.read_only: frozenset[str] = frozenset()  # the layout makes their mount points
        self._layout([self.home, *dirs])
        self.read_only = frozenset(posixpath.normpath(p) for p in read_only)
        self._namespace = (
            MountNamespace(self.root, self._system, self.mounts, self.read_only)
            if confinement == "namespace"
            else None
        )
        system = {d.strip("/").split("/")[0] for d in self._system}
        tops = {d.strip("/").split("/")[0] for d in [*dirs, *self.mounts] if d.strip("/")} - system
        own = sorted(
            {*(d.split("/")[0] for d in _OWN_DIRS), "home", self.home.split("/")[1], *tops}
        )
        # The host directory itself first, so a path `inside` made is left as it is.
        self._own = re.compile(
            re.escape(str(self.root))
            + r"|(?<![\w.~/-])/(?:"
            + "|".join(map(re.escape, own))
            + r")(?![\w.-])"
        )
        root = re.escape(str(self.root).encode())
        self._host_text = re.compile(root + rb"(?:/|(?=[^\w.-]))")
        self._host_text_end = re.compile(root + rb"\Z")
        self._pumps: set[asyncio.Task[None]] = set()

    def _layout(self, dirs: Sequence[str]) -> None:
        """The usual directories, and the host's system directory symlinks (``/bin -> usr/bin``)."""
        for system in self._system:
            inside = self.root / system.lstrip("/")
            if os.path.islink(system) and not os.path.lexists(inside):
                os.symlink(os.readlink(system), inside)
            elif not os.path.lexists(inside):
                inside.mkdir(parents=True)
        for own in [*_OWN_DIRS, *(d.lstrip("/") for d in dirs)]:
            (self.root / own).mkdir(parents=True, exist_ok=True)
        shim = self.root / GUEST_BIN.lstrip("/") / "python"
        if not shim.exists():
            shim.parent.mkdir(parents=True, exist_ok=True)
            shim.write_text('#!/bin/sh\nexec python3 "$@"\n')
            shim.chmod(0o755)
        for path in sorted(self.mounts, key=len):  # a mount inside another goes in after it
            parent, name = posixpath.split(path)
            point = self.host(parent, write=True) / name
            point.parent.mkdir(parents=True, exist_ok=True)
            if point.is_symlink() or point.is_file():
                point.unlink()
            elif point.is_dir() and self.bare:
                shutil.rmtree(point)  # what a mount would hide
            if self.bare:
                point.symlink_to(self.mounts[path], target_is_directory=True)
            else:
                point.mkdir(exist_ok=True)  # the mount goes over it

    # -- paths --------------------------------------------------------------
    def absolute(self, path: str, cwd: str | None = None) -> str:
        """``path`` as an absolute, normalized sandbox path (``~`` and relative: from the home)."""
        if "\x00" in path:
            raise PathRefused("path contains a NUL byte")
        if path == "~" or path.startswith("~/"):
            path = self.home + path[1:]
        path = posixpath.join(cwd or self.home, path)
        return "/" + posixpath.normpath(path).lstrip("/") if path != "/" else "/"

    def host(self, path: str, *, write: bool = False, cwd: str | None = None) -> Path:
        """The host path of a sandbox path, its symlinks followed inside the sandbox.

        Raises:
            PathRefused: ``write`` into a (read-only) system directory.
        """
        parts = self.absolute(path, cwd).split("/")[1:]
        resolved: list[str] = []
        hops = 0
        while parts:
            name = parts.pop(0)
            if name in ("", "."):
                continue
            if name == "..":
                if resolved:
                    resolved.pop()
                continue
            candidate = "/" + "/".join([*resolved, name])
            if self._system_dir(candidate):
                rest = posixpath.normpath("/".join([candidate, *parts]))
                if not self._system_dir(rest):  # a symlink's ".." led out again
                    parts, resolved = rest.split("/")[1:], []
                    continue
                if write:
                    raise PathRefused(f"{path}: read-only file system")
                return Path(rest)
            inside = self._mapped([*resolved, name])
            if inside.is_symlink():
                hops += 1
                if hops > _SYMLINK_HOPS:
                    raise PathRefused(f"{path}: too many levels of symbolic links")
                target = os.readlink(inside)
                if target == str(self.root) or target.startswith(str(self.root) + "/"):
                    target = target[len(str(self.root)) :] or "/"
                if target.startswith("/"):
                    resolved = []
                parts = target.split("/") + parts
                continue
            resolved.append(name)
        if write and self._read_only("/" + "/".join(resolved)):
            raise PathRefused(f"{path}: read-only file system")
        return self._mapped(resolved)

    def _mapped(self, parts: list[str]) -> Path:
        """The host path of the sandbox path of ``parts`` (symlinks resolved): in the host
        directory mounted over it, if there is one."""
        path = "/" + "/".join(parts)
        for mount in sorted(self.mounts, key=len, reverse=True):
            if path == mount or path.startswith(mount + "/"):
                return self.mounts[mount].joinpath(path[len(mount) :].lstrip("/"))
        return self.root.joinpath(*parts)

    def _read_only(self, path: str) -> bool:
        """Whether ``path`` is in a read-only mount (and no writable one inside it)."""
        mount = next(
            (m for m in sorted(self.mounts, key=len, reverse=True) if _within(path, m)), None
        )
        return mount in self.read_only

    def _system_dir(self, path: str) -> bool:
        return any(path == d or path.startswith(d + "/") for d in self.system_dirs)

    def vendor(self, host: Path) -> str:
        """The sandbox path of a host path `host` returned."""
        for mount, source in sorted(self.mounts.items(), key=lambda m: len(m[0]), reverse=True):
            if host.is_relative_to(source):
                rest = host.relative_to(source)
                return mount if rest == Path() else f"{mount}/{rest}"
        if host == self.root:
            return "/"
        if host.is_relative_to(self.root):
            return "/" + str(host.relative_to(self.root))
        return str(host)

    def inside(self, path: str, cwd: str | None = None) -> str:
        """The path a command in the sandbox uses for sandbox path ``path``."""
        return self._bare(self.host(path, cwd=cwd)) if self.bare else self.absolute(path, cwd)

    def _bare(self, host: Path) -> str:
        """A host path as a bare command uses it: a mounted one through the mount's
        symlink (so its output shows the sandbox path)."""
        if any(host.is_relative_to(source) for source in self.mounts.values()):
            return str(self.root) + self.vendor(host)
        return str(host)

    def rewrite(self, text: str) -> str:
        """``text`` (a command, code) with the sandbox's own paths as its commands see them."""
        if not self.bare:
            return text
        root = str(self.root)
        return self._own.sub(lambda m: m[0] if m[0] == root else root + m[0], text)

    async def snapshot(self, name: str | None = None) -> Snapshot:
        """The sandbox's files, its mounts' left out as a container commit leaves them: an
        empty directory at each mount path (a bare sandbox's copy has the symlink)."""
        kept = await super().snapshot(name)
        if self.bare:
            copy = self._provider._snapshot_dir(kept.id)
            for path, source in self.mounts.items():
                link = copy / path.lstrip("/")
                if link.is_symlink() and os.readlink(link) == str(source):
                    link.unlink()
                    link.mkdir()
        return kept

    # -- commands -----------------------------------------------------------
    async def spawn(
        self,
        cmd: str | Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
    ) -> LocalProcess:
        """Start a command in the sandbox, from ``cwd`` (a sandbox path; default the home).

        Raises:
            SandboxError: ``cwd`` is not a directory of the sandbox.
        """
        argv = ["/bin/bash", "-c", cmd] if isinstance(cmd, str) else list(cmd)
        where = self.absolute(cwd or self.home)
        try:
            workdir = self.host(where)
        except PathRefused as exc:
            raise SandboxError(str(exc), provider=self.provider, sandbox_id=self.id) from None
        if not workdir.is_dir():
            raise SandboxError(
                f"cannot start {argv[0]!r}: no such directory {where!r}",
                provider=self.provider,
                sandbox_id=self.id,
            )
        values = {
            k: self.rewrite(v) for k, v in {**self.meta.get("env", {}), **(env or {})}.items()
        }
        values = {
            "HOME": self.inside(self.home),
            "TMPDIR": self.inside("/tmp"),
            "PATH": f"{COMMAND_PATH}:{self.inside(GUEST_BIN)}",  # the host's venv is not in here
            **values,
        }
        if self.confinement == "bwrap":
            return await super().spawn(self._bwrap(where) + argv, env=values)
        if self._namespace is not None:
            return await self._enter(argv, values, where, self._namespace)
        shell = 'cd -- "$0" && exec "$@"'
        argv = ["/bin/sh", "-c", shell, self._bare(workdir), *map(self.rewrite, argv)]
        process = await super().spawn(argv, env=values)
        proc = process.proc
        proc.stdout = self._unmapped(proc.stdout)
        proc.stderr = self._unmapped(proc.stderr)
        return process

    async def _enter(
        self, argv: list[str], env: dict[str, str], cwd: str, namespace: MountNamespace
    ) -> LocalProcess:
        """Start ``argv`` in a namespace of its own, in sandbox directory ``cwd``."""
        self._check_running()
        self._track()
        pipe = asyncio.subprocess.PIPE
        proc = await self._exec(
            argv, str(self.root), env, argv[0], stdio=(pipe, pipe, pipe),
            enter=namespace.entering(cwd),
        )  # fmt: skip
        return LocalProcess(proc, self._provider.opts.max_output_bytes)

    def _bwrap(self, cwd: str) -> list[str]:
        cmd = [bwrap_command(), "--unshare-all", "--share-net", "--die-with-parent"]
        cmd += ["--bind", str(self.root), "/"]
        for system in self.system_dirs:
            cmd += ["--ro-bind", system, system]
        for mount in sorted(self.mounts, key=len):
            bind = "--ro-bind" if mount in self.read_only else "--bind"
            cmd += [bind, str(self.mounts[mount]), mount]
        cmd += ["--proc", "/proc", "--dev", "/dev", "--chdir", cwd, "--hostname", "sandbox"]
        return [*cmd, "--"]

    def _unmapped(self, source: asyncio.StreamReader | None) -> Any:
        """A reader of ``source`` with the sandbox's host directory written back as ``/``."""
        if source is None:
            return None
        sink = asyncio.StreamReader(limit=2**20)
        task = asyncio.get_running_loop().create_task(self._unmap(source, sink))
        self._pumps.add(task)
        task.add_done_callback(self._pumps.discard)
        return sink

    async def _unmap(self, source: asyncio.StreamReader, sink: asyncio.StreamReader) -> None:
        """Copy ``source`` to ``sink``, rewriting; a tail that may begin the host directory's
        path waits for the next chunk (at most `_HOLD_SECONDS`), so a split path is caught."""
        held = b""
        root = str(self.root).encode()
        try:
            while True:
                try:
                    if held:
                        chunk = await asyncio.wait_for(source.read(_CHUNK), _HOLD_SECONDS)
                    else:
                        chunk = await source.read(_CHUNK)
                except TimeoutError:
                    sink.feed_data(self._host_text_end.sub(b"/", held))
                    held = b""
                    continue
                if not chunk:
                    break
                text = self._host_text.sub(b"/", held + chunk)
                keep = next(
                    (n for n in range(min(len(root), len(text)), 0, -1) if text.endswith(root[:n])),
                    0,
                )
                held = text[len(text) - keep :] if keep else b""
                sink.feed_data(text[: len(text) - keep])
            sink.feed_data(self._host_text_end.sub(b"/", held))
        finally:
            sink.feed_eof()
