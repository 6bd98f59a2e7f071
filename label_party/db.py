"""Engine, sessions and migrations.

Transactions: one session per request; it commits when the endpoint returns and
rolls back when it raises (services never commit). Writers are serialized where a
check-then-write needs it: on Postgres the service locks the dataset row
(``SELECT … FOR UPDATE``) and the audit chain takes a transaction-scoped advisory
lock; on SQLite every request that may write opens its transaction with
``BEGIN IMMEDIATE`` (through a second engine, :attr:`Database.writer`), which takes
the database's single write lock at the transaction's first statement.

A transaction that holds a lock must never wait for another worker thread (with
every worker blocked on the lock it would never get one): authentication runs in
a short read transaction of its own, and write endpoints do all their database
work in one worker-thread call (:func:`label_party.deps.in_worker_thread`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from sqlalchemy import Engine, create_engine, event, text
from sqlalchemy.orm import Session, sessionmaker
from sqlalchemy.pool import NullPool

from shared import json_columns
from shared.migrations import upgrade_to_head
from shared.sqlite_wal import use_wal

MIGRATIONS_DIR = Path(__file__).parent / "migrations"
#: The Postgres advisory lock that serializes this party's migrations.
MIGRATION_LOCK = 7358002
#: Tables only the features party has: a database holding one is not ours.
_FEATURES_PARTY_TABLES: Final = ("feature_sets", "received_labels")

#: Seconds a SQLite writer waits for the write lock before giving up.
SQLITE_BUSY_TIMEOUT = 300


@dataclass
class Database:
    """The engine, and the session factories for readers and writers."""

    engine: Engine
    writer_engine: Engine

    def __post_init__(self) -> None:
        self.reader = sessionmaker(self.engine, expire_on_commit=False)
        self.writer = sessionmaker(self.writer_engine, expire_on_commit=False)

    def dispose(self) -> None:
        self.engine.dispose()
        if self.writer_engine is not self.engine:
            self.writer_engine.dispose()


#: Connections a Postgres pool keeps open when idle; up to ``connections`` in all.
_POOL_IDLE = 20


def connect(url: str, *, connections: int = 70) -> Database:
    """The engines of ``url``; on Postgres a pool of at most ``connections``
    (``LABELDP_DATABASE_CONNECTIONS``). SQLite opens one per transaction."""
    if url.startswith("sqlite"):
        return Database(_sqlite_engine(url, immediate=False), _sqlite_engine(url, immediate=True))
    idle = min(_POOL_IDLE, connections)
    engine = create_engine(
        url,
        pool_size=idle,
        max_overflow=connections - idle,
        pool_pre_ping=True,
        json_serializer=json_columns.dumps,
    )
    return Database(engine, engine)


def _sqlite_engine(url: str, *, immediate: bool) -> Engine:
    engine = create_engine(
        url,
        poolclass=NullPool,
        connect_args={"timeout": SQLITE_BUSY_TIMEOUT, "check_same_thread": False},
        json_serializer=json_columns.dumps,
    )

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        # Let SQLAlchemy (not the driver) decide when transactions begin.
        dbapi_connection.isolation_level = None
        use_wal(dbapi_connection)
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.execute("PRAGMA synchronous=FULL")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(connection: Any) -> None:
        connection.exec_driver_sql("BEGIN IMMEDIATE" if immediate else "BEGIN")

    return engine


@contextmanager
def transaction(factory: sessionmaker[Session]) -> Iterator[Session]:
    """A session that commits on success and rolls back on error.

    An exception whose ``commit_session`` attribute is true (a refusal whose audit
    entry must persist, see :mod:`label_party.exceptions`) is re-raised after commit.
    """
    session = factory()
    try:
        yield session
    except BaseException as exc:
        if getattr(exc, "commit_session", False):
            session.commit()
        else:
            session.rollback()
        raise
    else:
        session.commit()
    finally:
        session.close()


def lock_audit_chain(session: Session) -> None:
    """Serialize appends to the audit chain until this transaction ends.

    SQLite writers already hold the database's write lock (``BEGIN IMMEDIATE``).
    """
    if session.get_bind().dialect.name == "postgresql":
        session.execute(text("SELECT pg_advisory_xact_lock(7358001)"))


def lock_client(session: Session, client_id: str, *, revoking: bool) -> None:
    """Hold a client until this transaction ends: shared by a write it makes
    (:func:`label_party.auth.confirm`), exclusive by its revocation.

    Postgres advisory locks, whose queue is fair: a revocation waits for the writes
    already holding the client, and those that arrive after it wait for it (and
    find the client revoked). The row's ``FOR SHARE`` let each new write in ahead of
    a waiting ``FOR UPDATE``, so a busy client's revocation waited, and its new
    releases spent, for as long as it kept sending. SQLite writers are serial."""
    if session.get_bind().dialect.name == "postgresql":
        digest = hashlib.sha256(f"labeldp-client:{client_id}".encode()).digest()
        key = int.from_bytes(digest[:8], "big", signed=True)
        function = "pg_advisory_xact_lock" if revoking else "pg_advisory_xact_lock_shared"
        session.execute(text(f"SELECT {function}(:k)"), {"k": key})


def read_snapshot(session: Session) -> None:
    """Make every later read of this transaction see one committed state.

    Call first, before the transaction has read anything. Postgres's default
    READ COMMITTED gives each statement its own snapshot, so a reader that reads
    the audit log and then the ledger can see a release in the second that it
    did not see in the first; REPEATABLE READ holds the first statement's
    snapshot, READ ONLY makes the reader's intent checked. A SQLite read
    transaction already reads one snapshot from its first statement on.
    """
    if session.get_bind().dialect.name == "postgresql":
        session.execute(text("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY"))


def migrate(engine: Engine) -> None:
    """Bring the schema to the newest revision (run at server and worker start,
    one process at a time: ``shared.migrations``)."""
    upgrade_to_head(
        engine,
        MIGRATIONS_DIR,
        advisory_key=MIGRATION_LOCK,
        party="labels party",
        foreign_tables=_FEATURES_PARTY_TABLES,
    )
