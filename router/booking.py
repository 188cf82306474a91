"""What a reservation is to the router: a `Booking` it holds, or a `Denied` and why.

`Ledger.book` makes both. A booking remembers which ledger holds its
reservation (the shared store, or this replica's fail-open share), so the
commit, heartbeats and release of its lease go where the reservation went.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

from policies.exhausted import Exhausted
from policies.quota import Meter
from providers.base import Sandbox
from router.lease import Held
from router.state import EntryRef, Reservation
from router.state.warm import Claim

__all__ = ["RESERVE_GRACE", "Booking", "Denied", "describe", "remembered_denial"]

RESERVE_GRACE = 30.0  # a reservation outlives its create by this much before it expires


class Denied(Exception):
    """The ledger refused a reservation (breaker or quota); `describe` says why."""

    def __init__(self, reservation: Reservation) -> None:
        super().__init__(reservation.reason)
        self.reservation = reservation


@dataclass(frozen=True, slots=True)
class Booking:
    """A reservation this router holds, and which ledger holds it.

    Attributes:
        ref: the entry as the holding store knows it (under fail-open, with
            the replica's share of the limits).
        shared: False when this replica's fail-open share holds it.
        budget: the seconds the create (or a session's reconnect) may take.
    """

    lease_id: str
    entry: str
    ref: EntryRef
    shared: bool
    budget: float = 0.0
    counted: bool = True  # took a session unit (False: a reconnect, or a warm claim)
    claimed: Claim | None = None  # the warm sandbox the reservation claimed
    meter: Meter | None = None  # its price, held against its pool's usd budget

    def held(
        self,
        provider: str,
        sandbox: Sandbox,
        acquired_at: float,
        attempts: int,
        *,
        session: str | None = None,
        resumed: bool = False,
    ) -> Held:
        """The lease record for the sandbox this booking paid for."""
        return Held(
            self.lease_id,
            self.entry,
            provider,
            sandbox,
            acquired_at,
            attempts,
            store_kind="shared" if self.shared else "fallback",
            session=session,
            resumed=resumed,
            counted=self.counted,
            tenant=self.ref.tenant,
        )


def describe(r: Reservation, now: float) -> str:
    """Why a reservation was denied, for `NoProviderAvailable`'s message."""
    if r.reason == "tenant" and r.unit == "usd":
        return (
            f"tenant {r.detail!r} usd limit: ${r.used:.4f} spent or held of ${r.limit:.4f}, "
            f"no room for this lease's hold until its leases release or its window resets "
            f"at {_iso(r.until)}"
        )
    if r.reason == "tenant":
        return (
            f"tenant {r.detail!r} limit reached: {r.unit} {_num(r.used)}/{_num(r.limit)} "
            f"until {_iso(r.until) if r.unit == 'sessions' else 'its leases release'}"
        )
    if r.reason == "quota" and r.unit == "usd":
        return (
            f"usd budget: ${r.used:.4f} spent or held of ${r.limit:.4f}, no room for this "
            f"lease's hold until leases release or the window resets at {_iso(r.until)}"
        )
    if r.reason == "quota":
        return f"quota exhausted: {r.unit} {_num(r.used)}/{_num(r.limit)} until {_iso(r.until)}"
    if r.reason == "open":
        return f"breaker open for {max(0.0, r.until - now):.0f}s"
    if r.reason == "half_open":
        return "breaker half-open: a probe is in flight"
    if r.reason == "misconfigured":
        return f"misconfigured (credentials refused: {r.detail}); fix the config"
    if r.reason == "exhausted":
        return f"provider quota exhausted until {_iso(r.until)}"
    if r.reason == "rate_limited":
        return f"rate limited for {max(0.0, r.until - now):.0f}s"
    if r.reason == "capacity":
        return "provider concurrency cap reached"
    if r.reason == "outage":
        return r.detail
    return r.reason


def remembered_denial(known: Exhausted) -> Reservation:
    """The quota denial a remembered exhaustion stands for."""
    return Reservation(
        False,
        reason="quota",
        unit=known.unit,
        used=known.used,
        limit=known.limit,
        until=known.until,
        version=known.version,
    )


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).isoformat()


def _num(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:.1f}"
