"""Schema upgrades that processes starting together run one at a time.

Both parties migrate on every start of a service or a worker (Alembic, each
party's ``migrations`` folder), and a deployment starts them together. On
Postgres a transaction-scoped advisory lock makes the second wait for the first.
On SQLite the upgrade runs in one ``BEGIN IMMEDIATE`` transaction on a
connection whose driver does not manage transactions itself: pysqlite's own
handling leaves DDL outside any transaction, so two processes on a new file both
saw no schema and both created it (``table … already exists``); and a deferred
transaction that read first cannot take the write lock another committed after
its read (``database is locked`` at once, without waiting). With the write lock
taken at ``BEGIN``, the second process waits, then finds the schema current.

Each party refuses a database that holds the other party's tables. Both parties
number their revisions alike (``0001``…), so on a shared database Alembic took
the other party's head for its own and created nothing; and a features party
with the labels party's database could read what DESIGN §3.1 keeps inside the
labels party.
"""

from __future__ import annotations

from collections.abc import Collection
from pathlib import Path
from typing import Any, Final

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Connection, Engine, create_engine, event, inspect, text
from sqlalchemy.pool import NullPool

from shared.sqlite_wal import use_wal

#: Seconds a SQLite upgrade waits for another process's to finish.
SQLITE_WAIT_SECONDS: Final = 300


class SchemaError(RuntimeError):
    """A database this code must not migrate: the message says why and what to do."""


class ForeignSchemaError(SchemaError):
    """The database holds another party's tables: each party needs its own."""


class SchemaAheadError(SchemaError):
    """The database was migrated by a newer labeldp (an image rolled back)."""


def upgrade_to_head(
    engine: Engine,
    script_location: Path,
    *,
    advisory_key: int,
    party: str,
    foreign_tables: Collection[str],
) -> None:
    """Bring the database of ``engine`` to the newest revision in ``script_location``;
    ``advisory_key`` names the Postgres lock (one per party). Raises
    :class:`ForeignSchemaError`, changing nothing, if any of ``foreign_tables`` (the
    other party's) exists."""
    config = Config()
    config.set_main_option("script_location", str(script_location))
    migrator = migration_engine(engine)
    try:
        with migrator.begin() as connection:
            if connection.dialect.name == "postgresql":
                connection.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": advisory_key})
            _refuse_foreign(connection, party, foreign_tables)
            _refuse_newer(connection, config, party)
            config.attributes["connection"] = connection
            command.upgrade(config, "head")
    finally:
        if migrator is not engine:
            migrator.dispose()


def _refuse_foreign(connection: Connection, party: str, foreign_tables: Collection[str]) -> None:
    found = sorted(set(inspect(connection).get_table_names()) & set(foreign_tables))
    if found:
        raise ForeignSchemaError(
            f"the {party}'s database {connection.engine.url.render_as_string()} holds "
            f"another party's tables ({', '.join(found)}): give each party a database of "
            "its own (LABELDP_DATABASE_URL)"
        )


def _refuse_newer(connection: Connection, config: Config, party: str) -> None:
    """Refuse a schema at a revision this code does not know: a newer labeldp's
    (Alembic's own error is a traceback that names a revision and nothing else)."""
    script = ScriptDirectory.from_config(config)
    known = {revision.revision for revision in script.walk_revisions()}
    current = MigrationContext.configure(connection).get_current_heads()
    unknown = sorted(set(current) - known)
    if unknown:
        raise SchemaAheadError(
            f"the {party}'s database is at schema revision {', '.join(unknown)}, which this "
            f"labeldp does not know (its newest is {script.get_current_head()}): it was "
            "migrated by a newer version; run that version, or restore a backup taken "
            "before the upgrade"
        )


def migration_engine(engine: Engine) -> Engine:
    """``engine``, or for a SQLite file an engine on it whose transactions hold DDL
    too (pysqlite commits a DDL statement on its own): a migration that fails
    half-way changes nothing. The caller disposes it if it is not ``engine``."""
    return _immediate_sqlite(engine) if _is_sqlite_file(engine) else engine


def _is_sqlite_file(engine: Engine) -> bool:
    # An in-memory database lives in its engine's connection: no other process sees it.
    return engine.dialect.name == "sqlite" and engine.url.database not in (None, "", ":memory:")


def _immediate_sqlite(engine: Engine) -> Engine:
    """An engine on the same file whose transactions start with ``BEGIN IMMEDIATE``."""
    migrator = create_engine(
        engine.url,
        poolclass=NullPool,
        connect_args={"timeout": SQLITE_WAIT_SECONDS, "check_same_thread": False},
    )

    @event.listens_for(migrator, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.isolation_level = None  # SQLAlchemy, not the driver, begins
        # In WAL before it writes: a migration under the rollback journal held a lock
        # that a server starting beside it could not switch the journal past.
        use_wal(dbapi_connection)

    @event.listens_for(migrator, "begin")
    def _on_begin(connection: Any) -> None:
        connection.exec_driver_sql("BEGIN IMMEDIATE")

    return migrator
