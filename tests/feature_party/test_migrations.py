"""Schema migrations of the features party that are not exercised by every start."""

from __future__ import annotations

from pathlib import Path

import pytest
from alembic import command
from alembic.config import Config
from sqlalchemy import Engine, delete, inspect

from feature_party.db import Database, migrate
from feature_party.orm import Model
from shared.migrations import migration_engine
from tests.feature_party.conftest import make_settings

MIGRATIONS = Path(__file__).resolve().parents[2] / "feature_party" / "migrations"


def _downgrade(engine: Engine, revision: str) -> None:
    """As an operator's Alembic run would, in one transaction (DDL included)."""
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    migrator = migration_engine(engine)
    try:
        with migrator.begin() as connection:
            config.attributes["connection"] = connection
            command.downgrade(config, revision)
    finally:
        if migrator is not engine:
            migrator.dispose()


def test_downgrading_below_imported_models_refuses_while_one_exists(tmp_path: Path) -> None:
    """0002 requires a job for every model; an imported one has none, and the
    downgrade failed half-way with NOT NULL constraint failed: _alembic_tmp_models."""
    database = Database(make_settings(tmp_path).resolved_database_url)
    migrate(database.engine)
    try:
        with database.session() as session:
            session.add(Model(id="m1", job_id=None, source="labels-party-training",
                              training_id="t1", path="models/imported/x.pt",
                              task="classification", loss="cross-entropy", metrics={}))  # fmt: skip
        with pytest.raises(RuntimeError, match="1 imported model"):
            _downgrade(database.engine, "0002")
        assert "source" in {c["name"] for c in inspect(database.engine).get_columns("models")}
        # The refusal rolled back what the downgrade had done before it (0004's).
        assert inspect(database.engine).has_table("pending_release_keys")
        with database.session() as session:
            session.execute(delete(Model))
        _downgrade(database.engine, "0002")
        assert "source" not in {c["name"] for c in inspect(database.engine).get_columns("models")}
        migrate(database.engine)  # and back up
    finally:
        database.dispose()
