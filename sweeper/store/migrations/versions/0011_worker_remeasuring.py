"""The trial a worker is measuring again (a contended rerun, a drift reference, the final
interleaved re-measures): no trial row is running meanwhile, so the study page and the
overview read what the machine is doing from here

Revision ID: 0011
Revises: 0010
"""

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"


def upgrade() -> None:
    with op.batch_alter_table("sweeper_workers") as batch:
        batch.add_column(sa.Column("remeasuring", sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("sweeper_workers") as batch:
        batch.drop_column("remeasuring")
