"""Where the library's own log lines go: structlog once the app configured it, else
the stdlib logger of the same name.

The library never configures logging (docs/design.md, "Logging"), and
structlog left unconfigured prints every level, debug included, to stdout.
So a line goes through structlog only when the app has set structlog up;
otherwise through stdlib logging, whose default without any setup shows
warnings and worse on stderr and nothing else. Fields whose names look
secret, and URL passwords, are masked either way (`redact_secrets`, also
the structlog processor of `router.logs.configure_logging`).
"""

from __future__ import annotations

import logging
import re
from collections.abc import MutableMapping
from typing import Any

import structlog

__all__ = ["Log", "redact_secrets"]

_SECRET_NAME = re.compile(r"(api_?key|token|secret|password|authorization)", re.IGNORECASE)
_URL_PASSWORD = re.compile(r"(?P<scheme>[a-z][a-z0-9+.-]*://)(?P<user>[^:/@\s]*):[^@/\s]+@")


def redact_secrets(
    _logger: Any, _method: str, event_dict: MutableMapping[str, Any]
) -> MutableMapping[str, Any]:
    for key, value in list(event_dict.items()):
        if _SECRET_NAME.search(key):
            event_dict[key] = "***"
        elif isinstance(value, str) and "@" in value:
            event_dict[key] = _URL_PASSWORD.sub(r"\g<scheme>\g<user>:***@", value)
    return event_dict


class Log:
    """The library's logger ``name``: ``log.debug("sandbox_router.x.made", field=...)``."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._stdlib = logging.getLogger(name)

    def debug(self, event: str, **fields: Any) -> None:
        self.line(logging.DEBUG, event, fields)

    def info(self, event: str, **fields: Any) -> None:
        self.line(logging.INFO, event, fields)

    def warning(self, event: str, **fields: Any) -> None:
        self.line(logging.WARNING, event, fields)

    def error(self, event: str, **fields: Any) -> None:
        self.line(logging.ERROR, event, fields)

    def line(
        self, level: int, event: str, fields: dict[str, Any], *, exc_info: bool = False
    ) -> None:
        """One line at ``level``, where the app's setup sends it."""
        if structlog.is_configured():
            extra = {"exc_info": True} if exc_info else {}
            structlog.get_logger(self.name).log(level, event, **fields, **extra)
        elif self._stdlib.isEnabledFor(level):
            shown = dict(redact_secrets(None, "", dict(fields)))
            text = " ".join(f"{key}={value!r}" for key, value in shown.items())
            self._stdlib.log(level, "%s %s", event, text, exc_info=exc_info,
                             extra={"sandbox_router": shown})  # fmt: skip
