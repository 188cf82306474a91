"""Structured logs: one JSON line per routing event, secrets masked."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import structlog

from router.events import (
    BreakerTransition,
    Created,
    Event,
    Failover,
    StateError,
    emit,
    log_hook,
)
from router.logs import configure_logging


@pytest.fixture(autouse=True)
def _reset_structlog() -> None:
    yield
    structlog.reset_defaults()


def test_events_are_json_lines_named_sandbox_router(capsys: pytest.CaptureFixture[str]) -> None:
    configure_logging("json", "info")
    emit([log_hook], Failover(from_entry="daytona", to_entry="runloop", reason="unavailable"))
    emit([log_hook], BreakerTransition(entry="daytona", from_state="closed", to_state="open"))
    lines = [json.loads(line) for line in capsys.readouterr().err.splitlines()]
    assert [line["event"] for line in lines] == [
        "sandbox_router.failover",
        "sandbox_router.breaker",
    ]
    assert lines[0]["level"] == "warning"
    assert lines[0]["from_entry"] == "daytona"
    assert lines[1]["level"] == "warning"  # a circuit opening is worth a warning


def test_secret_looking_fields_and_url_passwords_are_masked(
    capsys: pytest.CaptureFixture[str],
) -> None:
    configure_logging("json", "info")
    error = "cannot reach redis://:hunter2@redis:6379/0"
    emit([log_hook], StateError(operation="reserve", mode="fail_closed", error=error))
    structlog.get_logger("app").info("app_line", api_key="sk-live-123")
    line = capsys.readouterr().err
    assert "hunter2" not in line
    assert "sk-live-123" not in line
    assert "redis://:***@redis:6379/0" in line


def test_a_failing_hook_never_breaks_routing(capsys: pytest.CaptureFixture[str]) -> None:
    configure_logging("json", "info")
    seen: list[Event] = []

    def broken(event: Event) -> None:
        raise RuntimeError("metrics backend down")

    emit([broken, seen.append], Created(entry="local", latency=0.1))
    assert [e.name for e in seen] == ["created"]
    assert "sandbox_router.hook_failed" in capsys.readouterr().err


def test_importing_the_library_configures_no_logging() -> None:
    import subprocess
    import sys

    probe = (
        "import logging, structlog\n"
        "import router, router.cli, router.config, router.logs, router.metrics, providers\n"
        "from router import Router\n"
        "print(structlog.is_configured(), logging.getLogger().handlers)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True
    )
    assert result.stdout.split() == ["False", "[]"]


def test_an_adapter_prints_nothing_to_stdout_when_the_app_set_up_no_logging() -> None:
    """Unconfigured structlog prints every level to stdout; the adapters' lines go to the
    stdlib logger then, where the app's setup (here: none) decides."""
    import subprocess
    import sys

    probe = (
        "from providers import e2b, modal, runloop\n"
        "from providers.daytona import provider\n"
        "for module in (e2b, modal, runloop, provider):\n"
        "    module.log.debug('sandbox_router.probe.created', entry='x', api_key='k-123')\n"
        "e2b.log.warning('sandbox_router.probe.slow', entry='x', api_key='k-123')\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True
    )
    assert result.stdout == ""
    assert "sandbox_router.probe.slow entry='x'" in result.stderr  # stdlib's last resort
    assert "created" not in result.stderr
    assert "k-123" not in result.stderr


def test_an_adapter_logs_through_structlog_once_the_app_configured_it(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from providers import e2b

    configure_logging("json", "debug")
    e2b.log.debug("sandbox_router.e2b.created", entry="e2b", sandbox_id="i-1")
    [line] = [json.loads(x) for x in capsys.readouterr().err.splitlines() if x.startswith("{")]
    assert (line["event"], line["sandbox_id"]) == ("sandbox_router.e2b.created", "i-1")


def _cli(chain: Path, *flags: str, stderr: int | None = None, verbose: bool = True) -> str:
    """Run ``sandbox-router [-v] [flags] exec`` and return what it wrote to stderr."""
    import subprocess
    import sys

    exe = Path(sys.executable).parent / "sandbox-router"
    result = subprocess.run(
        [str(exe), *(["-v"] if verbose else []), *flags, "exec", "--config", str(chain),
         "--", "true"],
        stdout=subprocess.DEVNULL, stderr=stderr if stderr is not None else subprocess.PIPE,
        text=True, timeout=60, check=True,
    )  # fmt: skip
    return result.stderr or ""


def _events(text: str) -> list[str]:
    return [json.loads(line)["event"] for line in text.splitlines() if line.startswith("{")]


@pytest.fixture
def chain(tmp_path: Path) -> Path:
    path = tmp_path / "chain.yaml"
    path.write_text(
        f"state_url: sqlite:///{tmp_path}/state.db\n"
        f"chain:\n  - {{name: local, provider: local, options: {{root: {tmp_path}/sb}}}}\n"
    )
    return path


def test_the_cli_logs_json_off_a_terminal_and_when_asked(chain: Path) -> None:
    assert "sandbox_router.acquired" in _events(_cli(chain))
    assert "sandbox_router.acquired" in _events(_cli(chain, "--log-format", "json"))


def test_the_cli_logs_for_people_on_a_terminal_and_when_asked(chain: Path) -> None:
    import os
    import pty

    console = _cli(chain, "--log-format", "console")
    assert "sandbox_router.acquired" in console
    assert _events(console) == []
    controller, terminal = pty.openpty()
    try:
        _cli(chain, stderr=terminal)
        os.close(terminal)
        seen = b""
        while chunk := _read(controller):
            seen += chunk
    finally:
        os.close(controller)
    text = seen.decode(errors="replace")
    assert "sandbox_router.acquired" in text
    assert _events(text) == []


def _read(fd: int) -> bytes:
    import os

    try:
        return os.read(fd, 65536)
    except OSError:  # the terminal's other end is closed
        return b""


def test_the_config_log_section_chooses_the_format_and_the_flag_wins(chain: Path) -> None:
    base = chain.read_text()
    chain.write_text(base + "log: {format: console}\n")
    assert _events(_cli(chain)) == []
    assert "sandbox_router.acquired" in _events(_cli(chain, "--log-format", "json"))
    chain.write_text(base + "log: {level: info}\n")
    assert "sandbox_router.acquired" in _events(_cli(chain, verbose=False))
    chain.write_text(base)
    assert _events(_cli(chain, verbose=False)) == []
