"""Each party's migrations build exactly its ORM's schema, and each party refuses
the other's database (``shared.migrations``), on SQLite and on Postgres."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import Engine, MetaData, inspect, text

import feature_party.db as features_db
import label_party.db as labels_db
from feature_party.orm import Base as FeaturesBase
from label_party.models import Base as LabelsBase
from shared.migrations import ForeignSchemaError, SchemaAheadError

REPO = Path(__file__).resolve().parents[2]


def _labels_engine(url: str) -> Engine:
    return labels_db.connect(url).engine


PARTIES: dict[str, tuple[Callable[[str], Engine], Callable[[Engine], None], MetaData]] = {
    "labels": (_labels_engine, labels_db.migrate, LabelsBase.metadata),
    "features": (features_db.make_engine, features_db.migrate, FeaturesBase.metadata),
}


@pytest.mark.parametrize("party", PARTIES)
def test_migrations_build_the_orm_schema(party: str, database_urls: dict[str, str]) -> None:
    """A model changed without its migration shows here as a difference."""
    make_engine, migrate, metadata = PARTIES[party]
    engine = make_engine(database_urls[party])
    try:
        migrate(engine)
        with engine.connect() as connection:
            context = MigrationContext.configure(connection, opts={"compare_type": True})
            assert compare_metadata(context, metadata) == []
    finally:
        engine.dispose()


@pytest.mark.parametrize(("party", "other"), [("labels", "features"), ("features", "labels")])
def test_a_party_refuses_the_other_partys_database(
    party: str, other: str, database_urls: dict[str, str]
) -> None:
    """Before, the second party found revision ``0003`` (its own head's number, the
    other party's revision) and created nothing."""
    url = database_urls[other]
    other_engine, other_migrate, _ = PARTIES[other]
    engine = other_engine(url)
    other_migrate(engine)
    before = set(inspect(engine).get_table_names())
    make_engine, migrate, _ = PARTIES[party]
    mine = make_engine(url)
    try:
        with pytest.raises(ForeignSchemaError, match="holds another party's tables"):
            migrate(mine)
        assert set(inspect(mine).get_table_names()) == before
    finally:
        mine.dispose()
        engine.dispose()


def test_the_worker_command_says_why_it_will_not_start(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'labels.sqlite3'}"
    engine = _labels_engine(url)
    labels_db.migrate(engine)
    engine.dispose()
    env = {
        **os.environ,
        "LABELDP_DATABASE_URL": url,
        "LABELDP_DATA_DIR": str(tmp_path / "features"),
    }
    done = subprocess.run(
        [sys.executable, "-m", "labeldp", "feature-party", "worker", "--once"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1, done.stderr
    assert "give each party a database of its own" in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize(
    ("party", "command"),
    [
        ("labels", ["label-party", "serve", "--port", "9"]),
        ("features", ["feature-party", "worker"]),
    ],
)
def test_a_database_migrated_by_a_newer_labeldp_is_refused_in_one_line(
    party: str, command: list[str], database_urls: dict[str, str], tmp_path: Path
) -> None:
    """An image rolled back onto a database a newer one migrated: Alembic's own
    error was a traceback naming revision '0099' and nothing else. Nothing changes."""
    make_engine, migrate, _ = PARTIES[party]
    url = database_urls[party]
    engine = make_engine(url)
    try:
        migrate(engine)
        with engine.begin() as connection:
            connection.execute(text("UPDATE alembic_version SET version_num = '0099'"))
        with pytest.raises(SchemaAheadError, match="revision 0099, which this labeldp does not"):
            migrate(engine)
    finally:
        engine.dispose()
    env = {k: v for k, v in os.environ.items() if not k.startswith("LABELDP_")}
    env |= {"LABELDP_DATABASE_URL": url, "LABELDP_DATA_DIR": str(tmp_path / "data"),
            "LABELDP_MODE": "dev"}  # fmt: skip
    done = subprocess.run([sys.executable, "-m", "labeldp", *command], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 1, done.stderr
    assert "migrated by a newer version" in done.stderr and "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    engine = make_engine(url)
    try:
        with engine.connect() as connection:
            version = connection.execute(text("SELECT version_num FROM alembic_version"))
            assert version.scalar_one() == "0099"
    finally:
        engine.dispose()


def test_a_database_url_of_an_unsupported_kind_is_one_line(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LABELDP_")}
    env |= {"LABELDP_DATABASE_URL": "mysql://u:p@127.0.0.1/db", "LABELDP_DATA_DIR": str(tmp_path),
            "LABELDP_MODE": "dev"}  # fmt: skip
    done = subprocess.run([sys.executable, "-m", "labeldp", "label-party", "worker"], cwd=REPO,
                          env=env, capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode != 0 and "Traceback" not in done.stderr, done.stderr
    assert "not a database URL this service knows" in done.stderr
