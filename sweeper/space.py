"""Space files: YAML → a validated, frozen ``Space`` → Optuna distributions.

This is the only module that calls ``trial.suggest_*``. Every error names the file, the YAML line,
the field and the value, e.g.::

    spaces/x.yaml:14: search.per_device_batch_size: List should have at least 1 item after
    validation, not 0 (got [])
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal, Self, TypeVar

from pydantic import (
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from sweeper import knobs, yamllines
from sweeper.catalog import OFFER_PATTERN
from sweeper.errors import SpaceError
from sweeper.job import Frozen as _Frozen
from sweeper.job import Workload
from sweeper.knobs import (
    KNOBS,
    AttnImplementation,
    CompileMode,
    DataParallel,
    Optimizer,
    PackingStrategy,
    PositiveInt,
    Precision,
    Quantization,
    SeqLength,
    TrialConfig,
    WorkerCount,
    WorkerStart,
)
from sweeper.samplers import DEFAULT_SAMPLER, SamplerName
from sweeper.seqlen import AUTO
from sweeper.spacekeys import misplaced_key

if TYPE_CHECKING:
    import optuna

__all__ = ["AttnImplementation", "CompileMode", "Precision", "TrialConfig"]

STUDY_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$"
StudyName = Annotated[str, Field(pattern=STUDY_NAME_PATTERN)]


class Hardware(_Frozen):
    """The machine a trial runs on and what it costs."""

    name: str = Field(min_length=1, description="e.g. 'H100 SXM 80GB'; used for pricing and MFU")
    usd_per_hour: float = Field(
        gt=0,
        description="rental price of one device (GPU), $/h: a run on N devices costs "
        "hours × N × this (on a CPU each rank counts as one)",
    )
    device: Literal["auto", "cpu", "cuda"] = "auto"
    catalog: str | None = Field(
        default=None,
        min_length=1,
        description="the GPU catalog `best --across-hardware` prices other GPUs from (a path "
        "from where sweeper runs); default: the shipped sweeper/gpus.yaml",
    )
    compare: list[Annotated[str, Field(pattern=OFFER_PATTERN)]] = Field(
        default_factory=list,
        description="offers `best --across-hardware` shows beside the catalog's GPUs, as "
        "catalog keys with a count: ['2x h100-sxm', '4x a100-40gb']",
    )


T = TypeVar("T")
# a knob's choices in ``search:``: a non-empty list (one item fixes the knob)
Choices = Annotated[list[T], Field(min_length=1)]


def _listed(name: str) -> Any:
    """A searched knob left out of ``search:``: its default is its only choice."""
    knob = knobs.KNOB[name]
    return Field(default_factory=lambda: [knob.default], description=knob.help)


class EffectiveBatch(_Frozen):
    """Samples per optimizer step over every device (batch × accumulation × devices).

    ``fixed``: the sweep keeps it, and gradient accumulation is derived from the batch size
    and the device count (fixed ÷ (batch × devices); a pair it does not divide is skipped);
    ``min``/``max``: configs outside are skipped without a trial. Left out: free, and the
    recommendation says how to scale the learning rate if it differs from the baseline's.
    """

    fixed: int | None = Field(default=None, gt=0)
    min: int | None = Field(default=None, gt=0)
    max: int | None = Field(default=None, gt=0)

    @model_validator(mode="after")
    def _one_mode(self) -> EffectiveBatch:
        if self.fixed is not None and (self.min is not None or self.max is not None):
            raise ValueError("set either 'fixed' or 'min'/'max', not both")
        if self.fixed is None and self.min is None and self.max is None:
            raise ValueError("set 'fixed', or 'min' and/or 'max'")
        if self.min is not None and self.max is not None and self.min > self.max:
            raise ValueError(f"min {self.min} exceeds max {self.max}")
        return self

    def admits(self, effective_batch: int) -> bool:
        if self.fixed is not None:
            return effective_batch == self.fixed
        low, high = self.min or 1, self.max or effective_batch
        return low <= effective_batch <= high

    def describe(self) -> str:
        if self.fixed is not None:
            return f"fixed at {self.fixed}"
        return f"within [{self.min or 1}, {self.max if self.max is not None else '∞'}]"


class _SearchRules(_Frozen):
    """The knobs (``SearchSpace``' fields, one per ``sweeper.knobs`` entry); each is a
    non-empty list of choices (one item fixes the knob). A knob left out takes its default as
    its only choice.

    With ``effective_batch.fixed``, gradient accumulation is derived and must be left out.
    """

    effective_batch: EffectiveBatch | None = None
    sampler: SamplerName = Field(
        default=DEFAULT_SAMPLER,
        description="how the sweep picks the next config: bayes (sweeper's own: the config "
        "most likely to beat the best beyond the noise, from a Bayesian model over the space's "
        "grid; the default, chosen by bench/search_replay.py), tpe, "
        "tpe-multivariate, gp (Optuna's), random, or grid (every config once, in random order)",
    )

    @field_validator(*knobs.NAMES, check_fields=False)
    @classmethod
    def _no_repeats(cls, values: list[Any] | str | None) -> list[Any] | str | None:
        if isinstance(values, str):
            return values  # max_seq_length: auto
        choices = values or []
        repeated = sorted({str(v) for v in choices if choices.count(v) > 1})
        if repeated:
            raise ValueError(f"choices repeat {', '.join(repeated)}; list each choice once")
        return values

    @model_validator(mode="after")
    def _batch_rules(self) -> _SearchRules:
        fixed = None if self.effective_batch is None else self.effective_batch.fixed
        batches = self.values("per_device_batch_size")
        accumulations = getattr(self, "gradient_accumulation_steps", None)
        if fixed is not None:
            if accumulations is not None:
                raise ValueError(
                    "gradient_accumulation_steps is derived from effective_batch.fixed "
                    f"({fixed} ÷ batch size); remove the list"
                )
            misfits = [b for b in batches if fixed % b]
            if misfits:
                raise ValueError(
                    f"effective_batch.fixed {fixed} is not a multiple of per_device_batch_size "
                    f"{misfits}; drop those sizes or pick a fixed batch they divide"
                )
            for devices in self.values("devices"):
                if not any(fixed % (b * devices) == 0 for b in batches):
                    raise ValueError(
                        f"effective_batch.fixed {fixed} is not a multiple of batch × devices "
                        f"for any per_device_batch_size {batches} with devices {devices}; drop "
                        f"that count, or list a batch size that divides {fixed} {devices} ways"
                    )
            return self
        if self.effective_batch is not None and not any(
            self.effective_batch.admits(b * a) for b in batches for a in accumulations or [1]
        ):
            raise ValueError(
                f"no batch × accumulation of the space is {self.effective_batch.describe()}"
            )
        return self

    def values(self, knob: str) -> list[Any]:
        """The choices listed for ``knob`` (accumulation: see ``accumulation_choices``); none
        for ``max_seq_length: auto`` until ``sweeper.seqlen.resolve`` reads them off the data."""
        listed = getattr(self, knob)
        return [] if listed is None or listed == AUTO else list(listed)

    @property
    def derives_accumulation(self) -> bool:
        """Accumulation follows from ``effective_batch.fixed``, batch and devices (so after
        them: ``devices`` comes late in the knobs' order)."""
        return self.effective_batch is not None and self.effective_batch.fixed is not None

    def accumulation_choices(self, batch: int, devices: int = 1) -> list[int]:
        """The accumulation steps a config with ``batch`` on ``devices`` may use: with
        ``effective_batch.fixed``, fixed ÷ (batch × devices), none where that does not divide.

        >>> s = SearchSpace(effective_batch=EffectiveBatch(fixed=32), per_device_batch_size=[4])
        >>> s.accumulation_choices(4), s.accumulation_choices(4, 2), s.accumulation_choices(4, 3)
        ([8], [4], [])
        """
        if self.effective_batch is not None and self.effective_batch.fixed is not None:
            fixed = self.effective_batch.fixed
            return [] if fixed % (batch * devices) else [fixed // (batch * devices)]
        return self.values("gradient_accumulation_steps") or [1]

    def choices_for(self, knob: str, config: Mapping[str, Any]) -> list[Any]:
        """What ``knob`` may take given the knobs before it in ``config`` (a derived
        accumulation: given the batch and the devices, which ``config`` must hold)."""
        if knob == "gradient_accumulation_steps":
            return self.accumulation_choices(
                config["per_device_batch_size"], config.get("devices") or 1
            )
        return self.values(knob)

    def admits(self, config: TrialConfig) -> str | None:
        """Why ``config`` is outside the space's rules (None: it is inside)."""
        fixed = None if self.effective_batch is None else self.effective_batch.fixed
        share = config.per_device_batch_size * config.devices
        if fixed is not None and fixed % share:
            return (
                f"effective_batch.fixed {fixed} is not a multiple of per_device_batch_size "
                f"{config.per_device_batch_size} × devices {config.devices}: no gradient "
                "accumulation makes it"
            )
        if self.effective_batch is not None and not self.effective_batch.admits(
            config.effective_batch
        ):
            return (
                f"effective batch {config.effective_batch} is not {self.effective_batch.describe()}"
            )
        return None

    def runnable(self, config: TrialConfig) -> str | None:
        """Why ``config`` cannot run as a trial of this space: a value outside a knob's
        choices, or outside the space's rules (None: it can run).

        E.g. ``"max_seq_length = 4096 is not among search.max_seq_length [512, 1024]; add it
        there so it can run as a trial"``.
        """
        values = config.model_dump()
        problem = knobs.inactive_problem(values)
        if problem is not None:
            return problem
        for knob in KNOBS:
            value = values[knob.name]
            if not knob.is_active(values) or getattr(self, knob.name) == AUTO:
                continue  # auto: the data decides, and the length of a known config is added
            choices = self.choices_for(knob.name, values)
            if not choices and knob.name == "gradient_accumulation_steps":
                continue  # nothing derives from fixed here: admits says why
            if value not in choices:
                return (
                    f"{knob.name} = {value!r} is not among search.{knob.name} {choices}; add it "
                    "there so it can run as a trial"
                )
        reason = self.admits(config)
        return None if reason is None else f"{reason}; it cannot run as a trial of this space"

    def searched(self) -> list[str]:
        """The knobs with more than one choice: the study's Optuna parameters."""
        return [
            k.name
            for k in KNOBS
            if k.name != "gradient_accumulation_steps"
            or self.effective_batch is None
            or self.effective_batch.fixed is None
            if len(self.values(k.name)) > 1
        ]

    def grid(self) -> Iterator[TrialConfig]:
        """Every distinct config the space admits (a knob that does not apply is None)."""

        derived = self.derives_accumulation

        def extend(index: int, partial: dict[str, Any]) -> Iterator[dict[str, Any]]:
            if index == len(KNOBS):  # accumulation derived now the devices are chosen
                key = "gradient_accumulation_steps"
                for steps in self.choices_for(key, partial) if derived else [partial[key]]:
                    yield {**partial, key: steps}  # (none where fixed does not divide)
                return
            knob = KNOBS[index]
            if derived and knob.name == "gradient_accumulation_steps":
                yield from extend(index + 1, partial)
                return
            if not knob.is_active(partial):
                yield from extend(index + 1, {**partial, knob.name: None})
                return
            for value in self.choices_for(knob.name, partial):
                yield from extend(index + 1, {**partial, knob.name: value})

        for values in extend(0, {}):
            config = TrialConfig(**values)
            if self.admits(config) is None:
                yield config

    def narrowed(self, only: Mapping[str, list[Any]]) -> Self:
        """This space with some knobs' lists replaced (what preflight left of them)."""
        return self.model_copy(update=dict(only))


# required knobs' defaults in a space, so a minimal space needs none of them: the lengths come
# from the data (sweeper.seqlen), a few batch sizes (the OOM rule skips what cannot fit),
# one accumulation step, the DataLoader on the training process
SEARCH_DEFAULTS: dict[str, Any] = {
    "max_seq_length": AUTO,
    "per_device_batch_size": [4, 8, 16],
    "num_workers": [0],
}


def _defaulted(name: str) -> Any:
    """A required knob left out of ``search:``: its ``SEARCH_DEFAULTS`` list."""
    listed = SEARCH_DEFAULTS[name]
    return Field(default_factory=lambda: list(listed), description=knobs.KNOB[name].help)


class SearchSpace(_SearchRules):
    """``search:``: one list of choices per knob, in ``KNOBS``' order (tests/test_knobs.py
    checks them against it). Accumulation is None when ``effective_batch.fixed`` derives it."""

    per_device_batch_size: Choices[PositiveInt] = _defaulted("per_device_batch_size")
    gradient_accumulation_steps: Choices[PositiveInt] | None = None
    num_workers: Choices[WorkerCount] = _defaulted("num_workers")
    prefetch_factor: Choices[PositiveInt] = _listed("prefetch_factor")
    persistent_workers: Choices[bool] = _listed("persistent_workers")
    multiprocessing_context: Choices[WorkerStart] = _listed("multiprocessing_context")
    pin_memory: Choices[bool] = _listed("pin_memory")
    max_seq_length: Choices[SeqLength] | Literal["auto"] = Field(
        default="auto",  # AUTO
        description="tokens per row; auto (the default): from the data's token "
        "lengths, so that one length truncates nothing (sweeper.seqlen)",
    )
    packing: Choices[bool] = _listed("packing")
    packing_strategy: Choices[PackingStrategy] = _listed("packing_strategy")
    padding_free: Choices[bool] = _listed("padding_free")
    precision: Choices[Precision] = _listed("precision")
    tf32: Choices[bool] = _listed("tf32")
    compile_mode: Choices[CompileMode] = _listed("compile_mode")
    attn_implementation: Choices[AttnImplementation] = _listed("attn_implementation")
    gradient_checkpointing: Choices[bool] = _listed("gradient_checkpointing")
    liger_kernel: Choices[bool] = _listed("liger_kernel")
    optim: Choices[Optimizer] = _listed("optim")
    quantization: Choices[Quantization] = _listed("quantization")
    devices: Choices[PositiveInt] = _listed("devices")
    data_parallel: Choices[DataParallel] = _listed("data_parallel")


class WarmupSettings(_Frozen):
    """Burn-in: run until step time is steady, i.e. the median of the last ``window`` steps is
    within ``tolerance`` of the median of the ``window`` before; bounded by steps and seconds."""

    min_steps: int = Field(default=2, ge=1)
    max_steps: int = Field(default=40, ge=1)
    max_seconds: float = Field(default=600, gt=0, description="compile can take minutes")
    window: int = Field(default=3, ge=2)
    tolerance: float = Field(default=0.05, gt=0, lt=1)

    @model_validator(mode="after")
    def _bounds(self) -> WarmupSettings:
        if self.min_steps > self.max_steps:
            raise ValueError("min_steps must not exceed max_steps")
        return self


class MeasureSettings(_Frozen):
    """The timed window: stop once the 95% interval of throughput is within ±target_ci,
    or at max_steps / max_seconds (then the achieved interval is reported as is)."""

    min_steps: int = Field(default=5, ge=2)
    max_steps: int = Field(default=500, ge=2)
    min_seconds: float = Field(
        default=5, ge=0, description="time at least this long, even if the interval is met"
    )
    warmup_multiple: float = Field(
        default=4.0,
        ge=0,
        description="time at least this many times as many steps as the burn-in took, so "
        "burn-in stays a small share of a trial (4 → at most 20% of its steps)",
    )
    max_seconds: float = Field(default=60, gt=0)
    target_ci: float = Field(default=0.02, gt=0, lt=1)

    @model_validator(mode="after")
    def _bounds(self) -> MeasureSettings:
        if self.min_steps > self.max_steps:
            raise ValueError("min_steps must not exceed max_steps")
        if self.min_seconds > self.max_seconds:
            raise ValueError("min_seconds must not exceed max_seconds")
        return self


class TrialSettings(_Frozen):
    """How each trial warms up and how long it measures."""

    warmup: WarmupSettings = WarmupSettings()
    measure: MeasureSettings = MeasureSettings()
    timeout_s: float = Field(default=900, gt=0, description="the child is killed after this")
    collective_timeout_s: float = Field(
        default=300, gt=0, description="several devices: a collective waiting this long fails"
    )
    preflight: bool = Field(
        default=True, description="probe attention, compile modes and precision before trials"
    )
    slow_precision_factor: float = Field(
        default=3.0,
        gt=1,
        description="preflight refuses a precision this many times slower "
        "than fp32 (bf16 autocast on CPUs without AMX is ~10x slower)",
    )


class Remeasure(_Frozen):
    """Measuring configs again (``sweeper.noise``): a config measured once knows its window's
    noise, not the run-to-run noise of the machine, nor whether the machine drifted."""

    rounds: int = Field(
        default=2,
        ge=0,
        description="at the end, re-measure the best configs whose $/run intervals overlap, "
        "interleaved (A, B, A, B ...), at most this many rounds, until they separate (0: never)",
    )
    top: int = Field(default=3, ge=2, description="at most this many configs take part")
    drift_every: int | None = Field(
        default=10,
        gt=0,
        description="re-measure the reference config (the baseline, else the first measured) "
        "after every this many measured trials, to see whether the machine drifted (null: never)",
    )
    contended_reruns: int = Field(
        default=1,
        ge=0,
        description="measure a config again, at once, up to this many times while the machine "
        "was shared during its window (other processes' CPU, steal, another GPU process)",
    )
    contended_later: int = Field(
        default=2,
        ge=0,
        description="a config still contended after its reruns is measured again later, up to "
        "this many times, each right after a trial that measured calm (the machine is quiet "
        "again); one such measurement per calm trial",
    )


class Budget(_Frozen):
    """What the sweep may spend: trials, minutes, device-hours or dollars (the first spent
    stops it), and when it stops early: no trial beyond noise has improved for ``patience``
    trials."""

    n_trials: int = Field(default=12, gt=0, description="trials to measure (launch --n-trials)")
    max_minutes: float | None = Field(
        default=None,
        gt=0,
        description="stop starting trials after this many minutes (preparation and preflight "
        "count); no trial starts with less time left than the longest so far took",
    )
    max_device_hours: float | None = Field(
        default=None, gt=0, description="the same limit in device-hours (N devices spend N)"
    )
    max_usd: float | None = Field(
        default=None,
        gt=0,
        description="the same limit in dollars, each device a trial holds priced at "
        "hardware.usd_per_hour",
    )
    patience: int | None = Field(
        default=None,
        gt=0,
        description="stop after this many measured trials in a row without a $/run better "
        "than the best so far by more than both trials' 95% intervals",
    )
    planned_runs: int | None = Field(
        default=None,
        gt=0,
        description="how many times the real job will run: stop when the next trial is expected "
        "to cost more than it would save over these runs (null: no such stop)",
    )
    remeasure: Remeasure = Remeasure()
    seed: int = 0

    def minutes(self, usd_per_hour: float) -> float | None:
        """The tightest of the time limits, in minutes (None: no limit).

        >>> Budget(n_trials=9, max_minutes=90, max_usd=2.5).minutes(2.5)
        60.0
        """
        limits = [
            self.max_minutes,
            None if self.max_device_hours is None else 60 * self.max_device_hours,
            None if self.max_usd is None else 60 * self.max_usd / usd_per_hour,
        ]
        known = [m for m in limits if m is not None]
        return min(known) if known else None


class _KnownConfig(_Frozen):
    """The config the user runs today (fields derived from ``sweeper.knobs``); it is the
    sweep's first trial and every result is compared with it. Each value must be one of the
    search space's choices; a knob left out takes its default, or the search's only choice."""

    label: str | None = Field(
        default=None, max_length=80, description="a name for reports, e.g. 'seed 001 after'"
    )

    def as_config(self, search: SearchSpace) -> TrialConfig:
        """The trial config; knobs left out resolved against ``search`` (see the class): a
        config resolved without the space would differ from the trial the sweep ran."""
        values = self.model_dump(exclude={"label"})
        for knob in KNOBS:
            if knob.required or values.get(knob.name) is not None:
                continue
            listed = search.values(knob.name)
            if knob.default in listed or not listed:
                values[knob.name] = knob.default
            elif len(listed) == 1:
                values[knob.name] = listed[0]
            elif knob.is_active(values):
                raise ValueError(
                    f"{knob.name} is left out, and search.{knob.name} {listed} has several "
                    f"values without the default {knob.default!r}; say which one it uses"
                )
        return TrialConfig.model_validate(knobs.normalize(values))


def _optional(name: str) -> Any:
    """A knob a known config may leave out (``_KnownConfig.as_config`` resolves it)."""
    return Field(default=None, description=knobs.KNOB[name].help)


class Baseline(_KnownConfig):
    """``baseline:`` and each of ``also_try:``: a value per knob, in ``KNOBS``' order
    (tests/test_knobs.py checks them against it); the required knobs must be given."""

    per_device_batch_size: PositiveInt
    gradient_accumulation_steps: PositiveInt
    num_workers: WorkerCount
    prefetch_factor: PositiveInt | None = _optional("prefetch_factor")
    persistent_workers: bool | None = _optional("persistent_workers")
    multiprocessing_context: WorkerStart | None = _optional("multiprocessing_context")
    pin_memory: bool | None = _optional("pin_memory")
    max_seq_length: SeqLength
    packing: bool | None = _optional("packing")
    packing_strategy: PackingStrategy | None = _optional("packing_strategy")
    padding_free: bool | None = _optional("padding_free")
    precision: Precision | None = _optional("precision")
    tf32: bool | None = _optional("tf32")
    compile_mode: CompileMode | None = _optional("compile_mode")
    attn_implementation: AttnImplementation | None = _optional("attn_implementation")
    gradient_checkpointing: bool | None = _optional("gradient_checkpointing")
    liger_kernel: bool | None = _optional("liger_kernel")
    optim: Optimizer | None = _optional("optim")
    quantization: Quantization | None = _optional("quantization")
    devices: PositiveInt | None = _optional("devices")
    data_parallel: DataParallel | None = _optional("data_parallel")


# workload keys that predate the knobs they became; they still set the knob's one choice
_WORKLOAD_KNOBS = ("precision", "tf32")


class Space(_Frozen):
    """A whole space file."""

    study: StudyName
    storage: str | None = None
    hardware: Hardware
    workload: Workload
    baseline: Baseline | None = None
    also_try: list[Baseline] = Field(
        default_factory=list,
        description="configs to run right after the baseline (e.g. a blog post's advice)",
    )
    search: SearchSpace = Field(default_factory=lambda: SearchSpace())
    trial: TrialSettings = TrialSettings()
    budget: Budget = Budget()

    @model_validator(mode="before")
    @classmethod
    def _workload_knobs(cls, data: Any) -> Any:
        """``workload.precision: bf16`` (the older spelling) is ``search.precision: [bf16]``."""
        if not isinstance(data, dict):
            return data
        workload, search = data.get("workload"), data.get("search", {})
        if not isinstance(workload, dict) or not isinstance(search, dict):
            return data
        search = dict(search)
        for name in _WORKLOAD_KNOBS:
            value = workload.get(name)
            if value is None:
                continue
            if name in search and search[name] != [value]:
                raise ValueError(
                    f"workload.{name} is {value!r} but search.{name} is {search[name]!r}; "
                    f"keep only search.{name}"
                )
            search[name] = [value]
        return {**data, "search": search}

    @model_validator(mode="after")
    def _worker_start_needs_the_loop(self) -> Space:
        # a script's own DataLoader takes it from sweeper.trial_config() (a Trainer script's
        # cannot: its trials fail as a mismatch, read back from the loader)
        starts = [v for v in self.search.values("multiprocessing_context") if v != "fork"]
        if starts and self.workload.engine not in ("loop", "script"):
            raise ValueError(
                f"search.multiprocessing_context {starts}: TrainingArguments has no way to set "
                f"it, so the {self.workload.engine} engine's DataLoader workers fork; list only "
                "fork, or use engine: loop or script (your own DataLoader)"
            )
        return self

    @model_validator(mode="after")
    def _packing_strategy_of_the_engine(self) -> Space:
        trl_only = [v for v in self.search.values("packing_strategy") if v != "wrapped"]
        if trl_only and self.workload.engine != "sft":
            raise ValueError(
                f"search.packing_strategy {trl_only}: these are TRL's packings (engine: sft); "
                f"the {self.workload.engine} engine packs as wrapped (a long sample continues "
                "in the next row); list only wrapped, or use engine: sft"
            )
        return self

    @model_validator(mode="after")
    def _quantization_needs_an_adapter(self) -> Space:
        quantized = [q for q in self.search.values("quantization") if q != "none"]
        if quantized and self.workload.adapter is None:
            raise ValueError(
                f"search.quantization {quantized}: quantized weights cannot be trained "
                "directly; add workload.adapter (LoRA), or list only 'none'"
            )
        return self

    @model_validator(mode="after")
    def _known_configs_in_space(self) -> Space:
        for where, known in self.named_known_configs():
            try:
                config = known.as_config(self.search)
            except ValueError as e:
                raise ValueError(f"{where}: {e}") from None
            reason = self.search.runnable(config)
            if reason is not None:
                raise ValueError(f"{where}: {reason}")
        return self

    def workload_hash(self) -> str:
        """Equal for studies that price the same job (on any hardware, at any price)."""
        job = self.workload.model_dump(
            mode="json", exclude={"checkpoint": {"dir"}, **dict.fromkeys(_WORKLOAD_KNOBS, True)}
        )
        # precision changes the arithmetic but not the job; it is a knob like any other
        return hashlib.sha256(json.dumps(job, sort_keys=True).encode()).hexdigest()[:16]

    def named_known_configs(self) -> list[tuple[str, Baseline]]:
        """``("baseline", ...)``, then ``("also_try[0]", ...)``, ...: where each is in the file."""
        named = [] if self.baseline is None else [("baseline", self.baseline)]
        return named + [(f"also_try[{i}]", c) for i, c in enumerate(self.also_try)]

    def known_configs(self) -> list[TrialConfig]:
        """The baseline, then ``also_try``: run first, in this order."""
        return [known.as_config(self.search) for _, known in self.named_known_configs()]

    def precision(self) -> str:
        """The precision when only one is searched (what ``workload.precision`` said)."""
        return self.search.values("precision")[0]


def optuna_params(config: TrialConfig, search: SearchSpace) -> dict[str, Any]:
    """The parameters ``suggest`` would record for ``config`` (for ``study.enqueue_trial``)."""
    values = config.model_dump()
    return {
        name: values[name]
        for name in search.searched()
        if values[name] is not None and knobs.KNOB[name].is_active(values)
    }


def suggest(trial: optuna.trial.BaseTrial, search: SearchSpace) -> TrialConfig:
    """Ask Optuna for one config. A knob with one choice is not a parameter; a knob that does
    not apply (prefetch_factor without workers) is None and not asked for."""
    searched = set(search.searched())
    derived = search.derives_accumulation
    values: dict[str, Any] = {}
    for knob in KNOBS:
        if derived and knob.name == "gradient_accumulation_steps":
            continue  # after the devices: below
        if not knob.is_active(values):
            values[knob.name] = None
            continue
        choices = search.choices_for(knob.name, values)
        if knob.name in searched:
            values[knob.name] = trial.suggest_categorical(knob.name, choices)
        else:
            values[knob.name] = choices[0]
    if derived:  # not dividing: 1, and the sweep's rules skip it saying why (``admits``)
        steps = search.choices_for("gradient_accumulation_steps", values)
        values["gradient_accumulation_steps"] = steps[0] if steps else 1
    return TrialConfig(**values)


# ---------------------------------------------------------------- loading with line numbers


def _named_loc(message: str) -> tuple[Any, ...]:
    """Where a message of a whole-space check points: ``baseline: per_device_batch_size = 3
    ...`` -> ("baseline", "per_device_batch_size"); ``also_try[1]: ...`` -> ("also_try", 1)."""
    found = re.match(r"(baseline|also_try\[(\d+)\]): (?:(\w+) = )?", message)
    if found is None:
        return ()
    where: tuple[Any, ...] = (
        ("baseline",) if found.group(2) is None else ("also_try", int(found.group(2)))
    )
    return where + ((found.group(3),) if found.group(3) else ())


def parse_space(text: str, source: str = "<space>") -> Space:
    """Validate a space from YAML text; raise SpaceError naming ``source:line: field``."""
    data, lines = yamllines.load(text, source, SpaceError)
    if not isinstance(data, dict):
        raise SpaceError(f"{source}:1: a space file is a mapping of keys (study, hardware, ...)")
    try:
        return Space.model_validate(data)
    except ValidationError as e:
        problems = []
        for err in e.errors():
            loc = tuple(p for p in err["loc"] if not (isinstance(p, str) and "[" in p))
            if not loc:  # a check of the whole space that names where it looked
                loc = _named_loc(err["msg"].removeprefix("Value error, "))
            field = yamllines.dotted(loc)
            if err["type"] == "extra_forbidden":
                message = (
                    misplaced_key(Space, loc) or "unknown key; remove it or check its spelling"
                )
            elif err["type"] == "missing":
                message = "required key is missing"
            elif err["type"] == "value_error":
                message = err["msg"].removeprefix("Value error, ")
                if err["loc"] == () and loc:  # the field now says where: once is enough
                    message = re.sub(r"^(baseline|also_try\[\d+\]): ", "", message)
                if loc and not isinstance(err.get("input"), dict | list):
                    message += f" (got {err.get('input')!r})"
            else:
                message = f"{err['msg']} (got {err.get('input')!r})"
            problems.append(f"{source}:{yamllines.line_for(loc, lines)}: {field}: {message}")
        raise SpaceError("\n".join(problems)) from None


def stored_space(text: str, study: str, source: str) -> Space:
    """The space a study stored, as that study: one imported ``--as NAME`` keeps its file's
    text, whose ``study:`` is still the name it was exported under (a worker reading the text
    alone would sweep, and create, the old name)."""
    return as_study(parse_space(text, source), study)


def as_study(space: Space, study: str) -> Space:
    """``space`` swept as study ``study`` (``launch --space FILE --study NAME``); a name the
    space file could not hold is a ``SpaceError``."""
    if re.fullmatch(STUDY_NAME_PATTERN, study) is None:
        raise SpaceError(
            f"--study {study!r}: a study name is 1-100 letters, digits, '.', '_' or '-', "
            "starting with a letter or digit"
        )
    return space.model_copy(update={"study": study})


# A space file is a page of YAML; a larger one is a mistake (``--space /dev/zero``, a dataset
# passed by accident), refused before it is read whole.
MAX_SPACE_BYTES = 1 << 20


def load_space(path: str | Path) -> Space:
    """Read and validate a space file."""
    path = Path(path)
    try:
        with path.open("rb") as file:
            data = file.read(MAX_SPACE_BYTES + 1)
    except OSError as e:
        raise SpaceError(f"{path}: cannot read space file: {e.strerror}") from e
    if len(data) > MAX_SPACE_BYTES:
        raise SpaceError(
            f"{path}: larger than {MAX_SPACE_BYTES // 1024} KiB, so not a space file; pass "
            "the YAML file that describes the sweep (see spaces/ for examples)"
        )
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        column = e.start - (data.rfind(b"\n", 0, e.start) + 1) + 1
        raise SpaceError(
            f"{path}:{line}:{column}: not UTF-8 text (byte 0x{data[e.start]:02x}); save the "
            f"file as UTF-8, e.g. iconv -f latin1 -t utf-8 {path} > fixed.yaml"
        ) from None
    return parse_space(text, source=str(path))
