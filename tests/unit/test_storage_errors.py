"""Storage refusing writes is the operator's to fix: 507 with the errno's name,
never a path or the OS's text; the log says the errno and where, not the text."""

from __future__ import annotations

import errno
import json
import logging
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.exc import DBAPIError
from sqlalchemy.exc import TimeoutError as PoolTimeoutError
from sqlalchemy.pool import QueuePool

from shared.errors import storage_problem, unexpected_error_response
from shared.logging import JsonFormatter
from tests.file_limits import fill, full_disk

LOGGER = logging.getLogger("tests.storage_errors")


def _raised(exc: OSError) -> OSError:
    try:
        raise exc
    except OSError as caught:
        return caught


def test_a_full_disk_is_507_naming_the_errno_and_nothing_else() -> None:
    exc = _raised(OSError(errno.ENOSPC, "No space left on device", "/data/labels/secret-ds"))
    response = unexpected_error_response(LOGGER, exc)
    body = json.loads(bytes(response.body))
    assert response.status_code == 507
    assert body["error"] == "storage_unavailable" and body["detail"] == {"errno": "ENOSPC"}
    assert "secret-ds" not in json.dumps(body) and "No space" not in json.dumps(body)
    read_only = unexpected_error_response(LOGGER, _raised(OSError(errno.EROFS, "ro")))
    assert read_only.status_code == 507


def test_other_errors_stay_a_plain_500() -> None:
    for exc in (_raised(OSError(errno.EIO, "io")), ValueError("label 42.0 is odd")):
        response = unexpected_error_response(LOGGER, exc)
        assert response.status_code == 500
        assert json.loads(bytes(response.body))["message"] == "internal error"


def test_the_log_names_the_errno_and_where_never_the_text() -> None:
    exc = _raised(OSError(errno.ENOSPC, "No space left on device", "/data/secret-ds"))
    record = LOGGER.makeRecord(LOGGER.name, logging.ERROR, __file__, 1, "unhandled error", (),
                               (type(exc), exc, exc.__traceback__))  # fmt: skip
    entry = json.loads(JsonFormatter().format(record))
    assert entry["exception"] == "OSError" and entry["errno"] == "ENOSPC"
    assert entry["where"].startswith(__file__)
    assert "secret-ds" not in json.dumps(entry)


def test_a_full_sqlite_database_is_storage_refusing_a_write(tmp_path: Path) -> None:
    """SQLite on a really full disk (a small tmpfs) says SQLITE_FULL: a 507 naming
    it, and what the workers retry, not a bare 500."""
    with full_disk(tmp_path / "small") as small:
        engine = create_engine(f"sqlite:///{small / 'db.sqlite3'}")
        with engine.begin() as conn:
            conn.execute(text("CREATE TABLE t (b BLOB)"))
        fill(small)
        with pytest.raises(DBAPIError) as full, engine.begin() as conn:
            conn.execute(text("INSERT INTO t VALUES (zeroblob(1000000))"))
        engine.dispose()
    assert storage_problem(full.value) == "SQLITE_FULL"
    response = unexpected_error_response(LOGGER, full.value)
    assert response.status_code == 507
    assert json.loads(bytes(response.body))["detail"] == {"errno": "SQLITE_FULL"}


def test_a_pool_with_every_connection_in_use_is_busy_not_down(tmp_path: Path) -> None:
    """The pool's own timeout said "the database is not answering" while Postgres
    answered every other process (helper-85): it is 503 ``database_busy``."""
    engine = create_engine(
        f"sqlite:///{tmp_path / 'busy.db'}", poolclass=QueuePool, pool_size=1, max_overflow=0,
        pool_timeout=0.1,
    )  # fmt: skip
    try:
        with engine.connect(), pytest.raises(PoolTimeoutError) as caught, engine.connect():
            pass
    finally:
        engine.dispose()
    response = unexpected_error_response(LOGGER, caught.value)
    body = json.loads(bytes(response.body))
    assert (response.status_code, body["error"]) == (503, "database_busy")
    assert response.headers["retry-after"] == "5"
