"""OS processes for the tests that need several apps at once (races, crashes, fleets)."""

from __future__ import annotations

import multiprocessing
from multiprocessing.context import ForkServerContext

__all__ = ["processes"]


def processes(*modules: str) -> ForkServerContext:
    """A context whose processes are forked from a server that imported the router (and
    ``modules``, the test's own) once, where each spawned interpreter imported it anew:
    about 0.4 s of CPU a process, 6 s for a race of 16."""
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["router", "router.testing", "providers.local", *modules])
    return ctx
