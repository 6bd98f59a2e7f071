"""Engine, sessions and migrations.

One session per request (or per worker operation): it commits at the end and
rolls back on error; services and repositories never commit (Polar's rule).
Migrations (Alembic, ``feature_party/migrations``) run on every start of the
service or a worker, one process at a time (``shared.migrations``).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

from sqlalchemy import Engine, create_engine, event, func, select
from sqlalchemy.orm import Session, sessionmaker

from shared import json_columns
from shared.migrations import upgrade_to_head
from shared.sqlite_wal import use_wal

_MIGRATIONS = Path(__file__).parent / "migrations"
_ADVISORY_LOCK = 0x1ABE1D9F  # any constant shared by every features-party process
#: Tables only the labels party has: the features party must never open its database.
_LABELS_PARTY_TABLES = ("ledger_entries", "audit_entries")


def make_engine(url: str) -> Engine:
    if url.startswith("sqlite"):
        path = url.split("///", 1)[-1]
        if path and path != ":memory:":
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(
            url,
            connect_args={"timeout": 30, "check_same_thread": False},
            json_serializer=json_columns.dumps,
        )

        @event.listens_for(engine, "connect")
        def _pragmas(dbapi_conn: Any, _record: Any) -> None:
            use_wal(dbapi_conn)
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA foreign_keys=ON")
            cur.execute("PRAGMA busy_timeout=30000")
            cur.close()

        return engine
    return create_engine(url, pool_pre_ping=True, json_serializer=json_columns.dumps)


def migrate(engine: Engine) -> None:
    """Upgrade the database to the newest migration."""
    upgrade_to_head(
        engine,
        _MIGRATIONS,
        advisory_key=_ADVISORY_LOCK,
        party="features party",
        foreign_tables=_LABELS_PARTY_TABLES,
    )


def end_reads(session: Session) -> None:
    """End the session's read-only transaction, giving its pooled connection back
    before slow network I/O: held across a stalled labels party, each request kept
    one, and 15 of them took the pool (5 + 10) and every other request with it. The
    session begins again when next used; its objects reload then."""
    if session.new or session.dirty or session.deleted or session.info.get(_WROTE):
        raise RuntimeError("end_reads on a session with writes: they would be lost")
    session.rollback()


_Row = TypeVar("_Row")


def get_for_update(session: Session, entity: type[_Row], ident: str) -> _Row | None:
    """``session.get(…, with_for_update=True)`` that locks on SQLite too. SQLite
    drops ``FOR UPDATE`` and its reads lock nothing, so two sessions read the same
    row and the later commit overwrote the earlier (an LP-MST run cancelled with a
    200 ended ``succeeded``): the session takes the database's write lock first,
    unless a write of its own already holds it."""
    _sqlite_write_lock(session)
    return session.get(entity, ident, with_for_update=True)


def lock_name(session: Session, name: str) -> None:
    """Serialize the transactions that lock ``name`` until each ends, where no row
    exists yet to lock: Postgres's transaction-scoped advisory lock on a 64-bit
    hash of it; on SQLite the database's write lock."""
    if session.connection().dialect.name == "postgresql":
        key = int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "big", signed=True)
        session.execute(select(func.pg_advisory_xact_lock(key)))
    else:
        _sqlite_write_lock(session)


def _sqlite_write_lock(session: Session) -> None:
    """Take SQLite's write lock now, unless a write of the session holds it already."""
    connection = session.connection()
    if connection.dialect.name == "sqlite":
        driver = connection.connection.driver_connection
        if driver is not None and not driver.in_transaction:
            driver.execute("BEGIN IMMEDIATE")  # waits out another writer (busy_timeout)


#: ``session.info`` key: the session's transaction has flushed a write.
_WROTE = "feature_party.wrote"


def _track_writes(factory: sessionmaker[Session]) -> None:
    """Keep :data:`_WROTE` in ``session.info`` for :func:`end_reads`."""

    @event.listens_for(factory, "after_flush")
    def _wrote(session: Session, _context: Any) -> None:
        session.info[_WROTE] = True

    @event.listens_for(factory, "after_transaction_end")
    def _ended(session: Session, transaction: Any) -> None:
        if transaction.parent is None:  # the outermost: its writes are settled
            session.info.pop(_WROTE, None)


class Database:
    """An engine and its session factory."""

    def __init__(self, url: str) -> None:
        self.engine = make_engine(url)
        self.sessions = sessionmaker(self.engine, expire_on_commit=False)
        _track_writes(self.sessions)

    @contextmanager
    def session(self) -> Iterator[Session]:
        """A unit of work: commit on success, roll back on error."""
        with self.sessions() as session:
            try:
                yield session
                session.commit()
            except BaseException:
                session.rollback()
                raise

    def dispose(self) -> None:
        self.engine.dispose()
