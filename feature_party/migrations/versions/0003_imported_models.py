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
    # 0002's models all came from a job: an imported one has none to give it.
    count = "SELECT count(*) FROM models WHERE job_id IS NULL"
    imported = op.get_bind().execute(sa.text(count)).scalar_one()
    if imported:
        raise RuntimeError(
            f"cannot downgrade below 0003: {imported} imported model(s) have no job "
            "(source labels-party-training); delete them first (DELETE FROM models "
            "WHERE job_id IS NULL) or keep this version"
        )
    with op.batch_alter_table("models") as batch:
        batch.drop_column("training_id")
        batch.drop_column("source")
        batch.alter_column("job_id", existing_type=sa.String(32), nullable=False)
