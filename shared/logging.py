"""Structured JSON logs with request ids, for both services.

One JSON object per line. A request id (from ``X-Request-ID`` or freshly made) is
kept in a context variable and stamped on every record logged while the request
runs. Callers pass structured fields with ``extra={"fields": {...}}``; nothing
here ever formats a request body, so no label value can reach a log line unless a
caller puts it there (DESIGN.md §3.1 forbids that).
"""

from __future__ import annotations

import errno
import json
import logging
import sys
from contextvars import ContextVar
from datetime import UTC, datetime
from typing import Annotated, Any, Literal

from pydantic import BeforeValidator

#: The standard library's other names for two levels.
_LEVEL_ALIASES = {"WARN": "WARNING", "FATAL": "CRITICAL"}


def _level_name(value: object) -> object:
    if not isinstance(value, str):
        return value
    upper = value.strip().upper()
    return _LEVEL_ALIASES.get(upper, upper)


#: The ``LABELDP_LOG_LEVEL`` setting (any case; ``warn`` and ``fatal`` too).
LogLevel = Annotated[
    Literal["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"], BeforeValidator(_level_name)
]

request_id_var: ContextVar[str | None] = ContextVar("labeldp_request_id", default=None)


class JsonFormatter(logging.Formatter):
    """Render a record as one JSON line: time, level, logger, message, request id, fields."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        request_id = request_id_var.get()
        if request_id is not None:
            entry["request_id"] = request_id
        fields = getattr(record, "fields", None)
        if isinstance(fields, dict):
            entry.update(fields)
        if record.exc_info and record.exc_info[0] is not None:
            entry.update(exception_fields(record.exc_info[1]))
        return json.dumps(entry, default=str)


def exception_fields(exc: BaseException | None) -> dict[str, Any]:
    """What a log may say of an exception: its type, an OS error's errno name and
    where it was raised — never its text, which may quote data."""
    if exc is None:
        return {}
    fields: dict[str, Any] = {"exception": type(exc).__name__}
    if isinstance(exc, OSError) and exc.errno is not None and exc.errno in errno.errorcode:
        fields["errno"] = errno.errorcode[exc.errno]
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    if tb is not None:
        fields["where"] = f"{tb.tb_frame.f_code.co_filename}:{tb.tb_lineno}"
    return fields


def configure_logging(level: str = "INFO") -> None:
    """Send every logger through one JSON handler on stderr (idempotent)."""
    root = logging.getLogger()
    for handler in list(root.handlers):
        if getattr(handler, "_labeldp", False):
            root.removeHandler(handler)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    handler._labeldp = True  # type: ignore[attr-defined]
    root.addHandler(handler)
    root.setLevel(level.upper())
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        logger = logging.getLogger(name)
        logger.handlers.clear()
        logger.propagate = True
    # Our middleware writes the access log; uvicorn's would duplicate it.
    logging.getLogger("uvicorn.access").disabled = True
