"""Schema migrations of the features party that are not exercised by every start."""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path

import pytest
from alembic import command
from alembic.config import Config
from sqlalchemy import Engine, delete, inspect, select, text

from feature_party.db import Database, migrate
from feature_party.orm import Job, Model
from shared.migrations import migration_engine
from tests.feature_party.conftest import make_settings, seed_inputs

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


@pytest.mark.parametrize("kind", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def test_jobs_queued_before_0005_keep_asking_for_their_gpus(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """0005 adds ``jobs.gpus``; a job queued or running before it that asked for GPUs
    must not become claimable by a CPU-only worker (its configuration is text on
    SQLite, a dict from Postgres' JSONB: both are read)."""
    url = request.getfixturevalue("fresh_postgres_url") if kind == "postgres" else None
    settings = make_settings(tmp_path, **({"database_url": url} if url else {}))
    database = Database(settings.resolved_database_url)
    migrate(database.engine)
    fs, labels = seed_inputs(database, settings, n=5)
    _downgrade(database.engine, "0004")
    jobs = {"queued-cuda": ("queued", "cuda"), "running-2": ("running", 2),
            "queued-cpu": ("queued", "cpu"), "done-cuda": ("succeeded", "cuda")}  # fmt: skip
    with database.engine.begin() as connection:
        for job_id, (status, device) in jobs.items():
            connection.execute(
                text("INSERT INTO jobs (id, status, feature_set_id, labels_id, config, attempts,"
                     " created_at) VALUES (:id, :status, :fs, :labels, :config, 0, :now)"),
                {"id": job_id, "status": status, "fs": fs, "labels": labels,
                 "config": json.dumps({"device": device}), "now": datetime(2026, 1, 1)},
            )  # fmt: skip
    try:
        migrate(database.engine)
        with database.session() as session:
            gpus = {row.id: row.gpus for row in session.execute(select(Job.id, Job.gpus))}
        assert gpus == {"queued-cuda": 1, "running-2": 2, "queued-cpu": 0, "done-cuda": 0}
    finally:
        database.dispose()
