"""The redis-py client for a state URL, and the one map of Redis failures.

`client` builds redis-py's client for ``redis://``, ``rediss://``,
``unix://``, ``redis+sentinel://`` and ``redis+cluster://`` (the lean
script connection of `router.state.resp` sits beside it where it serves).
`state_errors` turns a failure of Redis itself into `StateUnavailable`,
on either script runner and for every plain command.
"""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from redis import exceptions as redis_errors
from redis.asyncio import BlockingConnectionPool, Redis
from redis.asyncio.cluster import RedisCluster
from redis.asyncio.retry import Retry
from redis.asyncio.sentinel import Sentinel
from redis.backoff import ExponentialBackoff

from providers.errors import ConfigError, StateUnavailable
from router.state import on_cluster

__all__ = ["client", "redact", "state_errors"]

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
# At the start of a reply, inside redis-py's note on a failed pipeline command, or
# (Redis 6) after the "-" of a script's error: "ERR Error running script ...: -MISCONF ...".
_REFUSAL_CODE = re.compile(r"(?:^|caused error: \(['\"]|: -)(NOREPLICAS|READONLY|OOM|MISCONF)\b")
_DEFAULT_TIMEOUTS = {"socket_timeout": 2.0, "socket_connect_timeout": 2.0}
_POOL_SIZE = 64  # per router; ?max_connections=N in the URL overrides it
_POOL_WAIT = 10.0


class state_errors:  # lower case, as contextlib.suppress: it reads as a function
    """Turn a failure of Redis itself into StateUnavailable naming the store.

    Unreachable, and refusing writes (too few replicas, a replica after a
    failover, memory full, a failed snapshot): either way the ledger cannot
    decide, which is the router's fail_closed/fail_open case, not a provider's.
    A class rather than ``contextlib.contextmanager``: it wraps every script
    call, and a generator per call cost more than the mapping itself.
    """

    __slots__ = ("_url",)

    def __init__(self, url: str) -> None:
        self._url = url

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: object, exc: BaseException | None, tb: object) -> None:
        if exc is None:
            return
        if isinstance(exc, _UNAVAILABLE):
            raise StateUnavailable(f"state store {self._url}: {exc}") from exc
        if isinstance(exc, redis_errors.ResponseError):
            code = getattr(exc, "status_code", None)  # redis-py strips the codes it knows
            if code not in _REFUSALS:
                found = _REFUSAL_CODE.search(str(exc))
                code = found.group(1) if found else None
            if code is not None:
                raise StateUnavailable(
                    f"state store {self._url} refused the write ({code}): {_REFUSALS[code]}"
                ) from exc


def client(url: str) -> Any:
    """redis-py's asyncio client for ``url`` (plain, Cluster, or Sentinel's master)."""
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
    if on_cluster(url):
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
                f"state_url {redact(url)}: expected redis+sentinel://host:port[,host:port]"
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
    raise ConfigError(f"state_url {redact(url)}: unsupported Redis scheme {parts.scheme!r}")


def _reconnect() -> Retry:
    """Reconnect after a dropped connection (a Redis restart, a failover).

    A command may then run twice: every script call carries a call id, and a
    repeat returns the first answer (see `LedgerSupport`).
    """
    return Retry(ExponentialBackoff(cap=0.25, base=0.02), retries=2)


def redact(url: str) -> str:
    """``url`` with its password replaced by ``***`` (for messages and repr)."""
    parts = urlsplit(url)
    if parts.password:
        return url.replace(parts.password, "***", 1)
    return url
