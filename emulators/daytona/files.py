"""The daemon's files: listing them, and managing them as the daemon does.

Under ``{toolboxProxyUrl}/{sandboxId}`` (`emulators.daytona.toolbox` answers for the proxy):
``GET /files?path=&depth=`` lists a directory, ``POST /files/folder``,
``DELETE /files``, ``GET /files/info``, ``POST /files/move``, ``POST
/files/permissions``, ``GET /files/find`` (lines holding a text), ``GET
/files/search`` (names matching a glob), ``POST /files/replace``. Paths are
the sandbox's (`emulators.filesystem.GuestSandbox`); an OS error is
answered as the daemon answers it (`os_call`). Moving bytes in and out is
`emulators.daytona.transfers`.
"""

from __future__ import annotations

import asyncio
import fnmatch
import grp
import os
import posixpath
import pwd
import shutil
import stat
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from aiohttp import web

from emulators.daytona.sandboxes import Box, iso
from emulators.daytona.toolbox import BOX, DaemonError, json_body
from emulators.filesystem import PathRefused

__all__ = ["Files", "host_path", "os_call", "required", "writable"]


class Files:
    """The file listing and managing handlers (the sandbox is the proxy's `BOX`)."""

    def routes(self) -> list[web.RouteDef]:
        base = "/toolbox/{sandbox}/files"
        return [
            web.get(base, self.list_files),
            web.delete(base, self.delete_file),
            web.post(base + "/folder", self.create_folder),
            web.get(base + "/info", self.file_info),
            web.post(base + "/move", self.move_file),
            web.post(base + "/permissions", self.set_permissions),
            web.get(base + "/find", self.find_in_files),
            web.get(base + "/search", self.search_files),
            web.post(base + "/replace", self.replace_in_files),
        ]

    async def list_files(self, request: web.Request) -> web.Response:
        box: Box = request[BOX]
        path = request.query.get("path")
        if path is None:
            raise DaemonError(400, "path is required", "BAD_REQUEST")
        raw_depth = request.query.get("depth", "1")
        if not raw_depth.isdigit() or int(raw_depth) < 1:
            raise DaemonError(400, "depth must be at least 1", "BAD_REQUEST")
        target = host_path(box, path)
        if not target.exists():
            raise DaemonError(404, f"directory not found: {path}", "FILE_NOT_FOUND")
        if not target.is_dir():
            raise DaemonError(400, f"not a directory: {path}", "BAD_REQUEST")
        shown = path.rstrip("/") or "/"
        entries = await asyncio.to_thread(_walk, box, target, shown, int(raw_depth))
        return web.json_response(entries)

    async def create_folder(self, request: web.Request) -> web.Response:
        """``mkdir -p`` with the octal ``mode`` (``0755`` when unset)."""
        box: Box = request[BOX]
        (path,) = required(request, "path")
        mode = _mode(request.query.get("mode") or "755")
        target = writable(box, path)
        await os_call(path, lambda: target.mkdir(mode=mode, parents=True, exist_ok=True))
        return web.Response(status=201)

    async def delete_file(self, request: web.Request) -> web.Response:
        """A file, or a directory with ``recursive=true``."""
        box: Box = request[BOX]
        (path,) = required(request, "path")
        entry = _entry(box, path)
        st = await os_call(path, writable(box, path).stat)
        if stat.S_ISDIR(st.st_mode) and request.query.get("recursive") != "true":
            raise DaemonError(400, "cannot delete directory without recursive flag", "BAD_REQUEST")
        if entry.is_dir() and not entry.is_symlink():
            await os_call(path, lambda: shutil.rmtree(entry))
        else:
            await os_call(path, entry.unlink)
        return web.Response(status=204)

    async def file_info(self, request: web.Request) -> web.Response:
        box: Box = request[BOX]
        (path,) = required(request, "path")
        target = host_path(box, path)
        st = await os_call(path, target.stat)
        return web.json_response(_file_info(st, box.local.absolute(path)))

    async def move_file(self, request: web.Request) -> web.Response:
        """A rename; the destination's directory must exist and the destination must not."""
        box: Box = request[BOX]
        source, destination = required(request, "source", "destination")
        src = _entry(box, source)
        dst = _entry(box, destination)
        await os_call(source, src.lstat)
        await os_call(destination, dst.parent.stat)
        if dst.exists() or dst.is_symlink():
            raise DaemonError(409, "destination already exists", "CONFLICT")
        await os_call(source, lambda: shutil.move(src, dst))
        return web.Response(status=200)

    async def set_permissions(self, request: web.Request) -> web.Response:
        """``chmod`` to the octal ``mode``, ``chown`` to ``owner`` / ``group`` (names or ids;
        ``daytona``, the sandbox's user, is the emulator's own)."""
        box: Box = request[BOX]
        (path,) = required(request, "path")
        target = host_path(box, path)
        await os_call(path, target.stat)
        mode = request.query.get("mode")
        if mode:
            await os_call(path, lambda: target.chmod(_mode(mode)))
        owner, group = request.query.get("owner", ""), request.query.get("group", "")
        if owner or group:
            uid = _id_of(owner, pwd.getpwnam, "user") if owner else -1
            gid = _id_of(group, grp.getgrnam, "group") if group else -1
            try:
                await asyncio.to_thread(os.chown, target, uid, gid)
            except OSError as exc:
                message = f"failed to change owner: {exc.strerror}"
                raise DaemonError(400, message, "BAD_REQUEST") from None
        return web.Response(status=200)

    async def find_in_files(self, request: web.Request) -> web.Response:
        """Lines holding ``pattern`` (plain text) in the text files under ``path``."""
        box: Box = request[BOX]
        path, pattern = required(request, "path", "pattern")
        root = host_path(box, path)
        matches = await asyncio.to_thread(_find, root, path, pattern)
        return web.json_response(matches)

    async def search_files(self, request: web.Request) -> web.Response:
        """Paths under ``path`` (itself included) whose name matches the glob ``pattern``."""
        box: Box = request[BOX]
        path, pattern = required(request, "path", "pattern")
        root = host_path(box, path)
        files = await asyncio.to_thread(
            lambda: [
                shown
                for host, shown in _tree(root, path)
                if fnmatch.fnmatchcase(host.name, pattern)
            ]
        )
        return web.json_response({"files": files})

    async def replace_in_files(self, request: web.Request) -> web.Response:
        """Every occurrence of ``pattern`` replaced in each file; a result per file."""
        box: Box = request[BOX]
        body = await json_body(request)
        files, pattern = body.get("files"), body.get("pattern")
        new_value = body.get("newValue") or ""
        if (
            not isinstance(files, list)
            or not all(isinstance(f, str) for f in files)
            or not isinstance(pattern, str)
            or not isinstance(new_value, str)
        ):
            raise DaemonError(400, "invalid request body", "INVALID_REQUEST_BODY")
        results = []
        for file in files:
            try:
                target = box.local.host(file, write=True)
                content = await asyncio.to_thread(target.read_bytes)
                replaced = content.replace(pattern.encode(), new_value.encode())
                await asyncio.to_thread(target.write_bytes, replaced)
            except PathRefused as exc:
                results.append({"file": file, "success": False, "error": str(exc)})
            except OSError as exc:
                results.append({"file": file, "success": False, "error": _os_message(file, exc)})
            else:
                results.append({"file": file, "success": True})
        return web.json_response(results)


