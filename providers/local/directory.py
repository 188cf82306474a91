"""`LocalDirectory`: what a ``local`` sandbox is on disk, and how its paths are named.

The base of `providers.local.sandbox.LocalSandbox`, under its file calls
(`providers.local.files`) and its commands (`providers.local.commands`):
the directory, the metadata, the marks beside them (``<id>.paused``,
``<id>.procs``), and the mapping of a sandbox path (relative, or under
`HOME`) to the directory, its symlinks walked inside it
(`providers.local.paths`).
"""

from __future__ import annotations

import os
import posixpath
from pathlib import Path
from typing import TYPE_CHECKING, Any

from providers.base import Sandbox
from providers.errors import NotFound, SandboxError, SandboxPathError
from providers.local.isolation import HOME
from providers.local.paths import Escape, Tree

if TYPE_CHECKING:
    from providers.local.provider import LocalProvider

__all__ = ["LocalDirectory"]


class LocalDirectory(Sandbox):
    """A sandbox's private directory, its metadata and the marks beside them."""

    def __init__(self, provider: LocalProvider, sandbox_id: str, meta: dict[str, Any]) -> None:
        self._provider = provider
        self.id = sandbox_id
        self.provider = provider.name
        self.meta = meta
        self.dir = provider.root / sandbox_id
        self._cgroup: str | None = meta.get("cgroup")
        self._tracked = False

    @property
    def _procs(self) -> str:
        """Made by the first command (the kill looks for processes then only); holds the
        records of background processes (`providers.local.processes`)."""
        return os.path.join(self._provider.root, f"{self.id}.procs")

    @property
    def native(self) -> Path:
        return self.dir

    @property
    def labels(self) -> dict[str, str]:
        return dict(self.meta["labels"])

    @property
    def _paused(self) -> str:
        """Beside the metadata while the sandbox is paused: any process on the host sees it."""
        return os.path.join(self._provider.root, f"{self.id}.paused")

    def _check_alive(self) -> None:
        if not self.dir.is_dir():
            raise NotFound(
                f"local sandbox {self.id} was killed", provider=self.provider, sandbox_id=self.id
            )

    @property
    def paused(self) -> bool:
        return os.path.exists(self._paused)

    def _check_running(self) -> None:
        """Before a command starts: alive, and not paused (its command would hang frozen)."""
        self._check_alive()
        if self.paused:
            raise SandboxError(
                f"local sandbox {self.id} is paused: resume it to run commands",
                provider=self.provider,
                sandbox_id=self.id,
            )

    @property
    def _tree(self) -> Tree:
        return Tree(str(self.dir), HOME)

    def _inner(self, path: str) -> str:
        """``path`` from the sandbox's directory: a relative path, or one under
        /home/sandbox (or the directory's host path); anything else is refused."""
        if "\x00" in path:
            raise SandboxPathError(
                "path contains a NUL byte", provider=self.provider, sandbox_id=self.id
            )
        for base in (HOME, str(self.dir)):
            if path == base or path.startswith(base + "/"):
                return path[len(base) :].lstrip("/") or "."
        if os.path.isabs(path):
            raise SandboxPathError(
                f"path {path!r} is outside the sandbox (use a relative path or {HOME}/...)",
                provider=self.provider,
                sandbox_id=self.id,
            )
        return path

    def resolve(self, path: str) -> Path:
        """The host path of a sandbox path (relative, or under /home/sandbox), its
        symlinks resolved inside the sandbox (`Tree.locate`).

        For a command's ``cwd`` only: the file calls act on what they locate
        themselves. A path through a missing directory is kept as written:
        the command then fails to start in it, as it would under bwrap.
        """
        inner = self._inner(path)
        try:
            with self._tree.locate(inner, follow=True) as found:
                return self.dir.joinpath(*found.parts)
        except Escape:
            raise self._escape(path) from None
        except OSError:
            return self.dir / posixpath.normpath(inner)

    def _escape(self, path: str) -> SandboxPathError:
        return SandboxPathError(
            f"path {path!r} escapes the sandbox directory",
            provider=self.provider,
            sandbox_id=self.id,
        )

    def _error(self, message: str) -> SandboxError:
        return SandboxError(message, provider=self.provider, sandbox_id=self.id)

    @property
    def alive(self) -> bool:
        return self.dir.is_dir()
