"""The fleet store: Redis (``redis://``, ``rediss://``, ``redis+sentinel://``,
``redis+cluster://``).

Every decision is one Lua script run with EVALSHA (reloaded on NOSCRIPT);
the scripts live beside this module in ``lua/`` and share ``lib.lua``. The
happy path of an acquire is two round trips (``reserve``, then ``settle``),
a release is one. Scripts go through a `router.state.scripts.ScriptRunner`
(the lean socket of `router.state.resp` where it serves the URL, else
redis-py); every other command goes through redis-py. Both paths raise
through `_state_errors`, the one place that maps Redis failures.

Keys of one pool share the hash tag ``{<prefix>:<pool>}`` (usage per window,
the lease set, lease metadata, and the health of every entry drawing on the
pool), so each script touches one slot and runs on Redis Cluster.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import re
import uuid
from collections.abc import Callable, Iterator, Sequence
from typing import Any, NamedTuple
from urllib.parse import parse_qs, unquote, urlsplit

from redis import exceptions as redis_errors
from redis.asyncio import BlockingConnectionPool, Redis
from redis.asyncio.cluster import RedisCluster
from redis.asyncio.retry import Retry
from redis.asyncio.sentinel import Sentinel
from redis.backoff import ExponentialBackoff

from policies.breaker import BreakerConfig, BreakerState, Outcome
from policies.quota import UNITS, Limits, MonthlyWindow
from providers.errors import ConfigError, StateUnavailable
from router.state import scripts
from router.state.base import (
    CALL_MEMORY,
    JOURNAL_MEMORY,
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

__all__ = ["PoolKeys", "RedisStore"]

_UNAVAILABLE = (
    redis_errors.ConnectionError,
    redis_errors.TimeoutError,
    redis_errors.BusyLoadingError,
    redis_errors.ClusterDownError,
    redis_errors.TryAgainError,
    redis_errors.RedisClusterException,  # no node of the cluster answers
    OSError,
)
_REFUSALS = {
    "NOREPLICAS": "fewer replicas than min-replicas-to-write acknowledge writes",
    "READONLY": "it is a read-only replica (a failover moved the master?)",
    "OOM": "memory is full (maxmemory) and the policy evicts nothing",
    "MISCONF": "its last RDB snapshot failed and stop-writes-on-bgsave-error is on",
}
# At the start of a reply, or inside redis-py's note on a failed pipeline command.
_REFUSAL_CODE = re.compile(r"(?:^|caused error: \(['\"])(NOREPLICAS|READONLY|OOM|MISCONF)\b")
_USAGE_TTL = 62 * 24 * 3600  # a window's usage outlives it by a month, for status
_DEFAULT_TIMEOUTS = {"socket_timeout": 2.0, "socket_connect_timeout": 2.0}
_POOL_SIZE = 64  # per router; ?max_connections=N in the URL overrides it
_POOL_WAIT = 10.0
_CALL_MS = int(CALL_MEMORY * 1000)
_JOURNAL_MS = int(JOURNAL_MEMORY * 1000)


class PoolKeys(NamedTuple):
    """The keys of one pool, all under its hash tag (one Cluster slot)."""

    usage: str  # hash: sessions, sandbox_seconds of the current window
    leases: str  # zset: lease id -> expiry
    meta: str  # hash: lease id -> slot (json)
    health: str  # the entry's breaker state (json)


@contextlib.contextmanager
def _state_errors(url: str) -> Iterator[None]:
    """Turn a failure of Redis itself into StateUnavailable naming the store.

    Unreachable, and refusing writes (too few replicas, a replica after a
    failover, memory full, a failed snapshot): either way the ledger cannot
    decide, which is the router's fail_closed/fail_open case, not a provider's.
    """
    try:
        yield
    except _UNAVAILABLE as exc:
        raise StateUnavailable(f"state store {url}: {exc}") from exc
    except redis_errors.ResponseError as exc:
        code = getattr(exc, "status_code", None)  # redis-py strips the codes it knows
        if code not in _REFUSALS:
            found = _REFUSAL_CODE.search(str(exc))
            code = found.group(1) if found else None
        if code is None:
            raise
        raise StateUnavailable(
            f"state store {url} refused the write ({code}): {_REFUSALS[code]}"
        ) from exc


def _client(url: str) -> Any:
    parts = urlsplit(url)
    query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
    timeouts = {k: float(query.get(k, v)) for k, v in _DEFAULT_TIMEOUTS.items()}
    if parts.scheme in ("redis", "rediss", "unix"):
        # A burst of concurrent acquires waits for a pooled connection instead
        # of failing with "Too many connections" (redis-py's default pool).
        extra: dict[str, Any] = {k: v for k, v in timeouts.items() if k not in query}
        extra.setdefault("max_connections", _POOL_SIZE)
        extra["retry"] = _reconnect()
        pool = BlockingConnectionPool.from_url(url, timeout=_POOL_WAIT, **extra)
        return Redis.from_pool(pool)  # the client owns (and closes) its pool
    if parts.scheme in ("redis+cluster", "rediss+cluster"):
        base = url.replace("+cluster", "", 1)
        extra = {k: v for k, v in timeouts.items() if k not in query}
        return RedisCluster.from_url(base, **extra)
    if parts.scheme in ("redis+sentinel", "rediss+sentinel"):
        hosts = []
        for hostport in parts.netloc.rpartition("@")[2].split(","):
            host, _, port = hostport.partition(":")
            hosts.append((host, int(port or 26379)))
        path = [p for p in parts.path.split("/") if p]
        if not path:
            raise ConfigError(
                f"state_url {_redact(url)}: expected redis+sentinel://host:port[,host:port]"
                "/service_name[/db]"
            )
        db = int(path[1]) if len(path) > 1 else 0
        password = unquote(parts.password) if parts.password else None
        sentinel = Sentinel(  # type: ignore[no-untyped-call]  # redis-py leaves it unannotated
            hosts,
            sentinel_kwargs={"password": password, **timeouts},
            password=password,
            ssl=parts.scheme.startswith("rediss"),
            db=db,
            retry=_reconnect(),
            **timeouts,
        )
        return sentinel.master_for(path[0])
    raise ConfigError(f"state_url {_redact(url)}: unsupported Redis scheme {parts.scheme!r}")


def _reconnect() -> Retry:
    """Reconnect after a dropped connection (a Redis restart, a failover).

    A command may then run twice: every script call carries a call id, and a
    repeat returns the first answer (see `LedgerSupport`).
    """
    return Retry(ExponentialBackoff(cap=0.25, base=0.02), retries=2)


def _redact(url: str) -> str:
    parts = urlsplit(url)
    if parts.password:
        return url.replace(parts.password, "***", 1)
    return url


class RedisStore(StateStore):
    """State in Redis, shared by every replica pointed at it.

    ``runner`` picks the script runner (see `router.state.scripts.runner`).
    """

    def __init__(
        self, url: str, prefix: str = "sandbox-router", runner: scripts.RunnerName = "auto"
    ) -> None:
        self.url = _redact(url)
        self.prefix = prefix
        self._redis = _client(url)
        self._runner = scripts.runner(url, self._redis, runner)
        self._windows: dict[MonthlyWindow, tuple[float, float, str]] = {}

    @property
    def client(self) -> Any:
        """The redis-py client (for the CLI and tests)."""
        return self._redis

    def _window_key(self, window: MonthlyWindow, now: float) -> str:
        """The window's key, recomputed only when ``now`` leaves the cached window."""
        cached = self._windows.get(window)
        if cached is None or not cached[0] <= now < cached[1]:
            start, end = window.bounds(now)
            cached = (start.timestamp(), end.timestamp(), start.strftime("%Y-%m-%d"))
            self._windows[window] = cached
        return cached[2]

    def _tag(self, pool: str) -> str:
        return f"{{{self.prefix}:{pool}}}"

    def _memo(self, ref: EntryRef, call_id: str) -> str:
        """Where a script keeps this call's answer for a retry (see `LedgerSupport`)."""
        return f"{self._tag(ref.pool)}:call:{call_id or uuid.uuid4().hex}"

    def _keys(self, ref: EntryRef, now: float) -> PoolKeys:
        tag = self._tag(ref.pool)
        return PoolKeys(
            f"{tag}:usage:{self._window_key(ref.window, now)}",
            f"{tag}:leases",
            f"{tag}:lease",
            f"{tag}:entry:{ref.entry}",
        )

    async def _script(self, name: str, keys: Sequence[str], args: Sequence[Any]) -> Any:
        script = scripts.script(name)
        with _state_errors(self.url):
            return await self._runner.evalsha(script.sha, script.text, keys, args)

    async def _commands(
        self, queue: Callable[[Any], object], *, transaction: bool = False
    ) -> list[Any]:
        """Run the commands ``queue`` adds to a redis-py pipeline; their replies."""
        with _state_errors(self.url):
            async with self._redis.pipeline(transaction=transaction) as pipe:
                queue(pipe)
                replies: list[Any] = await pipe.execute()
                return replies

    async def reserve(
        self,
        ref: EntryRef,
        cfg: BreakerConfig,
        lease_id: str,
        now: float,
        hold: float,
        *,
        new_session: bool = True,
        call_id: str = "",
    ) -> Reservation:
        raw = await self._script(
            "reserve",
            [*self._keys(ref, now), self._memo(ref, call_id)],
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
                _CALL_MS,
            ],
        )
        r = json.loads(raw)
        if r["granted"]:
            transition = (r["from"], r["to"]) if r["from"] else None
            return Reservation(True, probe=bool(r["probe"]), transition=transition)
        if r["reason"] == "quota":
            return Reservation(
                False,
                reason="quota",
                unit=r["unit"],
                used=float(r["used"]),
                limit=float(r["limit"]),
                until=ref.window.reset_at(now).timestamp(),
            )
        return Reservation(
            False, reason=r["reason"], until=float(r["until_"]), detail=r.get("detail", "")
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
        raw = await self._script(
            "settle",
            [*self._keys(ref, now), self._memo(ref, call_id)],
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
                _CALL_MS,
            ],
        )
        r = json.loads(raw)
        return Settlement(bool(r["applied"]), (r["from"], r["to"]) if r["from"] else None)

    async def release(
        self, ref: EntryRef, lease_id: str, now: float, *, call_id: str = ""
    ) -> float | None:
        raw = await self._script(
            "release",
            [*self._keys(ref, now), self._memo(ref, call_id)],
            [now, lease_id, _USAGE_TTL, _CALL_MS],
        )
        seconds = json.loads(raw)["seconds"]
        return None if seconds is False else float(seconds)

    async def heartbeat(self, ref: EntryRef, lease_id: str, now: float, ttl: float) -> bool:
        keys = self._keys(ref, now)
        return bool(await self._script("heartbeat", [keys.leases, keys.meta], [now, lease_id, ttl]))

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
            [self._keys(ref, now).health, self._memo(ref, call_id)],
            [outcome.value, now, ref.fingerprint, detail, until or 0, _cfg(cfg), _CALL_MS],
        )
        r = json.loads(raw)
        return (r["from"], r["to"]) if r["from"] else None

    async def snapshot(self, refs: list[EntryRef], now: float) -> Snapshot:
        pools = {ref.pool: self._keys(ref, now) for ref in refs}

        def usage_and_health(pipe: Any) -> None:
            for keys in pools.values():
                pipe.hmget(keys.usage, ["sessions", "sandbox_seconds"])
                pipe.zrangebyscore(keys.leases, f"({now}", "+inf")
            for ref in refs:
                pipe.get(self._keys(ref, now).health)

        results = await self._commands(usage_and_health)
        live_ids: list[list[bytes]] = results[1 : 2 * len(pools) : 2]

        def lease_entries(pipe: Any) -> None:
            for keys, ids in zip(pools.values(), live_ids, strict=True):
                if ids:
                    pipe.hmget(keys.meta, ids)

        metas = iter(await self._commands(lease_entries))
        snap = Snapshot()
        live_by_entry: dict[str, int] = {}
        by_pool = {ref.pool: ref for ref in refs}
        for i, pool in enumerate(pools):
            sessions, seconds = results[2 * i]
            ids = live_ids[i]
            for raw in next(metas) if ids else []:
                if raw:
                    entry = json.loads(raw)["entry"]
                    live_by_entry[entry] = live_by_entry.get(entry, 0) + 1
            ref = by_pool[pool]
            snap.pools[pool] = PoolStatus(
                pool,
                ref.window.key(now),
                {
                    "sessions": float(sessions or 0),
                    "sandbox_seconds": float(seconds or 0),
                    "concurrent": float(len(ids)),
                },
                {u: ref.limits.get(u) for u in UNITS},
            )
        for j, ref in enumerate(refs):
            raw = results[2 * len(pools) + j]
            health = BreakerState.from_dict(json.loads(raw) if raw else None)
            snap.entries[ref.entry] = EntryStatus(
                ref.entry, health, live_by_entry.get(ref.entry, 0)
            )
        return snap

    async def set_usage(self, ref: EntryRef, unit: str, value: float, now: float) -> None:
        if unit not in ("sessions", "sandbox_seconds"):
            raise ValueError(f"unit must be sessions or sandbox_seconds, got {unit!r}")
        amount = int(value) if unit == "sessions" else float(value)
        await self._commands(lambda pipe: pipe.hset(self._keys(ref, now).usage, unit, amount))

    async def lease_ids(self, ref: EntryRef, now: float) -> set[str]:
        leases = self._keys(ref, now).leases
        [ids] = await self._commands(lambda pipe: pipe.zrangebyscore(leases, f"({now}", "+inf"))
        return {i.decode() for i in ids}

    def _session_keys(self) -> tuple[str, str]:
        tag = f"{{{self.prefix}:sessions}}"
        return f"{tag}:expiry", f"{tag}:binding"

    async def bind_session(
        self, session: str, entry: str, sandbox_id: str, expires: float, now: float
    ) -> None:
        index, bindings = self._session_keys()
        value = json.dumps({"entry": entry, "sandbox_id": sandbox_id})
        await self._commands(
            lambda pipe: pipe.hset(bindings, session, value).zadd(index, {session: expires}),
            transaction=True,
        )

    async def session(self, session: str, now: float) -> SessionBinding | None:
        index, bindings = self._session_keys()
        raw, expires = await self._commands(
            lambda pipe: pipe.hget(bindings, session).zscore(index, session), transaction=True
        )
        if raw is None or expires is None or expires <= now:
            return None
        data = json.loads(raw)
        return SessionBinding(data["entry"], data["sandbox_id"], float(expires))

    async def unbind_session(self, session: str) -> None:
        index, bindings = self._session_keys()
        await self._commands(
            lambda pipe: pipe.hdel(bindings, session).zrem(index, session), transaction=True
        )

    async def bound_sandboxes(self, now: float) -> set[tuple[str, str]]:
        index, bindings = self._session_keys()
        await self._script("session_prune", [index, bindings], [now])
        [values] = await self._commands(lambda pipe: pipe.hvals(bindings))
        found = set()
        for raw in values:
            data = json.loads(raw)
            found.add((data["entry"], data["sandbox_id"]))
        return found

    def _lock_key(self, name: str) -> str:
        return f"{{{self.prefix}:locks}}:{name}"

    async def lock(self, name: str, token: str, ttl: float, now: float) -> bool:
        key, ms = self._lock_key(name), int(ttl * 1000)
        [taken] = await self._commands(lambda pipe: pipe.set(key, token, nx=True, px=ms))
        return bool(taken)

    async def unlock(self, name: str, token: str) -> None:
        await self._script("unlock", [self._lock_key(name)], [token])

    def _fleet_key(self) -> str:
        return f"{{{self.prefix}:fleet}}:replicas"

    async def register_replica(
        self, replica: str, ttl: float, refs: list[EntryRef], now: float
    ) -> FleetView:
        key = self._fleet_key()
        *_, replicas = await self._commands(
            lambda pipe: (
                pipe.zremrangebyscore(key, "-inf", now).zadd(key, {replica: now + ttl}).zcard(key)
            ),
            transaction=True,
        )
        return FleetView(int(replicas), (await self.snapshot(refs, now)).pools)

    async def deregister_replica(self, replica: str) -> None:
        await self._commands(lambda pipe: pipe.zrem(self._fleet_key(), replica))

    async def reconcile(self, journal_id: str, spends: list[Spend], now: float) -> int:
        applied = 0
        for spend in spends:
            held = [
                {"id": h.lease_id, "entry": h.entry, "started": h.started, "ttl": h.ttl,
                 "sandbox": h.sandbox_id}
                for h in spend.leases
            ]  # fmt: skip
            keys = self._keys(spend.ref, now)
            journal = f"{self._tag(spend.ref.pool)}:journal:{journal_id}"
            applied += await self._script(
                "reconcile",
                [keys.usage, keys.leases, keys.meta, journal],
                [now, spend.sessions, repr(float(spend.sandbox_seconds)), _USAGE_TTL,
                 json.dumps(held), _JOURNAL_MS],
            )  # fmt: skip
        return applied

    async def ping(self) -> None:
        await self._commands(lambda pipe: pipe.ping())

    async def warnings(self) -> list[str]:
        try:
            info, save = await self._commands(
                lambda pipe: pipe.info("persistence").config_get("save")
            )
        except redis_errors.ResponseError:  # CONFIG disabled (managed Redis): cannot tell
            return []
        snapshots = bool(save.get("save") or save.get(b"save"))
        if not info.get("aof_enabled") and not snapshots:
            return [
                f"Redis at {self.url} persists nothing (no AOF, no RDB snapshots): a restart "
                "forgets every quota count and lease; enable appendonly yes"
            ]
        return []

    async def close(self) -> None:
        await self._runner.aclose()
        await self._redis.aclose()


@functools.lru_cache(maxsize=64)
def _cfg(cfg: BreakerConfig) -> str:
    """The breaker config as the scripts read it (a chain has one; asdict is slow)."""
    return json.dumps(dataclasses.asdict(cfg))


@functools.lru_cache(maxsize=64)
def _limit_args(limits: Limits) -> tuple[str, ...]:
    """A pool's limits as reserve's arguments, in UNITS order ('' = unlimited)."""
    return tuple("" if limits.get(u) is None else repr(limits.get(u)) for u in UNITS)
