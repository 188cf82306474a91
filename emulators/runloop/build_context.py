"""A blueprint's build context: the Dockerfile's ``COPY`` and ``ADD`` played from it.

A blueprint's ``build_context`` names a ``READ_ONLY`` object
(`emulators.runloop.objects`) holding a tar of the context directory, as
the SDK's ``upload_from_dir`` (or ``build_docker_context_tar``) makes one:
gzipped, its paths relative to the directory. The build unpacks it into a
scratch directory (members that would land outside it refused, as Docker
refuses them) and `plan` places each `emulators.runloop.dockerfiles.Copy`
as Docker does:

* a source is a path in the context (``..`` and a leading ``/`` stop at its
  root, as BuildKit cleans them), wildcards matching hidden files too, as
  Go's ``filepath.Match`` does; one matching nothing fails the build;
* a directory's contents go into the destination; a file goes to the
  destination, or into it when it ends with ``/`` or is a directory of the
  image; several sources need a destination ending with ``/``;
* ``ADD`` of a tar (plain, gzip, bzip2 or xz, known by its content, not its
  name) unpacks it into the destination directory; any other file is
  copied as ``COPY`` copies it;
* ``--chmod`` sets the mode of what is copied; ``--chown`` is dropped
  (every file is the devbox user's).

A path in the host's (read-only) system directories fails the build, as
any write there does. A ``.dockerignore`` in the context is not applied:
the SDK's ``build_docker_context_tar`` applies it before the upload.
"""

from __future__ import annotations

import glob
import os
import posixpath
import shutil
import tarfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from emulators.filesystem import GuestSandbox
from emulators.runloop.dockerfiles import Copy
from emulators.runloop.objects import unpack

__all__ = ["ContextError", "Placement", "plan"]

_WILDCARD = frozenset("*?[")


class ContextError(Exception):
    """A copy cannot be made from the context; the message says why, as a build log does."""


@dataclass(frozen=True)
class Placement:
    """One source of a copy and where it goes: ``tree`` (a directory's contents into
    ``target``), ``unpack`` (an ``ADD``'s tar into ``target``) or ``file`` (to ``target``,
    or into it when ``into`` or when the image has a directory there)."""

    source: Path
    target: str
    how: str
    into: bool
    mode: int | None

    @property
    def directory(self) -> str:
        """The directory of the image this writes into."""
        if self.how == "file" and not self.into:
            return posixpath.dirname(self.target)
        return self.target

    def apply(self, sandbox: GuestSandbox) -> None:
        """Copy into the sandbox's disk, off the loop.

        Raises:
            PathRefused: a path in a system directory.
            OSError, tarfile.TarError: it cannot be written (or unpacked).
        """
        if self.how == "tree":
            for child in sorted(self.source.iterdir()):
                self._put(child, sandbox.host(posixpath.join(self.target, child.name), write=True))
        elif self.how == "unpack":
            unpack(self.source, sandbox.host(self.target, write=True))
        else:
            target = sandbox.host(self.target, write=True)
            if self.into or target.is_dir():
                target = target / self.source.name
            self._put(self.source, target)

    def _put(self, source: Path, target: Path) -> None:
        target.parent.mkdir(parents=True, exist_ok=True)
        if source.is_dir() and not source.is_symlink():
            shutil.copytree(source, target, symlinks=True, dirs_exist_ok=True)
        else:
            if target.is_symlink() or target.is_file():
                target.unlink()
            shutil.copy2(source, target, follow_symlinks=False)
        if self.mode is not None:
            for path in [target, *(target.rglob("*") if target.is_dir() else ())]:
                if not path.is_symlink():
                    path.chmod(self.mode)


def _matches(context: Path, source: str, copy: Copy) -> list[Path]:
    """The context paths ``source`` names (a wildcard: every match, sorted)."""
    clean = posixpath.normpath("/" + source).lstrip("/") or "."
    if _WILDCARD & set(clean):
        found = sorted(glob.glob(clean, root_dir=context, include_hidden=True))
    else:
        found = [clean] if os.path.lexists(context / clean) else []
    if not found:
        raise ContextError(
            f"{copy.step}: {copy.instruction} failed: file not found in build context: {source}"
        )
    return [context / path for path in found]


def plan(copies: Sequence[Copy], context: Path) -> list[Placement]:
    """Where each copy's sources go, read from the unpacked ``context``.

    Raises:
        ContextError: a source is missing, or several go to a destination not ending in ``/``.
    """
    placements: list[Placement] = []
    for copy in copies:
        found = [path for source in copy.sources for path in _matches(context, source, copy)]
        into = copy.destination.endswith("/")
        if len(found) > 1 and not into:
            raise ContextError(
                f"{copy.step}: When using {copy.instruction} with more than one source file, "
                "the destination must be a directory and end with a /"
            )
        target = copy.destination.rstrip("/") or "/"
        for path in found:
            if path.is_dir() and not path.is_symlink():
                how = "tree"
            elif copy.instruction == "ADD" and _is_tar(path):
                how = "unpack"
            else:
                how = "file"
            placements.append(Placement(path, target, how, into, copy.mode))
    return placements


def _is_tar(path: Path) -> bool:
    try:
        return tarfile.is_tarfile(path)
    except OSError:
        return False
