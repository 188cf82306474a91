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
import json
from collections import Counter
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from policies import breaker, quota
from policies import warm as warm_policy
from policies.breaker import BreakerConfig, BreakerState, Outcome
from policies.quota import UNITS, LeaseSlot, PoolState
from policies.warm import Claim, WarmRecord
from router.state.base import (
    CALL_MEMORY,
    JOURNAL_MEMORY,
    SETTABLE_UNITS,
    EntryRef,
    EntryStatus,
    FleetView,
    PoolStatus,
    Reservation,
    SessionBinding,
    Settlement,
    Snapshot,
    Spend,
    StateStore,
)

__all__ = ["TableStore", "Tables"]

T = TypeVar("T")


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
    sessions, seconds = tx.usage(ref.pool, window)
    held = sum(tx.held(ref.pool).values())
    loaded = {lid: slot.entry for lid, slot in leases.items()}
    return _Pool(window, sessions, seconds, leases, held - len(leases), loaded)


def _save(tx: Tables, name: str, pool: _Pool) -> None:
    tx.save_usage(name, pool.window, pool.sessions, pool.sandbox_seconds)
    tx.save_leases(name, pool.leases, [lid for lid in pool.loaded if lid not in pool.leases])
    deltas = Counter(slot.entry for slot in pool.leases.values())
    deltas.subtract(pool.loaded.values())
    tx.count_held(name, {entry: n for entry, n in deltas.items() if n})


class Tables(Protocol):
    """Rows inside one transaction.

    A pool is its usage per window, its leases, and how many leases each
    entry holds in it (kept by `TableStore` on every save, so a snapshot
    reads no lease). A call loads only the leases it names and, to purge
    them, the expired ones: the store finds those by an index on expiry.
    Entry health has its own shape; everything else (sessions, locks, call
    answers, journal ids, replicas) is a keyed row of a named table with a
    value and an expiry.
    """

    def usage(self, pool: str, window: str) -> tuple[int, float]:
        """Sessions and sandbox seconds the pool used in ``window``."""

    def save_usage(self, pool: str, window: str, sessions: int, seconds: float) -> None: ...

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
        call_id: str = "",
    ) -> Reservation:
        return await self._once(
            call_id,
            now,
            lambda tx: _reserve(tx, ref, cfg, lease_id, now, hold, new_session, warm),
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
            if outcome is Outcome.SUCCESS:
                applied = quota.commit(pool, lease_id, now, ttl, sandbox_id)
            else:
                applied = quota.refund(pool, lease_id)
            _save(tx, ref.pool, pool)
            return Settlement(applied, _record(tx, ref, cfg, outcome, now, detail, until))

        return await self._once(call_id, now, settle, _settlement)

    async def release(
        self, ref: EntryRef, lease_id: str, now: float, *, call_id: str = ""
    ) -> float | None:
        def release(tx: Tables) -> float | None:
            pool = _load(tx, ref, now, [lease_id])
            seconds = quota.release(pool, lease_id, now)
            _save(tx, ref.pool, pool)
            if seconds is None:
                return None
            health = tx.load_entry(ref.entry)
            if health.block == breaker.CAPACITY:
                breaker.clear_capacity(health)
                tx.save_entry(ref.entry, health)
            return seconds

        return await self._once(call_id, now, release, lambda seconds: seconds)

    async def heartbeat(self, ref: EntryRef, lease_id: str, now: float, ttl: float) -> bool:
        def heartbeat(tx: Tables) -> bool:
            pool = _load(tx, ref, now, [lease_id])
            alive = quota.heartbeat(pool, lease_id, now, ttl)
            _save(tx, ref.pool, pool)
            return alive

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
            sessions, seconds = tx.usage(ref.pool, ref.window.key(now))
            if unit == "sessions":
                sessions = int(value)
            else:
                seconds = float(value)
            tx.save_usage(ref.pool, ref.window.key(now), sessions, seconds)
            bumped = str(_version(tx, ref.pool, ref.window.key(now)) + 1)
            expires = ref.window.reset_at(now).timestamp()  # the next window starts at 0
            tx.put("version", f"{ref.pool}|{ref.window.key(now)}", bumped, expires, now)

        await self._transact(set_usage)

    async def lease_ids(self, ref: EntryRef, now: float) -> set[str]:
        return await self._transact(lambda tx: tx.lease_ids(ref.pool, now))

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
    ) -> bool:
        # A running sandbox's row keeps the shape it had before ``paused`` existed.
        value = json.dumps([entry, sandbox_id, True] if paused else [entry, sandbox_id])

        def bind(tx: Tables) -> bool:
            if kept:
                row = tx.get("session", session)
                if row is None or row[1] <= now or json.loads(row[0])[1] != sandbox_id:
                    return False
            tx.put("session", session, value, expires, now)
            return True

        return await self._transact(bind)

    async def session(self, session: str, now: float) -> SessionBinding | None:
        row = await self._transact(lambda tx: tx.get("session", session))
        if row is None or row[1] <= now:
            return None
        entry, sandbox_id, *paused = json.loads(row[0])
        return SessionBinding(entry, sandbox_id, row[1], bool(paused and paused[0]))

    async def unbind_session(self, session: str) -> None:
        await self._transact(lambda tx: tx.delete("session", session))

    async def bound_sandboxes(self, now: float) -> set[tuple[str, str]]:
        rows = await self._transact(lambda tx: tx.live("session", now))
        return {tuple(json.loads(value)[:2]) for value, _ in rows.values()}

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
            tx.put("replica", replica, "", now + ttl, now)
            return FleetView(len(tx.live("replica", now)), _snapshot(tx, refs, now).pools)

        return await self._transact(register)

    async def deregister_replica(self, replica: str) -> None:
        await self._transact(lambda tx: tx.delete("replica", replica))

    async def reconcile(self, journal_id: str, spends: list[Spend], now: float) -> int:
        def reconcile(tx: Tables) -> int:
            applied = 0
            for spend in spends:
                key = f"{spend.ref.pool}:{journal_id}"
                seen = tx.get("journal", key)
                if seen is not None and seen[1] > now:
                    continue
                pool = _load(tx, spend.ref, now, [held.lease_id for held in spend.leases])
                pool.sessions += spend.sessions
                pool.sandbox_seconds += spend.sandbox_seconds
                for held in spend.leases:
                    pool.leases.setdefault(
                        held.lease_id,
                        LeaseSlot(held.entry, held.started, now + held.ttl, held.ttl,
                                  live=True, sandbox_id=held.sandbox_id),
                    )  # fmt: skip
                _save(tx, spend.ref.pool, pool)
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

    async def ping(self) -> None:
        await self._transact(lambda tx: None)


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
    return Settlement(fields["applied"], _pair(fields["transition"]))


