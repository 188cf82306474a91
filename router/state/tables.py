"""The store logic applied in-process, written once for SQLite and memory.

`TableStore` implements every capability of `StateStore` with the pure
policies (``policies/``) over `Tables`, the rows one transaction sees. A
store built on it supplies only those rows and `TableStore._transact`,
which runs a function as one atomic transaction (a lock held in memory,
``BEGIN IMMEDIATE`` on SQLite). The Redis store runs the same rules in Lua.
"""

from __future__ import annotations

import abc
import dataclasses
import functools
import json
import math
from collections import Counter
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from policies import breaker, fleet, quota
from policies import paused as paused_policy
from policies import sessions as session_policy
from policies import tenants as tenant_policy
from policies import warm as warm_policy
from policies.breaker import BreakerConfig, BreakerState, Outcome
from policies.paused import PausedHold
from policies.quota import UNITS, LeaseSlot, Limits, Meter, PoolState, QuotaDenial, Renewal
from policies.tenants import TenantState, TenantWindow
from policies.warm import Claim, WarmRecord
from router.state.base import (
    CALL_MEMORY,
    FLEET_MEMORY,
    JOURNAL_MEMORY,
    SETTABLE_UNITS,
    EntryRef,
    EntryStatus,
    FleetView,
    HeldLease,
    PoolStatus,
    Reservation,
    SessionBinding,
    SessionClaim,
    Settlement,
    Snapshot,
    Spend,
    StateStore,
    TenantRef,
    TenantUsage,
)

__all__ = ["TableStore", "Tables"]

T = TypeVar("T")
_USAGE_KEEP = 62 * 24 * 3600.0  # a tenant's window outlives it by this much, for `cost`


@dataclass(slots=True)
class _Pool(PoolState):
    """A pool loaded in part, for the pure policies of `policies.quota`.

    ``leases`` holds only what one call touches: the leases it names and,
    when it purges, the expired ones. ``loaded`` remembers them as loaded
    (id -> entry) and ``others`` counts the leases left unread, so
    ``used("concurrent")`` still counts every lease and `_save` turns the
    difference into the entries' held counts.
    """

    others: int = 0
    loaded: dict[str, str] = field(default_factory=dict)
    loaded_usd_held: float = 0.0

    def used(self, unit: str) -> float:
        if unit == "concurrent":
            return self.others + len(self.leases)
        return PoolState.used(self, unit)


def _load(
    tx: Tables, ref: EntryRef, now: float, ids: Collection[str] = (), *, purge: bool = False
) -> _Pool:
    """``ref``'s pool in the window of ``now``, with the leases ``ids`` (and the expired
    ones when ``purge``)."""
    leases = tx.leases(ref.pool, ids, now if purge else None)
    window = ref.window.key(now)
    sessions, seconds, usd = tx.usage(ref.pool, window)
    held = sum(tx.held(ref.pool).values())
    loaded = {lid: slot.entry for lid, slot in leases.items()}
    row = tx.get("usd_held", ref.pool)
    usd_held = float(row[0]) if row is not None else 0.0
    pool = _Pool(window, sessions, seconds, leases, usd, usd_held, held - len(leases), loaded)
    pool.loaded_usd_held = usd_held
    return pool


def _save(tx: Tables, name: str, pool: _Pool) -> None:
    tx.save_usage(name, pool.window, pool.sessions, pool.sandbox_seconds, pool.usd)
    tx.save_leases(name, pool.leases, [lid for lid in pool.loaded if lid not in pool.leases])
    deltas = Counter(slot.entry for slot in pool.leases.values())
    deltas.subtract(pool.loaded.values())
    tx.count_held(name, {entry: n for entry, n in deltas.items() if n})
    if pool.used("concurrent") == 0 and tx.get("paused", name) is None:
        pool.usd_held = 0.0  # nothing holds anything: no float dust is left over
    if pool.usd_held != pool.loaded_usd_held:
        tx.put("usd_held", name, repr(pool.usd_held), math.inf, 0.0)


