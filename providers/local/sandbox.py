"""`LocalSandbox`: a ``local`` sandbox's life: pause, snapshot, kill.

Killing a sandbox ends every process it started, from this process or from
another one (the janitor reaps by id): commands still running, their
background children, and children that left the process group by a double
fork or ``setsid``. A process group cannot do that, so the kill finds them
by what every one of them inherits (`providers.local.isolation`):

* a cgroup v2 of the sandbox's own (``sandbox-router.<id>.<root hash>``
  beside this process's cgroup), when this process may create one and move
  processes into it. The first command makes it, each command joins it
  before exec, and the kill writes ``cgroup.kill``: the kernel ends every
  member, forks in flight included, whatever it did to its environment.
  Its path is in the metadata, so any process can kill it.
* otherwise the environment variable ``SANDBOX_ROUTER_SANDBOX`` naming the
  sandbox (id and a hash of the root), which the kill looks for in
  ``/proc/<pid>/environ`` of every process, killing what carries it and
  scanning again until a scan finds none (a process may fork meanwhile). A
  hit is signalled through a pidfd opened before its environment is read
  again, so a reused pid is never signalled. That scan costs a few ms per
  kill on a host of a few hundred processes, and runs in a thread, only
  for a sandbox that ever ran a command (``<id>.procs`` beside its
  metadata says so).
* with bubblewrap, the command's pid namespace (``--unshare-pid``, and
  ``--die-with-parent`` on its pid 1): killing bwrap or its pid 1 ends
  every process in the namespace, even one that cleared its environment.

Without bubblewrap or a writable cgroup a command that clears its
environment (``env -i``) and leaves the process group outlives the kill:
only isolation can stop a command that wants to escape. The kill first
renames the sandbox directory away (atomically, so a command starting
concurrently sees the sandbox dead after its spawn and ends itself), then
ends the processes, then removes the tree no process writes into any more.

A pause stops every process where it is by the same means the kill finds
them (the cgroup's freezer, else SIGSTOP to what carries the marker) and
leaves ``<id>.paused`` beside the metadata, so every process on the host
lists it paused and may resume it. A snapshot is a copy of the directory in
``<root>/.snapshots/``, taken with the sandbox paused so that it is
consistent.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import shutil

from providers.base import PortURL, Snapshot, check_port
from providers.capabilities import Capability
from providers.errors import Unsupported
from providers.local.commands import LocalCommands
from providers.local.files import LocalFiles
from providers.local.isolation import cgroup_freeze
from providers.local.paths import copy_tree
from providers.local.processes import resume_all, stop_all

__all__ = ["LocalSandbox"]


class LocalSandbox(LocalCommands, LocalFiles):
    """A private directory and the commands run in it."""

    async def expose(self, port: int) -> PortURL:
        """The sandbox shares this host's network: its port is this host's loopback one."""
        if Capability.PORT not in self._provider.capabilities:
            raise Unsupported(self.provider, Capability.PORT)
        check_port(port, "expose(port)")
        self._check_alive()
        return PortURL(port, f"http://127.0.0.1:{port}", {})

    async def pause(self) -> None:
        """Stop every process of the sandbox where it is; the files stay as they are.

        The paused mark goes first, so a command starting meanwhile is
        refused (or, past that check, stopped with the rest). A cgroup is
        frozen (``cgroup.freeze``); without one the marked processes get
        SIGSTOP until a scan finds them all stopped (a stopped process
        cannot fork).
        """
        self._check_alive()
        os.close(os.open(self._paused, os.O_WRONLY | os.O_CREAT, 0o600))
        cgroup = self.meta.get("cgroup")
        if cgroup and await cgroup_freeze(cgroup, True):
            return
        if self._ran_commands():
            await asyncio.to_thread(stop_all, self._carrier())

    async def thaw(self) -> None:
        """Continue what `pause` stopped (nothing when it is not paused)."""
        self._check_alive()
        if not self.paused:
            return
        cgroup = self.meta.get("cgroup")
        if not (cgroup and await cgroup_freeze(cgroup, False)) and self._ran_commands():
            await asyncio.to_thread(resume_all, self._carrier())
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self._paused)

    async def snapshot(self, name: str | None = None) -> Snapshot:
        """Copy the sandbox's directory into the root's snapshot store (a later
        ``SandboxSpec(template=snapshot.id)`` on this entry starts from a copy), with
        its processes paused for the copy."""
        self._check_alive()
        snapshot_id = "local-snap-" + secrets.token_hex(8)
        store = self._provider.snapshots
        partial = store / f".{snapshot_id}.part"
        running = not self.paused

        def copy() -> None:
            store.mkdir(exist_ok=True)
            try:
                copy_tree(self.dir, partial)
                os.rename(partial, store / snapshot_id)
            except BaseException:
                shutil.rmtree(partial, ignore_errors=True)
                raise

        if running:  # frozen: a consistent copy, and no command swaps a path during it
            await self.pause()
        try:
            await asyncio.to_thread(copy)
        except (OSError, shutil.Error) as exc:
            raise self._error(f"snapshot: cannot copy the sandbox: {exc}") from exc
        finally:
            if running:
                await self.thaw()
        return Snapshot(snapshot_id, self.provider, name)

    async def kill(self) -> None:
        """End the sandbox: see the module docstring for the order and why.

        An empty directory goes with one rmdir; one with files is renamed
        away first and removed by a thread once its processes are dead.
        """
        doomed = None
        try:
            os.rmdir(self.dir)
        except FileNotFoundError:
            pass
        except OSError:
            doomed = os.path.join(self._provider.root, f".{self.id}.{secrets.token_hex(4)}.dead")
            try:
                os.rename(self.dir, doomed)
            except FileNotFoundError:
                doomed = None
        if self._ran_commands():
            await self._end_processes()
        if doomed is not None:
            await asyncio.to_thread(shutil.rmtree, doomed, ignore_errors=True)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self._paused)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join(self._provider.root, f"{self.id}.json"))
