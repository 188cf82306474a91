"""The embedded store: ``sqlite:///path``, persistent, safe across processes.

Every decision is one ``BEGIN IMMEDIATE`` transaction (the write lock is
taken up front, so two processes cannot both read the last unit as free),
run on one dedicated thread per store so the event loop never blocks on
the database. WAL mode lets readers (status, metrics) run beside writers.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

from policies.breaker import BreakerConfig, BreakerState, Outcome
from policies.quota import LeaseSlot, PoolState
from providers.errors import ConfigError, StateUnavailable
from router.state import base
from router.state.base import (
    EntryRef,
    Ledger,
    Reservation,
    SessionBinding,
    Settlement,
    Snapshot,
    StateStore,
)

__all__ = ["SQLiteStore"]

T = TypeVar("T")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS usage (
    ns TEXT NOT NULL, pool TEXT NOT NULL, window TEXT NOT NULL,
    sessions INTEGER NOT NULL DEFAULT 0, sandbox_seconds REAL NOT NULL DEFAULT 0,
    PRIMARY KEY (ns, pool, window));
CREATE TABLE IF NOT EXISTS leases (
    ns TEXT NOT NULL, pool TEXT NOT NULL, lease_id TEXT NOT NULL, entry TEXT NOT NULL,
    started REAL NOT NULL, expires REAL NOT NULL, ttl REAL NOT NULL, live INTEGER NOT NULL,
    counted INTEGER NOT NULL, sandbox_id TEXT NOT NULL,
    PRIMARY KEY (ns, pool, lease_id));
CREATE TABLE IF NOT EXISTS sessions (
    ns TEXT NOT NULL, name TEXT NOT NULL, entry TEXT NOT NULL, sandbox_id TEXT NOT NULL,
    expires REAL NOT NULL, PRIMARY KEY (ns, name));
CREATE TABLE IF NOT EXISTS locks (
    ns TEXT NOT NULL, name TEXT NOT NULL, token TEXT NOT NULL, expires REAL NOT NULL,
    PRIMARY KEY (ns, name));
CREATE TABLE IF NOT EXISTS entries (
    ns TEXT NOT NULL, entry TEXT NOT NULL, state TEXT NOT NULL,
    PRIMARY KEY (ns, entry));
"""


class _Tx:
    """`Ledger` rows of one namespace inside the open transaction."""

    def __init__(self, conn: sqlite3.Connection, ns: str) -> None:
        self.conn = conn
        self.ns = ns

    def load_pool(self, pool: str, window: str) -> PoolState:
        row = self.conn.execute(
            "SELECT sessions, sandbox_seconds FROM usage WHERE ns=? AND pool=? AND window=?",
            (self.ns, pool, window),
        ).fetchone()
        state = PoolState(window, *(row or (0, 0.0)))
        for lid, entry, started, expires, ttl, live, counted, sandbox_id in self.conn.execute(
            "SELECT lease_id, entry, started, expires, ttl, live, counted, sandbox_id "
            "FROM leases WHERE ns=? AND pool=?",
            (self.ns, pool),
        ):
            state.leases[lid] = LeaseSlot(
                entry, started, expires, ttl, bool(live), bool(counted), sandbox_id
            )
        return state

    def save_pool(self, pool: str, state: PoolState) -> None:
        self.conn.execute(
            "INSERT INTO usage (ns, pool, window, sessions, sandbox_seconds) VALUES (?,?,?,?,?) "
            "ON CONFLICT (ns, pool, window) DO UPDATE SET sessions=excluded.sessions, "
            "sandbox_seconds=excluded.sandbox_seconds",
            (self.ns, pool, state.window, state.sessions, state.sandbox_seconds),
        )
        self.conn.execute("DELETE FROM leases WHERE ns=? AND pool=?", (self.ns, pool))
        self.conn.executemany(
            "INSERT INTO leases VALUES (?,?,?,?,?,?,?,?,?,?)",
            [
                (
                    self.ns,
                    pool,
                    lid,
                    s.entry,
                    s.started,
                    s.expires,
                    s.ttl,
                    int(s.live),
                    int(s.counted),
                    s.sandbox_id,
                )
                for lid, s in state.leases.items()
            ],
        )

    def load_entry(self, entry: str) -> BreakerState:
        row = self.conn.execute(
            "SELECT state FROM entries WHERE ns=? AND entry=?", (self.ns, entry)
        ).fetchone()
        return BreakerState.from_dict(json.loads(row[0]) if row else None)

    def save_entry(self, entry: str, state: BreakerState) -> None:
        self.conn.execute(
            "INSERT INTO entries (ns, entry, state) VALUES (?,?,?) "
            "ON CONFLICT (ns, entry) DO UPDATE SET state=excluded.state",
            (self.ns, entry, json.dumps(state.to_dict())),
        )


