"""Pending release keys: the idempotency key made for a release request that gave
none, kept until its labels are stored, so that a retry after a crash reuses it.

Revision ID: 0004
Revises: 0003
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "pending_release_keys",
        sa.Column("fingerprint", sa.String(64), primary_key=True),
        sa.Column("idempotency_key", sa.String(200), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("pending_release_keys")