def _file_info(st: os.stat_result, shown: str) -> dict[str, Any]:
    """A file's ``FileInfo`` as the daemon gives it: from ``stat`` (a symlink shows what it
    points to), owner and group as numeric ids, ``name`` the last part of ``shown``."""
    modified = time.gmtime(st.st_mtime)
    return {
        "name": posixpath.basename(shown.rstrip("/")) or "/",
        "path": shown,
        "isDir": stat.S_ISDIR(st.st_mode),
        "size": st.st_size,
        "mode": stat.filemode(st.st_mode),
        "permissions": oct(st.st_mode & 0o777)[2:].zfill(4),
        "owner": str(st.st_uid),
        "group": str(st.st_gid),
        "modTime": time.strftime("%Y-%m-%d %H:%M:%S +0000 UTC", modified),
        "modifiedAt": iso(st.st_mtime),
    }


def required(request: web.Request, *names: str) -> list[str]:
    """The query parameters ``names``, each required nonempty."""
    values = [request.query.get(name, "") for name in names]
    if not all(values):
        raise DaemonError(400, f"{' and '.join(names)} are required", "BAD_REQUEST")
    return values


def host_path(box: Box, path: str) -> Path:
    try:
        return box.local.host(path)
    except PathRefused as exc:
        raise DaemonError(400, str(exc), "INVALID_FILE_PATH") from None


