"""The embedded store: ``sqlite:///path``, persistent, safe across processes.

Every decision is one ``BEGIN IMMEDIATE`` transaction (the write lock is
taken up front, so two processes cannot both read the last unit as free),
run on one dedicated thread per store so the event loop never blocks on
the database. WAL mode lets readers (status, metrics) run beside writers.
"""

from __future__ import annotations

import asyncio
import json
import random
import sqlite3
import time
from collections.abc import Callable, Collection, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TypeVar

from policies.breaker import BreakerState
from policies.quota import LeaseSlot
from providers.errors import ConfigError, StateUnavailable
from router.state.tables import Tables, TableStore

__all__ = ["SQLiteStore"]

T = TypeVar("T")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS usage (
    ns TEXT NOT NULL, pool TEXT NOT NULL, window TEXT NOT NULL,
    sessions INTEGER NOT NULL DEFAULT 0, sandbox_seconds REAL NOT NULL DEFAULT 0,
    usd REAL NOT NULL DEFAULT 0,
    PRIMARY KEY (ns, pool, window));
CREATE TABLE IF NOT EXISTS leases (
    ns TEXT NOT NULL, pool TEXT NOT NULL, lease_id TEXT NOT NULL, entry TEXT NOT NULL,
    started REAL NOT NULL, expires REAL NOT NULL, ttl REAL NOT NULL, live INTEGER NOT NULL,
    counted INTEGER NOT NULL, sandbox_id TEXT NOT NULL,
    rate REAL NOT NULL DEFAULT 0, fee REAL NOT NULL DEFAULT 0, step REAL NOT NULL DEFAULT 0,
    renew REAL NOT NULL DEFAULT 0, covered REAL NOT NULL DEFAULT 0,
    kill INTEGER NOT NULL DEFAULT 0, short INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (ns, pool, lease_id));
CREATE INDEX IF NOT EXISTS leases_expiry ON leases (ns, pool, expires);
CREATE TABLE IF NOT EXISTS held (
    ns TEXT NOT NULL, pool TEXT NOT NULL, entry TEXT NOT NULL, leases INTEGER NOT NULL,
    PRIMARY KEY (ns, pool, entry));
CREATE TABLE IF NOT EXISTS rows (
    ns TEXT NOT NULL, tbl TEXT NOT NULL, key TEXT NOT NULL, value TEXT NOT NULL,
    expires REAL NOT NULL, PRIMARY KEY (ns, tbl, key));
CREATE INDEX IF NOT EXISTS rows_expiry ON rows (ns, tbl, expires);
CREATE TABLE IF NOT EXISTS entries (
    ns TEXT NOT NULL, entry TEXT NOT NULL, state TEXT NOT NULL,
    PRIMARY KEY (ns, entry));
