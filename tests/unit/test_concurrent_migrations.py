"""Processes that start together on a new SQLite file migrate one at a time
(``shared.migrations``): before, the loser of the race crashed with ``table …
already exists`` or ``database is locked`` (a features-party worker started with
its API died so in CI)."""

from __future__ import annotations

import importlib
import multiprocessing as mp
import sqlite3
from multiprocessing.queues import Queue
from multiprocessing.synchronize import Barrier
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

PROCESSES = 3
ROUNDS = 3


def _migrate(party: str, url: str, barrier: Barrier, results: Queue[str | None]) -> None:
    db = importlib.import_module(f"{party}.db")
    engine = db.make_engine(url) if party == "feature_party" else db.connect(url).engine
    barrier.wait()  # every process reaches the empty file before any migrates
    try:
        db.migrate(engine)
        results.put(None)
    except Exception as exc:  # the parent reports it
        results.put(f"{type(exc).__name__}: {exc}"[:300])


@pytest.mark.parametrize("party", ["label_party", "feature_party"])
def test_processes_starting_together_all_migrate(party: str, tmp_path: Path) -> None:
    ctx = mp.get_context("spawn")
    for round_ in range(ROUNDS):
        path = tmp_path / f"round{round_}.sqlite"
        barrier, results = ctx.Barrier(PROCESSES), ctx.Queue()
        procs = [
            ctx.Process(target=_migrate, args=(party, f"sqlite:///{path}", barrier, results))
            for _ in range(PROCESSES)
        ]
        for proc in procs:
            proc.start()
        errors = [e for e in (results.get(timeout=120) for _ in procs) if e is not None]
        for proc in procs:
            proc.join(timeout=30)
        assert errors == [], f"round {round_}: {errors}"
        with sqlite3.connect(path) as conn:
            (versions,) = conn.execute("SELECT count(*) FROM alembic_version").fetchone()
        assert versions == 1
