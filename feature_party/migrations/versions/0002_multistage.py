"""LP-MST runs (``feature_party.multistage``).

Revision ID: 0002
Revises: 0001
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

JSON = sa.JSON().with_variant(JSONB(), "postgresql")


def upgrade() -> None:
    op.create_table(
        "multistage_runs",
        sa.Column("id", sa.String(32), primary_key=True),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column(
            "feature_set_id", sa.String(32), sa.ForeignKey("feature_sets.id"), nullable=False
        ),
        sa.Column("labels_party_url", sa.String(500), nullable=False),
        sa.Column("dataset_id", sa.String(200), nullable=False),
        sa.Column("config", JSON, nullable=False),
        sa.Column("state", JSON, nullable=False),
        sa.Column("error", sa.Text),
        sa.Column("created_at", sa.DateTime, nullable=False),
        sa.Column("updated_at", sa.DateTime, nullable=False),
        sa.Column("finished_at", sa.DateTime),
    )


def downgrade() -> None:
    op.drop_table("multistage_runs")