class Tables(Protocol):
    """Rows inside one transaction.

    A pool is its usage per window, its leases, and how many leases each
    entry holds in it (kept by `TableStore` on every save, so a snapshot
    reads no lease). A call loads only the leases it names and, to purge
    them, the expired ones: the store finds those by an index on expiry.
    Entry health has its own shape; everything else (sessions, locks, call
    answers, journal ids, replicas, a pool's ``usd_held``) is a keyed row of a
    named table with a value and an expiry.
    """

    def usage(self, pool: str, window: str) -> tuple[int, float, float]:
        """Sessions, sandbox seconds and USD the pool used in ``window``."""

    def save_usage(
        self, pool: str, window: str, sessions: int, seconds: float, usd: float
    ) -> None: ...

    def leases(
        self, pool: str, ids: Collection[str], expired_at: float | None
    ) -> dict[str, LeaseSlot]:
        """The leases named in ``ids`` and, unless None, every one expired at ``expired_at``."""

    def save_leases(
        self, pool: str, leases: Mapping[str, LeaseSlot], dropped: Collection[str]
    ) -> None:
        """Write ``leases`` back (new or changed) and delete the ``dropped`` ids."""

    def held(self, pool: str) -> dict[str, int]:
        """How many leases each entry holds in the pool (expired ones not purged too)."""

    def count_held(self, pool: str, deltas: Mapping[str, int]) -> None:
        """Add ``deltas`` to the entries' counts; a count at zero has no row."""

    def lease_ids(self, pool: str, now: float) -> set[str]:
        """Ids of the pool's unexpired leases (an operator's listing: reads them all)."""

    def load_entry(self, entry: str) -> BreakerState: ...
    def save_entry(self, entry: str, state: BreakerState) -> None: ...

    def get(self, table: str, key: str) -> tuple[str, float] | None:
        """The row's value and expiry, expired or not."""

    def put(self, table: str, key: str, value: str, expires: float, now: float) -> None:
        """Write the row; rows of ``table`` expired at ``now`` may be dropped."""

    def delete(self, table: str, key: str) -> None: ...

    def live(self, table: str, now: float) -> dict[str, tuple[str, float]]:
        """The rows unexpired at ``now`` (the expired ones are dropped)."""


