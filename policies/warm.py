"""Warm pools: sandboxes made before anyone asks, as pure decisions over a pool.

A warm sandbox is real, and the ledger counts it as such:

* its ``sessions`` unit is spent when the refill reserves its create, once:
  a claim takes none (the claimed lease is not ``counted``, so a claim
  given back refunds only its slot);
* a *running* warm sandbox holds a lease (a concurrency slot) from its
  create on, under the lease id its labels carry; its seconds from the
  commit to its claim (or its kill) are metered into ``sandbox_seconds``
  when it is claimed (or taken), and the claimed lease meters its own
  from its commit: the pool is charged every second the vendor bills;
* a *paused* warm sandbox holds no slot and meters nothing while paused
  (the vendors bill a paused sandbox's storage, not its compute): its
  seconds from create to pause are metered when it is put in the pool, and
  a claim takes a slot like any reservation (the concurrency limit applies).

In a pool with a ``usd`` budget a warm sandbox is priced like a lease
(`policies.quota`): the refill's reservation holds its fee and its whole
stay (``max_idle`` plus the lease TTL) from before its create, so warm
sandboxes never take the pool past its budget; its idle time is settled
when it is claimed (its fee and idle seconds charged, its hold dropped) or
taken to be killed. The claimed reservation is then priced by the
acquire's `Meter` (its first cover held, no fee: nothing is made), and is
claimed only when the budget has room for that cover, counting what the
settlement frees; else the claim is skipped and the acquire's own
reservation is refused for ``usd``. A claim for a tenant with a ``usd``
limit must fit that budget too (`policies.tenants`): the claimed cover is
held against it in the same call, else the claim is skipped and the
reservation that follows is refused for the tenant's ``usd``.

A `WarmRecord` is keyed by that lease id in the store, per entry. A claim
picks the claimable record made first (``since``, then the lease id), turns
it into the caller's reservation under the same lease id (so the janitor,
which keeps what a live lease's label names, never sees it unheld), and
needs only the units a claim spends: ``sandbox_seconds``, plus
``concurrent`` for a paused one.

Each replica also connects ahead to the running warm sandboxes it may claim
(`reach`), so its claim finds a handle and skips the vendor's connect. A
handle counts only while it is recent (``REACH_FRESH``): the connect is
what proves the sandbox still answers, so one older than that is connected
again (past half of it, in the background) rather than trusted.

The Redis store runs the same rules in Lua (``router/state/lua/warm.lua``);
``tests/state/test_lua_matches_policies.py`` holds the two to the same answers.
"""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass

from policies import quota
from policies.breaker import EXHAUSTED, MISCONFIGURED, BreakerState, Circuit
from policies.quota import LeaseSlot, Limits, Meter, PoolState

__all__ = [
    "REACH_FRESH",
    "Claim",
    "WarmRecord",
    "claim",
    "failing",
    "fresh",
    "put",
    "reach",
    "take",
    "vendor_pool",
]

REACH_FRESH = 60.0  # seconds a handle connected ahead of a claim is trusted


@dataclass(frozen=True, slots=True)
class WarmRecord:
    """A ready warm sandbox, as the store holds it under its lease id.

    Attributes:
        sandbox_id: the provider's id (``connect`` / ``resume`` take it).
        since: when it was put in the pool (ready).
        deadline: when it stops being claimable (``since + max_idle``): the
            refill kills it then.
        expires: when the store forgets the record by itself, should no
            replica be left to kill it (its running lease expires then too).
        paused: parked with `Sandbox.pause` (resume it on claim).
    """

    sandbox_id: str
    since: float
    deadline: float
    expires: float
    paused: bool = False


@dataclass(frozen=True, slots=True)
class Claim:
    """A warm sandbox handed to a reservation: ``lease_id`` is now the caller's.

    ``idle`` is how long it waited; ``metered`` the seconds charged for that
    wait (0 for a paused one).
    """

    lease_id: str
    sandbox_id: str
    paused: bool
    idle: float
    metered: float


def claim(
    pool: PoolState,
    limits: Limits,
    records: MutableMapping[str, WarmRecord],
    entry: str,
    now: float,
    hold: float,
    meter: Meter | None = None,
    also: tuple[float, float] | None = None,
) -> Claim | None:
    """Hand the first claimable record's sandbox to a reservation held for ``hold`` s,
    priced by ``meter`` (the acquire's).

    None when none is ready or a unit the claim spends is used up, ``usd``
    included (the caller's ordinary reserve then decides, and denies for the
    same unit). ``also`` is a second budget the claimed cover must fit, as
    (spent and held, limit): its tenant's (`policies.tenants.budget`), which
    the warm sandbox's settlement frees nothing of. A running record whose lease
    is gone (the store lost it) is dropped: its sandbox, unrecorded and
    unleased, is the janitor's.
    """
    if _used_up(pool, limits, "sandbox_seconds"):
        return None
    for lease_id in sorted(records, key=lambda lid: (records[lid].since, lid)):
        record = records[lease_id]
        if record.deadline <= now:
            continue  # the refill kills it
        claimed = LeaseSlot(entry, now, now + hold, hold, counted=False)
        _price(claimed, meter)
        if record.paused:
            if _used_up(pool, limits, "concurrent"):
                continue  # a running one needs no slot of its own
            if not _fits(pool, limits, claimed, 0.0, also):
                return None
            del records[lease_id]
            pool.leases[lease_id] = claimed
            pool.usd_held += claimed.hold()
            return Claim(lease_id, record.sandbox_id, True, now - record.since, 0.0)
        slot = pool.leases.get(lease_id)
        if slot is None or not slot.live:
            del records[lease_id]
            continue
        metered = max(0.0, now - slot.started)
        if not _fits(pool, limits, claimed, slot.hold() - slot.charge(metered), also):
            return None
        del records[lease_id]
        pool.sandbox_seconds += metered
        quota.settle_usd(pool, slot, metered, fee=slot.counted)
        pool.leases[lease_id] = claimed
        pool.usd_held += claimed.hold()
        return Claim(lease_id, record.sandbox_id, False, now - record.since, metered)
    return None


