"""Tables sweeper owns, beside Optuna's in the same database.

Optuna keeps the search state (its ``studies``/``trials`` tables); these keep the typed
measurement of each trial and what it costs, so that the API can filter and sort in SQL.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any, Protocol

from sqlalchemy import JSON, BigInteger, Boolean, DateTime, Float, ForeignKey, Index, String, Text
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship
from sqlalchemy.types import TypeDecorator

JsonType = JSON().with_variant(JSONB(), "postgresql")


class ConfigJson(TypeDecorator[dict[str, Any]]):
    """A trial's config: JSON whose knobs read back in their declared order
    (``knobs.in_order``), as Postgres's JSONB stores an object's keys in an order of its own."""

    impl = JsonType
    cache_ok = True

    def process_result_value(self, value: Any, dialect: Any) -> dict[str, Any] | None:
        from sweeper.knobs import in_order

        return in_order(value) if isinstance(value, dict) else value


TRIAL_STATES = ("running", "complete", "failed", "pruned")
# "stopping": a stop was requested (REST); the sweep ends after its running trial → "stopped"
STUDY_STATES = ("running", "stopping", "stopped", "finished", "interrupted", "failed")
NONE_COMPLETED = "no trial completed"


def ended_without_answer(state: str, trials: Mapping[Any, int]) -> bool:
    """Whether a study whose sweep ended well (``finished``, ``stopped``) has failed trials and
    no completed one: its state alone reads as an answer, and there is none."""
    return (
        state in ("finished", "stopped")
        and not trials.get("complete")
        and bool(trials.get("failed"))
    )


class Base(DeclarativeBase):
    pass


class StudyRow(Base):
    __tablename__ = "sweeper_studies"

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(255), unique=True)
    state: Mapped[str] = mapped_column(String(16))
    hardware_name: Mapped[str] = mapped_column(String(255))
    usd_per_hour: Mapped[float] = mapped_column(Float)
    device: Mapped[str] = mapped_column(String(16))
    samples: Mapped[int] = mapped_column(BigInteger)
    epochs: Mapped[float] = mapped_column(Float)
    n_trials_planned: Mapped[int]
    space_yaml: Mapped[str] = mapped_column(Text)
    space_path: Mapped[str | None] = mapped_column(String(1024))
    dataset_stats: Mapped[dict[str, Any] | None] = mapped_column(
        JsonType, doc="token-length distribution of the dataset, from the prepare step"
    )
    preflight: Mapped[dict[str, Any] | None] = mapped_column(
        JsonType, doc="what the preflight probes dropped, and why"
    )
    baseline: Mapped[dict[str, Any] | None] = mapped_column(
        JsonType, doc="the user's current config (a TrialConfig dump), run as the first trial"
    )
    workload_hash: Mapped[str | None] = mapped_column(
        String(64), index=True, doc="studies with the same hash price the same job"
    )
    sweep_seconds: Mapped[float] = mapped_column(
        Float,
        default=0.0,
        server_default="0",
        doc="device-seconds the sweep itself used (wall time × devices held, every worker)",
    )
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))

    trials: Mapped[list[TrialRow]] = relationship(
        back_populates="study", cascade="all, delete-orphan", passive_deletes=True
    )


class TrialRow(Base):
    __tablename__ = "sweeper_trials"
    __table_args__ = (
        Index("ix_sweeper_trials_study_number", "study_id", "number", unique=True),
        Index("ix_sweeper_trials_study_cost", "study_id", "state", "cost_per_run_usd"),
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    study_id: Mapped[int] = mapped_column(ForeignKey("sweeper_studies.id", ondelete="CASCADE"))
    number: Mapped[int] = mapped_column(doc="Optuna's trial number in the study")
    state: Mapped[str] = mapped_column(String(16))
    # the config the trial was asked to run: the study's key of it (dedup, claims, Optuna's
    # params). engine: script: a knob the program ran at its own value holds sweeper's default
    # here, and what ran in ``own_values`` (the config as it ran: knob_values.as_ran)
    config: Mapped[dict[str, Any]] = mapped_column(ConfigJson)
    own_values: Mapped[dict[str, Any] | None] = mapped_column(
        JsonType,
        doc="the knobs a script ran at its own values where they differ from config "
        "(Measurement.own_values); none for every other trial",
    )
    started_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    finished_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    wall_s: Mapped[float | None] = mapped_column(Float, doc="child start to result, seconds")

    # The metrics of sweeper.measurement.COLUMN_METRICS, by the same names (what they mean is
    # documented there; tests/test_measurement.py checks these columns against them).
    it_per_s: Mapped[float | None] = mapped_column(Float, doc="optimizer steps per second")
    samples_per_s: Mapped[float | None] = mapped_column(Float)
    tokens_per_s: Mapped[float | None] = mapped_column(Float, doc="real (non-pad) tokens/s")
    padded_tokens_per_s: Mapped[float | None] = mapped_column(Float)
    data_wait_share: Mapped[float | None] = mapped_column(Float)
    mfu: Mapped[float | None] = mapped_column(Float, doc="model FLOPs utilization (GPU only)")
    peak_memory_bytes: Mapped[int | None] = mapped_column(BigInteger)
    compile_s: Mapped[float | None] = mapped_column(Float)
    hours_per_run: Mapped[float | None] = mapped_column(Float)
    cost_per_run_usd: Mapped[float | None] = mapped_column(Float)
    projection: Mapped[dict[str, Any] | None] = mapped_column(
        JsonType, doc="train hours, start-up, compile and checkpoint seconds of the run"
    )
    device_memory_bytes: Mapped[int | None] = mapped_column(BigInteger)
    device_name: Mapped[str | None] = mapped_column(String(255), doc="what it was measured on")
    loss_first: Mapped[float | None] = mapped_column(Float)
    loss_last: Mapped[float | None] = mapped_column(Float)
    failure_kind: Mapped[str | None] = mapped_column(String(32))
    failure_message: Mapped[str | None] = mapped_column(Text)
    measurement: Mapped[dict[str, Any] | None] = mapped_column(JsonType)
    # How sure the $/run is (sweeper.noise): with more than one measurement of the config, the
    # throughput and cost columns above hold their pooled estimate and ``remeasures`` each one
    cost_ci95_rel: Mapped[float | None] = mapped_column(
        Float, doc="half-width of the $/run's 95% interval, relative to it"
    )
    contended: Mapped[bool | None] = mapped_column(
        Boolean, doc="every measurement of the config was taken on a shared machine"
    )
    remeasures: Mapped[list[dict[str, Any]] | None] = mapped_column(
        JsonType, doc="each measurement of the config (sweeper.noise.Sample), the first included"
    )
    worker_id: Mapped[str | None] = mapped_column(String(36), doc="the worker that ran it")

    study: Mapped[StudyRow] = relationship(back_populates="trials")


class WorkerRow(Base):
    """One sweep process working on a study: alive while its heartbeat is fresh."""

    __tablename__ = "sweeper_workers"

    id: Mapped[str] = mapped_column(String(36), primary_key=True)
    study_id: Mapped[int] = mapped_column(
        ForeignKey("sweeper_studies.id", ondelete="CASCADE"), index=True
    )
    host: Mapped[str] = mapped_column(String(255))
    pid: Mapped[int]
    devices: Mapped[str | None] = mapped_column(
        String(255), doc="its CUDA_VISIBLE_DEVICES; none if it was not set"
    )
    state: Mapped[str] = mapped_column(String(16), doc="alive, done or lost")
    started_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    heartbeat_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    finished_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    device_seconds: Mapped[float] = mapped_column(
        Float,
        default=0.0,
        server_default="0",
        doc="device time it used: wall seconds × the devices its trial held (one between trials)",
    )
    remeasuring: Mapped[int | None] = mapped_column(
        doc="the number of the trial it is measuring again now (no trial row runs meanwhile)"
    )


class TrialMetrics(Protocol):
    """A trial's config and scalar results: a ``TrialRow`` or a row of
    ``Store.trial_metrics`` (which loads exactly these fields, in this order)."""

    number: int
    state: str
    config: dict[str, Any]
    own_values: dict[str, Any] | None
    it_per_s: float | None
    samples_per_s: float | None
    tokens_per_s: float | None
    padded_tokens_per_s: float | None
    data_wait_share: float | None
    mfu: float | None
    peak_memory_bytes: int | None
    device_memory_bytes: int | None
    hours_per_run: float | None
    cost_per_run_usd: float | None
    projection: dict[str, Any] | None
    device_name: str | None
    failure_kind: str | None
    cost_ci95_rel: float | None
    contended: bool | None
    remeasures: list[dict[str, Any]] | None


class ClaimRow(Base):
    """A config taken by one trial of the study: a second worker proposing it finds it here
    (the primary key makes the claim atomic) and does not run it."""

    __tablename__ = "sweeper_claims"

    study_id: Mapped[int] = mapped_column(
        ForeignKey("sweeper_studies.id", ondelete="CASCADE"), primary_key=True
    )
    config_key: Mapped[str] = mapped_column(String(64), primary_key=True)
    trial_number: Mapped[int]
    worker_id: Mapped[str | None] = mapped_column(String(36))
