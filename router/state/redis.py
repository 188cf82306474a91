"""The fleet store: Redis (``redis://``, ``rediss://``, ``redis+sentinel://``,
``redis+cluster://``).

Every decision is one Lua script run with EVALSHA (reloaded on NOSCRIPT);
the scripts live beside this module in ``lua/`` and share ``lib.lua``. The
happy path of an acquire is two round trips (``reserve``, then ``settle``),
a release is one; ``settle`` and ``release`` are sent before they return
(their answers futures), so the router's commit and free need no task.
Scripts go through a `router.state.scripts.ScriptRunner` (the lean socket
of `router.state.resp` where it serves the URL, else redis-py); every other
command goes through redis-py. Both paths raise
through `router.state.redis_client.state_errors`, the one place that maps
Redis failures. Key names come from `router.state.redis_keys`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import json
from collections.abc import Callable, Collection, Sequence
from typing import Any, TypeVar

from redis import exceptions as redis_errors

from policies.breaker import BreakerConfig, Outcome
from policies.fleet import Registration
from policies.paused import PausedHold
from policies.quota import UNITS, Limits, Meter, QuotaDenial, Renewal, ShortOf
from policies.tenants import TENANT_UNITS, TenantDenial, TenantWindow
from router.state import on_cluster, redis_snapshot, scripts
from router.state.base import (
    CALL_MEMORY,
    FLEET_MEMORY,
    JOURNAL_MEMORY,
    SETTABLE_UNITS,
    EntryRef,
    FleetView,
    Reservation,
    Settlement,
    Snapshot,
    Spend,
    StateStore,
    TenantRef,
    TenantUsage,
)
from router.state.redis_client import client, redact, state_errors
from router.state.redis_keys import KeySpace, PoolKeys
from router.state.redis_sessions import RedisSessions
from router.state.warm import Claim, WarmRecord

__all__ = ["PoolKeys", "RedisStore"]

T = TypeVar("T")
_USAGE_TTL = 62 * 24 * 3600  # a window's usage outlives it by a month, for status
_CALL_MS = int(CALL_MEMORY * 1000)
_JOURNAL_MS = int(JOURNAL_MEMORY * 1000)
_FLEET_MS = int(FLEET_MEMORY * 1000)


class RedisStore(RedisSessions, StateStore):
    """State in Redis, shared by every replica pointed at it.

    ``runner`` picks the script runner (see `router.state.scripts.runner`).
    ``tenants``: the config counts tenants (``tenants:``); on Redis Cluster every
    ledger key then shares one hash tag (`router.state.redis_keys`).
    """

    def __init__(
        self,
        url: str,
        prefix: str = "sandbox-router",
        runner: scripts.RunnerName = "auto",
        *,
        tenants: bool = False,
    ) -> None:
        self.url = redact(url)
        self.prefix = prefix
        self._keys = KeySpace(prefix, shared=tenants and on_cluster(url))
        self._cluster = on_cluster(url)
        self._redis = client(url)
        self._runner = scripts.runner(url, self._redis, runner)

    @property
    def client(self) -> Any:
        """The redis-py client (for the CLI and tests)."""
        return self._redis

    async def _script(self, name: str, keys: Sequence[str], args: Sequence[Any]) -> Any:
        script = scripts.script(name)
        with state_errors(self.url):
            return await self._runner.evalsha(script.sha, script.text, keys, args)

    def _post(
        self, name: str, keys: Sequence[str], args: Sequence[Any], decode: Callable[[Any], T]
    ) -> asyncio.Future[T]:
        """The script sent now, its decoded answer a future (see `ScriptRunner.post`)."""
        script = scripts.script(name)
        answer = functools.partial(self._answer, decode)
        return self._runner.post(script.sha, script.text, keys, args, answer)

    def _answer(self, decode: Callable[[Any], T], call: asyncio.Future[Any]) -> T:
        with state_errors(self.url):
            return decode(call.result())

    async def _commands(
        self, queue: Callable[[Any], object], *, transaction: bool = False
    ) -> list[Any]:
        """Run the commands ``queue`` adds to a redis-py pipeline; their replies."""
        with state_errors(self.url):
            async with self._redis.pipeline(transaction=transaction) as pipe:
                queue(pipe)
                replies: list[Any] = await pipe.execute()
                return replies

    def reserve(
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
    ) -> asyncio.Future[Reservation]:
        return self._post(
            "reserve",
            [
                *self._keys.pool(ref, now),
                self._keys.warm(ref),
                *self._keys.tenant(ref.tenant, now),
                self._keys.memo(ref, call_id),
            ],
            [
                now,
                lease_id,
                ref.entry,
                hold,
                *_limit_args(ref.limits),
                ref.fingerprint,
                _cfg(cfg),
                _USAGE_TTL,
                "1" if new_session else "0",
                "1" if warm else "0",
                *_meter_args(meter),
                *_tenant_args(ref.tenant),
                _CALL_MS,
            ],
            functools.partial(_reservation, ref, now),
        )

    def settle(
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
    ) -> asyncio.Future[Settlement]:
        return self._post(
            "settle",
            [
                *self._keys.pool(ref, now),
                *self._keys.tenant(ref.tenant, now),
                self._keys.memo(ref, call_id),
            ],
            [
                now,
                lease_id,
                outcome.value,
                ttl,
                detail,
                until or 0,
                ref.fingerprint,
                _cfg(cfg),
                sandbox_id,
                _usd_limit(ref.limits),
                *_tenant_budget(ref.tenant),
                _USAGE_TTL,
                _CALL_MS,
            ],
            _settlement,
        )

    def release(
        self, ref: EntryRef, lease_id: str, now: float, *, call_id: str = ""
    ) -> asyncio.Future[float | None]:
        return self._post(
            "release",
            [*self._keys.pool(ref, now), *self._keys.tenant(ref.tenant, now),
             self._keys.memo(ref, call_id)],
            [now, lease_id, _USAGE_TTL, ref.tenant.name if ref.tenant else "", _CALL_MS],
            _seconds,
        )  # fmt: skip

    async def heartbeat(self, ref: EntryRef, lease_id: str, now: float, ttl: float) -> Renewal:
        keys = self._keys.pool(ref, now)
        tenant: list[Any] = []
        if ref.tenant is not None:
            tenant = [*_tenant_budget(ref.tenant), _USAGE_TTL]
        raw = await self._script(
            "heartbeat",
            [keys.usage, keys.leases, keys.meta, keys.held, *self._keys.tenant(ref.tenant, now)],
            [now, lease_id, ttl, _usd_limit(ref.limits), *tenant],
        )
        alive, _, short = raw.decode().partition("|")
        ends, _, short_of = short.partition("|")
        return Renewal(alive == "1", float(ends) if ends else 0.0, _short_of(short_of))

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
        raw = await self._script(
            "record",
            [self._keys.pool(ref, now).health, self._keys.memo(ref, call_id)],
            [outcome.value, now, ref.fingerprint, detail, until or 0, _cfg(cfg), _CALL_MS],
        )
        r = json.loads(raw)
        return (r["from"], r["to"]) if r["from"] else None

    async def snapshot(self, refs: list[EntryRef], now: float) -> Snapshot:
        by_pool: dict[str, list[EntryRef]] = {}
        for ref in refs:
            by_pool.setdefault(ref.pool, []).append(ref)

        async def pool(members: list[EntryRef]) -> Any:
            keys = self._keys.pool(members[0], now)
            healths = [self._keys.pool(ref, now).health for ref in members]
            entries = [ref.entry for ref in members]
            return await self._script(
                "snapshot", [keys.usage, keys.leases, keys.meta, keys.held, *healths],
                [now, _USAGE_TTL, *entries],
            )  # fmt: skip

        replies = await asyncio.gather(*(pool(members) for members in by_pool.values()))
        return redis_snapshot.decode(list(by_pool.values()), replies, now)

    async def set_usage(self, ref: EntryRef, unit: str, value: float, now: float) -> None:
        if unit not in SETTABLE_UNITS:
            raise ValueError(f"unit must be one of {SETTABLE_UNITS}, got {unit!r}")
        amount = int(value) if unit == "sessions" else float(value)
        usage = self._keys.pool(ref, now).usage
        await self._commands(
            lambda pipe: pipe.hset(usage, unit, amount).hincrby(usage, "version", 1),
            transaction=True,
        )

    async def lease_ids(self, ref: EntryRef, now: float) -> set[str]:
        leases = self._keys.pool(ref, now).leases
        [ids] = await self._commands(lambda pipe: pipe.zrangebyscore(leases, f"({now}", "+inf"))
        return {i.decode() for i in ids}

    async def tenants(self, window: TenantWindow, now: float, top: int) -> list[TenantUsage]:
        spend = self._keys.tenant_spend(window, now)
        [ranked] = await self._commands(
            lambda pipe: pipe.zrevrange(spend, 0, top - 1) if top > 0 else pipe.ping()
        )
        if top <= 0 or not ranked:
            return []
        names = [name.decode() for name in ranked]

        def queue(pipe: Any) -> None:
            for name in names:
                leases, slots = self._keys.tenant_leases(name)
                pipe.hmget(self._keys.tenant_usage(window, now, name), "sessions", "usd")
                pipe.hget(slots, "$usd").zcount(leases, f"({now}", "+inf")

        replies = await self._commands(queue)
        found = []
        for i, name in enumerate(names):
            (sessions, usd), held, live = replies[3 * i : 3 * i + 3]
            usage = TenantUsage(
                name, window.key(now), int(sessions or 0), float(usd or 0),
                float(held or 0), int(live),
            )  # fmt: skip
            if usage.sessions or usage.usd or usage.usd_held or usage.concurrent:
                found.append(usage)  # else touched, never spent (a refunded reservation)
        found.sort(key=lambda t: (-t.usd, -t.sessions, t.tenant))
        return found

    async def lock(self, name: str, token: str, ttl: float, now: float) -> bool:
        key, ms = self._keys.lock(name), int(ttl * 1000)
        [taken] = await self._commands(lambda pipe: pipe.set(key, token, nx=True, px=ms))
        return bool(taken)

    async def unlock(self, name: str, token: str) -> None:
        await self._script("unlock", [self._keys.lock(name)], [token])

    async def register_replica(
        self, replica: str, ttl: float, refs: list[EntryRef], now: float
    ) -> FleetView:
        replicas, seq, joined, oldest = await self._script(
            "register", list(self._keys.fleet()), [replica, now, ttl, _FLEET_MS]
        )
        registration = Registration(int(replicas), int(seq), int(joined), int(oldest))
        return FleetView(registration, (await self.snapshot(refs, now)).pools)

    async def deregister_replica(self, replica: str, now: float) -> None:
        await self._script("deregister", [self._keys.fleet()[0]], [replica, now])

    async def reconcile(self, journal_id: str, spends: list[Spend], now: float) -> int:
        applied = 0
        for spend in spends:
            held = [
                {"id": h.lease_id, "entry": h.entry, "started": h.started, "ttl": h.ttl,
                 "sandbox": h.sandbox_id, **_held_meter(h.meter)}
                for h in spend.leases
            ]  # fmt: skip
            keys = self._keys.pool(spend.ref, now)
            tenant = spend.ref.tenant
            once = journal_id if tenant is None else f"{journal_id}:{tenant.name}"
            journal = self._keys.journal(spend.ref, once)
            applied += await self._script(
                "reconcile",
                [keys.usage, keys.leases, keys.meta, keys.held,
                 *self._keys.tenant(tenant, now), journal],
                [now, spend.sessions, repr(float(spend.sandbox_seconds)), _USAGE_TTL,
                 json.dumps(held), _JOURNAL_MS, json.dumps(list(spend.unanswered)),
                 repr(float(spend.usd)), tenant.name if tenant else ""],
            )  # fmt: skip
        return applied

    def _warm_keys(self, ref: EntryRef, now: float) -> list[str]:
        keys = self._keys.pool(ref, now)
        return [keys.usage, keys.leases, keys.meta, keys.held, self._keys.warm(ref)]

    async def warm_put(self, ref: EntryRef, lease_id: str, record: WarmRecord, now: float) -> bool:
        args = [lease_id, json.dumps(dataclasses.asdict(record)), "1" if record.paused else "0",
                record.since, record.expires, _USAGE_TTL, _CALL_MS]  # fmt: skip
        keys = [*self._warm_keys(ref, now), self._keys.memo(ref, "")]
        answer: bytes = await self._script("warm_put", keys, args)
        return answer == b"1"

    async def warm_take(self, ref: EntryRef, lease_id: str, now: float) -> float | None:
        keys = [*self._warm_keys(ref, now), self._keys.memo(ref, "")]
        seconds = await self._script("warm_take", keys, [now, lease_id, _USAGE_TTL, _CALL_MS])
        return float(seconds) if seconds else None

    async def warm_list(self, ref: EntryRef, now: float) -> dict[str, WarmRecord]:
        key = self._keys.warm(ref)
        [rows] = await self._commands(lambda pipe: pipe.hgetall(key))
        records = {lid.decode(): WarmRecord(**json.loads(raw)) for lid, raw in rows.items()}
        return {lid: r for lid, r in records.items() if r.expires > now}

    async def warm_kept(self, ref: EntryRef, now: float) -> set[str]:
        keys = [self._keys.pool(ref, now).leases, self._keys.warm(ref)]
        return {lid.decode() for lid in await self._script("warm_kept", keys, [now])}

    async def hold_paused(
        self, ref: EntryRef, sandbox_id: str, hold: PausedHold, now: float
    ) -> QuotaDenial | None:
        keys = self._keys.pool(ref, now)
        numbers = (repr(float(v)) for v in (hold.started, hold.expires, hold.rate))
        raw = await self._script(
            "paused_hold",
            [keys.usage, keys.leases, keys.meta, keys.held, *self._keys.tenant(ref.tenant, now)],
            [now, sandbox_id, hold.entry, *numbers, _usd_limit(ref.limits), _USAGE_TTL,
             *_tenant_budget(ref.tenant)],
        )  # fmt: skip
        if not raw:
            return None
        budget, used = raw[0].decode(), float(raw[1])
        if budget == "tenant":
            assert ref.tenant is not None
            assert ref.tenant.limits.usd is not None
            return TenantDenial("usd", used, ref.tenant.limits.usd)
        assert ref.limits.usd is not None  # only a limit refuses
        return QuotaDenial("usd", used, ref.limits.usd)

    async def settle_paused(self, ref: EntryRef, sandbox_id: str, now: float) -> float | None:
        keys = self._keys.pool(ref, now)
        raw = await self._script(
            "paused_settle",
            [keys.usage, keys.leases, keys.held, *self._keys.tenant(ref.tenant, now)],
            [now, sandbox_id, _USAGE_TTL, *([ref.tenant.name] if ref.tenant else [])],
        )
        return float(raw) if raw else None

    async def paused_tenant(self, ref: EntryRef, sandbox_id: str) -> str | None:
        held = self._keys.held(ref)
        [raw] = await self._commands(lambda pipe: pipe.hget(held, "$paused"))
        found = json.loads(raw).get(sandbox_id) if raw else None
        return found.get("tenant") if isinstance(found, dict) else None

    async def ping(self) -> None:
        await self._commands(lambda pipe: pipe.ping())

    async def warnings(self, refs: Collection[EntryRef], now: float) -> list[str]:
        found = await self._moved(refs, now) if self._cluster else []
        try:  # one by one: a Cluster's pipeline refuses INFO
            with state_errors(self.url):
                info = await self._redis.info("persistence")
                save = await self._redis.config_get("save")
        except redis_errors.ResponseError:  # CONFIG disabled (managed Redis): cannot tell
            return found
        snapshots = bool(save.get("save") or save.get(b"save"))
        if not info.get("aof_enabled") and not snapshots:
            found.append(
                f"Redis at {self.url} persists nothing (no AOF, no RDB snapshots): a restart "
                "forgets every quota count and lease; enable appendonly yes"
            )
        return found

    async def _moved(self, refs: Collection[EntryRef], now: float) -> list[str]:
        """On a Cluster, the pools whose current window is counted in the other layout
        (the config's ``tenants:`` turned on or off since: `router.state.redis_keys`),
        which this store does not read: their counts start from zero here."""
        pools = {ref.pool: ref for ref in refs}
        other = KeySpace(self.prefix, shared=not self._keys.shared)
        keys = [(other.pool(ref, now).usage, other.pool(ref, now).leases) for ref in pools.values()]
        replies = await self._commands(lambda pipe: [pipe.exists(*pair) for pair in keys])
        moved = [pool for pool, found in zip(pools, replies, strict=True) if found]
        if not moved:
            return []
        tags = [f"{{{self.prefix}:<pool>}}", f"{{{self.prefix}:ledger}}"]
        was, now_at = tags if self._keys.shared else tags[::-1]
        turned = "on" if self._keys.shared else "off"
        return [
            f"Redis Cluster at {self.url}: this window's counts of pool(s) "
            f"{', '.join(map(repr, moved))} are under the hash tag {was}, and this router "
            f"counts under {now_at} (the config's tenants: section was turned {turned}): "
            "they start from zero here. Carry them over with `sandbox-router quota set "
            "POOL UNIT VALUE` (docs/money.md)"
        ]

    async def close(self) -> None:
        await self._runner.aclose()
        await self._redis.aclose()


def _settlement(raw: bytes) -> Settlement:
    applied, moved_from, moved_to, short, *short_of = raw.decode().split("|")
    moved = (moved_from, moved_to) if moved_from else None
    return Settlement(applied == "1", moved, float(short) if short else 0.0, _short_of(*short_of))


def _short_of(budget: str = "") -> ShortOf | None:
    """Which budget a script said was short (none in an answer an older router's script
    memoised: the router takes that for its pool's)."""
    if budget == "tenant":
        return "tenant"
    return "pool" if budget == "pool" else None


def _seconds(raw: bytes) -> float | None:
    return float(raw) if raw else None


@functools.lru_cache(maxsize=64)
def _cfg(cfg: BreakerConfig) -> str:
    """The breaker config as the scripts read it (a chain has one; asdict is slow)."""
    return json.dumps(dataclasses.asdict(cfg))


def _usd_limit(limits: Limits) -> str:
    return "" if limits.usd is None else repr(float(limits.usd))


@functools.lru_cache(maxsize=256)
def _meter_args(meter: Meter | None) -> tuple[str, ...]:
    """A lease's meter as reserve's arguments (rate '' = unpriced); floats as repr, so the
    script reads the numbers the Python policies use."""
    if meter is None:
        return ("", "0", "0", "0", "0", "0")
    return (
        *(repr(float(v)) for v in (meter.rate, meter.fee, meter.step, meter.first, meter.renew)),
        "1" if meter.kill else "0",
    )


def _held_meter(meter: Meter | None) -> dict[str, Any]:
    """A handed-over lease's meter as the reconcile script reads it (nothing: unpriced)."""
    if meter is None or (meter.rate <= 0 and meter.fee <= 0):
        return {}
    numbers = ("rate", "fee", "step", "first", "renew")
    return {**{k: repr(float(getattr(meter, k))) for k in numbers}, "kill": int(meter.kill)}


@functools.lru_cache(maxsize=1024)
def _tenant_args(tenant: TenantRef | None) -> tuple[str, ...]:
    """A tenant as reserve's arguments: its name and limits ('' = unlimited)."""
    if tenant is None:
        return ("", "", "", "")
    return (
        tenant.name,
        *("" if (v := tenant.limits.get(u)) is None else repr(v) for u in TENANT_UNITS),
    )


def _tenant_budget(tenant: TenantRef | None) -> tuple[str, str]:
    """A tenant as settle's and heartbeat's arguments: its name and usd limit."""
    if tenant is None:
        return ("", "")
    usd = tenant.limits.usd
    return (tenant.name, "" if usd is None else repr(float(usd)))


@functools.lru_cache(maxsize=64)
def _limit_args(limits: Limits) -> tuple[str, ...]:
    """A pool's limits as reserve's arguments, in UNITS order ('' = unlimited)."""
    return tuple("" if limits.get(u) is None else repr(limits.get(u)) for u in UNITS)


def _reservation(ref: EntryRef, now: float, raw: bytes) -> Reservation:
    """The reserve script's answer: ``+probe|from|to`` for a plain grant, else JSON."""
    if raw[:1] == b"+":
        probe, moved_from, moved_to = raw[1:].decode().split("|")
        moved = (moved_from, moved_to) if moved_from else None
        return Reservation(True, probe=probe == "1", transition=moved)
    r = json.loads(raw)
    if r["granted"]:
        transition = (r["from"], r["to"]) if r["from"] else None
        claimed = Claim(**r["claimed"]) if "claimed" in r else None
        return Reservation(True, probe=bool(r["probe"]), transition=transition, claimed=claimed)
    if r["reason"] == "tenant" and ref.tenant is not None:
        return Reservation(
            False,
            reason="tenant",
            unit=r["unit"],
            used=float(r["used"]),
            limit=float(r["limit"]),
            until=ref.tenant.window.reset_at(now).timestamp(),
            detail=ref.tenant.name,
        )
    if r["reason"] == "quota":
        return Reservation(
            False,
            reason="quota",
            unit=r["unit"],
            used=float(r["used"]),
            limit=float(r["limit"]),
            until=ref.window.reset_at(now).timestamp(),
            version=int(r["version"]),
        )
    return Reservation(
        False, reason=r["reason"], until=float(r["until_"]), detail=r.get("detail", "")
    )