class TableStore(StateStore):
    """Every store capability over `Tables`; a subclass supplies `_transact`."""

    @abc.abstractmethod
    async def _transact(self, fn: Callable[[Tables], T]) -> T:
        """Run ``fn`` in one transaction; StateUnavailable if the store cannot."""

    async def _once(
        self, call_id: str, now: float, fn: Callable[[Tables], T], decode: Callable[[Any], T]
    ) -> T:
        """`_transact`, answering a repeated ``call_id`` from the first call's answer.

        Without an id there is nothing to remember: this store never retries
        a call by itself.
        """
        if not call_id:
            return await self._transact(fn)

        def once(tx: Tables) -> T:
            seen = tx.get("call", call_id)
            if seen is not None and seen[1] > now:
                return decode(json.loads(seen[0]))
            answer = fn(tx)
            tx.put("call", call_id, json.dumps(_plain(answer)), now + CALL_MEMORY, now)
            return answer

        return await self._transact(once)

    async def reserve(
        self,
        ref: EntryRef,
        cfg: BreakerConfig,
        lease_id: str,
        now: float,
        hold: float,
        *,
        new_session: bool = True,
        warm: bool = False,
        meter: Meter | None = None,
        call_id: str = "",
    ) -> Reservation:
        return await self._once(
            call_id,
            now,
            lambda tx: _reserve(tx, ref, cfg, lease_id, now, hold, new_session, warm, meter),
            _reservation,
        )

    async def settle(
        self,
        ref: EntryRef,
        cfg: BreakerConfig,
        lease_id: str,
        now: float,
        *,
        outcome: Outcome,
        ttl: float = 0.0,
        detail: str = "",
        until: float | None = None,
        sandbox_id: str = "",
        call_id: str = "",
    ) -> Settlement:
        def settle(tx: Tables) -> Settlement:
            pool = _load(tx, ref, now, [lease_id])
            tenant = _load_tenant(tx, ref.tenant, now, _kept(pool, lease_id))
            short_at, short_of = 0.0, None
            if outcome is Outcome.SUCCESS:
                also = _budget(ref.tenant, tenant)
                renewal = quota.commit(pool, lease_id, now, ttl, sandbox_id, ref.limits, also)
                applied, short_at, short_of = renewal.alive, renewal.short_at, renewal.short_of
                if tenant is not None:
                    tenant_policy.mirror(tenant, lease_id, pool.leases.get(lease_id))
            else:
                applied = quota.refund(pool, lease_id)
                if tenant is not None:
                    tenant_policy.refund(tenant, lease_id)
            _save(tx, ref.pool, pool)
            _save_tenant(tx, ref.tenant, tenant, now)
            transition = _record(tx, ref, cfg, outcome, now, detail, until)
            return Settlement(applied, transition, short_at, short_of)

        return await self._once(call_id, now, settle, _settlement)

    async def release(
        self, ref: EntryRef, lease_id: str, now: float, *, call_id: str = ""
    ) -> float | None:
        def release(tx: Tables) -> float | None:
            pool = _load(tx, ref, now, [lease_id])
            tenant = _load_tenant(tx, ref.tenant, now, _kept(pool, lease_id))
            seconds = quota.release(pool, lease_id, now)
            _save(tx, ref.pool, pool)
            if tenant is not None:
                tenant_policy.release(tenant, lease_id, now)
                _save_tenant(tx, ref.tenant, tenant, now)
            if seconds is None:
                return None
            health = tx.load_entry(ref.entry)
            if health.block == breaker.CAPACITY:
                breaker.clear_capacity(health)
                tx.save_entry(ref.entry, health)
            return seconds

        return await self._once(call_id, now, release, lambda seconds: seconds)

    async def heartbeat(self, ref: EntryRef, lease_id: str, now: float, ttl: float) -> Renewal:
        def heartbeat(tx: Tables) -> Renewal:
            pool = _load(tx, ref, now, [lease_id])
            tenant = _load_tenant(tx, ref.tenant, now, _kept(pool, lease_id))
            also = _budget(ref.tenant, tenant)
            renewal = quota.heartbeat(pool, lease_id, now, ttl, ref.limits, also)
            _save(tx, ref.pool, pool)
            if tenant is not None:
                tenant_policy.mirror(tenant, lease_id, pool.leases.get(lease_id))
                _save_tenant(tx, ref.tenant, tenant, now)
            return renewal

        return await self._transact(heartbeat)

    async def record(
        self,
        ref: EntryRef,
        cfg: BreakerConfig,
        outcome: Outcome,
        now: float,
        *,
        detail: str = "",
        until: float | None = None,
        call_id: str = "",
    ) -> tuple[str, str] | None:
        return await self._once(
            call_id, now, lambda tx: _record(tx, ref, cfg, outcome, now, detail, until), _pair
        )

    async def snapshot(self, refs: list[EntryRef], now: float) -> Snapshot:
        return await self._transact(lambda tx: _snapshot(tx, refs, now))

    async def set_usage(self, ref: EntryRef, unit: str, value: float, now: float) -> None:
        if unit not in SETTABLE_UNITS:
            raise ValueError(f"unit must be one of {SETTABLE_UNITS}, got {unit!r}")

        def set_usage(tx: Tables) -> None:
            sessions, seconds, usd = tx.usage(ref.pool, ref.window.key(now))
            if unit == "sessions":
                sessions = int(value)
            elif unit == "usd":
                usd = float(value)
            else:
                seconds = float(value)
            tx.save_usage(ref.pool, ref.window.key(now), sessions, seconds, usd)
            bumped = str(_version(tx, ref.pool, ref.window.key(now)) + 1)
            expires = ref.window.reset_at(now).timestamp()  # the next window starts at 0
            tx.put("version", f"{ref.pool}|{ref.window.key(now)}", bumped, expires, now)

        await self._transact(set_usage)

    async def lease_ids(self, ref: EntryRef, now: float) -> set[str]:
        return await self._transact(lambda tx: tx.lease_ids(ref.pool, now))

    async def tenants(self, window: TenantWindow, now: float, top: int) -> list[TenantUsage]:
        def tenants(tx: Tables) -> list[TenantUsage]:
            key = window.key(now)
            found = []
            for usage, (value, _) in tx.live("tenant_usage", now).items():
                window_key, _, name = usage.partition("|")
                if window_key != key:
                    continue
                sessions, usd = json.loads(value)
                row = tx.get("tenant", name)
                held, live = 0.0, 0
                if row is not None:
                    state: dict[str, Any] = json.loads(row[0])
                    held = state["held"]
                    live = sum(slot["expires"] > now for slot in state["leases"].values())
                if sessions or usd or held or live:  # else touched, never spent
                    found.append(TenantUsage(name, key, sessions, usd, held, live))
            found.sort(key=lambda t: (-t.usd, -t.sessions, t.tenant))
            return found[:top]

        return await self._transact(tenants)

    async def claim_session(
        self, session: str, holder: str, expires: float, now: float
    ) -> SessionClaim:
        def claim(tx: Tables) -> SessionClaim:
            answer, row = session_policy.claim(_binding(tx, session), holder, expires, now)
            if row is not None:
                _put_binding(tx, session, row, now)
            return answer

        return await self._transact(claim)

    async def bind_session(
        self,
        session: str,
        entry: str,
        sandbox_id: str,
        expires: float,
        now: float,
        *,
        paused: bool = False,
        kept: bool = False,
        holder: str = "",
    ) -> bool:
        new = SessionBinding(entry, sandbox_id, expires, paused, holder)

        def bind(tx: Tables) -> bool:
            if not session_policy.bind(_binding(tx, session), new, now, kept=kept):
                return False
            _put_binding(tx, session, new, now)
            return True

        return await self._transact(bind)

    async def release_session(
        self,
        session: str,
        holder: str,
        expires: float,
        now: float,
        *,
        sandbox_id: str = "",
        paused: bool | None = None,
        drop: bool = False,
    ) -> bool:
        def release(tx: Tables) -> bool:
            row = _binding(tx, session)
            held, left = session_policy.let_go(
                row, holder, sandbox_id, expires, now, paused=paused, drop=drop
            )
            if left is None and row is not None:
                tx.delete("session", session)
            elif left is not row and left is not None:
                _put_binding(tx, session, left, now)
            return held

        return await self._transact(release)

    async def session(self, session: str, now: float) -> SessionBinding | None:
        found = session_policy.live(await self._transact(lambda tx: _binding(tx, session)), now)
        return found if found is not None and found.sandbox_id else None

    async def take_session(self, session: str, now: float) -> SessionBinding | None:
        def take(tx: Tables) -> SessionBinding | None:
            found = session_policy.live(_binding(tx, session), now)
            tx.delete("session", session)
            return found if found is not None and found.sandbox_id else None

        return await self._transact(take)

    async def unbind_session(self, session: str) -> None:
        await self._transact(lambda tx: tx.delete("session", session))

    async def bound_sandboxes(self, now: float) -> set[tuple[str, str]]:
        rows = await self._transact(lambda tx: tx.live("session", now))
        bound = (json.loads(value)[:2] for value, _ in rows.values())
        return {(entry, sandbox_id) for entry, sandbox_id in bound if sandbox_id}

    async def lock(self, name: str, token: str, ttl: float, now: float) -> bool:
        def lock(tx: Tables) -> bool:
            holder = tx.get("lock", name)
            if holder is not None and holder[1] > now:
                return False
            tx.put("lock", name, token, now + ttl, now)
            return True

        return await self._transact(lock)

    async def unlock(self, name: str, token: str) -> None:
        def unlock(tx: Tables) -> None:
            holder = tx.get("lock", name)
            if holder is not None and holder[0] == token:
                tx.delete("lock", name)

        await self._transact(unlock)

    async def register_replica(
        self, replica: str, ttl: float, refs: list[EntryRef], now: float
    ) -> FleetView:
        def register(tx: Tables) -> FleetView:
            counter = tx.get("fleet", "seq")
            seq = (int(counter[0]) if counter is not None and counter[1] > now else 0) + 1
            tx.put("fleet", "seq", str(seq), now + FLEET_MEMORY, now)
            members, registration = fleet.register(_members(tx, now), seq, replica, now, ttl)
            _save_member(tx, replica, members[replica], now)
            return FleetView(registration, _snapshot(tx, refs, now).pools)

        return await self._transact(register)

    async def deregister_replica(self, replica: str, now: float) -> None:
        def deregister(tx: Tables) -> None:
            members = fleet.deregister(_members(tx, now), replica, now)
            if replica in members:
                _save_member(tx, replica, members[replica], now)

        await self._transact(deregister)

    async def reconcile(self, journal_id: str, spends: list[Spend], now: float) -> int:
        def reconcile(tx: Tables) -> int:
            applied = 0
            for spend in spends:
                key = f"{spend.ref.pool}:{_journal_key(journal_id, spend.ref.tenant)}"
                seen = tx.get("journal", key)
                if seen is not None and seen[1] > now:
                    continue
                ids = [*spend.unanswered, *(held.lease_id for held in spend.leases)]
                pool = _load(tx, spend.ref, now, ids)
                tenant = _load_tenant(tx, spend.ref.tenant, now, _kept(pool, *ids))
                for lease_id in spend.unanswered:
                    quota.refund(pool, lease_id)
                    if tenant is not None:
                        tenant_policy.refund(tenant, lease_id)
                pool.sessions += spend.sessions
                pool.sandbox_seconds += spend.sandbox_seconds
                pool.usd += spend.usd
                if tenant is not None:
                    tenant.sessions += spend.sessions
                    tenant.usd += spend.usd
                for held in spend.leases:
                    if held.lease_id not in pool.leases:
                        slot = pool.leases[held.lease_id] = _handed_over(pool, held, now)
                        if tenant is not None and held.lease_id not in tenant.leases:
                            tenant_policy.hand_over(tenant, held.lease_id, slot)
                _save(tx, spend.ref.pool, pool)
                _save_tenant(tx, spend.ref.tenant, tenant, now)
                tx.put("journal", key, "", now + JOURNAL_MEMORY, now)
                applied += 1
            return applied

        return await self._transact(reconcile)

    async def warm_put(self, ref: EntryRef, lease_id: str, record: WarmRecord, now: float) -> bool:
        def put(tx: Tables) -> bool:
            pool = _load(tx, ref, now, [lease_id])
            records = _warm_rows(tx, ref, now)
            if not warm_policy.put(pool, records, lease_id, record):
                return False
            _save(tx, ref.pool, pool)
            _save_warm(tx, ref, records, now)
            return True

        return await self._transact(put)

    async def warm_take(self, ref: EntryRef, lease_id: str, now: float) -> float | None:
        def take(tx: Tables) -> float | None:
            pool = _load(tx, ref, now, [lease_id])
            records = _warm_rows(tx, ref, now)
            seconds = warm_policy.take(pool, records, lease_id, now)
            _save(tx, ref.pool, pool)
            _save_warm(tx, ref, records, now)
            return seconds

        return await self._transact(take)

    async def warm_list(self, ref: EntryRef, now: float) -> dict[str, WarmRecord]:
        return await self._transact(lambda tx: dict(_warm_rows(tx, ref, now)))

    async def warm_kept(self, ref: EntryRef, now: float) -> set[str]:
        return await self._transact(
            lambda tx: tx.lease_ids(ref.pool, now) | set(_warm_rows(tx, ref, now))
        )

    async def hold_paused(
        self, ref: EntryRef, sandbox_id: str, hold: PausedHold, now: float
    ) -> QuotaDenial | None:
        return await self._transact(lambda tx: _hold_paused(tx, ref, sandbox_id, hold, now))

    async def settle_paused(self, ref: EntryRef, sandbox_id: str, now: float) -> float | None:
        return await self._transact(lambda tx: _settle_paused(tx, ref, sandbox_id, now))

    async def paused_tenant(self, ref: EntryRef, sandbox_id: str) -> str | None:
        found = await self._transact(lambda tx: _paused_rows(tx, ref.pool).get(sandbox_id))
        return None if found is None else found.tenant

    async def ping(self) -> None:
        await self._transact(lambda tx: None)


