"""sweeper_studies and sweeper_trials

Revision ID: 0001
Revises:
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision = "0001"
down_revision = None

JsonType = sa.JSON().with_variant(JSONB(), "postgresql")


def upgrade() -> None:
    op.create_table(
        "sweeper_studies",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("name", sa.String(255), nullable=False, unique=True),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("hardware_name", sa.String(255), nullable=False),
        sa.Column("usd_per_hour", sa.Float, nullable=False),
        sa.Column("device", sa.String(16), nullable=False),
        sa.Column("samples", sa.BigInteger, nullable=False),
        sa.Column("epochs", sa.Float, nullable=False),
        sa.Column("n_trials_planned", sa.Integer, nullable=False),
        sa.Column("space_yaml", sa.Text, nullable=False),
        sa.Column("space_path", sa.String(1024)),
        sa.Column("dataset_stats", JsonType),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_table(
        "sweeper_trials",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column(
            "study_id",
            sa.Integer,
            sa.ForeignKey("sweeper_studies.id", ondelete="CASCADE"),
            nullable=False,
        ),
        sa.Column("number", sa.Integer, nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("config", JsonType, nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("finished_at", sa.DateTime(timezone=True)),
        sa.Column("wall_s", sa.Float),
        sa.Column("it_per_s", sa.Float),
        sa.Column("samples_per_s", sa.Float),
        sa.Column("tokens_per_s", sa.Float),
        sa.Column("padded_tokens_per_s", sa.Float),
        sa.Column("data_wait_share", sa.Float),
        sa.Column("peak_memory_bytes", sa.BigInteger),
        sa.Column("compile_s", sa.Float),
        sa.Column("hours_per_run", sa.Float),
        sa.Column("cost_per_run_usd", sa.Float),
        sa.Column("loss_first", sa.Float),
        sa.Column("loss_last", sa.Float),
        sa.Column("failure_kind", sa.String(32)),
        sa.Column("failure_message", sa.Text),
        sa.Column("measurement", JsonType),
    )
    op.create_index(
        "ix_sweeper_trials_study_number", "sweeper_trials", ["study_id", "number"], unique=True
    )
    op.create_index(
        "ix_sweeper_trials_study_cost",
        "sweeper_trials",
        ["study_id", "state", "cost_per_run_usd"],
    )


def downgrade() -> None:
    op.drop_table("sweeper_trials")
    op.drop_table("sweeper_studies")
