"""sweeper_studies.baseline: the user's current config, the sweep's first trial

Revision ID: 0003
Revises: 0002
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision = "0003"
down_revision = "0002"

JsonType = sa.JSON().with_variant(JSONB(), "postgresql")


def upgrade() -> None:
    with op.batch_alter_table("sweeper_studies") as batch:
        batch.add_column(sa.Column("baseline", JsonType))


def downgrade() -> None:
    with op.batch_alter_table("sweeper_studies") as batch:
        batch.drop_column("baseline")