def _journal_key(journal_id: str, tenant: TenantRef | None) -> str:
    """A journal is applied once per pool and tenant (a hand-over's spends of one pool
    are split by tenant)."""
    return journal_id if tenant is None else f"{journal_id}:{tenant.name}"


def _handed_over(pool: _Pool, held: HeldLease, now: float) -> LeaseSlot:
    """The slot of a lease an outage ledger granted, live from ``now``: its price held
    (covering it to ``now + ttl``) without asking the budget (it runs already)."""
    slot = LeaseSlot(
        held.entry, held.started, now + held.ttl, held.ttl, live=True, sandbox_id=held.sandbox_id
    )
    if held.meter is not None:
        m = held.meter
        slot.rate, slot.fee, slot.step, slot.renew = m.rate, m.fee, m.step, m.renew
        slot.covered, slot.kill = m.first, m.kill
        pool.usd_held += slot.hold()
        quota.cover(pool, slot, Limits())
    return slot


def _paused_rows(tx: Tables, pool: str) -> dict[str, PausedHold]:
    """The pool's paused storage holds by sandbox id (one row: a pool pauses few)."""
    row = tx.get("paused", pool)
    if row is None:
        return {}
    return {sid: PausedHold(*fields) for sid, fields in json.loads(row[0]).items()}