"""
# PRAGMA user_version: 1 keeps `held` (a file from before gets it counted once); 2 prices
# leases (`_ADDED`: a file from before gets the columns, its leases unpriced).
_VERSION = 2
_ADDED = {
    "usage": ["usd REAL NOT NULL DEFAULT 0"],
    "leases": [
        f"{name} {kind} NOT NULL DEFAULT 0"
        for name, kind in (("rate", "REAL"), ("fee", "REAL"), ("step", "REAL"),
                           ("renew", "REAL"), ("covered", "REAL"), ("kill", "INTEGER"),
                           ("short", "INTEGER"))
    ],
}  # fmt: skip
_LEASE_COLUMNS = (
    "lease_id, entry, started, expires, ttl, live, counted, sandbox_id, "
    "rate, fee, step, renew, covered, kill, short"
)


class _Tx:
    """`Tables` of one namespace inside the open transaction."""

    def __init__(self, conn: sqlite3.Connection, ns: str) -> None:
        self.conn = conn
        self.ns = ns

    def usage(self, pool: str, window: str) -> tuple[int, float, float]:
        row = self.conn.execute(
            "SELECT sessions, sandbox_seconds, usd FROM usage WHERE ns=? AND pool=? AND window=?",
            (self.ns, pool, window),
        ).fetchone()
        return (row[0], row[1], row[2]) if row else (0, 0.0, 0.0)

    def save_usage(self, pool: str, window: str, sessions: int, seconds: float, usd: float) -> None:
        self.conn.execute(
            "INSERT INTO usage (ns, pool, window, sessions, sandbox_seconds, usd) "
            "VALUES (?,?,?,?,?,?) ON CONFLICT (ns, pool, window) DO UPDATE SET "
            "sessions=excluded.sessions, sandbox_seconds=excluded.sandbox_seconds, "
            "usd=excluded.usd",
            (self.ns, pool, window, sessions, seconds, usd),
        )

    def leases(
        self, pool: str, ids: Collection[str], expired_at: float | None
    ) -> dict[str, LeaseSlot]:
        select = f"SELECT {_LEASE_COLUMNS} FROM leases WHERE ns=? AND pool=? AND "
        rows = list(
            self.conn.execute(
                select + f"lease_id IN ({','.join('?' * len(ids))})", (self.ns, pool, *ids)
            )
            if ids
            else ()
        )
        if expired_at is not None:
            rows += self.conn.execute(select + "expires<=?", (self.ns, pool, expired_at))
        return {
            lid: LeaseSlot(entry, started, expires, ttl, bool(live), bool(counted), sandbox_id,
                           rate, fee, step, renew, covered, bool(kill), bool(short))
            for (lid, entry, started, expires, ttl, live, counted, sandbox_id,
                 rate, fee, step, renew, covered, kill, short) in rows
        }  # fmt: skip

    def save_leases(
        self, pool: str, leases: Mapping[str, LeaseSlot], dropped: Collection[str]
    ) -> None:
        self.conn.executemany(
            "DELETE FROM leases WHERE ns=? AND pool=? AND lease_id=?",
            [(self.ns, pool, lid) for lid in dropped],
        )
        self.conn.executemany(
            f"INSERT OR REPLACE INTO leases (ns, pool, {_LEASE_COLUMNS}) "
            "VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
            [
                (self.ns, pool, lid, s.entry, s.started, s.expires, s.ttl, int(s.live),
                 int(s.counted), s.sandbox_id, s.rate, s.fee, s.step, s.renew, s.covered,
                 int(s.kill), int(s.short))
                for lid, s in leases.items()
            ],
        )  # fmt: skip

    def held(self, pool: str) -> dict[str, int]:
        rows = self.conn.execute(
            "SELECT entry, leases FROM held WHERE ns=? AND pool=?", (self.ns, pool)
        )
        return dict(rows.fetchall())

    def count_held(self, pool: str, deltas: Mapping[str, int]) -> None:
        self.conn.executemany(
            "INSERT INTO held VALUES (?,?,?,?) ON CONFLICT (ns, pool, entry) "
            "DO UPDATE SET leases=leases+excluded.leases",
            [(self.ns, pool, entry, n) for entry, n in deltas.items()],
        )
        if deltas:
            self.conn.execute(
                "DELETE FROM held WHERE ns=? AND pool=? AND leases<=0", (self.ns, pool)
            )

    def lease_ids(self, pool: str, now: float) -> set[str]:
        rows = self.conn.execute(
            "SELECT lease_id FROM leases WHERE ns=? AND pool=? AND expires>?", (self.ns, pool, now)
        )
        return {lid for (lid,) in rows}

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

    def get(self, table: str, key: str) -> tuple[str, float] | None:
        row: tuple[str, float] | None = self.conn.execute(
            "SELECT value, expires FROM rows WHERE ns=? AND tbl=? AND key=?",
            (self.ns, table, key),
        ).fetchone()
        return row

    def put(self, table: str, key: str, value: str, expires: float, now: float) -> None:
        self._prune(table, now)
        self.conn.execute(
            "INSERT INTO rows VALUES (?,?,?,?,?) ON CONFLICT (ns, tbl, key) DO UPDATE SET "
            "value=excluded.value, expires=excluded.expires",
            (self.ns, table, key, value, expires),
        )

    def delete(self, table: str, key: str) -> None:
        self.conn.execute("DELETE FROM rows WHERE ns=? AND tbl=? AND key=?", (self.ns, table, key))

    def live(self, table: str, now: float) -> dict[str, tuple[str, float]]:
        self._prune(table, now)
        rows = self.conn.execute(
            "SELECT key, value, expires FROM rows WHERE ns=? AND tbl=?", (self.ns, table)
        )
        return {key: (value, expires) for key, value, expires in rows}

    def _prune(self, table: str, now: float) -> None:
        self.conn.execute(
            "DELETE FROM rows WHERE ns=? AND tbl=? AND expires<=?", (self.ns, table, now)
        )


_BUSY_SECONDS = 30.0  # how long a transaction waits for another process's


def _prepare(conn: sqlite3.Connection) -> None:
    """WAL mode, the schema and its migrations, waiting out other processes' locks.

    SQLite answers "database is locked" at once, without its busy wait, where waiting
    would deadlock: the switch to WAL of a file still in rollback mode while another
    connection holds a write. Processes opening a new file together meet it; each tries
    again until the busy timeout is spent.
    """
    deadline = time.monotonic() + _BUSY_SECONDS
    pause = 0.005
    while True:
        try:
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=NORMAL")
            conn.executescript(_SCHEMA)
            _migrate(conn)
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() + pause > deadline:
                raise
        time.sleep(pause * random.uniform(0.5, 1.5))
        pause = min(pause * 2, 0.2)


class SQLiteStore(TableStore):
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
            conn = sqlite3.connect(self.path, timeout=_BUSY_SECONDS, isolation_level=None)
            try:
                _prepare(conn)
            except BaseException:
                conn.close()
                raise
            self._conn = conn
        return self._conn

    def _transaction(self, fn: Callable[[Tables], T]) -> T:
        try:
            conn = self._connect()
            conn.execute("BEGIN IMMEDIATE")
            try:
                result = fn(_Tx(conn, self.prefix))
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")
        except sqlite3.Error as exc:
            raise StateUnavailable(f"state store {self.url}: {exc}") from exc
        return result

    async def _transact(self, fn: Callable[[Tables], T]) -> T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, self._transaction, fn)

    async def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            await asyncio.get_running_loop().run_in_executor(self._executor, conn.close)
        self._executor.shutdown(wait=False)


def _migrate(conn: sqlite3.Connection) -> None:
    """Bring a file written by an older router up to date, once, under the write lock:
    count its leases (`held`, version 1), add the priced columns (version 2)."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        version = conn.execute("PRAGMA user_version").fetchone()[0]
        if version < 1:
            conn.execute(
                "INSERT OR REPLACE INTO held "
                "SELECT ns, pool, entry, COUNT(*) FROM leases GROUP BY ns, pool, entry"
            )
        if version < _VERSION:
            for table, columns in _ADDED.items():
                have = {row[1] for row in conn.execute(f"PRAGMA table_info({table})")}
                for column in columns:
                    if column.split()[0] not in have:
                        conn.execute(f"ALTER TABLE {table} ADD COLUMN {column}")
            conn.execute(f"PRAGMA user_version={_VERSION}")
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")
