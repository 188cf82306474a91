"""``python -m benchmarks transfer``: moving a large file and a large tree through the router.

A 1 GiB file and a 20,000-file directory go up into a sandbox and back,
through the router's lease (``upload_file``/``download_file``,
``upload_dir``/``download_dir``) and through the vendor SDK called
directly on the same emulator. Each run is a fresh process, so its peak
RSS (``VmHWM``) is that run's alone, and the emulator serves from a
process of its own, so its buffers are not counted. Target: the router's
peak under 100 MB whatever the size, since nothing is held whole.
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import os
import resource
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from emulators import available
from providers import provider_class
from providers.capabilities import Capability
from router import Router
from router.logs import configure_logging

MiB = 1 << 20


def make_inputs(root: Path, size: int, files: int) -> tuple[Path, Path]:
    """A ``size``-byte file (a random MiB repeated) and a tree of ``files`` small files."""
    root.mkdir(parents=True, exist_ok=True)
    big = root / "big.bin"
    block = os.urandom(MiB)
    with big.open("wb") as out:
        for _ in range(size // MiB):
            out.write(block)
    tree = root / "tree"
    for i in range(files):
        leaf = tree / f"d{i // 500:03d}" / f"f{i:05d}.txt"
        leaf.parent.mkdir(parents=True, exist_ok=True)
        leaf.write_bytes(b"x" * (i % 2048))
    return big, tree


def _rss_mb() -> float:
    """This process's peak RSS in MB: ``VmHWM``, the high-water mark of its own memory.

    Not ``ru_maxrss``: Linux carries the parent's RSS at the fork over the
    exec into it, so a spawned child started at the harness's 80 MB.
    """
    with contextlib.suppress(OSError), open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return round(int(line.split()[1]) / 1024, 1)
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)


async def _through_router(
    provider: str, options: dict[str, Any], big: Path, tree: Path, out: Path
) -> dict[str, float]:
    config = {
        "state_url": "memory://",
        "chain": [{"name": provider, "provider": provider, "options": options}],
    }
    timings: dict[str, float] = {}
    async with Router.from_config(config, hooks=[]) as router, await router.aacquire() as lease:
        box = lease.sandbox
        for name, step in (
            ("upload_file_s", lambda: box.upload_file(big, "big.bin")),
            ("download_file_s", lambda: box.download_file("big.bin", out / "big.bin")),
            ("upload_dir_s", lambda: box.upload_dir(tree, "tree")),
            ("download_dir_s", lambda: box.download_dir("tree", out / "tree")),
        ):
            timings[name] = await _timed(step)
    return timings


async def _timed(step: Callable[[], Awaitable[None]]) -> float:
    start = time.perf_counter()
    await step()
    return round(time.perf_counter() - start, 3)


def _measure(provider: str, path: str, env: dict[str, str], options: dict[str, Any],
             big: Path, tree: Path, out: Path, conn: Any) -> None:  # fmt: skip
    os.environ.update(env)  # a child process of its own: the SDKs read their addresses here
    configure_logging("json", "warning")  # as the parent: stdout carries only the JSON
    baseline = _rss_mb()
    if path == "router":
        timings = asyncio.run(_through_router(provider, options, big, tree, out))
    else:
        from benchmarks.transfer_direct import DIRECT

        timings = asyncio.run(DIRECT[provider](big, tree, out))
    conn.send({**timings, "baseline_rss_mb": baseline, "peak_rss_mb": _rss_mb()})


def _run(provider: str, path: str, env: dict[str, str], options: dict[str, Any],
         big: Path, tree: Path, out: Path) -> dict[str, Any]:  # fmt: skip
    out.mkdir(parents=True, exist_ok=True)
    ctx = multiprocessing.get_context("spawn")
    here, there = ctx.Pipe()
    child = ctx.Process(target=_measure, args=(provider, path, env, options, big, tree, out, there))
    child.start()
    there.close()  # the child's end: its exit is then an EOF here, not an hour's wait
    deadline = time.monotonic() + 3600
    while not here.poll(1.0) and child.is_alive() and time.monotonic() < deadline:
        pass
    try:
        got: dict[str, Any] = here.recv() if here.poll() else {"error": "no answer"}
    except EOFError:
        got = {"error": f"exit {child.exitcode}"}
    if child.is_alive():
        child.kill()
    child.join(60)
    if "error" in got and child.exitcode not in (None, 0):
        got["error"] += f" (exit {child.exitcode})"
    size = big.stat().st_size / MiB
    for key in ("upload_file_s", "download_file_s"):
        if got.get(key):
            got[key.replace("_s", "_mib_per_s")] = round(size / got[key], 1)
    return got


def transfer(root: Path, quick: bool) -> dict[str, Any]:
    from benchmarks.transfer_direct import DIRECT
    from emulators.process import emulator_process

    size, files = (64 * MiB, 2_000) if quick else (1024 * MiB, 20_000)
    big, tree = make_inputs(root / "in", size, files)
    result: dict[str, Any] = {"file_mib": size // MiB, "files": files, "target_peak_rss_mb": 100}
    local = {"root": str(root / "sandboxes"), "isolation": "none"}
    result["local"] = {"router": _run("local", "router", {}, local, big, tree, root / "out-local")}
    for name in available(list(DIRECT)):
        if Capability.FILES_STREAM not in provider_class(name).capabilities:
            result[name] = {"skipped": f"{name} does not declare files.stream"}
            continue
        with emulator_process(name) as emu:
            env = emu.sdk_env()
            result[name] = {
                path: _run(name, path, env, {}, big, tree, root / f"out-{name}-{path}")
                for path in ("router", "direct")
            }
    return result


__all__ = ["make_inputs", "transfer"]