def _save_paused(tx: Tables, pool: str, holds: Mapping[str, PausedHold], now: float) -> None:
    """Write the pool's holds back (no row once it holds none: `_save` reads that)."""
    if not holds:
        if tx.get("paused", pool) is not None:
            tx.delete("paused", pool)
        return
    value = {sid: _paused_fields(h) for sid, h in holds.items()}
    tx.put("paused", pool, json.dumps(value), math.inf, now)


def _hold_paused(
    tx: Tables, ref: EntryRef, sandbox_id: str, hold: PausedHold, now: float
) -> QuotaDenial | None:
    """`PausedSupport.hold_paused` in one transaction (`policies.paused.hold`)."""
    pool = _load(tx, ref, now, purge=True)
    quota.purge_expired(pool, now)
    holds = _paused_rows(tx, ref.pool)
    paused_policy.purge_expired(pool, holds, now)
    tenant = _load_tenant(tx, ref.tenant, now)
    also = None if ref.tenant is None or tenant is None else (tenant, ref.tenant.limits)
    named = dataclasses.replace(hold, tenant=ref.tenant.name if ref.tenant else None)
    denial = paused_policy.hold(pool, holds, sandbox_id, named, ref.limits, also)
    _save_paused(tx, ref.pool, holds, now)
    _save(tx, ref.pool, pool)
    _save_tenant(tx, ref.tenant, tenant, now)
    return denial


