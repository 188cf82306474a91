"""envd's directory watchers: ``WatchDir`` (a stream) and the polled ``CreateWatcher`` family.

envd watches with inotify (fsnotify); the emulator compares snapshots of the
directory every `POLL_SECONDS` instead, which yields the same event kinds for
what a test does between two looks: a new path is ``CREATE``, a path whose
inode, size or mtime changed is ``WRITE``, a mode change ``CHMOD``, a path gone
``REMOVE``, and a path gone whose inode shows up under a new name ``RENAME``
(old name) then ``CREATE`` (new name). Names are relative to the watched
directory; a recursive watch sees every level below it. An upload
(`emulators.e2b.envd`) is reported as the inotify events of envd's own write
(create, chown, write), not from snapshots: its partial file is not seen.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import secrets
import stat
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from emulators.e2b.connect import Message, RpcError, Send

__all__ = ["POLL_SECONDS", "DirWatcher", "WatcherService"]

POLL_SECONDS = 0.05
_PARTIAL = re.compile(r"\..+\.upload-[0-9a-f]{8}")

# path relative to the watched directory -> (inode, size, mtime_ns, mode)
Snapshot = dict[str, tuple[int, int, int, int]]


def _snapshot(root: Path, recursive: bool) -> Snapshot:
    seen: Snapshot = {}

    def scan(directory: Path, prefix: str) -> None:
        try:
            children = list(os.scandir(directory))
        except OSError:
            return
        for child in children:
            if _PARTIAL.fullmatch(child.name):
                continue
            try:
                info = child.stat(follow_symlinks=False)
            except OSError:
                continue
            name = prefix + child.name
            seen[name] = (info.st_ino, info.st_size, info.st_mtime_ns, info.st_mode)
            if recursive and stat.S_ISDIR(info.st_mode):
                scan(Path(child.path), name + "/")

    scan(root, "")
    return seen


@dataclass(eq=False)
class DirWatcher:
    """One watch of a directory: `poll` gives the events since the last poll.

    Args:
        root: the watched directory's host path.
        recursive: watch every level below it too.
        entry: ``EntryInfo`` of a path (for ``include_entry``); None leaves entries out.
    """

    root: Path
    recursive: bool
    entry: Callable[[Path], Message] | None = None
    id: str = field(default_factory=lambda: secrets.token_hex(8))
    pending: list[Message] = field(default_factory=list)
    task: asyncio.Task[None] | None = None

    def __post_init__(self) -> None:
        self.before = _snapshot(self.root, self.recursive)
        self._noted: list[tuple[str, str]] = []
        self._lock = threading.Lock()

    def _note(self, host: Path, kinds: Sequence[str]) -> None:
        """Report ``kinds`` of events for ``host`` (a file the emulator itself changed),
        and take its state as seen so the next look does not report it again; the
        caller holds the lock."""
        if not host.is_relative_to(self.root):
            return
        name = str(host.relative_to(self.root))
        if name == "." or (not self.recursive and "/" in name):
            return
        self._noted += [(name, kind) for kind in kinds]
        try:
            info = host.lstat()
        except OSError:
            self.before.pop(name, None)
        else:
            self.before[name] = (info.st_ino, info.st_size, info.st_mtime_ns, info.st_mode)

    def poll(self) -> list[Message]:
        with self._lock:
            now = _snapshot(self.root, self.recursive)
            before, self.before = self.before, now
            events, self._noted = self._noted, []
        moved = {v[0]: k for k, v in now.items() if k not in before}
        for name, (inode, *_rest) in before.items():
            if name not in now:
                events.append((name, "RENAME" if inode in moved else "REMOVE"))
        for name, (inode, size, mtime, mode) in now.items():
            old = before.get(name)
            if old is None:
                events.append((name, "CREATE"))
            elif old[:3] != (inode, size, mtime) and not stat.S_ISDIR(mode):
                events.append((name, "WRITE"))
            elif old[3] != mode:
                events.append((name, "CHMOD"))
        return [self._event(name, kind) for name, kind in events]

    def _event(self, name: str, kind: str) -> Message:
        event: Message = {"name": name, "type": f"EVENT_TYPE_{kind}"}
        if self.entry is not None and kind not in ("REMOVE", "RENAME"):
            with contextlib.suppress(OSError):
                event["entry"] = self.entry(self.root / name)
        return event


class WatcherService:
    """The watch RPCs of one sandbox's envd, over host paths the caller resolved."""

    def __init__(self) -> None:
        self.watchers: dict[str, DirWatcher] = {}  # the polled ones, by id
        self.active: set[DirWatcher] = set()  # every watcher, streamed ones too

    def change(self, make: Callable[[], object], host: Path, kinds: Sequence[str]) -> None:
        """Make a change to ``host`` (blocking; run it off the loop) and report it to every
        watcher as ``kinds`` of events, no look of theirs in between."""
        watchers = list(self.active)
        for watcher in watchers:
            watcher._lock.acquire()
        try:
            make()
            for watcher in watchers:
                watcher._note(host, kinds)
        finally:
            for watcher in watchers:
                watcher._lock.release()

    def open(
        self, root: Path, path: str, message: Message, entry: Callable[[Path], Message]
    ) -> DirWatcher:
        """A watcher of ``root`` (``path`` as the client named it), as a WatchDirRequest asks.

        Raises:
            RpcError: ``not_found`` for a missing path, ``invalid_argument`` for a non-directory.
        """
        if not root.exists():
            raise RpcError("not_found", f"path {path} not found")
        if not root.is_dir():
            raise RpcError("invalid_argument", f"path {path} not a directory")
        watcher = DirWatcher(
            root,
            bool(message.get("recursive")),
            entry if message.get("includeEntry") else None,
        )
        self.active.add(watcher)
        return watcher

    async def stream(
        self,
        watcher: DirWatcher,
        send: Send,
        keepalive: float | None,
        alive: Callable[[], bool],
    ) -> None:
        """WatchDir: start, then the events as they come, keepalives between, until the
        client goes, the call's deadline passes or the sandbox is gone."""
        try:
            await send({"start": {}})
            idle = 0.0
            while alive():
                await asyncio.sleep(POLL_SECONDS)
                events = await asyncio.to_thread(watcher.poll)
                for event in events:
                    await send({"filesystem": event})
                idle = 0.0 if events else idle + POLL_SECONDS
                if keepalive is not None and idle >= keepalive:
                    await send({"keepalive": {}})
                    idle = 0.0
        finally:
            self.active.discard(watcher)

    def create(self, watcher: DirWatcher) -> Message:
        """CreateWatcher: poll in the background, keeping the events for GetWatcherEvents."""

        async def collect() -> None:
            while True:
                await asyncio.sleep(POLL_SECONDS)
                watcher.pending.extend(await asyncio.to_thread(watcher.poll))

        watcher.task = asyncio.ensure_future(collect())
        self.watchers[watcher.id] = watcher
        return {"watcherId": watcher.id}

    def _watcher(self, message: Message) -> DirWatcher:
        watcher = self.watchers.get(message.get("watcherId") or "")
        if watcher is None:
            raise RpcError("not_found", f"watcher {message.get('watcherId')} not found")
        return watcher

    async def events(self, message: Message) -> Message:
        """The events since the last call, a look taken now included (inotify's are
        queued the moment they happen)."""
        watcher = self._watcher(message)
        now = await asyncio.to_thread(watcher.poll)
        events, watcher.pending = [*watcher.pending, *now], []
        return {"events": events}

    def remove(self, message: Message) -> Message:
        watcher = self._watcher(message)
        self.watchers.pop(watcher.id, None)
        self.active.discard(watcher)
        if watcher.task is not None:
            watcher.task.cancel()
        return {}

    def close(self) -> None:
        """Stop every polled watcher (the sandbox is going away)."""
        for watcher in self.watchers.values():
            if watcher.task is not None:
                watcher.task.cancel()
        self.watchers.clear()
        self.active.clear()
