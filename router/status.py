"""Status: every entry's health, quota and live leases, from one ledger read.

`read_status` builds the `RouterStatus` that `Router.status`, the CLI and
the Prometheus state collector show. When the shared store cannot be read,
it shows this replica's fail-open share and says why (``state_ok`` False);
when it can, an outage journal this router sees is handed over first, so
the usage shown counts it (`router.outage.Outage.adopt`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime

from policies.breaker import Circuit
from policies.pricing import HOUR, Price, rate, window_spend
from policies.quota import UNITS, projected_exhaustion, projected_spend
from router.entries import Entry
from router.ledger import Ledger
from router.state import EntryRef
from router.state.base import EntryStatus, PoolStatus

__all__ = ["EntryView", "RouterStatus", "read_status"]


@dataclass(frozen=True, slots=True)
class EntryView:
    """One entry in `Router.status`.

    Attributes:
        state: ``closed``, ``open``, ``half_open``, or a block:
            ``misconfigured``, ``exhausted``, ``rate_limited``, ``capacity``;
            ``unconfigured`` when credentials are missing.
        until: when an open breaker or a block ends (None when it does not).
        used / limits: per unit, for the entry's pool (``usd``: the window's
            settled spend).
        usd_held: what the pool's live leases hold against its ``usd`` budget on
            top of ``used["usd"]`` (`policies.quota`).
        window_start / reset_at: when the pool's window (its month) started, and
            when it resets.
        exhausted_at: when each limited unit runs out at this window's
            average rate so far (only units with usage).
        capabilities: what ``acquire(requires=...)`` may ask of the entry.
        price: its price (None: unpriced, it costs nothing); ``price_source``
            says where the price comes from (config, the vendor's published
            price, or none).
        spend_usd: the pool's metered seconds and sessions this window priced
            at this entry's rate for its default size (`policies.pricing.window_spend`):
            an estimate, since the store keeps seconds, not each lease's size;
            for a pool shared by several entries, what the whole pool would
            cost at this entry's rate.
        hourly_usd: an hour of one sandbox of the entry's default size.
        usd_projected: the pool's settled ``usd`` at its window's reset if it goes on
            at this window's average rate (`policies.quota.projected_spend`).
    """

    name: str
    provider: str
    pool: str
    configured: bool
    unconfigured_reason: str | None
    state: str
    until: datetime | None
    detail: str
    used: dict[str, float]
    limits: dict[str, float | None]
    window_start: datetime
    reset_at: datetime
    live_leases: int
    exhausted_at: dict[str, datetime]
    capabilities: frozenset[str] = frozenset()
    price: Price | None = None
    price_source: str = ""
    spend_usd: float = 0.0
    hourly_usd: float = 0.0
    usd_held: float = 0.0
    usd_projected: float = 0.0


@dataclass(frozen=True, slots=True)
class RouterStatus:
    entries: list[EntryView]
    state_url: str
    state_ok: bool
    state_error: str | None
    on_state_error: str


async def read_status(
    ledger: Ledger, entries: Mapping[str, Entry], on_state_error: str, now: float
) -> RouterStatus:
    snap, error = await ledger.snapshot([e.ref for e in entries.values()])
    views = [_view(e, snap.pools[e.ref.pool], snap.entries[e.name], now) for e in entries.values()]
    return RouterStatus(
        views, ledger.store.url, error is None, error or ledger.state_error, on_state_error
    )


def _view(e: Entry, pool: PoolStatus, status: EntryStatus, now: float) -> EntryView:
    health = status.breaker
    reason = e.unusable()
    if reason is not None:
        state, until = "unconfigured", None
    elif health.block:
        state = health.block
        until = _dt(health.block_until) if health.block_until else None
    else:
        state = health.circuit
        until = _dt(health.open_until) if health.circuit is Circuit.OPEN else None
    return EntryView(
        name=e.name,
        provider=e.provider.kind,
        pool=e.ref.pool,
        configured=reason is None,
        unconfigured_reason=reason,
        state=state,
        until=until,
        detail=health.block_detail,
        used=dict(pool.used),
        limits={u: e.ref.limits.get(u) for u in UNITS},
        window_start=e.ref.window.bounds(now)[0],
        reset_at=e.ref.window.reset_at(now),
        live_leases=status.live_leases,
        exhausted_at=_projections(pool.used, e.ref, now),
        capabilities=e.capabilities,
        price=e.tariff.price,
        price_source=e.tariff.source,
        spend_usd=window_spend(e.tariff, pool.used["sandbox_seconds"], pool.used["sessions"]),
        hourly_usd=rate(e.tariff.price, e.tariff.size) * HOUR,
        usd_held=pool.usd_held,
        usd_projected=projected_spend(pool.used["usd"], *_window(e.ref, now), now),
    )


# A trickle of usage against a large limit projects past what datetime can hold.
_LAST_TIMESTAMP = datetime(9999, 1, 1, tzinfo=UTC).timestamp()


def _window(ref: EntryRef, now: float) -> tuple[float, float]:
    start, end = ref.window.bounds(now)
    return start.timestamp(), end.timestamp()


def _projections(used: Mapping[str, float], ref: EntryRef, now: float) -> dict[str, datetime]:
    start = _window(ref, now)[0]
    out = {}
    for unit in ("sessions", "sandbox_seconds", "usd"):
        when = projected_exhaustion(used[unit], ref.limits.get(unit), start, now)
        if when is not None and when < _LAST_TIMESTAMP:
            out[unit] = _dt(when)
    return out


def _dt(ts: float) -> datetime:
    return datetime.fromtimestamp(ts, UTC)
