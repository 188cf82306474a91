"""Opening a SQLite state file other processes are opening or writing at the same time."""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path

from policies.quota import Limits, MonthlyWindow
from router.state import EntryRef, open_store

NOW = 1_790_000_000.0


async def test_the_first_open_waits_for_a_writer_that_holds_the_file(tmp_path: Path) -> None:
    """A replica opening a file another holds a write on (before the file is in WAL mode)
    waits for it: SQLite answers "database is locked" to the switch to WAL at once, with no
    busy wait, where the switch would deadlock; 16 processes racing on a new file hit it."""
    path = tmp_path / "state.db"
    other = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    other.execute("CREATE TABLE theirs (a)")
    other.execute("BEGIN IMMEDIATE")
    threading.Timer(0.5, other.execute, ("COMMIT",)).start()
    store = open_store(f"sqlite:///{path}", "sandbox-router")
    try:
        r = EntryRef("a", "p", Limits(sessions=1), MonthlyWindow(), "fp")
        snap = await store.snapshot([r], NOW)
        assert snap.pools["p"].used["sessions"] == 0
    finally:
        await store.close()
        other.close()
