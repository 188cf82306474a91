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
    assert journal.pending() == 2
    taken = journal.take()
    assert taken is not None
    batch, rows = taken
    assert rows == [
        JournalRow("l-1", "pool", "e2b", True, 100.0, 300.0, "sb-1", 12.5),
        JournalRow("l-2", "pool", "e2b", False, 101.0, 300.0, "sb-2", None),
    ]
    assert not journal.released("l-2", 3.0)  # in flight to the store: the store meters it
    again = OutageJournal(path, "r1").take()  # a crash before the store answered
    assert again is not None
    assert again[0] == batch
    journal.handed_over(batch)
    assert journal.take() is None
    assert not journal.holds("l-1")


def test_new_spend_after_a_batch_waits_for_the_next_one(tmp_path: Path) -> None:
    journal = OutageJournal(tmp_path / "j.db", "r1")
    journal.granted("l-1", "p", "x", 1.0, 10.0, "a")
    first = journal.take()
    assert first is not None
    journal.granted("l-2", "p", "x", 2.0, 10.0, "b")
    assert journal.take() == first  # the unfinished batch goes first, unchanged
    journal.handed_over(first[0])
    second = journal.take()
    assert second is not None
    assert [r.lease_id for r in second[1]] == ["l-2"]


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
    taken = OutageJournal(path, "me").take()
    assert taken is not None
    assert [r.lease_id for r in taken[1]] == ["l-9"]
