"""LabelDP-Pro trainings: a lease-queue table whose rows end in a model artifact.

Revision ID: 0003
Revises: 0002
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

TS = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "trainings",
        sa.Column("id", sa.String(36), primary_key=True),
        sa.Column("dataset_id", sa.String(36), sa.ForeignKey("datasets.id"), nullable=False),
        sa.Column(
            "ledger_entry_id",
            sa.String(36),
            sa.ForeignKey("ledger_entries.id"),
            nullable=False,
            unique=True,
        ),
        sa.Column("created_by", sa.String(36), nullable=False),
        sa.Column("spec", sa.JSON, nullable=False),
        sa.Column("features_sha256", sa.String(64), nullable=False),
        sa.Column("num_examples", sa.BigInteger, nullable=False),
        sa.Column("idempotency_key", sa.String(200), nullable=True),
        sa.Column("request_fingerprint", sa.String(64), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("progress", sa.JSON, nullable=True),
        sa.Column("accounting", sa.JSON, nullable=True),
        sa.Column("metrics", sa.JSON, nullable=True),
        sa.Column("model_sha256", sa.String(64), nullable=True),
        sa.Column("error", sa.Text, nullable=True),
        sa.Column("worker_id", sa.String(200), nullable=True),
        sa.Column("attempts", sa.Integer, nullable=False),
        sa.Column("lease_expires_at", TS, nullable=True),
        sa.Column("created_at", TS, nullable=False),
        sa.Column("started_at", TS, nullable=True),
        sa.Column("finished_at", TS, nullable=True),
        sa.UniqueConstraint("dataset_id", "idempotency_key"),
    )
    op.create_index("ix_trainings_dataset_id", "trainings", ["dataset_id"])
    op.create_index("ix_trainings_status", "trainings", ["status", "created_at"])


def downgrade() -> None:
    op.drop_table("trainings")