def _price(slot: LeaseSlot, meter: Meter | None) -> None:
    """Price a claimed reservation by the acquire's meter: its rate for its first
    cover, no fee (the sandbox was made, and its fee charged, by the refill)."""
    if meter is not None and meter.rate > 0:
        slot.rate, slot.step, slot.renew = meter.rate, meter.step, meter.renew
        slot.covered, slot.kill = meter.first, meter.kill


def _fits(
    pool: PoolState,
    limits: Limits,
    slot: LeaseSlot,
    freed: float,
    also: tuple[float, float] | None,
) -> bool:
    """Whether the budget holds ``slot``'s cover once ``freed`` USD of holds is let go,
    and ``also`` (the tenant's) holds it."""
    if not slot.priced:
        return True
    if also is not None and also[0] + slot.hold() > also[1]:
        return False
    return limits.usd is None or pool.usd + pool.usd_held - freed + slot.hold() <= limits.usd


def put(
    pool: PoolState, records: MutableMapping[str, WarmRecord], lease_id: str, record: WarmRecord
) -> bool:
    """Put a committed lease's sandbox in the pool; False when the lease is not live.

    Running: the lease keeps its slot until ``record.expires``. Paused: the
    lease is released (its seconds until now metered) and holds nothing.
    """
    slot = pool.leases.get(lease_id)
    if slot is None or not slot.live:
        return False
    if record.paused:
        quota.release(pool, lease_id, record.since)
    else:
        slot.expires, slot.ttl = record.expires, record.expires - slot.started
    records[lease_id] = record
    return True


def take(
    pool: PoolState, records: MutableMapping[str, WarmRecord], lease_id: str, now: float
) -> float | None:
    """Take a record out of the pool to kill its sandbox: the seconds metered for it
    (its lease released), or None when it was not there (claimed, or taken already)."""
    record = records.pop(lease_id, None)
    if record is None:
        return None
    if record.paused:
        return 0.0
    return quota.release(pool, lease_id, now) or 0.0


def failing(
    health: BreakerState, used: Mapping[str, float], limits: Limits, now: float
) -> str | None:
    """Why an entry's warm sandboxes are drained (killed), or None.

    The entry failed: its circuit is open, its credentials were refused
    (misconfigured), the provider said its quota is gone (exhausted), or
    the pool has no ``sandbox_seconds`` left. A passing block (rate
    limited, capacity) only stops claims while it lasts (the reserve's
    admission refuses them), and spent ``sessions`` are no reason at all:
    the warm sandboxes are what they were spent on.
    """
    if health.block == MISCONFIGURED or (health.block == EXHAUSTED and now < health.block_until):
        return health.block
    if health.circuit is Circuit.OPEN and now < health.open_until:
        return "open"
    limit = limits.sandbox_seconds
    if limit is not None and used.get("sandbox_seconds", 0.0) >= limit:
        return "quota"
    return None


def vendor_pool(
    size: int, health: BreakerState, used: Mapping[str, float], limits: Limits, now: float
) -> tuple[int, str | None]:
    """The size to set a pool the vendor holds (``warm.server``) to, and why it is 0.

    As `failing` drains the router's own pools, and one more reason: no
    ``sessions`` left. The vendor's ready sandboxes were spent on nothing yet
    (each create it serves takes a session then), so none could be handed
    out until the window resets, and they cost the whole time.
    """
    why = failing(health, used, limits, now)
    if why is None and limits.sessions is not None and used.get("sessions", 0.0) >= limits.sessions:
        why = "sessions"
    return (0, why) if why is not None else (size, None)


def reach(
    records: Mapping[str, WarmRecord], reached: Mapping[str, float], now: float
) -> tuple[list[str], list[str]]:
    """Which warm sandboxes a replica connects to ahead of a claim, and which of
    its handles it lets go.

    ``reached`` maps the sandbox ids it holds handles for to when each was
    connected. It reaches the claimable running ones it has no handle for,
    or one past half of ``REACH_FRESH``; it lets go of handles whose sandbox
    is no longer claimable (claimed, killed, past its deadline, or paused:
    a connect would resume a paused one, which the vendor then bills).
    """
    claimable = {
        record.sandbox_id
        for record in records.values()
        if not record.paused and record.deadline > now
    }
    due = [
        sandbox_id
        for sandbox_id in sorted(claimable)
        if now - reached.get(sandbox_id, -REACH_FRESH) > REACH_FRESH / 2
    ]
    return due, sorted(set(reached) - claimable)


def fresh(reached_at: float, now: float) -> bool:
    """Whether a handle connected at ``reached_at`` may stand in for a connect now."""
    return now - reached_at <= REACH_FRESH


def _used_up(pool: PoolState, limits: Limits, unit: str) -> bool:
    limit = limits.get(unit)
    return limit is not None and pool.used(unit) >= limit
