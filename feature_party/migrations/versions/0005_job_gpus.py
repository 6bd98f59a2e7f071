"""Jobs say how many GPUs a worker needs to claim them, so a CPU-only worker leaves
a GPU job queued for a GPU worker instead of taking it and failing it.

Revision ID: 0005
Revises: 0004
"""

from __future__ import annotations

import json
from typing import Any

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("gpus", sa.Integer(), nullable=False, server_default="0"))
    # Jobs not yet ended that asked for GPUs keep asking (ended ones never run again).
    connection = op.get_bind()
    rows = connection.execute(
        sa.text("SELECT id, config FROM jobs WHERE status IN ('queued', 'running')")
    ).all()
    for job_id, config in rows:
        gpus = _gpus(_loaded(config).get("device"))
        if gpus:
            connection.execute(
                sa.text("UPDATE jobs SET gpus = :gpus WHERE id = :id"), {"gpus": gpus, "id": job_id}
            )


def _gpus(device: object) -> int:
    """As ``TrainingConfig.gpus`` read it at this revision (a migration keeps its own)."""
    if device == "cuda":
        return 1
    return device if isinstance(device, int) and not isinstance(device, bool) else 0


def _loaded(config: Any) -> dict[str, Any]:
    """A job's configuration as read here: text on SQLite, a dict from Postgres' JSONB."""
    value = json.loads(config) if isinstance(config, str | bytes) else config
    return value if isinstance(value, dict) else {}


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("gpus")
