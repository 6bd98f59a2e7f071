"""Release failures: a mechanism that failed after reading the labels is charged,
and a retry with the same idempotency key replays the failure instead of paying
again.

Downgrading drops the table, not the charges: the failures' ledger entries and
``release.failed`` audit entries stay, and code of revision 0003, which knows
neither, reports them in ``GET /v1/audit/verify`` as ledger entries without an
audit entry, and no longer counts them in freezing the labels. Upgrade again
rather than run 0003 code on such a database.

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
        "release_failures",
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
        sa.Column("mechanism", sa.String(100), nullable=False),
        sa.Column("idempotency_key", sa.String(200), nullable=True),
        sa.Column("request_fingerprint", sa.String(64), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.UniqueConstraint("dataset_id", "idempotency_key"),
    )
    op.create_index("ix_release_failures_dataset_id", "release_failures", ["dataset_id"])


def downgrade() -> None:
    op.drop_table("release_failures")
