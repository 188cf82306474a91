"""Structured logs: one JSON line per routing event, secrets masked."""

from __future__ import annotations

import json

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
