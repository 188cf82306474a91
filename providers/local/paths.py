"""Paths inside a local sandbox's directory, walked one name at a time by descriptor.

A command in the sandbox may swap a directory for a symlink at any moment.
A path checked first (``realpath``) and used after can then lead out of the
sandbox: a swap between the two sent about one read in 300 to the host's
files under a tight loop of swaps. So a file call never hands the kernel a
path of more than one name: `Tree.locate` walks from the sandbox
directory's descriptor, opening each directory with ``O_NOFOLLOW`` relative
to the one before (``dir_fd``), and follows a symlink only by reading it and
walking its target inside the same tree. An absolute target under the
sandbox's home (or its host directory) starts again at the root; any other
absolute target, and ``..`` above the root, is an `Escape`. What the call
acts on is one name in a directory it holds open, used with ``O_NOFOLLOW``
or ``follow_symlinks=False``, so a symlink that appears there meanwhile is
refused (``ELOOP``), never followed.

A whole tree (a snapshot) is copied by path (`copy_tree`): only while its
sandbox is paused, or before its sandbox exists.
"""

from __future__ import annotations

import contextlib
import errno
import os
import posixpath
import shutil
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Escape", "Located", "Tree", "copy_tree"]

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_MAX_LINKS = 40  # as the kernel's own limit on symlinks in one lookup


class Escape(ValueError):
    """The path, or a symlink on it, leads out of the tree."""


@dataclass(frozen=True, slots=True)
class Located:
    """One name in an open directory: what a file call acts on.

    ``name`` is empty for the tree's root itself (``parent`` is then the
    root). ``parts`` is the canonical path from the root, symlinks resolved.
    """

    parent: int
    name: str
    parts: tuple[str, ...]

    def lstat(self) -> os.stat_result:
        if not self.name:
            return os.stat(self.parent)
        return os.stat(self.name, dir_fd=self.parent, follow_symlinks=False)

    def open(self, flags: int, mode: int = 0o666) -> int:
        """Open the name itself (never a symlink put there since the walk)."""
        if not self.name:
            return os.open(".", flags | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=self.parent)
        return os.open(self.name, flags | os.O_NOFOLLOW | os.O_CLOEXEC, mode, dir_fd=self.parent)


class Tree:
    """A directory tree seen from inside: ``home`` is its root's name to commands.

    Attributes:
        root: the tree's directory on the host.
        home: the absolute path commands see the root at.
    """

    def __init__(self, root: str, home: str) -> None:
        self.root = root
        self.home = home

    @contextmanager
    def locate(self, path: str, *, follow: bool, make_parents: bool = False) -> Iterator[Located]:
        """Walk ``path`` (relative to the root) and yield its last name in its open directory.

        ``follow``: a symlink as the last name is followed too (for reads and
        writes of the file); without it the link itself is located (remove,
        rename, stat). ``make_parents``: missing directories on the way are
        made. A missing directory on the way raises FileNotFoundError; the
        last name may be missing. Every descriptor is closed on exit.
        """
        stack = [os.open(self.root, _DIR_FLAGS)]
        names: list[str] = []
        pending = [p for p in posixpath.normpath(path).split("/") if p not in ("", ".")]
        links = 0
        try:
            while pending:
                name = pending.pop(0)
                if name == "..":
                    if not names:
                        raise Escape(path)
                    os.close(stack.pop())
                    names.pop()
                    continue
                last = not pending
                try:
                    st = os.stat(name, dir_fd=stack[-1], follow_symlinks=False)
                except FileNotFoundError:
                    if last:
                        yield Located(stack[-1], name, (*names, name))
                        return
                    if not make_parents:
                        raise
                    with contextlib.suppress(FileExistsError):
                        os.mkdir(name, dir_fd=stack[-1])
                else:
                    if stat.S_ISLNK(st.st_mode) and (follow or not last):
                        links += 1
                        if links > _MAX_LINKS:
                            raise OSError(errno.ELOOP, os.strerror(errno.ELOOP), path)
                        target = os.readlink(name, dir_fd=stack[-1])
                        if target.startswith("/"):
                            target = self._inside(target, path)
                            while len(stack) > 1:
                                os.close(stack.pop())
                            names.clear()
                        pending[:0] = [p for p in target.split("/") if p not in ("", ".")]
                        continue
                    if last:
                        yield Located(stack[-1], name, (*names, name))
                        return
                stack.append(os.open(name, _DIR_FLAGS, dir_fd=stack[-1]))
                names.append(name)
            if names:  # the path ended on a directory reached through `..` or a link
                yield Located(stack[-2], names[-1], tuple(names))
            else:
                yield Located(stack[0], "", ())
        finally:
            for fd in stack:
                os.close(fd)

    def _inside(self, target: str, path: str) -> str:
        """An absolute symlink target as a path from the root, if it names the tree."""
        target = posixpath.normpath(target)
        for base in (self.home, self.root):
            if target == base or target.startswith(base.rstrip("/") + "/"):
                return target[len(base) :]
        raise Escape(path)


def copy_tree(source: Path, target: Path) -> None:
    """Copy a sandbox's tree: symlinks as links, FIFOs, sockets and devices left out
    (a FIFO would block the copy; a socket's server is gone with its process)."""

    def specials(directory: str, names: list[str]) -> set[str]:
        kinds = (stat.S_ISREG, stat.S_ISDIR, stat.S_ISLNK)
        return {
            n
            for n in names
            if not any(k(os.lstat(os.path.join(directory, n)).st_mode) for k in kinds)
        }

    shutil.copytree(source, target, symlinks=True, ignore=specials)
