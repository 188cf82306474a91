"""The outage journal: what this replica granted while the state store was down.

Under ``on_state_error: fail_open`` a replica serves from its own outage
ledger (its share, `policies.outage`), so every lease it grants then is spend
the fleet's ledger has not seen. The journal keeps each such lease on disk
(SQLite, synchronous commits) until the store is back, and hands it over
with `StateStore.reconcile` exactly once:

* a lease is written when its create succeeded (a refunded create spent
  nothing), with its price (`policies.quota.Meter`, so the hand-over carries
  its usd: the cost of a released one, the hold of one still held), and its
  seconds when it is released;
* handing over first stamps every unsent row with a batch id, in one
  transaction, then sends the batch; a lost reply or a crash resends the
  same id, which the store applies once;
* a lease still held at hand-over goes to the store as a live slot, and from
  then on the shared store meters it;
* a reservation sent as the store went down and never answered is written
  too (the store may have made it, with its session): the hand-over has the
  store refund it if it holds it, whatever the share then granted;
* each row names its lease's tenant (`policies.tenants`), so the hand-over
  counts its spend to the tenant too.

Several processes on one host may share the file: a process hands over its
own rows and those of processes that are gone (a crashed replica's spend
still counts), for the pools its config has (a row of another pool waits
for a router that has it: the store needs the pool's window).

The file must outlive the process that writes it: a replica on an ephemeral
disk (a container's own layer) loses, with the disk, every unit it granted
during an outage that it could not hand over, so the ledger undercounts
them; point ``fail_open_journal`` at a persistent volume.
"""

from __future__ import annotations

import dataclasses
import json
import os
import secrets
import sqlite3
from collections.abc import Collection, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from policies.quota import Meter

__all__ = ["Batch", "JournalRow", "OutageJournal"]

_SCHEMA = """
create table if not exists unanswered (
    lease_id text primary key,
    owner text not null,
    pid integer not null,
    pool text not null,
    batch text,
    tenant text
);
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
    batch text,
    meter text,
    tenant text
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
    meter: Meter | None = None  # its price (None: it costs nothing)
    tenant: str | None = None  # the tenant it is counted to


@dataclass(frozen=True, slots=True)
class Batch:
    """Rows handed over together, under one id the store applies once."""

    id: str
    leases: list[JournalRow]
    unanswered: list[tuple[str, str, str | None]]  # (lease id, pool, tenant)


_TABLES = ("leases", "unanswered")


class OutageJournal:
    """Leases granted while the store was down, kept until the store has them."""

    def __init__(self, path: Path, owner: str) -> None:
        self.path = path
        self.owner = owner
        path.parent.mkdir(parents=True, exist_ok=True)
        with self._db() as db:
            db.executescript(_SCHEMA)
            columns = {row[1] for row in db.execute("pragma table_info(leases)")}
            if "meter" not in columns:  # a journal an older router wrote: its leases unpriced
                db.execute("alter table leases add column meter text")
            for table in _TABLES:  # and without tenants
                columns = {row[1] for row in db.execute(f"pragma table_info({table})")}
                if "tenant" not in columns:
                    db.execute(f"alter table {table} add column tenant text")

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
        meter: Meter | None = None,
        tenant: str | None = None,
    ) -> None:
        """A lease the outage ledger granted and whose sandbox exists."""
        priced = None if meter is None else json.dumps(dataclasses.asdict(meter))
        with self._db() as db:
            db.execute(
                "insert or ignore into leases (lease_id, owner, pid, pool, entry, counted, "
                "started, ttl, sandbox_id, released, batch, meter, tenant) "
                "values (?,?,?,?,?,?,?,?,?,null,null,?,?)",
                (lease_id, self.owner, os.getpid(), pool, entry, int(counted), started, ttl,
                 sandbox_id, priced, tenant),
            )  # fmt: skip

    def unanswered(self, lease_id: str, pool: str, tenant: str | None = None) -> None:
        """A reservation of ``pool`` the store may have made without answering."""
        with self._db() as db:
            db.execute(
                "insert or ignore into unanswered (lease_id, owner, pid, pool, batch, tenant) "
                "values (?,?,?,?,null,?)",
                (lease_id, self.owner, os.getpid(), pool, tenant),
            )

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

    def pending(self, pools: Collection[str]) -> int:
        """How many rows of ``pools`` wait to be handed over (this replica's and orphans')."""
        with self._db() as db:
            return len(self._mine(db, pools)) + len(self._mine(db, pools, "unanswered"))

    def take(self, pools: Collection[str]) -> Batch | None:
        """The batch of ``pools``' rows to hand over (an unfinished one first), or None.
        Another pool's rows wait for a router that has it."""
        with self._db() as db:
            mine = {table: self._mine(db, pools, table) for table in _TABLES}
            if not any(mine.values()):
                return None
            batches = {r[10] for r in mine["leases"] if r[10] is not None}
            batches |= {r[4] for r in mine["unanswered"] if r[4] is not None}
            batch = min(batches) if batches else "j-" + secrets.token_hex(8)
            if not batches:
                for table, rows in mine.items():
                    db.executemany(
                        f"update {table} set batch = ? where lease_id = ? and batch is null",
                        [(batch, row[0]) for row in rows],
                    )
                mine = {table: self._mine(db, pools, table) for table in _TABLES}
            leases = [
                JournalRow(
                    r[0], r[3], r[4], bool(r[5]), r[6], r[7], r[8], r[9], _meter(r[11]), r[12]
                )
                for r in mine["leases"]
                if r[10] == batch
            ]
            unanswered = [(r[0], r[3], r[5]) for r in mine["unanswered"] if r[4] == batch]
            return Batch(batch, leases, unanswered)

    def handed_over(self, batch: str, pools: Collection[str]) -> None:
        """The store has ``batch``'s rows of ``pools``: forget them."""
        with self._db() as db:
            for table in _TABLES:
                db.executemany(
                    f"delete from {table} where batch = ? and pool = ?",
                    [(batch, p) for p in pools],
                )

    def abandon(self) -> None:
        """Leave this replica's rows to whichever process reaches the store next
        (it closes with the store still down)."""
        with self._db() as db:
            for table in _TABLES:
                db.execute(f"update {table} set pid = 0 where owner = ?", (self.owner,))

    def _mine(
        self, db: sqlite3.Connection, pools: Collection[str], table: str = "leases"
    ) -> list[tuple[Any, ...]]:
        order = "started" if table == "leases" else "rowid"
        rows = db.execute(f"select * from {table} order by {order}").fetchall()
        return [r for r in rows if r[3] in pools and (r[1] == self.owner or not _alive(int(r[2])))]


def _meter(raw: str | None) -> Meter | None:
    return None if raw is None else Meter(**json.loads(raw))


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