def _settle_paused(tx: Tables, ref: EntryRef, sandbox_id: str, now: float) -> float | None:
    """`PausedSupport.settle_paused` in one transaction (`policies.paused.settle`): the
    tenant's copy is charged when ``ref`` names the hold's tenant."""
    pool = _load(tx, ref, now)
    holds = _paused_rows(tx, ref.pool)
    found = holds.get(sandbox_id)
    mine = ref.tenant is not None and found is not None and found.tenant == ref.tenant.name
    tenant = _load_tenant(tx, ref.tenant if mine else None, now)
    charged = paused_policy.settle(pool, holds, sandbox_id, now, tenant)
    paused_policy.purge_expired(pool, holds, now)
    _save_paused(tx, ref.pool, holds, now)
    _save(tx, ref.pool, pool)
    _save_tenant(tx, ref.tenant, tenant, now)
    return charged


def _paused_fields(found: PausedHold) -> list[Any]:
    """A hold as its row keeps it (its tenant last, only when it has one)."""
    fields: list[Any] = [found.entry, found.started, found.expires, found.rate]
    return fields if found.tenant is None else [*fields, found.tenant]


def _binding(tx: Tables, session: str) -> SessionBinding | None:
    """The session's row as a binding, expired or not."""
    row = tx.get("session", session)
    if row is None:
        return None
    entry, sandbox_id, *more = json.loads(row[0])
    paused = bool(more and more[0])
    holder = more[1] if len(more) > 1 else ""
    return SessionBinding(entry, sandbox_id, row[1], paused, holder)


def _put_binding(tx: Tables, session: str, binding: SessionBinding, now: float) -> None:
    """Write the session's row; an unheld binding keeps the shape it had before holders
    (``[entry, sandbox_id]``, ``paused`` appended only when true)."""
    fields: list[object] = [binding.entry, binding.sandbox_id]
    if binding.holder:
        fields += [binding.paused, binding.holder]
    elif binding.paused:
        fields.append(True)
    tx.put("session", session, json.dumps(fields), binding.expires, now)


def _plain(answer: object) -> object:
    if dataclasses.is_dataclass(answer) and not isinstance(answer, type):
        return dataclasses.asdict(answer)
    return answer


def _pair(value: list[str] | None) -> tuple[str, str] | None:
    return (value[0], value[1]) if value else None


def _reservation(fields: dict[str, Any]) -> Reservation:
    claimed = fields["claimed"]
    return Reservation(
        **{
            **fields,
            "transition": _pair(fields["transition"]),
            "claimed": Claim(**claimed) if claimed else None,
        }
    )


def _settlement(fields: dict[str, Any]) -> Settlement:
    return Settlement(
        fields["applied"], _pair(fields["transition"]), fields["short_at"], fields.get("short_of")
    )


