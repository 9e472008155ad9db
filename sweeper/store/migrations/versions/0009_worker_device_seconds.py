"""The device time each worker used (wall seconds × the devices its trials held), so the
workers of one study share its device-time budget instead of each spending all of it

Revision ID: 0009
Revises: 0008
"""

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"


def upgrade() -> None:
    with op.batch_alter_table("sweeper_workers") as batch:
        batch.add_column(
            sa.Column("device_seconds", sa.Float(), nullable=False, server_default="0")
        )


def downgrade() -> None:
    with op.batch_alter_table("sweeper_workers") as batch:
        batch.drop_column("device_seconds")
