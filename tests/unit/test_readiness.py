"""``/readyz`` (``shared.readiness``): not ready while the database fails or a
directory the service writes to refuses a file."""

from __future__ import annotations

import json
from pathlib import Path

from sqlalchemy import create_engine, text

from shared import readiness


def _database(url: str):  # type: ignore[no-untyped-def]
    def check() -> None:
        engine = create_engine(url)
        try:
            with engine.connect() as connection:
                connection.execute(text("SELECT count(*) FROM sqlite_master"))
        finally:
            engine.dispose()

    return check


def test_ready_only_when_the_database_answers_and_every_directory_takes_a_file(
    tmp_path: Path,
) -> None:
    good = _database(f"sqlite:///{tmp_path / 'ok.sqlite3'}")
    (tmp_path / "garbage.sqlite3").write_bytes(b"this is not a database file" * 100)
    broken = _database(f"sqlite:///{tmp_path / 'garbage.sqlite3'}")
    assert readiness.problem(good, [tmp_path, tmp_path / "not-made-yet"]) is None
    assert readiness.problem(broken, [tmp_path]) == "the database is not reachable"
    # /proc/self takes no new file, even from root: a directory remounted read-only.
    why = readiness.problem(good, [tmp_path, Path("/proc/self")])
    assert why is not None and why.startswith("self/ cannot be written")
    assert list(tmp_path.glob(".write-check*")) == []  # probes leave nothing
    ready, unready = readiness.response(None), readiness.response("the database is not reachable")
    assert ready.status_code == 200 and json.loads(bytes(ready.body)) == {"status": "ready"}
    assert unready.status_code == 503 and json.loads(bytes(unready.body))["error"] == "not_ready"
