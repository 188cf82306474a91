"""What every part of a router shares: its config, its entries, its hooks, its clock and
its tracers.

The `Router` facade makes one `Context` and hands it to each part (ledger,
upkeep, sessions, acquire, janitor), so a part is built, and tested, from
the same things.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from router.config import RouterConfig
from router.entries import Entry
from router.events import Hook, RouterEvent, emit
from router.spans import Spans

__all__ = ["Context"]


@dataclass(frozen=True, slots=True)
class Context:
    config: RouterConfig
    entries: Mapping[str, Entry]
    hooks: list[Hook]  # the router's own list: hooks added later are seen by every part
    clock: Callable[[], float]
    spans: Spans  # the router's tracers (`router.spans`), one list too

    def emit(self, event: RouterEvent) -> None:
        """Hand ``event`` to every hook."""
        emit(self.hooks, event)
