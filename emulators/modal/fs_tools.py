"""``modal-sandbox-fs-tools`` as the Modal emulator runs it inside a sandbox.

Modal's SDK implements ``Sandbox.filesystem`` as execs of a binary in the
container, ``/__modal/.bin/modal-sandbox-fs-tools '<json command>'``: file
contents on stdin (``WriteFile``) or stdout (``ReadFile``), listings and
stats as JSON on stdout, and a failure as exit code 1 with
``{"error_kind", "message"}`` on stderr. This stdlib-only script keeps that
contract; the emulator runs it with the sandbox's Python, from the sandbox
directory, as ``python3 -c <this file> <json command> <home>``: paths under
``<home>`` (the sandbox's Modal working directory) are that directory, other
paths are refused as the only part of the container the emulator models.
"""

from __future__ import annotations

import errno
import json
import os
import posixpath
import shutil
import stat
import sys
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
    def __init__(self, home: str) -> None:
        self.home = home.rstrip("/") or "/"

    def local(self, path: str) -> str:
        path = posixpath.normpath(path)
        if path == self.home:
            return "."
        if path.startswith(self.home + "/"):
            return path[len(self.home) + 1 :]
        raise ToolError(
            "PermissionDenied",
            f"Permission denied: {path} is outside {self.home}, the only directory "
            "the Modal emulator models",
        )

    def modal(self, local: str) -> str:
        return self.home if local == "." else f"{self.home}/{local}"

    def entry(self, local: str) -> dict[str, Any]:
        info = os.lstat(local)
        kind = (
            "symlink"
            if stat.S_ISLNK(info.st_mode)
            else "directory"
            if stat.S_ISDIR(info.st_mode)
            else "file"
        )
        return {
            "name": posixpath.basename(self.modal(local)),
            "path": self.modal(local),
            "type": kind,
            "size": info.st_size,
            "mode": info.st_mode,
            "permissions": stat.filemode(info.st_mode),
            "owner": str(info.st_uid),
            "group": str(info.st_gid),
            "modified_time": info.st_mtime,
            "symlink_target": os.readlink(local) if kind == "symlink" else None,
        }

    def ReadFile(self, path: str) -> None:
        local = self.local(path)
        if os.path.isdir(local):
            raise ToolError("IsDirectory", "Is a directory (os error 21)")
        with open(local, "rb") as source:
            shutil.copyfileobj(source, sys.stdout.buffer)

    def WriteFile(self, path: str) -> None:
        local = self.local(path)
        if os.path.isdir(local):
            raise ToolError("IsDirectory", "Is a directory (os error 21)")
        parent = posixpath.dirname(local)
        if parent:
            os.makedirs(parent, exist_ok=True)
        with open(local, "wb") as target:
            shutil.copyfileobj(sys.stdin.buffer, target)

    def ListFiles(self, path: str) -> None:
        local = self.local(path)
        if os.path.exists(local) and not os.path.isdir(local):
            raise ToolError("NotDirectory", "Not a directory (os error 20)")
        names = sorted(os.listdir(local))
        entries = [self.entry(name if local == "." else f"{local}/{name}") for name in names]
        json.dump(entries, sys.stdout)

    def Stat(self, path: str) -> None:
        json.dump(self.entry(self.local(path)), sys.stdout)

    def MakeDirectory(self, path: str, parents: bool = True) -> None:
        local = self.local(path)
        if parents:
            os.makedirs(local, exist_ok=True)
        elif os.path.lexists(local):
            raise ToolError("PathAlreadyExists", "File exists (os error 17)")
        else:
            os.mkdir(local)

    def Remove(self, path: str, recursive: bool = False) -> None:
        local = self.local(path)
        if local == ".":
            raise ToolError("PermissionDenied", "Permission denied: the working directory itself")
        if os.path.isdir(local) and not os.path.islink(local):
            if recursive:
                shutil.rmtree(local)
            else:
                os.rmdir(local)
        else:
            os.remove(local)


def main(argv: list[str]) -> int:
    command = json.loads(argv[1])
    ((name, args),) = command.items()
    tool = Tool(argv[2])
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
