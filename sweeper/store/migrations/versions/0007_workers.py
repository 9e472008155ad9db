"""Workers of a study and their heartbeats; which worker ran each trial; claims (one trial
per config, whichever worker proposed it first)

Revision ID: 0007
Revises: 0006
"""

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"


def upgrade() -> None:
    op.create_table(
        "sweeper_workers",
        sa.Column("id", sa.String(36), primary_key=True),
        sa.Column(
            "study_id",
            sa.Integer(),
            sa.ForeignKey("sweeper_studies.id", ondelete="CASCADE"),
            nullable=False,
            index=True,
        ),
        sa.Column("host", sa.String(255), nullable=False),
        sa.Column("pid", sa.Integer(), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("heartbeat_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("finished_at", sa.DateTime(timezone=True)),
    )
    with op.batch_alter_table("sweeper_trials") as batch:
        batch.add_column(sa.Column("worker_id", sa.String(36)))
    op.create_table(
        "sweeper_claims",
        sa.Column(
            "study_id",
            sa.Integer(),
            sa.ForeignKey("sweeper_studies.id", ondelete="CASCADE"),
            primary_key=True,
        ),
        sa.Column("config_key", sa.String(64), primary_key=True),
        sa.Column("trial_number", sa.Integer(), nullable=False),
        sa.Column("worker_id", sa.String(36)),
    )


def downgrade() -> None:
    op.drop_table("sweeper_claims")
    with op.batch_alter_table("sweeper_trials") as batch:
        batch.drop_column("worker_id")
    op.drop_table("sweeper_workers")
