"""Which entries to try, in which order, and why the others are skipped."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

__all__ = ["Candidate", "Strategy", "order"]

Strategy = Literal["ordered", "balanced", "cheapest"]


@dataclass(frozen=True, slots=True)
class Candidate:
    """One chain entry as the ordering sees it.

    Attributes:
        name: the entry's name.
        unconfigured: why it has no credentials, or None when configured.
        capabilities: what its provider can do.
        remaining: the smallest remaining quota fraction of its pool (0..1).
        price: the estimated USD of the lease asked for (`policies.pricing.estimate`).
    """

    name: str
    unconfigured: str | None
    capabilities: frozenset[str]
    remaining: float = 1.0
    price: float = 0.0


def order(
    candidates: Sequence[Candidate], strategy: Strategy, requires: Iterable[str] = ()
) -> tuple[list[str], dict[str, str]]:
    """Entries to try in order, and a reason for each one skipped.

    ``ordered`` keeps the chain order; ``balanced`` prefers the entry with the
    largest remaining quota fraction; ``cheapest`` the lowest estimated price.
    The chain order breaks ties. Health and quota are not looked at here: an
    entry whose breaker is open or whose pool is spent is denied by the
    ledger's reservation and skipped, so the first one tried is the cheapest
    that is healthy and has quota.
    """
    needed = frozenset(requires)
    usable: list[Candidate] = []
    skipped: dict[str, str] = {}
    for c in candidates:
        if c.unconfigured is not None:
            skipped[c.name] = f"not configured: {c.unconfigured}"
        elif missing := sorted(needed - c.capabilities):
            skipped[c.name] = f"lacks capability {', '.join(missing)}"
        else:
            usable.append(c)
    if strategy == "balanced":
        usable = sorted(usable, key=lambda c: -c.remaining)
    elif strategy == "cheapest":
        usable = sorted(usable, key=lambda c: c.price)
    return [c.name for c in usable], skipped