def _reserve(
    tx: Tables,
    ref: EntryRef,
    cfg: BreakerConfig,
    lease_id: str,
    now: float,
    hold: float,
    new_session: bool,
    warm: bool = False,
    meter: Meter | None = None,
) -> Reservation:
    pool = _load(tx, ref, now, [lease_id], purge=True)
    if lease_id in pool.leases:  # granted before (a repeat the call memo forgot)
        return Reservation(True)
    tenant = _load_tenant(tx, ref.tenant, now)
    health = tx.load_entry(ref.entry)
    admission = breaker.admit(health, cfg, now, ref.fingerprint)
    if not admission.allowed:
        tx.save_entry(ref.entry, health)
        _save_tenant(tx, ref.tenant, tenant, now)
        return Reservation(
            False, reason=admission.reason, until=admission.until, detail=health.block_detail
        )
    if warm and not admission.probe and _room(ref.tenant, tenant):
        quota.purge_expired(pool, now)
        records = _warm_rows(tx, ref, now)
        unread = tx.leases(ref.pool, [lid for lid in records if lid not in pool.loaded], None)
        pool.leases.update(unread)
        pool.loaded.update({lid: slot.entry for lid, slot in unread.items()})
        pool.others -= len(unread)
        also = _budget(ref.tenant, tenant)
        claimed = warm_policy.claim(pool, ref.limits, records, ref.entry, now, hold, meter, also)
        _save_warm(tx, ref, records, now)
        if claimed is not None:
            tx.save_entry(ref.entry, health)
            _save(tx, ref.pool, pool)
            if tenant is not None:
                tenant_policy.add(tenant, claimed.lease_id, pool.leases[claimed.lease_id])
                _save_tenant(tx, ref.tenant, tenant, now)
            return Reservation(True, transition=admission.transition, claimed=claimed)
    admit = None
    if ref.tenant is not None and tenant is not None:
        admit = functools.partial(tenant_policy.check, tenant, ref.tenant.limits)
    verdict = quota.reserve(
        pool, ref.limits, lease_id, ref.entry, now, hold, new_session, meter, admit
    )
    if isinstance(verdict, quota.QuotaDenial):
        if admission.probe:
            health.probe_until = 0.0
        tx.save_entry(ref.entry, health)
        _save(tx, ref.pool, pool)
        _save_tenant(tx, ref.tenant, tenant, now)
        if ref.tenant is not None and isinstance(verdict, tenant_policy.TenantDenial):
            return Reservation(
                False,
                reason="tenant",
                unit=verdict.unit,
                used=verdict.used,
                limit=verdict.limit,
                until=ref.tenant.window.reset_at(now).timestamp(),
                detail=ref.tenant.name,
            )
        return Reservation(
            False,
            reason="quota",
            unit=verdict.unit,
            used=verdict.used,
            limit=verdict.limit,
            until=ref.window.reset_at(now).timestamp(),
            version=_version(tx, ref.pool, pool.window),
        )
    tx.save_entry(ref.entry, health)
    _save(tx, ref.pool, pool)
    if tenant is not None:
        tenant_policy.add(tenant, lease_id, pool.leases[lease_id])
        _save_tenant(tx, ref.tenant, tenant, now)
    return Reservation(True, probe=admission.probe, transition=admission.transition)


def _load_tenant(
    tx: Tables, tenant: TenantRef | None, now: float, keep: Collection[str] = ()
) -> TenantState | None:
    """The tenant's ledger in the window of ``now``, its expired leases purged (charged
    until their expiry) but ``keep`` (`policies.tenants.purge_expired`); None for a
    lease without a tenant."""
    if tenant is None:
        return None
    window = tenant.window.key(now)
    usage = tx.get("tenant_usage", f"{window}|{tenant.name}")
    sessions, usd = json.loads(usage[0]) if usage is not None else (0, 0.0)
    row = tx.get("tenant", tenant.name)
    held, leases, paused = 0.0, {}, {}
    if row is not None:
        data = json.loads(row[0])
        held = data["held"]
        leases = {lid: LeaseSlot(**fields) for lid, fields in data["leases"].items()}
        paused = {sid: PausedHold(*fields) for sid, fields in data.get("paused", {}).items()}
    state = TenantState(window, sessions, usd, held, leases, paused)
    tenant_policy.purge_expired(state, now, keep)
    paused_policy.purge_expired(state, state.paused, now)
    return state


def _save_tenant(
    tx: Tables, tenant: TenantRef | None, state: TenantState | None, now: float
) -> None:
    """Write what changed of the tenant's window usage and its leases (no row once it
    holds none)."""
    if tenant is None or state is None:
        return
    key = f"{state.window}|{tenant.name}"
    usage, stored = json.dumps([state.sessions, state.usd]), tx.get("tenant_usage", key)
    # A row as soon as it holds a lease: `tenants` lists it (what Redis's spend zset does).
    before = stored[0] if stored is not None else json.dumps([0, 0.0])
    if before != usage or (stored is None and (state.leases or state.paused)):
        expires = tenant.window.reset_at(now).timestamp() + _USAGE_KEEP
        tx.put("tenant_usage", key, usage, expires, now)
    row = tx.get("tenant", tenant.name)
    if not state.leases and not state.paused:
        if row is not None:
            tx.delete("tenant", tenant.name)
        return
    leases = {lid: dataclasses.asdict(slot) for lid, slot in state.leases.items()}
    data: dict[str, Any] = {"held": state.usd_held, "leases": leases}
    if state.paused:
        data["paused"] = {sid: _paused_fields(h) for sid, h in state.paused.items()}
    value = json.dumps(data)
    if row is None or row[0] != value:
        tx.put("tenant", tenant.name, value, math.inf, now)


