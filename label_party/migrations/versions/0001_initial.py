"""Initial schema: clients, datasets, grants, partition plans, ledger, releases, audit.

Revision ID: 0001
Revises:
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

TS = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "clients",
        sa.Column("id", sa.String(36), primary_key=True),
        sa.Column("name", sa.String(200), nullable=False),
        sa.Column("role", sa.String(20), nullable=False),
        sa.Column("token_hash", sa.String(64), nullable=False, unique=True),
        sa.Column("created_at", TS, nullable=False),
        sa.Column("revoked_at", TS, nullable=True),
    )
    op.create_table(
        "datasets",
        sa.Column("id", sa.String(36), primary_key=True),
        sa.Column("name", sa.String(200), nullable=False),
        sa.Column("task", sa.String(20), nullable=False),
        sa.Column("label_domain", sa.JSON, nullable=False),
        sa.Column("epsilon_budget", sa.BigInteger, nullable=False),
        sa.Column("delta_budget", sa.BigInteger, nullable=False),
        sa.Column("num_labels", sa.BigInteger, nullable=True),
        sa.Column("labels_sha256", sa.String(64), nullable=True),
        sa.Column("created_by", sa.String(36), nullable=False),
        sa.Column("created_at", TS, nullable=False),
    )
    op.create_table(
        "grants",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("dataset_id", sa.String(36), sa.ForeignKey("datasets.id"), nullable=False),
        sa.Column("client_id", sa.String(36), sa.ForeignKey("clients.id"), nullable=False),
        sa.Column("created_at", TS, nullable=False),
        sa.UniqueConstraint("dataset_id", "client_id"),
    )
    op.create_index("ix_grants_dataset_id", "grants", ["dataset_id"])
    op.create_index("ix_grants_client_id", "grants", ["client_id"])
    op.create_table(
        "partition_plans",
        sa.Column("id", sa.String(36), primary_key=True),
        sa.Column(
            "dataset_id", sa.String(36), sa.ForeignKey("datasets.id"), nullable=False, unique=True
        ),
        sa.Column("parts", sa.JSON, nullable=False),
        sa.Column("sha256", sa.String(64), nullable=False),
        sa.Column("created_by", sa.String(36), nullable=False),
        sa.Column("created_at", TS, nullable=False),
    )
    op.create_table(
        "ledger_entries",
        sa.Column("id", sa.String(36), primary_key=True),
        sa.Column("dataset_id", sa.String(36), sa.ForeignKey("datasets.id"), nullable=False),
        sa.Column("epsilon", sa.BigInteger, nullable=False),
        sa.Column("delta", sa.BigInteger, nullable=False),
        sa.Column("parts", sa.JSON, nullable=True),
        sa.Column("created_at", TS, nullable=False),
    )
    op.create_index("ix_ledger_entries_dataset_id", "ledger_entries", ["dataset_id"])
    op.create_table(
        "releases",
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
        sa.Column("prior_epsilon", sa.BigInteger, nullable=False),
        sa.Column("mechanism", sa.JSON, nullable=False),
        sa.Column("prior", sa.JSON, nullable=True),
        sa.Column("num_labels", sa.BigInteger, nullable=False),
        sa.Column("sha256", sa.String(64), nullable=False),
        sa.Column("idempotency_key", sa.String(200), nullable=True),
        sa.Column("request_fingerprint", sa.String(64), nullable=False),
        sa.Column("created_at", TS, nullable=False),
        sa.UniqueConstraint("dataset_id", "idempotency_key"),
    )
    op.create_index("ix_releases_dataset_id", "releases", ["dataset_id"])
    op.create_table(
        "audit_entries",
        sa.Column("seq", sa.BigInteger, primary_key=True, autoincrement=False),
        sa.Column("created_at", sa.String(40), nullable=False),
        sa.Column("actor", sa.String(36), nullable=False),
        sa.Column("action", sa.String(40), nullable=False),
        sa.Column("dataset_id", sa.String(36), nullable=True),
        sa.Column("payload", sa.Text, nullable=False),
        sa.Column("prev_hash", sa.String(64), nullable=False),
        sa.Column("hash", sa.String(64), nullable=False),
    )
    op.create_index("ix_audit_entries_dataset_id", "audit_entries", ["dataset_id"])


def downgrade() -> None:
    for table in (
        "audit_entries",
        "releases",
        "ledger_entries",
        "partition_plans",
        "grants",
        "datasets",
        "clients",
    ):
        op.drop_table(table)
