"""structlog setup for the ``sandbox-router`` command: JSON lines off a terminal,
a readable console on one.

`configure_logging` is called by the CLI and may be called by apps; the
library itself never configures logging (not on import, not in `Router`):
an app's setup is the app's. A redaction processor
masks any field whose name looks like a secret, as a last line of defence
(no code path puts a secret into an event in the first place).
"""

from __future__ import annotations

import logging
import sys
from typing import Any, Literal

import structlog

from providers.logs import redact_secrets

__all__ = ["LogFormat", "configure_logging", "redact_secrets"]

LogFormat = Literal["auto", "json", "console"]


class _Stderr:
    """Writes each line to whatever ``sys.stderr`` is at that moment (not at setup:
    a test runner or daemon may swap it)."""

    def msg(self, message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    debug = info = warning = warn = error = critical = exception = fatal = log = msg


def _stderr_logger(*_args: Any) -> _Stderr:
    return _Stderr()


def configure_logging(fmt: LogFormat = "auto", level: str = "info") -> None:
    """Send structlog's events to stderr, as JSON lines or for people to read.

    Args:
        fmt: ``json``, ``console``, or ``auto``: console when stderr is a terminal.
        level: the least severe level shown (``debug``, ``info``, ``warning``...).
    """
    pretty = fmt == "console" or (fmt == "auto" and sys.stderr.isatty())
    renderer: Any = (
        structlog.dev.ConsoleRenderer() if pretty else structlog.processors.JSONRenderer()
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            redact_secrets,
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(
            logging.getLevelNamesMapping()[level.upper()]
        ),
        logger_factory=_stderr_logger,
        cache_logger_on_first_use=False,
    )
