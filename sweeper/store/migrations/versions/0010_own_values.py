"""The knobs a script ran at its own values (engine: script, a knob its space does not search
and the trial does not give it), beside the config the trial was asked, which stays the
study's key of the config: what the recommendation, exports and dashboard show as what ran

Revision ID: 0010
Revises: 0009
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision = "0010"
down_revision = "0009"

JsonType = sa.JSON().with_variant(JSONB(), "postgresql")


def upgrade() -> None:
    with op.batch_alter_table("sweeper_trials") as batch:
        batch.add_column(sa.Column("own_values", JsonType, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("sweeper_trials") as batch:
        batch.drop_column("own_values")
