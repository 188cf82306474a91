"""``modal-sandbox-fs-tools`` as the Modal emulator runs it inside a sandbox.

Modal's SDK implements ``Sandbox.filesystem`` as execs of a binary in the
container, ``/__modal/.bin/modal-sandbox-fs-tools '<json command>'``: file
contents on stdin (``WriteFile``) or stdout (``ReadFile``), listings and
stats as JSON on stdout, watch events as JSON lines on stdout (``Watch``,
until its timeout or the end of stdin), and a failure as exit code 1 with
``{"error_kind", "message"}`` on stderr. This stdlib-only script keeps that
contract; the emulator runs it with the sandbox's Python, from the
working directory, as ``python3 -c <this file> <json command> <json read-only
dirs>``. The paths in the command are as the sandbox's processes see them
(`emulators.filesystem.GuestSandbox.inside`); a write under one of the
read-only directories (the system's and read-only volumes', bound read-only
under bubblewrap) fails as the read-only mount makes it fail, also where no
mount enforces it.
"""

from __future__ import annotations

import errno
import json
import os
import posixpath
import select
import shutil
import stat
import sys
import time
from typing import Any

_KINDS = {
    errno.ENOENT: "NotFound",
    errno.EISDIR: "IsDirectory",
    errno.ENOTDIR: "NotDirectory",
    errno.EACCES: "PermissionDenied",
    errno.EPERM: "PermissionDenied",
    errno.EROFS: "PermissionDenied",
    errno.EEXIST: "AlreadyExists",
    errno.ENOTEMPTY: "DirectoryNotEmpty",
    errno.EFBIG: "FileTooLarge",
}


class ToolError(Exception):
    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message


def _oserror(exc: OSError) -> ToolError:
    kind = _KINDS.get(exc.errno or 0, "Io")
    return ToolError(kind, f"{exc.strerror} (os error {exc.errno})")


class Tool:
    def __init__(self, readonly: list[str]) -> None:
        self.readonly = [os.path.realpath(d) for d in readonly]  # a mount's symlink resolved

    def writable(self, path: str) -> str:
        real = os.path.realpath(path)
        if any(real == d or real.startswith(d + "/") for d in self.readonly):
            raise ToolError("PermissionDenied", "Read-only file system (os error 30)")
        return path

    def entry(self, path: str) -> dict[str, Any]:
        info = os.lstat(path)
        kind = (
            "symlink"
            if stat.S_ISLNK(info.st_mode)
            else "directory"
            if stat.S_ISDIR(info.st_mode)
            else "file"
        )
        return {
            "name": posixpath.basename(path),
            "path": path,
            "type": kind,
            "size": info.st_size,
            "mode": info.st_mode,
            "permissions": stat.filemode(info.st_mode),
            "owner": str(info.st_uid),
            "group": str(info.st_gid),
            "modified_time": info.st_mtime,
            "symlink_target": os.readlink(path) if kind == "symlink" else None,
        }

    def ReadFile(self, path: str) -> None:
        if os.path.isdir(path):
            raise ToolError("IsDirectory", "Is a directory (os error 21)")
        with open(path, "rb") as source:
            shutil.copyfileobj(source, sys.stdout.buffer)

    def WriteFile(self, path: str) -> None:
        if os.path.isdir(self.writable(path)):
            raise ToolError("IsDirectory", "Is a directory (os error 21)")
        parent = posixpath.dirname(path)
        if parent:
            os.makedirs(parent, exist_ok=True)
        with open(path, "wb") as target:
            shutil.copyfileobj(sys.stdin.buffer, target)

    def ListFiles(self, path: str) -> None:
        if os.path.exists(path) and not os.path.isdir(path):
            raise ToolError("NotDirectory", "Not a directory (os error 20)")
        entries = [self.entry(posixpath.join(path, name)) for name in sorted(os.listdir(path))]
        json.dump(entries, sys.stdout)

    def Stat(self, path: str) -> None:
        json.dump(self.entry(path), sys.stdout)

    def MakeDirectory(self, path: str, parents: bool = True) -> None:
        if parents:
            os.makedirs(self.writable(path), exist_ok=True)
        elif os.path.lexists(path):
            raise ToolError("PathAlreadyExists", "File exists (os error 17)")
        else:
            os.mkdir(self.writable(path))

    def Remove(self, path: str, recursive: bool = False) -> None:
        if os.path.realpath(self.writable(path)) == os.getcwd():
            raise ToolError("PermissionDenied", "Permission denied: the working directory itself")
        if os.path.isdir(path) and not os.path.islink(path):
            if recursive:
                shutil.rmtree(path)
            else:
                os.rmdir(path)
        else:
            os.remove(path)

    def Watch(
        self,
        path: str,
        recursive: bool = False,
        filter: list[str] | None = None,
        timeout_secs: float | None = None,
    ) -> None:
        """One JSON line per change (``{"event_type", "paths"}``) to ``path`` (a file, or a
        directory's entries, nested ones too when ``recursive``) until ``timeout_secs`` pass
        or stdin ends; found by polling the tree every `WATCH_INTERVAL` seconds."""
        if not os.path.exists(path):
            raise ToolError("NotFound", "No such file or directory (os error 2)")
        deadline = None if timeout_secs is None else time.monotonic() + timeout_secs
        seen = _tree(path, recursive)
        while deadline is None or time.monotonic() < deadline:
            wait = (
                WATCH_INTERVAL
                if deadline is None
                else min(WATCH_INTERVAL, deadline - time.monotonic())
            )
            ready, _, _ = select.select([sys.stdin], [], [], max(wait, 0))
            if ready and not os.read(sys.stdin.fileno(), 65536):
                return
            now = _tree(path, recursive)
            changes = [("Create", p) for p in now.keys() - seen.keys()]
            changes += [("Remove", p) for p in seen.keys() - now.keys()]
            changes += [("Modify", p) for p in now.keys() & seen.keys() if now[p] != seen[p]]
            for kind, changed in sorted(changes, key=lambda c: c[1]):
                if filter is None or kind in filter:
                    print(json.dumps({"event_type": kind, "paths": [changed]}), flush=True)
            seen = now


WATCH_INTERVAL = 0.1


def _tree(path: str, recursive: bool) -> dict[str, tuple[int, int, int]]:
    """What is at ``path`` (a directory: what is in it), each with its mode, size and mtime."""
    found: dict[str, tuple[int, int, int]] = {}

    def note(at: str) -> None:
        try:
            info = os.lstat(at)
        except OSError:
            return
        found[at] = (info.st_mode, info.st_size, info.st_mtime_ns)

    if not os.path.isdir(path):
        note(path)
        return found
    for parent, dirs, files in os.walk(path):
        for name in dirs + files:
            note(posixpath.join(parent, name))
        if not recursive:
            break
    return found


def main(argv: list[str]) -> int:
    command = json.loads(argv[1])
    ((name, args),) = command.items()
    tool = Tool(json.loads(argv[2]))
    try:
        method = getattr(tool, name, None) if name[:1].isupper() else None
        if method is None:
            raise ToolError("NotSupported", f"{name} is not supported by the Modal emulator")
        method(**args)
    except ToolError as exc:
        json.dump({"error_kind": exc.kind, "message": exc.message}, sys.stderr)
        return 1
    except OSError as exc:
        error = _oserror(exc)
        json.dump({"error_kind": error.kind, "message": error.message}, sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
