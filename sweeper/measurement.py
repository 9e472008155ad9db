"""The typed result of one trial: throughput, step times, memory, phases and environment.

A trial is a function from a config to a ``Measurement``. Each key the child reports is one
documented field here, with its unit. The scalars that travel further carry a ``Metric`` beside
their type: how they read (label, unit, which way is better, number format) and where they go.
From that one declaration come

- the values of ``TrialRow``'s metric columns (``Measurement.columns``) and the metric fields of
  a trial in the REST API (``api.schemas.TrialSummary``);
- the Optuna user attributes of a completed trial (``OPTUNA_ATTRS``, ``optuna_attrs``);
- the keys trials sort by (``SORT_KEYS``: REST ``?sort=`` and the store) and the columns of the
  dashboard's trials table (``TABLE_METRICS``).

``METRICS`` also lists the two metrics the sweep projects from a Measurement (``sweeper.cost``):
hours and $ per run. The ORM columns stay written out in ``sweeper/store/models.py``, where
migrations need them; ``tests/test_measurement.py`` checks them against ``METRICS``.

Unknown keys are refused, so a misspelt key fails its trial loudly instead of vanishing; only
``phases_s`` takes keys of an engine's own (``dataset``: TRL's tokenization). Fields added after
measurements were first stored have defaults (``engine``, ``optimizer``, ``trainable_params``,
``mean_row_tokens``, ...), so stored studies (``studies/*.json``) still load; a field added
later needs one too.

How the child builds it (``sweeper/trial/engines``), and what the sweep does with it::

    measurement = Measurement(
        engine="trainer",
        samples_per_s=..., tokens_per_s=..., it_per_s=...,  # every field without a default
        phases_s=Phases(imports=..., model=..., dataset=...),
        env=Environment(device_type="cuda", device_name=..., ...),
    )
    return measurement.model_dump()  # ChildResult.payload; NaN and inf arrive as null

    # the sweep (sweeper/sweep/executor.py), from ChildResult.payload:
    measurement = parse_measurement(payload).with_inherited_startup(run.inherited_startup_s)
    store.finish_trial(..., measurement=measurement.model_dump(), **measurement.columns())

Tests and benchmarks build one with ``sample_measurement(**overrides)``. Nothing here imports
torch: the controller (Python 3.13, no torch) validates what the child sent.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from dataclasses import KW_ONLY, dataclass, replace
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError

from sweeper.errors import SweeperError

Better = Literal["higher", "lower"]
# How a unit's values read in tables: a number filter of the dashboard (dashboards/__init__.py);
# "text" shows the value as it is; any other unit reads as three significant digits ("sig3").
_FORMATS = {"share": "percent", "bytes": "memory", "USD": "usd", "h": "hours", "": "text"}


@dataclass(frozen=True)
class Metric:
    """How one scalar of a trial reads and where it goes, declared beside its field::

        Metric("samples/s", "samples/s", better="higher", column=True, optuna=True, table=True)

    ``name``, ``path``, ``value_type`` and ``description`` are filled in from the field when
    ``METRICS`` is built.
    """

    label: str  # table header and axis title, e.g. "samples/s"
    unit: str  # "samples/s", "s", "bytes", "share" (0..1), "USD", "h", "" (text)
    _: KW_ONLY
    better: Better | None = None  # None: a fact about the trial, not a goal; never a sort key
    column: bool = False  # a column of TrialRow (and a field of the REST trial) holds a copy
    optuna: bool = False  # copied onto the Optuna trial as a user attribute
    table: bool = False  # a column of the dashboard's trials table
    name: str = ""
    path: tuple[str, ...] = ()  # where it sits in a Measurement; () for projected metrics
    value_type: Any = None
    description: str = ""

    @property
    def format(self) -> str:
        """The dashboard's number filter for it: sig3, percent, memory, usd, hours or text."""
        return _FORMATS.get(self.unit, "sig3")

    @property
    def sortable(self) -> bool:
        """Trials sort by it: a stored column with a better direction."""
        return self.column and self.better is not None


class MeasurementError(SweeperError):
    """A trial's result is not a Measurement: a key is missing, unknown or of the wrong type
    (a child of another sweeper version, or a typo in an engine)."""


def _nan_if_null(value: Any) -> Any:
    return math.nan if value is None else value


