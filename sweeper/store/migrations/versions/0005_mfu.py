"""MFU as a column, so the trials table can show and sort it without the raw measurement;
filled from the measurement of trials stored before

Revision ID: 0005
Revises: 0004
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision = "0005"
down_revision = "0004"

JsonType = sa.JSON().with_variant(JSONB(), "postgresql")


def upgrade() -> None:
    with op.batch_alter_table("sweeper_trials") as batch:
        batch.add_column(sa.Column("mfu", sa.Float()))
    trials = sa.table(
        "sweeper_trials",
        sa.column("id", sa.Integer),
        sa.column("measurement", JsonType),
        sa.column("mfu", sa.Float),
    )
    connection = op.get_bind()
    rows = connection.execute(
        sa.select(trials.c.id, trials.c.measurement).where(trials.c.measurement.is_not(None))
    )
    for trial_id, measurement in rows.all():
        mfu = (measurement or {}).get("mfu")
        if isinstance(mfu, int | float) and mfu == mfu:  # skips NaN
            connection.execute(trials.update().where(trials.c.id == trial_id).values(mfu=mfu))


def downgrade() -> None:
    with op.batch_alter_table("sweeper_trials") as batch:
        batch.drop_column("mfu")
