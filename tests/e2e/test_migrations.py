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
from sqlalchemy import Engine, MetaData, inspect

import feature_party.db as features_db
import label_party.db as labels_db
from feature_party.orm import Base as FeaturesBase
from label_party.models import Base as LabelsBase
from shared.migrations import ForeignSchemaError

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
