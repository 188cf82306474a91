"""The ``local`` provider: sandboxes on this host.

Each sandbox is a private directory under the provider's root with its
metadata beside it. Commands run with a scrubbed environment, resource
limits and in a new session; when ``bwrap`` is on PATH, inside bubblewrap:
new pid/net/ipc/uts namespaces (the host's network instead with the
``network`` option), the system directories read-only and the sandbox
directory as the only writable home, ``/home/sandbox``. bubblewrap's own
``--new-session`` is left out: the session started here already has no
controlling terminal, and bwrap would move its pid 1 out of the process
group, where a kill that lands during bwrap's setup (before its pid 1 sets
its parent-death signal) cannot reach it and the command runs on.

One module per concern:

* `provider`: `LocalProvider`: the metadata, listing, kill by id, the
  snapshots' store; `options`: its options.
* `sandbox`: `LocalSandbox`, its pause, snapshot and kill (how a kill finds
  every process a sandbox started, and the races).
* `directory`: the sandbox on disk and the naming of paths inside it.
* `files`: the file calls, on the directory from the host.
* `paths`: the walk of a path by descriptor that keeps a file call inside.
* `commands`: commands run, streamed, in the background, on a terminal.
* `processes`: the records of background processes, terminals, and the
  sweeps that find processes by the marker they carry.
* `isolation`: bubblewrap, rlimits, cgroups and the marker.

The same machinery backs every emulator in ``emulators/``, so an emulated
cloud sandbox runs real commands too.
"""

from providers.local.commands import LocalProcess
from providers.local.isolation import HOME, bwrap_available
from providers.local.options import LocalOptions
from providers.local.provider import LocalProvider
from providers.local.sandbox import LocalSandbox

__all__ = [
    "HOME",
    "LocalOptions",
    "LocalProcess",
    "LocalProvider",
    "LocalSandbox",
    "bwrap_available",
]
