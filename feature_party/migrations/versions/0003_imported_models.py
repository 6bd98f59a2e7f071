"""Models imported from the labels party (LabelDP-Pro trainings): ``models.job_id``
becomes nullable, ``source`` says where a model came from (``job`` |
``labels-party-training``) and ``training_id`` names the labels-party training.

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


def upgrade() -> None:
    with op.batch_alter_table("models") as batch:
        batch.alter_column("job_id", existing_type=sa.String(32), nullable=True)
        batch.add_column(sa.Column("source", sa.String(40), nullable=False, server_default="job"))
        batch.add_column(sa.Column("training_id", sa.String(200), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("models") as batch:
        batch.drop_column("training_id")
        batch.drop_column("source")
        batch.alter_column("job_id", existing_type=sa.String(32), nullable=False)
