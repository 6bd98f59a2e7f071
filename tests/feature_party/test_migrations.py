"""Schema migrations of the features party that are not exercised by every start."""

from __future__ import annotations

from pathlib import Path

import pytest
from alembic import command
from alembic.config import Config
from sqlalchemy import Engine, delete, inspect

from feature_party.db import Database, migrate
from feature_party.orm import Model
from tests.feature_party.conftest import make_settings

MIGRATIONS = Path(__file__).resolve().parents[2] / "feature_party" / "migrations"


def _downgrade(engine: Engine, revision: str) -> None:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    with engine.begin() as connection:
        config.attributes["connection"] = connection
        command.downgrade(config, revision)


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
        with database.session() as session:
            session.execute(delete(Model))
        _downgrade(database.engine, "0002")
        assert "source" not in {c["name"] for c in inspect(database.engine).get_columns("models")}
        migrate(database.engine)  # and back up
    finally:
        database.dispose()
