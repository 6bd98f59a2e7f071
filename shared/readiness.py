"""``GET /readyz`` of both parties: can this process serve requests now? Its
database answers, and the directories it writes to take a file. ``/healthz`` only
says the process is up; a probe that routes traffic needs this one (a database
outage, a disk remounted read-only)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path

from starlette.responses import JSONResponse, Response

from shared.errors import error_response
from shared.startup import write_probe

#: What the database check runs: a read of the schema's revision table, which a
#: SQLite file that is no database fails (``SELECT 1`` never reads the file).
CHECK_QUERY = "SELECT version_num FROM alembic_version"


def problem(check_database: Callable[[], None], directories: Iterable[Path]) -> str | None:
    """Why the service is not ready, or None. Directories not made yet are skipped:
    the first write makes them, under a parent that is probed too."""
    try:
        check_database()
    except Exception:  # any failure means not ready; its text may hold the URL
        return "the database is not reachable"
    for directory in directories:
        if not directory.is_dir():
            continue
        try:
            write_probe(directory)
        except OSError as exc:
            return f"{directory.name}/ cannot be written ({exc.strerror or type(exc).__name__})"
    return None


def response(why: str | None) -> Response:
    """200 ``{"status": "ready"}``, or 503 ``not_ready`` saying why."""
    if why is None:
        return JSONResponse({"status": "ready"})
    return error_response(503, "not_ready", why)
