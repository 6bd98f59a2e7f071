"""Alembic environment: runs on the connection that ``feature_party.db.migrate``
passes in (no ini file, no URL in here)."""

from __future__ import annotations

from alembic import context

from feature_party.orm import Base

connection = context.config.attributes["connection"]
context.configure(connection=connection, target_metadata=Base.metadata)
with context.begin_transaction():
    context.run_migrations()
