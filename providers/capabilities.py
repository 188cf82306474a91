"""What an entry can do beyond create/run/read/write: the names `requires=` routes by.

Each adapter declares its set in ``Provider.capabilities``; a call it does
not declare raises `Unsupported`, naming the provider and the capability,
never a silent no-op. docs/capabilities.md's matrix lists them per vendor.
"""

from __future__ import annotations

from enum import StrEnum

__all__ = ["AGENT_WORK", "FILE_WORK", "Capability"]


class Capability(StrEnum):
    """What an entry can do beyond run/files; ``acquire(requires=...)`` routes by these."""

    RUN_CODE = "run_code"
    STATEFUL_CODE = "run_code.stateful"  # a kernel keeps variables between calls
    FILES = "files"
    GPU = "gpu"
    STREAM = "stream"  # output reaches the caller while the command runs
    STDIN = "stdin"  # write to / close a running command's stdin
    PROCESS = "process"  # start in the background, wait for it
    PROCESS_KILL = "process.kill"  # kill one process, not the sandbox
    PROCESS_LIST = "process.list"
    PROCESS_ATTACH = "process.attach"  # reattach by id from another process or replica
    PTY = "pty"
    PTY_RESIZE = "pty.resize"
    FILES_MANAGE = "files.manage"  # remove, make_dir, exists, rename, stat
    FILES_STREAM = "files.stream"  # large files and whole directories, streamed both ways
    PORT = "port"  # expose a port as a URL the app can reach
    PAUSE = "pause"  # pause a sandbox (its bill stops, its files stay), resume it by id
    SNAPSHOT = "snapshot"  # a sandbox's filesystem as a template for later creates
    WARM_SERVER = "warm.server"  # the vendor keeps sandboxes of a template ready for creates


AGENT_WORK = frozenset(
    {
        Capability.STREAM,
        Capability.STDIN,
        Capability.PROCESS,
        Capability.PROCESS_KILL,
        Capability.PROCESS_LIST,
        Capability.PROCESS_ATTACH,
        Capability.PTY,
        Capability.PTY_RESIZE,
    }
)
"""Every process and terminal capability: what a provider declares when it lacks none."""

FILE_WORK = frozenset({Capability.FILES, Capability.FILES_MANAGE, Capability.FILES_STREAM})
"""Every file capability."""
