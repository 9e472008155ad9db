"""The GPUs each worker was given (its CUDA_VISIBLE_DEVICES), so an operator can tell which
device ran which trial

Revision ID: 0008
Revises: 0007
"""

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"


def upgrade() -> None:
    with op.batch_alter_table("sweeper_workers") as batch:
        batch.add_column(sa.Column("devices", sa.String(255)))


def downgrade() -> None:
    with op.batch_alter_table("sweeper_workers") as batch:
        batch.drop_column("devices")
