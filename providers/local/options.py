"""`LocalOptions`: what a ``local`` entry of the config may set."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from providers.base import ProviderOptions

__all__ = ["LocalOptions"]


class LocalOptions(ProviderOptions):
    """Options of the ``local`` provider.

    Attributes:
        root: where sandbox directories live (default: a per-user temp dir).
        isolation: ``auto`` uses bubblewrap when present, ``bwrap`` requires
            it, ``none`` runs commands as plain child processes.
        cpu_seconds, memory_mb, file_size_mb, max_processes: rlimits applied
            to every command.
        max_output_bytes: stdout and stderr are each cut at this size.
        python: interpreter for ``run_code(language="python")``.
        cgroup: give each sandbox a cgroup v2 of its own when this process
            may make one, so a kill ends its every process whatever they
            did to their environment; ``False`` leaves that to the
            environment marker and, with bwrap, the pid namespace.
        network: with bwrap, share the host's network (``--share-net``):
            a server in the sandbox is reachable on 127.0.0.1, so the entry
            declares ``port``, and the sandbox reaches everything this host
            does (its loopback services included). ``False`` gives it an
            empty network namespace of its own. Without bwrap commands
            always share the host's network.
    """

    root: Path | None = None
    isolation: Literal["auto", "bwrap", "none"] = "auto"
    cpu_seconds: int = 600
    memory_mb: int = 2048
    file_size_mb: int = 512
    max_processes: int = 512
    max_output_bytes: int = 10 * 1024 * 1024
    python: str = "python3"
    cgroup: bool = True
    network: bool = False
