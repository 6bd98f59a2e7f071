"""Prior sets: example priors (groups or per-example probabilities) sent by the features party.

Revision ID: 0002
Revises: 0001
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "prior_sets",
        sa.Column("id", sa.String(36), primary_key=True),
        sa.Column("dataset_id", sa.String(36), sa.ForeignKey("datasets.id"), nullable=False),
        sa.Column("kind", sa.String(20), nullable=False),
        sa.Column("num_rows", sa.BigInteger, nullable=False),
        sa.Column("num_groups", sa.Integer, nullable=True),
        sa.Column("num_classes", sa.Integer, nullable=True),
        sa.Column("sha256", sa.String(64), nullable=False),
        sa.Column("created_by", sa.String(36), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_index("ix_prior_sets_dataset_id", "prior_sets", ["dataset_id"])


def downgrade() -> None:
    op.drop_table("prior_sets")
