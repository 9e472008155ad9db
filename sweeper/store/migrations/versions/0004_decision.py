"""What the decision needs: the run's one-time costs per trial, device memory and name, the
workload a study prices (to compare hardware), and what the sweep itself cost

Revision ID: 0004
Revises: 0003
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision = "0004"
down_revision = "0003"

JsonType = sa.JSON().with_variant(JSONB(), "postgresql")


def upgrade() -> None:
    with op.batch_alter_table("sweeper_trials") as batch:
        batch.add_column(sa.Column("projection", JsonType))
        batch.add_column(sa.Column("device_memory_bytes", sa.BigInteger()))
        batch.add_column(sa.Column("device_name", sa.String(255)))
    with op.batch_alter_table("sweeper_studies") as batch:
        batch.add_column(sa.Column("workload_hash", sa.String(64)))
        batch.add_column(sa.Column("sweep_seconds", sa.Float(), nullable=False, server_default="0"))
    op.create_index("ix_sweeper_studies_workload_hash", "sweeper_studies", ["workload_hash"])


def downgrade() -> None:
    op.drop_index("ix_sweeper_studies_workload_hash", "sweeper_studies")
    with op.batch_alter_table("sweeper_studies") as batch:
        batch.drop_column("sweep_seconds")
        batch.drop_column("workload_hash")
    with op.batch_alter_table("sweeper_trials") as batch:
        batch.drop_column("device_name")
        batch.drop_column("device_memory_bytes")
        batch.drop_column("projection")
