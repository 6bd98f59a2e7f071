"""Timestamps: aware UTC in Python and in every answer, whatever a database keeps.

The labels party stores ``timestamp with time zone``, the features party
``timestamp without time zone`` holding UTC; SQLite keeps neither zone. Read
through :class:`UTCDateTime`, both give aware UTC datetimes, so the API writes
``…Z`` (a naive answer left clients to guess the zone), and Postgres's
``timestamptz`` comes back in UTC rather than the connection's ``TimeZone``.
"""

from __future__ import annotations

from datetime import UTC, datetime

from sqlalchemy import DateTime
from sqlalchemy.engine import Dialect
from sqlalchemy.types import TypeDecorator


def utcnow() -> datetime:
    """Now, aware UTC: the one clock convention of both parties' code."""
    return datetime.now(UTC)


class UTCDateTime(TypeDecorator[datetime]):
    """A ``DateTime`` column read as aware UTC. ``UTCDateTime(timezone=False)``
    keeps a zone-less column's storage (naive UTC) and takes aware values for it."""

    impl = DateTime
    cache_ok = True

    def __init__(self, timezone: bool = False) -> None:
        super().__init__(timezone=timezone)
        # Positional-or-keyword and stored under its own name: SQLAlchemy's cache
        # key reads such arguments (a keyword-only one gave both variants one key).
        self.timezone = timezone

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        aware = value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)
        return aware if self.timezone else aware.replace(tzinfo=None)

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)
