"""How sure a $/run is: its 95% interval, whether the machine was shared, and each measurement
of the config (sweeper.noise); trials stored before take their window's interval

Revision ID: 0006
Revises: 0005
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision = "0006"
down_revision = "0005"

JsonType = sa.JSON().with_variant(JSONB(), "postgresql")


def upgrade() -> None:
    with op.batch_alter_table("sweeper_trials") as batch:
        batch.add_column(sa.Column("cost_ci95_rel", sa.Float()))
        batch.add_column(sa.Column("contended", sa.Boolean()))
        batch.add_column(sa.Column("remeasures", JsonType))
    trials = sa.table(
        "sweeper_trials",
        sa.column("id", sa.Integer),
        sa.column("state", sa.String),
        sa.column("measurement", JsonType),
        sa.column("cost_ci95_rel", sa.Float),
    )
    connection = op.get_bind()
    rows = connection.execute(
        sa.select(trials.c.id, trials.c.measurement).where(
            trials.c.state == "complete", trials.c.measurement.is_not(None)
        )
    )
    for trial_id, measurement in rows.all():
        ci = (measurement or {}).get("throughput_ci95_rel")
        if isinstance(ci, int | float) and 0 <= ci < float("inf"):  # skips NaN and inf
            connection.execute(
                trials.update().where(trials.c.id == trial_id).values(cost_ci95_rel=ci)
            )


def downgrade() -> None:
    with op.batch_alter_table("sweeper_trials") as batch:
        batch.drop_column("remeasures")
        batch.drop_column("contended")
        batch.drop_column("cost_ci95_rel")