def _reserve(
    tx: Tables,
    ref: EntryRef,
    cfg: BreakerConfig,
    lease_id: str,
    now: float,
    hold: float,
    new_session: bool,
    warm: bool = False,
) -> Reservation:
    pool = _load(tx, ref, now, [lease_id], purge=True)
    if lease_id in pool.leases:  # granted before (a repeat the call memo forgot)
        return Reservation(True)
    health = tx.load_entry(ref.entry)
    admission = breaker.admit(health, cfg, now, ref.fingerprint)
    if not admission.allowed:
        tx.save_entry(ref.entry, health)
        return Reservation(
            False, reason=admission.reason, until=admission.until, detail=health.block_detail
        )
    if warm and not admission.probe:
        quota.purge_expired(pool, now)
        records = _warm_rows(tx, ref, now)
        unread = tx.leases(ref.pool, [lid for lid in records if lid not in pool.loaded], None)
        pool.leases.update(unread)
        pool.loaded.update({lid: slot.entry for lid, slot in unread.items()})
        pool.others -= len(unread)
        claimed = warm_policy.claim(pool, ref.limits, records, ref.entry, now, hold)
        _save_warm(tx, ref, records, now)
        if claimed is not None:
            tx.save_entry(ref.entry, health)
            _save(tx, ref.pool, pool)
            return Reservation(True, transition=admission.transition, claimed=claimed)
    verdict = quota.reserve(pool, ref.limits, lease_id, ref.entry, now, hold, new_session)
    if isinstance(verdict, quota.QuotaDenial):
        if admission.probe:
            health.probe_until = 0.0
        tx.save_entry(ref.entry, health)
        _save(tx, ref.pool, pool)
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
    return Reservation(True, probe=admission.probe, transition=admission.transition)


def _warm_table(ref: EntryRef) -> str:
    return f"warm:{ref.pool}:{ref.entry}"


def _warm_rows(tx: Tables, ref: EntryRef, now: float) -> dict[str, WarmRecord]:
    """The entry's warm records the store still keeps (a record past ``expires`` is gone)."""
    return {
        lid: WarmRecord(**json.loads(value))
        for lid, (value, _) in tx.live(_warm_table(ref), now).items()
    }


def _save_warm(tx: Tables, ref: EntryRef, records: dict[str, WarmRecord], now: float) -> None:
    """Write ``records`` as the entry's warm rows: new ones added, missing ones deleted."""
    table = _warm_table(ref)
    stored = tx.live(table, now)
    for lid in stored.keys() - records.keys():
        tx.delete(table, lid)
    for lid in records.keys() - stored.keys():
        record = records[lid]
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
            _save(tx, ref.pool, pool)
            held[ref.pool] = tx.held(ref.pool)
            snap.pools[ref.pool] = PoolStatus(
                ref.pool,
                pool.window,
                {u: float(pool.used(u)) for u in UNITS},
                {u: ref.limits.get(u) for u in UNITS},
                _version(tx, ref.pool, pool.window),
            )
        snap.entries[ref.entry] = EntryStatus(
            ref.entry, tx.load_entry(ref.entry), held[ref.pool].get(ref.entry, 0)
        )
    return snap
