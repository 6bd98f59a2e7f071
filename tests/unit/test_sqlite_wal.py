"""``shared.sqlite_wal``: the switch to WAL waits for another process's lock."""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path

import pytest

from shared.sqlite_wal import use_wal


def _locked_for(path: Path, seconds: float) -> threading.Thread:
    holder = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    # What a migrating worker holds: a write under the rollback journal, whose lock
    # the switch gets SQLITE_BUSY for at once (it would have to wait on a writer).
    holder.execute("BEGIN IMMEDIATE")
    holder.execute("CREATE TABLE migrated (x)")
    release = threading.Timer(seconds, lambda: (holder.execute("COMMIT"), holder.close()))
    release.start()
    return release


def test_the_switch_waits_for_a_lock_the_pragma_alone_does_not(tmp_path: Path) -> None:
    """A server's first connection failed "database is locked" at once, though its
    busy timeout was 30 s, while its worker migrated the new database."""
    path = tmp_path / "db.sqlite3"
    sqlite3.connect(path).close()
    release = _locked_for(path, 0.5)
    plain = sqlite3.connect(path, timeout=30, isolation_level=None)
    with pytest.raises(sqlite3.OperationalError, match="locked"):
        plain.execute("PRAGMA journal_mode=WAL")
    use_wal(plain)
    assert plain.execute("PRAGMA journal_mode").fetchone() == ("wal",)
    release.join()
    plain.close()


def test_a_lock_held_past_the_wait_is_still_an_error(tmp_path: Path) -> None:
    path = tmp_path / "db.sqlite3"
    sqlite3.connect(path).close()
    release = _locked_for(path, 1.0)
    with pytest.raises(sqlite3.OperationalError, match="locked"):
        use_wal(sqlite3.connect(path, isolation_level=None), wait_seconds=0.2)
    release.join()
