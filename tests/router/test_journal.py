"""The outage journal: durable, handed over once, orphans included."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from router.journal import JournalRow, OutageJournal


def test_a_lease_is_kept_until_its_batch_is_handed_over(tmp_path: Path) -> None:
    path = tmp_path / "journal.db"
    journal = OutageJournal(path, "r1")
    journal.granted("l-1", "pool", "e2b", 100.0, 300.0, "sb-1")
    journal.granted("l-2", "pool", "e2b", 101.0, 300.0, "sb-2", counted=False)
    assert journal.released("l-1", 12.5)
    assert journal.pending(["pool"]) == 2
    taken = journal.take(["pool"])
    assert taken is not None
    batch, rows = taken.id, taken.leases
    assert rows == [
        JournalRow("l-1", "pool", "e2b", True, 100.0, 300.0, "sb-1", 12.5),
        JournalRow("l-2", "pool", "e2b", False, 101.0, 300.0, "sb-2", None),
    ]
    assert not journal.released("l-2", 3.0)  # in flight to the store: the store meters it
    again = OutageJournal(path, "r1").take(["pool"])  # a crash before the store answered
    assert again is not None
    assert again.id == batch
    journal.handed_over(batch, ["pool"])
    assert journal.take(["pool"]) is None
    assert not journal.holds("l-1")


def test_new_spend_after_a_batch_waits_for_the_next_one(tmp_path: Path) -> None:
    journal = OutageJournal(tmp_path / "j.db", "r1")
    journal.granted("l-1", "p", "x", 1.0, 10.0, "a")
    first = journal.take(["p"])
    assert first is not None
    journal.granted("l-2", "p", "x", 2.0, 10.0, "b")
    assert journal.take(["p"]) == first  # the unfinished batch goes first, unchanged
    journal.handed_over(first.id, ["p"])
    second = journal.take(["p"])
    assert second is not None
    assert [r.lease_id for r in second.leases] == ["l-2"]


def test_a_gone_process_s_spend_is_handed_over_a_live_one_s_is_not(tmp_path: Path) -> None:
    path = tmp_path / "j.db"
    dead = subprocess.run(
        [sys.executable, "-c",
         "import sys; from pathlib import Path; from router.journal import OutageJournal;"
         f"OutageJournal(Path({str(path)!r}), 'crashed').granted('l-9', 'p', 'x', 1.0, 10.0, 's')"],
        check=True,
    )  # fmt: skip
    assert dead.returncode == 0
    OutageJournal(path, "neighbour").granted("l-5", "p", "x", 2.0, 10.0, "t")  # alive (us)
    taken = OutageJournal(path, "me").take(["p"])
    assert taken is not None
    assert [r.lease_id for r in taken.leases] == ["l-9"]


def test_a_router_hands_over_only_its_own_pools_and_forgets_only_those(tmp_path: Path) -> None:
    """A router whose config lacks a pool cannot hand its rows over (the store needs the
    pool's window): they wait, even in a batch another router began, for one that has it."""
    path = tmp_path / "j.db"
    OutageJournal(path, "gone").granted("l-1", "p", "x", 1.0, 10.0, "a")
    OutageJournal(path, "gone").granted("l-2", "q", "y", 2.0, 10.0, "b")
    OutageJournal(path, "gone").abandon()
    both = OutageJournal(path, "full").take(["p", "q"])  # stamped, then that router died
    assert both is not None
    partial = OutageJournal(path, "partial")
    assert partial.pending(["p"]) == 1
    taken = partial.take(["p"])
    assert taken is not None
    assert (taken.id, [r.lease_id for r in taken.leases]) == (both.id, ["l-1"])
    partial.handed_over(taken.id, ["p"])
    assert partial.pending(["p"]) == 0
    rest = OutageJournal(path, "other").take(["p", "q"])
    assert rest is not None
    assert (rest.id, [r.lease_id for r in rest.leases]) == (both.id, ["l-2"])


def test_an_unanswered_reservation_is_handed_over_with_its_batch(tmp_path: Path) -> None:
    """Alone (the share then refused) or beside the lease the share booked under its id."""
    path = tmp_path / "j.db"
    journal = OutageJournal(path, "r1")
    journal.unanswered("l-1", "p")
    journal.unanswered("l-2", "p")
    journal.granted("l-2", "p", "x", 1.0, 10.0, "a")
    assert journal.pending(["p"]) == 3
    taken = journal.take(["p"])
    assert taken is not None
    assert taken.unanswered == [("l-1", "p", None), ("l-2", "p", None)]
    assert [r.lease_id for r in taken.leases] == ["l-2"]
    journal.abandon()
    again = OutageJournal(path, "r2").take(["p"])  # r1 ended before the store answered
    assert again == taken
    journal.handed_over(taken.id, ["p"])
    assert journal.pending(["p"]) == 0


def test_a_lease_s_tenant_is_kept_and_an_older_journal_gains_the_column(tmp_path: Path) -> None:
    import sqlite3

    path = tmp_path / "j.db"
    old = sqlite3.connect(path)  # a journal a router before tenants wrote
    old.executescript(
        "create table leases (lease_id text primary key, owner text not null, pid integer "
        "not null, pool text not null, entry text not null, counted integer not null, "
        "started real not null, ttl real not null, sandbox_id text not null, released real, "
        "batch text, meter text);"
        "create table unanswered (lease_id text primary key, owner text not null, pid "
        "integer not null, pool text not null, batch text);"
        "insert into leases values ('l-0', 'gone', 0, 'p', 'x', 1, 0.5, 10.0, 'a', 2.0, "
        "null, null);"
    )
    old.commit()
    old.close()
    journal = OutageJournal(path, "r1")
    journal.granted("l-1", "p", "x", 1.0, 10.0, "b", tenant="user-42")
    journal.unanswered("l-2", "p", "user-42")
    taken = journal.take(["p"])
    assert taken is not None
    assert [(row.lease_id, row.tenant) for row in taken.leases] == [
        ("l-0", None), ("l-1", "user-42"),
    ]  # fmt: skip
    assert taken.unanswered == [("l-2", "p", "user-42")]