def _kept(pool: _Pool, *lease_ids: str) -> set[str]:
    """The leases a call names, kept from their tenant's purge while their pool holds
    them."""
    return {lid for lid in lease_ids if lid in pool.leases}


def _budget(tenant: TenantRef | None, state: TenantState | None) -> tuple[float, float] | None:
    """The tenant's usd budget as a renewal must fit it too (`policies.quota.cover`)."""
    if tenant is None or state is None:
        return None
    return tenant_policy.budget(state, tenant.limits)


def _room(tenant: TenantRef | None, state: TenantState | None) -> bool:
    """Whether a warm claim may go ahead for the tenant: it has room for one more lease
    (its usd budget is the claim's to check: `policies.warm.claim`)."""
    if tenant is None or state is None:
        return True
    return tenant.limits.concurrent is None or len(state.leases) < tenant.limits.concurrent


def _warm_table(ref: EntryRef) -> str:
    return f"warm:{ref.pool}:{ref.entry}"


def _warm_rows(tx: Tables, ref: EntryRef, now: float) -> dict[str, WarmRecord]:
    """The entry's warm records the store still keeps (a record past ``expires`` is gone)."""
    return {
        lid: WarmRecord(**json.loads(value))
        for lid, (value, _) in tx.live(_warm_table(ref), now).items()
    }


def _save_warm(tx: Tables, ref: EntryRef, records: dict[str, WarmRecord], now: float) -> None:
    """Write ``records`` as the entry's warm rows: new and changed ones written, missing
    ones deleted."""
    table = _warm_table(ref)
    stored = tx.live(table, now)
    for lid in stored.keys() - records.keys():
        tx.delete(table, lid)
    for lid, record in records.items():
        if lid not in stored or WarmRecord(**json.loads(stored[lid][0])) != record:
            tx.put(table, lid, json.dumps(dataclasses.asdict(record)), record.expires, now)


def _version(tx: Tables, pool: str, window: str) -> int:
    """The pool's limits version in ``window`` (0 until an operator changes its usage)."""
    row = tx.get("version", f"{pool}|{window}")
    return int(row[0]) if row else 0


def _record(
    tx: Tables,
    ref: EntryRef,
    cfg: BreakerConfig,
    outcome: Outcome,
    now: float,
    detail: str,
    until: float | None,
) -> tuple[str, str] | None:
    health = tx.load_entry(ref.entry)
    transition = breaker.record(
        health, cfg, outcome, now, fingerprint=ref.fingerprint, detail=detail, until=until
    )
    tx.save_entry(ref.entry, health)
    return transition


def _snapshot(tx: Tables, refs: list[EntryRef], now: float) -> Snapshot:
    """Usage and health after purging the expired leases: reads no live lease."""
    snap = Snapshot()
    held: dict[str, dict[str, int]] = {}
    for ref in refs:
        if ref.pool not in snap.pools:
            pool = _load(tx, ref, now, purge=True)
            quota.purge_expired(pool, now)
            holds = _paused_rows(tx, ref.pool)
            if paused_policy.purge_expired(pool, holds, now):
                _save_paused(tx, ref.pool, holds, now)
            _save(tx, ref.pool, pool)
            held[ref.pool] = tx.held(ref.pool)
            snap.pools[ref.pool] = PoolStatus(
                ref.pool,
                pool.window,
                {u: float(pool.used(u)) for u in UNITS},
                {u: ref.limits.get(u) for u in UNITS},
                _version(tx, ref.pool, pool.window),
                pool.usd_held,
            )
        snap.entries[ref.entry] = EntryStatus(
            ref.entry, tx.load_entry(ref.entry), held[ref.pool].get(ref.entry, 0)
        )
    return snap


def _members(tx: Tables, now: float) -> dict[str, fleet.Member]:
    """The fleet registry's members still counted at ``now`` (`policies.fleet`)."""
    rows = tx.live("member", now)
    return {name: fleet.Member(**json.loads(value)) for name, (value, _) in rows.items()}


def _save_member(tx: Tables, replica: str, member: fleet.Member, now: float) -> None:
    """Write ``member`` back; its row lasts as long as the registry counts it."""
    value = json.dumps(dataclasses.asdict(member))
    tx.put("member", replica, value, member.expires + member.ttl, now)
