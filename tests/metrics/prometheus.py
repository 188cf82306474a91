"""A real Prometheus server on loopback for the tests (the Debian `prometheus` binary)."""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path
from types import TracebackType
from typing import Any

import httpx
import yaml

from tests.metrics.conftest import free_port

BINARY = shutil.which("prometheus")
SKIP_REASON = (
    "the prometheus binary is not installed (Debian package `prometheus`; .ci/run installs it)"
)


class Prometheus:
    """Scrapes ``targets`` every second and evaluates ``rule_files`` every second."""

    def __init__(self, workdir: Path, targets: list[str], rule_files: list[Path]) -> None:
        assert BINARY is not None, SKIP_REASON
        self.workdir = workdir
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = workdir / "prometheus.log"
        config = {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(p) for p in rule_files],
            "scrape_configs": [
                {
                    "job_name": "sandbox-router",
                    "scrape_timeout": "1s",
                    "static_configs": [{"targets": targets}],
                }
            ],
        }
        self.config = workdir / "prometheus.yml"
        self.config.write_text(yaml.safe_dump(config))
        self.proc: subprocess.Popen[bytes] | None = None
        self.client = httpx.Client(base_url=self.url, timeout=10)

    def __enter__(self) -> Prometheus:
        assert BINARY is not None
        with self.log.open("wb") as log:
            self.proc = subprocess.Popen(
                [
                    BINARY,
                    f"--config.file={self.config}",
                    f"--storage.tsdb.path={self.workdir / 'data'}",
                    f"--web.listen-address=127.0.0.1:{self.port}",
                    "--log.level=warn",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"prometheus exited: {self.log.read_text()}")
            try:
                if self.client.get("/-/ready").status_code == 200:
                    return self
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        self.__exit__(None, None, None)
        raise RuntimeError(f"prometheus not ready in 30 s: {self.log.read_text()}")

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.client.close()
        if self.proc is not None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)

    def api(self, path: str, **params: Any) -> Any:
        response = self.client.get(f"/api/v1/{path}", params=params)
        body = response.json()
        assert body["status"] == "success", f"{path} {params}: {body}"
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        data = self.api("query", query=expr)
        assert data["resultType"] == "vector", f"{expr}: {data['resultType']}"
        result: list[dict[str, Any]] = data["result"]
        return result

    def wait_for(self, expr: str, timeout: float = 20) -> list[dict[str, Any]]:
        """Poll until ``expr`` returns something."""
        deadline = time.monotonic() + timeout
        while True:
            result = self.query(expr)
            if result or time.monotonic() > deadline:
                return result
            time.sleep(0.25)
