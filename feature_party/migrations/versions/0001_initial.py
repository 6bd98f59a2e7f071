"""Initial schema: feature sets, received labels, jobs, models.

Revision ID: 0001
Revises:
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

JSON = sa.JSON().with_variant(JSONB(), "postgresql")


def upgrade() -> None:
    op.create_table(
        "feature_sets",
        sa.Column("id", sa.String(32), primary_key=True),
        sa.Column("name", sa.String(200)),
        sa.Column("num_rows", sa.Integer, nullable=False),
        sa.Column("columns", JSON, nullable=False),
        sa.Column("roles", JSON, nullable=False),
        sa.Column("path", sa.String(500), nullable=False),
        sa.Column("created_at", sa.DateTime, nullable=False),
    )
    op.create_table(
        "received_labels",
        sa.Column("id", sa.String(32), primary_key=True),
        sa.Column(
            "feature_set_id", sa.String(32), sa.ForeignKey("feature_sets.id"), nullable=False
        ),
        sa.Column("labels_party_url", sa.String(500), nullable=False),
        sa.Column("dataset_id", sa.String(200), nullable=False),
        sa.Column("release_id", sa.String(200), nullable=False),
        sa.Column("manifest", JSON, nullable=False),
        sa.Column("sha256", sa.String(64), nullable=False),
        sa.Column("path", sa.String(500), nullable=False),
        sa.Column("num_labels", sa.Integer, nullable=False),
        sa.Column("matched", sa.Integer, nullable=False),
        sa.Column("unmatched", sa.Integer, nullable=False),
        sa.Column("created_at", sa.DateTime, nullable=False),
    )
    op.create_table(
        "jobs",
        sa.Column("id", sa.String(32), primary_key=True),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column(
            "feature_set_id", sa.String(32), sa.ForeignKey("feature_sets.id"), nullable=False
        ),
        sa.Column("labels_id", sa.String(32), sa.ForeignKey("received_labels.id"), nullable=False),
        sa.Column("config", JSON, nullable=False),
        sa.Column("progress", JSON),
        sa.Column("metrics", JSON),
        sa.Column("error", sa.Text),
        sa.Column("model_id", sa.String(32)),
        sa.Column("worker_id", sa.String(200)),
        sa.Column("attempts", sa.Integer, nullable=False),
        sa.Column("lease_expires_at", sa.DateTime),
        sa.Column("created_at", sa.DateTime, nullable=False),
        sa.Column("started_at", sa.DateTime),
        sa.Column("finished_at", sa.DateTime),
    )
    op.create_index("ix_jobs_status_created", "jobs", ["status", "created_at"])
    op.create_table(
        "models",
        sa.Column("id", sa.String(32), primary_key=True),
        sa.Column("job_id", sa.String(32), sa.ForeignKey("jobs.id"), nullable=False, unique=True),
        sa.Column("path", sa.String(500), nullable=False),
        sa.Column("task", sa.String(32), nullable=False),
        sa.Column("loss", sa.String(64), nullable=False),
        sa.Column("metrics", JSON, nullable=False),
        sa.Column("created_at", sa.DateTime, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("models")
    op.drop_index("ix_jobs_status_created", table_name="jobs")
    op.drop_table("jobs")
    op.drop_table("received_labels")
    op.drop_table("feature_sets")
