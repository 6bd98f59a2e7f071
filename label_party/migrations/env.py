"""Alembic environment: runs on the connection handed over by :func:`label_party.db.migrate`."""

from __future__ import annotations

from alembic import context

from label_party.models import Base

connection = context.config.attributes["connection"]
context.configure(connection=connection, target_metadata=Base.metadata, render_as_batch=True)
with context.begin_transaction():
    context.run_migrations()
