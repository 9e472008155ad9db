"""sweeper_studies.preflight: what the preflight probes found on the sweep's device

Revision ID: 0002
Revises: 0001
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision = "0002"
down_revision = "0001"

JsonType = sa.JSON().with_variant(JSONB(), "postgresql")


def upgrade() -> None:
    with op.batch_alter_table("sweeper_studies") as batch:
        batch.add_column(sa.Column("preflight", JsonType))


def downgrade() -> None:
    with op.batch_alter_table("sweeper_studies") as batch:
        batch.drop_column("preflight")
