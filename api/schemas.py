"""Response models of the REST API; field names are the store's column names."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, computed_field, create_model

from sweeper.catalog import Catalog as GpuCatalog
from sweeper.knob_values import as_ran
from sweeper.measurement import COLUMN_METRICS
from sweeper.noise import Basis
from sweeper.recommend import padding_share
from sweeper.recommendation import Recommendation
from sweeper.space import TrialConfig
from sweeper.store.models import ended_without_answer
from sweeper.studyfile import RealTokenMfu

TrialState = Literal["running", "complete", "failed", "pruned"]


def assume_utc(value: datetime) -> datetime:
    # SQLite drops the offset of timezone-aware columns; the store always writes UTC.
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)


UtcDatetime = Annotated[datetime, AfterValidator(assume_utc)]


class _Response(BaseModel):
    model_config = ConfigDict(from_attributes=True, frozen=True)


class StudySummary(_Response):
    """One study with its trial counts and best price so far."""

    name: str
    state: str = Field(description="running | finished | interrupted | failed")
    hardware_name: str
    usd_per_hour: float = Field(
        description="one device's $/h: a run on N devices costs hours × N × this"
    )
    device: str
    samples: int = Field(description="samples per epoch of the real job")
    epochs: float
    n_trials_planned: int
    trials: dict[TrialState, int] = Field(description="number of trials in each state")
    best_cost_per_run_usd: float | None = Field(
        description="lowest $/run among completed trials; null when none completed"
    )
    created_at: UtcDatetime
    updated_at: UtcDatetime = Field(
        description="the study's last change: its own (state, settings) or a trial starting "
        "or finishing"
    )
    remeasuring: list[int] = Field(
        default=[],
        description="trials being measured again now by the study's live workers (a run on a "
        "shared machine taken again, a drift reference, the final re-measures of the configs "
        "that tie with the best): no trial is running meanwhile",
    )

    @computed_field(  # type: ignore[prop-decorator]
        description="true when the sweep ended (finished or stopped) with failed trials and no "
        "completed one: the study has no answer, whatever its state says"
    )
    @property
    def none_completed(self) -> bool:
        return ended_without_answer(self.state, self.trials)


class StudyDetail(StudySummary):
    """A study's summary plus the space file it ran, its dataset's statistics and what its
    preflight found (``dropped``: knob -> value -> why it cannot run on the sweep's machine;
    ``fallbacks``: knob -> the value run instead; ``probes``: each probe's outcome)."""

    space_yaml: str
    dataset_stats: dict[str, Any] | None
    preflight: dict[str, Any] | None = None


class _Trial(_Response):
    number: int
    state: TrialState
    config: dict[str, Any] = Field(
        description="the config the trial was asked to run, the study's key of it (what "
        "?config= filters on); where a script ran a knob at its own value, see own_values "
        "and ran_config"
    )
    own_values: dict[str, Any] | None = Field(
        default=None,
        description="engine: script: the knobs the script ran at its own values (not searched, "
        "not given to it) where they differ from config, which holds sweeper's defaults for "
        "them; null for every other trial",
    )
    started_at: UtcDatetime
    finished_at: UtcDatetime | None
    wall_s: float | None = Field(description="s from the child's start to its result")

    @computed_field(  # type: ignore[prop-decorator]
        description="the config as it ran: config with own_values in place"
    )
    @property
    def ran_config(self) -> dict[str, Any]:
        return as_ran(self.config, self.own_values)

    @computed_field(description="share of the computed tokens that is padding")  # type: ignore[prop-decorator]
    @property
    def padding_share(self) -> float | None:
        return padding_share(self.tokens_per_s, self.padded_tokens_per_s)  # type: ignore[attr-defined]


# One field per stored metric (sweeper.measurement.COLUMN_METRICS), null until the trial
# completes: what a trial measured and what its run is projected to take.
if TYPE_CHECKING:
    _MeasuredTrial = _Trial
else:
    _MeasuredTrial = create_model(
        "_MeasuredTrial",
        __base__=_Trial,
        __module__=__name__,
        **{
            m.name: (m.value_type | None, Field(default=None, description=m.description))
            for m in COLUMN_METRICS
        },
    )


class TrialSummary(_MeasuredTrial):
    """One trial: its config, measured throughput and projected price, or how it failed."""

    projection: dict[str, float | int | str] | None = Field(
        default=None,
        description="training hours and one-time seconds of the projected run, and where the "
        "one-time figures came from (checkpoint_source: measured or reused; compile_cache: "
        "cold or warm)",
    )
    failure_kind: str | None
    failure_message: str | None
    contended: bool | None = Field(
        default=None,
        description="every measurement of the config was taken while the machine was shared "
        "(other processes' CPU, steal, another process on the GPU)",
    )
    remeasures: list[dict[str, Any]] | None = Field(
        default=None,
        description="each measurement of the config when it was measured more than once "
        "(kind: trial, rerun, final or drift); the metric fields then hold their estimate: the "
        "mean of the calm ones, or, when every one was contended, the fastest's (measured_as)",
    )
    worker_id: str | None = Field(
        default=None, description="the worker (sweep process) that ran it; none before workers"
    )

    @property
    def basis(self) -> Basis | None:
        """Which measurements a completed trial's figures stand on (``sweeper.noise.Basis``)."""
        if self.state != "complete":
            return None
        return Basis.stored(self.remeasures, self.contended)

    @computed_field(  # type: ignore[prop-decorator]
        description="which measurements a completed trial's metric fields stand on: '1 "
        "measurement', 'mean of 3 measurements', 'mean of 2 measurements (1 more, taken on a "
        "shared machine, left out)' or 'fastest of 4 measurements, all on a shared machine' "
        "(sharing only slows a run: the fastest counts, and cost_ci95_rel is at least the "
        "measurements' spread); null for any other trial"
    )
    @property
    def measured_as(self) -> str | None:
        basis = self.basis
        return None if basis is None else basis.text()


class TrialDetail(TrialSummary):
    """A trial with its raw measurement (per-step times and everything derived from them)."""

    measurement: dict[str, Any] | None
    real_token_mfu: RealTokenMfu | None = Field(
        default=None,
        description="MFU counting real (non-pad) tokens only: as recorded, or, for a trial "
        "recorded before sweeper counted only real tokens (its mfu counts padding), derived "
        "from its padding share (derived: true; the recorded figures are left as they are)",
    )


# The recommendation has one definition, shared with the CLI.
BestConfig = Recommendation


class WorkerSummary(_Response):
    """One sweep process that worked on a study (``sweeper launch`` or ``sweeper worker``)."""

    id: str
    host: str
    pid: int
    devices: str | None = Field(description="its CUDA_VISIBLE_DEVICES; null if it was not set")
    state: Literal["alive", "silent", "done", "lost"] = Field(
        description="alive: beating; silent: no heartbeat for longer than the grace period, "
        "reaped (its running trial marked lost) when a sweep of the study starts or on DELETE; "
        "done: ended; lost: reaped"
    )
    trials: int = Field(description="trials it ran")
    device_seconds: float = Field(
        description="device time it used: wall seconds × the devices its trial held (one "
        "between trials); the workers of a run share budget.max_usd / max_device_hours by these"
    )
    started_at: UtcDatetime
    heartbeat_at: UtcDatetime
    finished_at: UtcDatetime | None


class EnqueueRequest(BaseModel):
    """A config to run as a trial of the study (every knob of the space)."""

    model_config = ConfigDict(extra="forbid")

    config: TrialConfig


class EnqueueResponse(_Response):
    study: str
    queued: dict[str, Any] = Field(description="the Optuna params queued (a WAITING trial)")
    note: str


class StopResponse(_Response):
    study: str
    state: str
    note: str


class Accelerator(_Response):
    """An accelerator sweeper knows the dense peak TFLOPS of (for MFU)."""

    name: str
    bf16_tflops: float
    tf32_tflops: float
    fp32_tflops: float


class PricedHardware(_Response):
    """Hardware at a price, as studies in this storage used it."""

    hardware_name: str
    device: str
    usd_per_hour: float
    studies: list[str]


class Catalog(_Response):
    accelerators: list[Accelerator]
    hardware_in_use: list[PricedHardware] = Field(
        description="each (hardware, $/h) pair of the stored studies; re-price any study with "
        "/best?usd_per_hour=..."
    )
    gpu_catalog: GpuCatalog | None = Field(
        default=None,
        description="the shipped GPU catalog (sweeper/gpus.yaml): price, peaks, memory, "
        "bandwidth and interconnect of each GPU type, with each figure's source and date; "
        "/studies/{name}/compare prices a job on them",
    )