def writable(box: Box, path: str) -> Path:
    try:
        return box.local.host(path, write=True)
    except PathRefused as exc:
        raise DaemonError(400, str(exc), "INVALID_FILE_PATH") from None


def _entry(box: Box, path: str) -> Path:
    """The host path of the entry ``path`` names itself: its directory's symlinks
    followed, not a symlink it ends in (a delete or a move acts on the link)."""
    absolute = box.local.absolute(path)
    if absolute == "/":
        raise DaemonError(400, "/: cannot delete or move the root", "BAD_REQUEST")
    return writable(box, posixpath.dirname(absolute)) / posixpath.basename(absolute)


def _mode(raw: str) -> int:
    try:
        return int(raw, 8)
    except ValueError:
        raise DaemonError(400, "invalid mode format", "BAD_REQUEST") from None


def _id_of(name: str, lookup: Callable[[str], Any], kind: str) -> int:
    if name.isdigit():
        return int(name)
    if name == "daytona":
        return os.getuid() if kind == "user" else os.getgid()
    try:
        return int(lookup(name)[2])
    except KeyError:
        raise DaemonError(400, f"{kind} not found", "BAD_REQUEST") from None


def _os_message(path: str, exc: OSError) -> str:
    return f"{path}: {exc.strerror or exc}".lower()


async def os_call(path: str, call: Callable[[], Any]) -> Any:
    """``call`` off the loop, its OS error answered as the daemon does (404, 403, else 400)."""
    try:
        return await asyncio.to_thread(call)
    except FileNotFoundError as exc:
        raise DaemonError(404, _os_message(path, exc), "FILE_NOT_FOUND") from None
    except PermissionError as exc:
        raise DaemonError(403, _os_message(path, exc), "FILE_ACCESS_DENIED") from None
    except OSError as exc:
        raise DaemonError(400, _os_message(path, exc), "BAD_REQUEST") from None


def _tree(root: Path, shown: str) -> Iterator[tuple[Path, str]]:
    """``root`` and what lies under it, depth first in name order; symlinks not followed;
    nothing when ``root`` is missing (the daemon's walk skips it and answers no matches)."""
    if not root.exists() and not root.is_symlink():
        return
    yield root, shown
    if root.is_dir() and not root.is_symlink():
        try:
            children = sorted(root.iterdir(), key=lambda p: p.name)
        except OSError:
            return
        for child in children:
            yield from _tree(child, posixpath.join(shown, child.name))


def _find(root: Path, shown: str, pattern: str) -> list[dict[str, Any]]:
    """The daemon's content search, a line at a time: regular files that are not binary
    (no NUL in their first 512 bytes)."""
    matches: list[dict[str, Any]] = []
    wanted = pattern.encode()
    for host, path in _tree(root, shown):
        if not host.is_file() or host.is_symlink():
            continue
        try:
            with host.open("rb") as file:
                if b"\x00" in file.read(512):
                    continue
                file.seek(0)
                for number, line in enumerate(file, 1):
                    if wanted in line:
                        text = line.rstrip(b"\n").removesuffix(b"\r").decode(errors="replace")
                        matches.append({"file": path, "line": number, "content": text})
        except OSError:
            continue
    return matches


def _walk(box: Box, directory: Path, shown: str, depth: int) -> list[dict[str, Any]]:
    """The entries under ``directory``, ``depth`` levels deep; a symlink shows what it points
    to (followed inside the sandbox), a dangling one is left out, as by the daemon."""
    entries = []
    for child in sorted(directory.iterdir(), key=lambda p: p.name):
        child_shown = f"{shown}/{child.name}" if shown != "/" else f"/{child.name}"
        try:
            real = box.local.host(child_shown) if child.is_symlink() else child
            st = real.stat()
        except (OSError, PathRefused):
            continue
        entries.append(_file_info(st, child_shown))
        if depth > 1 and child.is_dir() and not child.is_symlink():
            entries.extend(_walk(box, child, child_shown, depth - 1))
    return entries
