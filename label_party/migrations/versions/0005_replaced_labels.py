"""Replaced labels: the file a labels upload replaced, recorded in the upload's
transaction, so that a crash between the commit and the file's deletion leaves
the start-up sweep a record to delete it by (it set the raw labels aside in
``orphans/`` instead, which a correction or a deletion request must not leave).

Revision ID: 0005
Revises: 0004
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "replaced_labels",
        sa.Column("dataset_id", sa.String(36), sa.ForeignKey("datasets.id"), primary_key=True),
        sa.Column("sha256", sa.String(64), primary_key=True),
    )


def downgrade() -> None:
    op.drop_table("replaced_labels")