class SQLiteStore(StateStore):
    """State in one SQLite file shared by every process on the host."""

    def __init__(self, url: str, prefix: str = "sandbox-router") -> None:
        self.url = url
        self.prefix = prefix
        path = url.removeprefix("sqlite://")
        if not path.startswith("/") or path == "/":
            raise ConfigError(
                f"state_url {url!r}: expected sqlite:///absolute/path/to/file.db "
                "(three slashes, then an absolute path)"
            )
        self.path = Path(path)
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="sandbox-router-sqlite")
        self._conn: sqlite3.Connection | None = None

    def _connect(self) -> sqlite3.Connection:
        if self._conn is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            conn = sqlite3.connect(self.path, timeout=30.0, isolation_level=None)
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=NORMAL")
            conn.executescript(_SCHEMA)
            self._conn = conn
        return self._conn

    def _transaction(self, fn: Callable[[Ledger], T]) -> T:
        try:
            conn = self._connect()
            conn.execute("BEGIN IMMEDIATE")
        except sqlite3.Error as exc:
            raise StateUnavailable(f"state store {self.url}: {exc}") from exc
        try:
            result = fn(_Tx(conn, self.prefix))
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        try:
            conn.execute("COMMIT")
        except sqlite3.Error as exc:
            raise StateUnavailable(f"state store {self.url}: {exc}") from exc
        return result

    async def _run(self, fn: Callable[[Ledger], T]) -> T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, self._transaction, fn)

    async def reserve(
        self,
        ref: EntryRef,
        cfg: BreakerConfig,
        lease_id: str,
        now: float,
        hold: float,
        *,
        new_session: bool = True,
    ) -> Reservation:
        return await self._run(
            lambda tx: base.apply_reserve(tx, ref, cfg, lease_id, now, hold, new_session)
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
    ) -> Settlement:
        return await self._run(
            lambda tx: base.apply_settle(
                tx, ref, cfg, lease_id, now, outcome, ttl, detail, until, sandbox_id
            )
        )

    async def release(self, ref: EntryRef, lease_id: str, now: float) -> float | None:
        return await self._run(lambda tx: base.apply_release(tx, ref, lease_id, now))

    async def heartbeat(self, ref: EntryRef, lease_id: str, now: float, ttl: float) -> bool:
        return await self._run(lambda tx: base.apply_heartbeat(tx, ref, lease_id, now, ttl))

    async def record(
        self,
        ref: EntryRef,
        cfg: BreakerConfig,
        outcome: Outcome,
        now: float,
        *,
        detail: str = "",
        until: float | None = None,
    ) -> tuple[str, str] | None:
        return await self._run(
            lambda tx: base.apply_record(tx, ref, cfg, outcome, now, detail, until)
        )

    async def snapshot(self, refs: list[EntryRef], now: float) -> Snapshot:
        return await self._run(lambda tx: base.apply_snapshot(tx, refs, now))

    async def set_usage(self, ref: EntryRef, unit: str, value: float, now: float) -> None:
        await self._run(lambda tx: base.apply_set_usage(tx, ref, unit, value, now))

    async def lease_ids(self, ref: EntryRef, now: float) -> set[str]:
        return await self._run(lambda tx: base.apply_lease_ids(tx, ref, now))

    async def _sql(self, sql: str, args: tuple[object, ...]) -> list[tuple[Any, ...]]:
        def run(tx: Ledger) -> list[tuple[Any, ...]]:
            assert isinstance(tx, _Tx)
            return tx.conn.execute(sql, (tx.ns, *args)).fetchall()

        return await self._run(run)

    async def bind_session(
        self, session: str, entry: str, sandbox_id: str, expires: float, now: float
    ) -> None:
        await self._sql(
            "INSERT INTO sessions VALUES (?,?,?,?,?) ON CONFLICT (ns, name) DO UPDATE SET "
            "entry=excluded.entry, sandbox_id=excluded.sandbox_id, expires=excluded.expires",
            (session, entry, sandbox_id, expires),
        )

    async def session(self, session: str, now: float) -> SessionBinding | None:
        rows = await self._sql(
            "SELECT entry, sandbox_id, expires FROM sessions WHERE ns=? AND name=? AND expires>?",
            (session, now),
        )
        return SessionBinding(*rows[0]) if rows else None

    async def unbind_session(self, session: str) -> None:
        await self._sql("DELETE FROM sessions WHERE ns=? AND name=?", (session,))

    async def bound_sandboxes(self, now: float) -> set[tuple[str, str]]:
        await self._sql("DELETE FROM sessions WHERE ns=? AND expires<=?", (now,))
        rows = await self._sql("SELECT entry, sandbox_id FROM sessions WHERE ns=?", ())
        return {(entry, sandbox_id) for entry, sandbox_id in rows}

    async def lock(self, name: str, token: str, ttl: float, now: float) -> bool:
        rows = await self._sql(
            "INSERT INTO locks VALUES (?,?,?,?) ON CONFLICT (ns, name) DO UPDATE SET "
            "token=excluded.token, expires=excluded.expires WHERE locks.expires<=? "
            "RETURNING token",
            (name, token, now + ttl, now),
        )
        return bool(rows)

    async def unlock(self, name: str, token: str) -> None:
        await self._sql("DELETE FROM locks WHERE ns=? AND name=? AND token=?", (name, token))

    async def ping(self) -> None:
        await self._run(lambda tx: None)

    async def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            await asyncio.get_running_loop().run_in_executor(self._executor, conn.close)
        self._executor.shutdown(wait=False)