# A float that may be NaN or inf; JSON (the child's result, stored measurements) holds those as
# null, which reads back as NaN.
MaybeNaN = Annotated[float, BeforeValidator(_nan_if_null)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Phases(BaseModel):
    """Wall seconds of each phase of the child, from its start to the end of the timed window.

    An engine may time phases of its own under other names (``dataset``: TRL's tokenization);
    None: the engine does not time that phase apart.
    """

    model_config = ConfigDict(extra="allow", frozen=True)
    __pydantic_extra__: dict[str, float | None] = Field(init=False)

    spawn_to_start: float | None = Field(
        default=None,
        description="s from the parent's spawn to the child's first line (None when unknown)",
    )
    imports: float | None = Field(default=None, description="s importing torch, transformers")
    tokenizer: float | None = Field(default=None, description="s loading the tokenizer")
    data: float | None = Field(default=None, description="s building the dataset and loader")
    model: float | None = Field(default=None, description="s building the model on the device")
    optimizer: float | None = Field(
        default=None, description="s building the optimizer (and torch.compile's wrapper)"
    )
    warmup: float | None = Field(default=None, description="s of the burn-in steps")
    window: float | None = Field(default=None, description="s of the timed window")
    checkpoint: float | None = Field(
        default=None,
        description="s spent on the checkpoint after the window (saving and timing one, or "
        "looking up the study's figure)",
    )


class Environment(_Strict):
    """What the numbers were measured on: enough to refuse comparing apples with pears."""

    device_type: str = Field(description='torch device type the trial ran on: "cpu" | "cuda"')
    device_name: Annotated[str, Metric("measured on", "", column=True)] = Field(
        description="the GPU's name (torch), or the CPU's model name"
    )
    driver: str | None = Field(description="NVIDIA kernel driver version; None on CPU")
    cuda: str | None = Field(description="CUDA version torch was built with; None on CPU builds")
    cudnn: int | None = Field(description="cuDNN version; None on CPU")
    torch: str = Field(description="torch version")
    transformers: str = Field(description="transformers version")
    python: str = Field(description="Python version of the child")
    host: str = Field(description="host name")
    cpu_threads: int = Field(description="torch's intra-op threads")
    cpu_count: int | None = Field(description="logical CPUs of the host (os.cpu_count)")
    model_config_hash: str = Field(description="hash of the model's config: same model, same hash")
    dataset_hash: str = Field(description="hash of the prepared dataset")
    runtime_env: dict[str, str] = Field(
        default_factory=dict,
        description="the environment variables that change how torch, CUDA and NCCL run "
        "(PYTORCH_*, TORCH_*, CUDA_*, NCCL_*, OMP_NUM_THREADS, MKL_NUM_THREADS; not cache or "
        "install paths), as the trial saw them: PYTORCH_CUDA_ALLOC_CONF changes peak memory; "
        "empty in measurements recorded before it was kept",
    )


class RankFigures(_Strict):
    """One rank of a multi-device trial, as it saw its own timed window."""

    rank: int = Field(description="the rank (0 wrote the measurement)")
    step_time_mean_s: float = Field(description="s: this rank's mean window step time")
    window_s: float = Field(description="s: this rank's timed window")
    rows: int = Field(description="rows this rank trained in the window (its share of the data)")
    peak_memory_bytes: int = Field(description="bytes: this rank's peak (see memory_kind)")
    parameter_share: float = Field(
        description="this rank's share of the parameters' elements: 1 whole (DDP), about "
        "1/devices sharded (FSDP2)"
    )
    first_batch: str | None = Field(
        default=None,
        description="a digest of the first batch's token ids: ranks reading their own "
        "shares of the data have different ones",
    )
    communication_s: float | None = Field(
        default=None,
        description="s per window step this rank's backward waited on DDP's gradient "
        "all-reduce after its own compute (waiting for a slower peer included); None: not "
        "told (FSDP2, or CUDA where DDP samples its stats)",
    )


class ProgramRun(_Strict):
    """How long the user's own program would train, read from its running Trainer at
    ``on_train_begin`` (``engine: script``): TrainingArguments after their defaults and the
    Trainer's own plan. The trial ends the program after its window; the real run trains this.
    A loop under ``sweeper.step`` shows its DataLoader at most (``loader=``): the rows of an
    epoch, not how many epochs or steps it runs (None then)."""

    num_train_epochs: float | None = Field(
        default=None, description="TrainingArguments.num_train_epochs as it ran; None: a loop"
    )
    max_steps: int | None = Field(
        default=None,
        description="TrainingArguments.max_steps as it ran (-1: the epochs decide the length); "
        "None: a loop",
    )
    planned_steps: int | None = Field(
        default=None,
        description="optimizer steps the Trainer planned for the whole run "
        "(TrainerState.max_steps)",
    )
    train_rows: int | None = Field(
        default=None, description="rows of the program's training set (None: no len, streamed)"
    )
    arguments: str | None = Field(
        default=None,
        description="the class of the arguments its Trainer ran: SFTConfig for TRL's (or a "
        "subclass of it), else the class's own name (TrainingArguments); None: a loop, or a "
        "record older than this field",
    )
    learning_rate: float | None = Field(
        default=None,
        description="the program's peak learning rate as it ran: its TrainingArguments' after "
        "their defaults, or a loop's optimizer's (its scheduler's max_lr or initial_lr, else "
        "lr); what the recommendation's learning-rate advice scales. None: the loop showed no "
        "optimizer, or a record older than this field",
    )


class Measurement(_Strict):
    """One trial's measurement: burn-in until steady, then a timed window (``sweeper/trial``).

    Rates are over the timed window, synchronized at its edges.
    """

    # ---------------------------------------------------------------- throughput
    samples_per_s: Annotated[
        MaybeNaN,
        Metric("samples/s", "samples/s", better="higher", column=True, optuna=True, table=True),
    ] = Field(
        description="training samples/s; with packing, real tokens/s ÷ the dataset's mean tokens "
        "per sample (NaN, null in JSON, when that mean is unknown)"
    )
    tokens_per_s: Annotated[
        float,
        Metric("tokens/s", "tokens/s", better="higher", column=True, optuna=True, table=True),
    ] = Field(
        description="real (non-pad) tokens/s: padding never counts (padded_tokens_per_s has it)"
    )
    it_per_s: Annotated[
        float,
        Metric("it/s", "steps/s", better="higher", column=True, optuna=True, table=True),
    ] = Field(
        description="optimizer steps/s; not comparable across gradient accumulation, never ranks"
    )
    rows_per_s: float = Field(
        description="rows/s fed to the model in the timed window: samples/s without packing; a "
        "wrapped packed row (samples run together) counts one; a padding-free batch (one "
        "flattened row whose position ids restart per sample, TRL's bfd packing among them) "
        "counts each sample, so there it is the window's samples/s, not packed rows/s (that is "
        "it_per_s × effective_batch)"
    )
    padded_tokens_per_s: Annotated[float, Metric("padded tokens/s", "tokens/s", column=True)] = (
        Field(description="tokens/s the model computes, padding included")
    )
    padding_share: Annotated[float, Metric("padding", "share", optuna=True)] = Field(
        description="share (0..1) of the computed tokens that is padding"
    )
    data_wait_share: Annotated[
        float,
        Metric("data wait", "share", better="lower", column=True, optuna=True, table=True),
    ] = Field(description="share (0..1) of the window the host waited for the next batch")

    # ---------------------------------------------------------------- model FLOPs
    mfu: Annotated[
        float | None,
        Metric("MFU", "share", better="higher", column=True, table=True),
    ] = Field(
        description="model FLOPs utilization (0..1) of the REAL tokens: achieved_tflops ÷ the "
        "device's dense peak for the precision (fp8: the bf16 peak); padding computed is not "
        "counted; None on CPUs and devices without a peak in sweeper.hardware"
    )
    mean_row_tokens: float | None = Field(
        default=None,
        description="tokens per row computed in the timed window, padding included, rows as "
        "rows_per_s counts them (a padding-free batch's samples each count as a row); None in "
        "measurements stored before it",
    )
    mean_sample_tokens: float | None = Field(
        default=None,
        description="real tokens per sample of the timed window's batches (a wrapped packed "
        "row counts as one): the T of MFU's attention term. Not what prices the run: with "
        "packing, samples_per_s divides by the whole dataset's mean tokens per sample, which "
        "a short window's samples can miss by a few percent; None in measurements stored "
        "before it",
    )
    achieved_tflops: float = Field(
        description="model TFLOPS achieved on the real tokens (PaLM's 6N + 12·L·d·T per real "
        "token × tokens_per_s; measurements stored before issue 36 counted padded tokens)"
    )
    flops_per_token: float = Field(description="model FLOPs per real token, forward + backward")
    peak_tflops: float | None = Field(description="the device's dense peak TFLOPS; None if unknown")
    peak_name: str | None = Field(
        default=None, description="the sweeper.hardware entry the peak is from, e.g. 'H100 SXM'"
    )

    # ---------------------------------------------------------------- memory
    peak_memory_bytes: Annotated[
        int,
        Metric("peak memory", "bytes", better="lower", column=True, optuna=True, table=True),
    ] = Field(description="bytes: CUDA max allocated, or the child's peak RSS on CPU")
    peak_memory_reserved_bytes: int | None = Field(
        default=None, description="bytes: CUDA max reserved by the caching allocator (CUDA only)"
    )
    device_memory_bytes: Annotated[int, Metric("device memory", "bytes", column=True)] = Field(
        description="bytes the device has: the GPU's, or the host's (its cgroup limit)"
    )
    memory_kind: Literal["cuda_max_allocated", "cpu_peak_rss"] = Field(
        description="what peak_memory_bytes counts"
    )

    # ---------------------------------------------------------------- step times
    step_time_p50_s: float = Field(description="s: median optimizer step time of the window")
    step_time_p90_s: float = Field(description="s: 90th percentile step time of the window")
    step_time_mean_s: float = Field(description="s: mean step time of the window")
    step_time_cv: float = Field(description="coefficient of variation of the window's step times")
    throughput_ci95_rel: MaybeNaN = Field(
        description="half-width of the 95% interval of the mean step time, relative to it (inf, "
        "so NaN here, with fewer than 2 steps)"
    )
    ci_target: float = Field(description="the interval the window aimed for (trial.measure)")
    ci_met: bool = Field(description="throughput_ci95_rel ≤ ci_target")
    measured_steps: int = Field(description="optimizer steps in the timed window")
    window_s: float = Field(description="s: wall time of the timed window")
    step_times_s: list[float] = Field(description="s: each step of the window")

    # ---------------------------------------------------------------- the machine meanwhile
    # (sweeper.trial.contention; None: could not be read, or stored before it was measured)
    host_others_cpu: float | None = Field(
        default=None, description="CPUs' worth of time other processes used during the window"
    )
    cpu_steal_share: float | None = Field(
        default=None, description="share (0..1) of CPU time the hypervisor stole in the window"
    )
    gpu_other_processes: int | None = Field(
        default=None, description="compute processes on the trial's GPU besides the child"
    )
    contended: bool = Field(
        default=False, description="the machine was shared during the window (sweeper.noise)"
    )
    contention: str | None = Field(default=None, description="why it counts as contended")

    # ---------------------------------------------------------------- burn-in
    warmup_steps: int = Field(description="optimizer steps of the burn-in")
    warmup_steady: bool = Field(description="the burn-in ended steady, not at its cap")
    warmup_s: float = Field(description="s: the burn-in steps together")
    warmup_excess_s: float = Field(
        description="s the burn-in cost beyond as many steady steps (compile, autotuning, "
        "allocator warm-up): paid once per run"
    )
    first_step_s: float = Field(description="s: the first step")
    warmup_step_times_s: list[float] = Field(description="s: each burn-in step")

    # ---------------------------------------------------------------- paid once per run
    startup_s: Annotated[float, Metric("start-up", "s", optuna=True)] = Field(
        description="s of start-up a run pays: the child's own (process start to the first "
        "step), plus startup_inherited_s once the sweep has recorded it"
    )
    startup_own_s: float | None = Field(
        default=None, description="s: the child's own start-up (set by the sweep)"
    )
    startup_inherited_s: float | None = Field(
        default=None,
        description="s the fork server spent loading before it forked the child (set by the "
        "sweep; 0 for a spawned child)",
    )
    compile_s: Annotated[
        float, Metric("compile", "s", better="lower", column=True, optuna=True)
    ] = Field(
        description="s of torch.compile a run pays, cold (0 for a config that does not compile): "
        "this trial's burn-in excess when it compiled into an empty cache, otherwise the cold "
        "figure of the study's first trial of the same graphs (compile_cache says which)"
    )
    compile_measured_s: float | None = Field(
        default=None,
        description="s: this trial's own burn-in excess of a compiled config (warm when "
        "compile_cache is warm); None when not compiled or stored before it was recorded",
    )
    compile_cache: Literal["cold", "warm"] | None = Field(
        default=None,
        description="how this trial compiled: into an empty cache (cold, measured here) or into "
        "the study's cache of the same graphs (warm: compile_s is the earlier cold figure)",
    )
    compile_signature: str | None = Field(
        default=None, description="hash of what decides the compiled graphs (oneoff.py)"
    )
    checkpoint_save_s: Annotated[float | None, Metric("checkpoint save", "s", optuna=True)] = Field(
        description="s to save and fsync one checkpoint; None when the run saves none"
    )
    checkpoint_bytes: int | None = Field(description="bytes of one checkpoint; None when none")
    checkpoint_source: Literal["measured", "reused"] | None = Field(
        default=None,
        description="measured: this trial saved and timed a checkpoint; reused: an earlier trial "
        "of the study with the same checkpoint_signature did, and its figure is priced here",
    )
    checkpoint_signature: str | None = Field(
        default=None,
        description="hash of what a save writes (model, parameter bytes per dtype, adapter, "
        "optimizer state, directory, host): same signature, same save",
    )

    # ---------------------------------------------------------------- training
    loss_first: Annotated[float, Metric("first loss", "nats", column=True)] = Field(
        description="nats: cross-entropy loss of the first burn-in step"
    )
    loss_last: Annotated[float, Metric("last loss", "nats", column=True)] = Field(
        description="nats: loss of the last window step"
    )
    losses: list[float] = Field(description="nats: loss of every step, burn-in then window")
    data_wait_s: list[float] = Field(description="s the host waited for data, per step")
    loader_epochs: int = Field(description="times the loader was restarted at its end")

    # ---------------------------------------------------------------- what ran
    engine: Literal["loop", "trainer", "sft", "script"] = Field(
        default="loop",
        description="what trained: sweeper's plain loop, transformers' Trainer or TRL's "
        "SFTTrainer (measurements stored before engines existed ran the loop)",
    )
    n_params: int = Field(description="parameters of the model")
    trainable_params: int | None = Field(
        default=None, description="parameters the optimizer updates; None when not recorded"
    )
    optimizer: str | None = Field(
        default=None, description="the optimizer as torch ran it, e.g. 'AdamW (fused)'"
    )
    tf32_matmul: bool | None = Field(
        default=None, description="fp32 matmuls ran on TF32 tensor cores (read back from torch)"
    )
    effective_batch: int = Field(description="samples (rows) per optimizer step, over every device")
    devices: int = Field(
        default=1, description="devices (ranks) the trial trained on; samples/s is the group's"
    )
    communication_share: float | None = Field(
        default=None,
        description="share of the step the slowest rank waited on communication after its "
        "own compute (see RankFigures.communication_s; None: one device, or not told)",
    )
    ranks: list[RankFigures] | None = Field(
        default=None,
        description="each rank's own figures, on several devices (the step time and "
        "peak memory above are the slowest rank's and the largest)",
    )
    packing: bool = Field(description="rows were packed from several samples")
    cross_sample_attention: bool | None = Field(
        default=None,
        description="rows held several samples and the attention attended across them "
        "(sweeper's packed rows with a mask of ones; TRL's wrapped packing): True; several "
        "samples per row kept apart (padding-free, TRL's bfd packing, checked on the model "
        "that trained): False; one sample per row, or not recorded: None",
    )
    float8_share: float | None = Field(
        default=None,
        description="share (0..1) of the model's Linear layers that trained in float8 (torchao), "
        "read off the model; None unless precision is fp8 (0 fails the trial as a mismatch)",
    )
    effective: dict[str, Any] | None = Field(
        default=None,
        description="each knob's value read back from what ran (the DataLoader, the optimizer "
        "object, the model, the arguments after their defaults); a trial whose value differs "
        "from its config's fails as a mismatch (None: stored before read-back existed)",
    )
    own_values: dict[str, Any] | None = Field(
        default=None,
        description="engine: script: the knobs the program ran at its own values (not in the "
        "space's search, not given to it as a flag or launch option) where they differ from "
        "the trial's config, which holds sweeper's defaults for them and stays as asked (the "
        "study's key of the config): e.g. a TRL script's SFTConfig running precision bf16 "
        "while the config says fp32. The config as it ran is the config overlaid with these "
        "(sweeper.knob_values.as_ran); None: none differ, or not recorded",
    )
    ended_in_window: str | None = Field(
        default=None,
        description="engine: script: the program's own run ended inside the timed window, with "
        "the steps it needs: kept as a capped window is, and this says what it had not reached "
        "(the interval, min_seconds); None: the window closed as usual",
    )
    unreached: list[str] | None = Field(
        default=None,
        description="engine: script: the knobs that never reached the program (not among its "
        "flags or environment, and it never called sweeper.trial_config()): the config's "
        "values for them did not run, the program's own did, unseen; None: every knob "
        "reached it, or not recorded",
    )
    program_run: ProgramRun | None = Field(
        default=None,
        description="engine: script with a Trainer: the run the program itself would train "
        "(its epochs or max_steps after TrainingArguments' defaults), beside the space's "
        "workload.epochs that hours and $/run price (sweeper.caveats.program_run_warnings); "
        "None otherwise",
    )
    loss_labels: Literal["all", "replies"] | None = Field(
        default=None,
        description="the tokens the loss was taken on: every token, or the assistant's "
        "replies only (None: stored before this was recorded)",
    )
    reply_markers: bool | None = Field(
        default=None,
        description="the chat template marks the assistant's replies ({% generation %}), "
        "as TRL's assistant_only_loss needs (None: no chat records, or not recorded)",
    )
    phases_s: Phases = Field(description="s per phase of the child")
    env: Environment = Field(description="what it was measured on")

    def one_off_sources(self) -> dict[str, Any]:
        """Where the projection's one-off costs come from, to store beside it: the
        recommendation, the CLI and the dashboard say whether a figure was measured in the
        winning trial or reused from an earlier one.

        >>> sample_measurement(checkpoint_source="reused").one_off_sources()
        {'checkpoint_source': 'reused'}
        """
        values = {
            "checkpoint_source": self.checkpoint_source,
            "compile_cache": self.compile_cache,
            "compile_measured_s": self.compile_measured_s if self.compile_cache == "warm" else None,
        }
        return {key: value for key, value in values.items() if value is not None}

    def one_off_notes(self) -> tuple[str, ...]:
        """Where the one-off costs of $/run come from (sweeper/trial/oneoff.py).

        >>> sample_measurement(checkpoint_source="reused").one_off_notes()[0][:46]
        'checkpoint save 75 s: measured by an earlier t'
        """
        notes = []
        if self.checkpoint_save_s is not None and self.checkpoint_source is not None:
            notes.append(
                f"checkpoint save {self.checkpoint_save_s:.3g} s: "
                + (
                    "measured by an earlier trial of the study with the same state and disk"
                    if self.checkpoint_source == "reused"
                    else "measured in this trial"
                )
            )
        if self.compile_cache == "warm" and self.compile_measured_s is not None:
            notes.append(
                f"compile {self.compile_s:.3g} s: the cold compile an earlier trial with the same "
                f"graphs measured; this one compiled warm in {self.compile_measured_s:.3g} s"
            )
        elif self.compile_cache == "cold":
            notes.append(f"compile {self.compile_s:.3g} s: measured cold in this trial")
        return tuple(notes)

    def columns(self) -> dict[str, Any]:
        """The values ``TrialRow``'s measured columns copy, by column name.

        >>> sample_measurement().columns()["device_name"]
        'NVIDIA H100 80GB HBM3'
        """
        return {m.name: self._at(m.path) for m in METRICS.values() if m.column and m.path}

    def optuna_attrs(self) -> dict[str, Any]:
        """What the sweep copies onto the Optuna trial (optuna-dashboard shows it); NaN and inf
        become None, as Optuna stores attributes as JSON."""
        values = {m.name: self._at(m.path) for m in METRICS.values() if m.optuna and m.path}
        return {
            name: None if isinstance(value, float) and not math.isfinite(value) else value
            for name, value in values.items()
        }

    def with_inherited_startup(self, seconds: float) -> Measurement:
        """The measurement as the sweep records it: ``startup_s`` becomes the run's whole
        start-up, the child's own plus the ``seconds`` the fork server spent loading before it
        forked the child.

        >>> m = sample_measurement(startup_s=2.0).with_inherited_startup(5.0)
        >>> m.startup_s, m.startup_own_s, m.startup_inherited_s
        (7.0, 2.0, 5.0)
        """
        own = self.startup_s if self.startup_own_s is None else self.startup_own_s
        return self.model_copy(
            update={
                "startup_own_s": own,
                "startup_inherited_s": seconds,
                "startup_s": own + seconds,
            }
        )

    def _at(self, path: tuple[str, ...]) -> Any:
        value: Any = self
        for name in path:
            value = getattr(value, name)
        return value


def parse_measurement(payload: Mapping[str, Any]) -> Measurement:
    """A child's result as a Measurement; MeasurementError names each field that is missing,
    unknown or of the wrong type.

    >>> parse_measurement(sample_measurement().model_dump() | {"sampels_per_s": 1.0})
    ... # doctest: +ELLIPSIS
    Traceback (most recent call last):
    sweeper.measurement.MeasurementError: ... sampels_per_s: unknown key (misspelt, ...)
    """
    try:
        return Measurement.model_validate(payload)
    except ValidationError as e:
        problems = [_problem(error) for error in e.errors()]
        if len(problems) > 8:
            problems = [*problems[:8], f"and {len(problems) - 8} more"]
        raise MeasurementError(
            "the trial's result does not fit sweeper.measurement.Measurement: "
            + "; ".join(problems)
        ) from e


def _problem(error: Any) -> str:
    where = ".".join(str(part) for part in error["loc"]) or "the result"
    if error["type"] == "missing":
        return f"{where}: missing"
    if error["type"] == "extra_forbidden":
        return f"{where}: unknown key (misspelt, or from another sweeper version)"
    return f"{where}: {error['msg']} (got {error['input']!r:.60})"


# ---------------------------------------------------------------- metrics of a trial


def _field_metrics(model: type[BaseModel], path: tuple[str, ...] = ()) -> Iterator[Metric]:
    for name, info in model.model_fields.items():
        for meta in info.metadata:
            if isinstance(meta, Metric):
                yield replace(
                    meta,
                    name=name,
                    path=(*path, name),
                    value_type=info.annotation,
                    description=info.description or "",
                )
        if isinstance(info.annotation, type) and issubclass(info.annotation, BaseModel):
            yield from _field_metrics(info.annotation, (*path, name))


# What the sweep projects from a Measurement (sweeper.cost.project_run) and stores beside it.
_PROJECTED = (
    Metric(
        "$/run",
        "USD",
        name="cost_per_run_usd",
        better="lower",
        column=True,
        table=True,
        value_type=float,
        description="USD: the real job's projected price at the study's $/h (the objective)",
    ),
    Metric(
        "$/run ±",
        "share",
        name="cost_ci95_rel",
        column=True,
        table=True,
        value_type=float,
        description="half-width of the $/run's 95% interval, relative to it: the window's "
        "interval, widened by the machine's run-to-run noise once configs were measured again "
        "(sweeper.noise)",
    ),
    Metric(
        "hours/run",
        "h",
        name="hours_per_run",
        better="lower",
        column=True,
        table=True,
        value_type=float,
        description="h: the real job's projected wall time (training, start-up, compile, "
        "checkpoint saves)",
    ),
)


def _metrics() -> dict[str, Metric]:
    metrics: dict[str, Metric] = {}
    for metric in (*_field_metrics(Measurement), *_PROJECTED):
        if metric.name in metrics:
            raise TypeError(f"two metrics are named {metric.name!r}")
        metrics[metric.name] = metric
    return metrics


# Every metric of a trial, by name: the Measurement's (in field order), then the projected ones.
METRICS: dict[str, Metric] = _metrics()
# Stored in TrialRow columns of the same names (and REST fields of a trial).
COLUMN_METRICS = tuple(m for m in METRICS.values() if m.column)
# Copied onto the Optuna trial as user attributes.
OPTUNA_ATTRS = tuple(m.name for m in METRICS.values() if m.optuna)
# Columns trials sort by, besides their number and wall time.
SORT_KEYS = tuple(m.name for m in METRICS.values() if m.sortable)
# The dashboard's trials table, in order.
TABLE_METRICS = tuple(m for m in METRICS.values() if m.table)


# ---------------------------------------------------------------- for tests and benchmarks


def sample_measurement(**overrides: Any) -> Measurement:
    """A plausible, self-consistent Measurement for tests and benchmarks: a 1.2B-parameter
    model in bf16 on one H100, batch 8 × accumulation 2 of 512-token rows, 0.5 s per step.

    ``overrides`` replace fields (validated: a misspelt one raises); a dict given for ``env``
    or ``phases_s`` updates those parts only.

    >>> sample_measurement(samples_per_s=40.0).samples_per_s
    40.0
    >>> sample_measurement(env={"device_name": "NVIDIA A100-SXM4-80GB"}).env.torch
    '2.11.0+cu128'
    """
    step_times = [0.49, 0.5, 0.51, 0.5, 0.5, 0.49, 0.51, 0.5, 0.5, 0.5] * 2
    values: dict[str, Any] = {
        "samples_per_s": 32.0,
        "tokens_per_s": 12_288.0,
        "it_per_s": 2.0,
        "rows_per_s": 32.0,
        "padded_tokens_per_s": 16_384.0,
        "padding_share": 0.25,
        "data_wait_share": 0.02,
        # real tokens only (issue 36): 7.47e9 FLOPs × 12,288 real tokens/s ÷ 989.4 TFLOP/s
        "mfu": 0.0928,
        "mean_row_tokens": 512.0,
        "mean_sample_tokens": 384.0,
        "achieved_tflops": 91.8,
        "flops_per_token": 7.47e9,
        "peak_tflops": 989.4,
        "peak_name": "H100 SXM",
        "peak_memory_bytes": 40 * 2**30,
        "peak_memory_reserved_bytes": 44 * 2**30,
        "device_memory_bytes": 85_029_158_912,
        "memory_kind": "cuda_max_allocated",
        "step_time_p50_s": 0.5,
        "step_time_p90_s": 0.51,
        "step_time_mean_s": 0.5,
        "step_time_cv": 0.0133,
        "throughput_ci95_rel": 0.0062,
        "ci_target": 0.02,
        "ci_met": True,
        "measured_steps": len(step_times),
        "window_s": 10.0,
        "step_times_s": step_times,
        "warmup_steps": 6,
        "warmup_steady": True,
        "warmup_s": 4.1,
        "warmup_excess_s": 1.1,
        "first_step_s": 1.6,
        "warmup_step_times_s": [1.6, 0.5, 0.5, 0.5, 0.5, 0.5],
        "startup_s": 31.0,
        "compile_s": 0.0,
        "checkpoint_save_s": 75.0,
        "checkpoint_bytes": 14_800_000_000,
        "loss_first": 10.45,
        "loss_last": 9.6,
        "losses": [10.45 - 0.03 * step for step in range(26)],
        "data_wait_s": [0.01] * 26,
        "loader_epochs": 0,
        "engine": "loop",
        "n_params": 1_235_814_400,
        "trainable_params": 1_235_814_400,
        "optimizer": "AdamW (fused)",
        "tf32_matmul": False,
        "effective_batch": 16,
        "packing": False,
        "phases_s": {
            "spawn_to_start": 0.02,
            "imports": 6.5,
            "tokenizer": 0.4,
            "data": 1.2,
            "model": 21.0,
            "optimizer": 1.9,
            "warmup": 4.1,
            "window": 10.0,
        },
        "env": {
            "device_type": "cuda",
            "device_name": "NVIDIA H100 80GB HBM3",
            "driver": "570.124.06",
            "cuda": "12.8",
            "cudnn": 91002,
            "torch": "2.11.0+cu128",
            "transformers": "5.17.0",
            "python": "3.11.13",
            "host": "gpu-1",
            "cpu_threads": 16,
            "cpu_count": 32,
            "model_config_hash": "2ac32b957dbf0c76",
            "dataset_hash": "d5cafc2f80f8",
        },
    }
    for part in ("phases_s", "env"):
        if isinstance(overrides.get(part), Mapping):
            overrides = overrides | {part: values[part] | dict(overrides[part])}
    return Measurement.model_validate(values | overrides)
