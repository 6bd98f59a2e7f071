"""Switching a SQLite database to write-ahead logging while another process uses it.

``PRAGMA journal_mode=WAL`` answers "database is locked" at once, without waiting
out the connection's busy timeout, while another connection holds a lock: a
features-party server and its worker started together on a new database, and the
server's first connection failed while the worker migrated (the documented
walkthrough's services, on a loaded machine). The switch is retried instead.
"""

from __future__ import annotations

import sqlite3
import time
from typing import Any

#: How long a connection keeps trying, as long as the drivers' busy timeouts.
WAIT_SECONDS = 30.0


def use_wal(dbapi_connection: Any, wait_seconds: float = WAIT_SECONDS) -> None:
    """Put the connection's database in WAL mode, retrying while it is locked."""
    deadline = time.monotonic() + wait_seconds
    pause = 0.01
    while True:
        try:
            dbapi_connection.execute("PRAGMA journal_mode=WAL").fetchall()
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() + pause > deadline:
                raise
        time.sleep(pause)
        pause = min(pause * 2, 0.5)
