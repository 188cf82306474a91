"""The outage journal: what this replica granted while the state store was down.

Under ``on_state_error: fail_open`` a replica serves from its own outage
ledger (its share, `policies.outage`), so every lease it grants then is spend
the fleet's ledger has not seen. The journal keeps each such lease on disk
(SQLite, synchronous commits) until the store is back, and hands it over
with `StateStore.reconcile` exactly once:

* a lease is written when its create succeeded (a refunded create spent
  nothing), and its seconds when it is released;
* handing over first stamps every unsent row with a batch id, in one
  transaction, then sends the batch; a lost reply or a crash resends the
  same id, which the store applies once;
* a lease still held at hand-over goes to the store as a live slot, and from
  then on the shared store meters it.

Several processes on one host may share the file: a process hands over its
own rows and those of processes that are gone (a crashed replica's spend
still counts).
"""

from __future__ import annotations

import os
import secrets
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["JournalRow", "OutageJournal"]

_SCHEMA = """
create table if not exists leases (
    lease_id text primary key,
    owner text not null,
    pid integer not null,
    pool text not null,
    entry text not null,
    counted integer not null,
    started real not null,
    ttl real not null,
    sandbox_id text not null,
    released real,
    batch text
)
"""


@dataclass(frozen=True, slots=True)
class JournalRow:
    """One lease granted during an outage (``released``: its metered seconds, once freed)."""

    lease_id: str
    pool: str
    entry: str
    counted: bool  # took a session unit (False: a sticky session's reconnect)
    started: float
    ttl: float
    sandbox_id: str
    released: float | None


class OutageJournal:
    """Leases granted while the store was down, kept until the store has them."""

    def __init__(self, path: Path, owner: str) -> None:
        self.path = path
        self.owner = owner
        path.parent.mkdir(parents=True, exist_ok=True)
        with self._db() as db:
            db.execute(_SCHEMA)

    @contextmanager
    def _db(self) -> Iterator[sqlite3.Connection]:
        db = sqlite3.connect(self.path, timeout=10, isolation_level="IMMEDIATE")
        try:
            db.execute("pragma journal_mode=wal")
            db.execute("pragma synchronous=full")
            with db:
                yield db
        finally:
            db.close()

    def granted(
        self,
        lease_id: str,
        pool: str,
        entry: str,
        started: float,
        ttl: float,
        sandbox_id: str,
        *,
        counted: bool = True,
    ) -> None:
        """A lease the outage ledger granted and whose sandbox exists."""
        with self._db() as db:
            db.execute(
                "insert or ignore into leases values (?,?,?,?,?,?,?,?,?,null,null)",
                (lease_id, self.owner, os.getpid(), pool, entry, int(counted), started, ttl,
                 sandbox_id),
            )  # fmt: skip

    def released(self, lease_id: str, seconds: float) -> bool:
        """Meter a journaled lease; False when the journal no longer holds it (handed over)."""
        with self._db() as db:
            cur = db.execute(
                "update leases set released = ? where lease_id = ? and batch is null",
                (seconds, lease_id),
            )
            return cur.rowcount == 1

    def holds(self, lease_id: str) -> bool:
        with self._db() as db:
            row = db.execute("select 1 from leases where lease_id = ?", (lease_id,)).fetchone()
            return row is not None

    def pending(self) -> int:
        """How many leases wait to be handed over (this replica's and orphans')."""
        with self._db() as db:
            return len(self._mine(db))

    def take(self) -> tuple[str, list[JournalRow]] | None:
        """The batch to hand over (an unfinished one first): its id and rows, or None."""
        with self._db() as db:
            mine = self._mine(db)
            if not mine:
                return None
            batches = {row[10] for row in mine if row[10] is not None}
            batch = min(batches) if batches else "j-" + secrets.token_hex(8)
            if not batches:
                db.executemany(
                    "update leases set batch = ? where lease_id = ? and batch is null",
                    [(batch, row[0]) for row in mine],
                )
                mine = self._mine(db)
            rows = [
                JournalRow(r[0], r[3], r[4], bool(r[5]), r[6], r[7], r[8], r[9])
                for r in mine
                if r[10] == batch
            ]
            return batch, rows

    def handed_over(self, batch: str) -> None:
        """The store has ``batch``: forget it."""
        with self._db() as db:
            db.execute("delete from leases where batch = ?", (batch,))

    def abandon(self) -> None:
        """Leave this replica's rows to whichever process reaches the store next
        (it closes with the store still down)."""
        with self._db() as db:
            db.execute("update leases set pid = 0 where owner = ?", (self.owner,))

    def _mine(self, db: sqlite3.Connection) -> list[tuple[Any, ...]]:
        rows = db.execute("select * from leases order by started").fetchall()
        return [r for r in rows if r[1] == self.owner or not _alive(int(r[2]))]


def _alive(pid: int) -> bool:
    if pid <= 0:
        return False  # abandoned
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
