"""The ``search:`` section of a space: each knob's choices and the rules that join them.

A knob is a non-empty list of choices (one item fixes it; one left out takes its default, or a
``SEARCH_DEFAULTS`` list); ``effective_batch`` fixes or bounds batch × accumulation × devices.
``SearchSpace`` answers what the sweep may run: each knob's choices given the knobs before it,
the Optuna parameters (``searched``), every config it admits (``grid``), and why a config
cannot run as a trial of it (``runnable``). ``sweeper.space`` reads it from the file and asks
Optuna for configs of it (``suggest``).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Annotated, Any, Literal, Self, TypeVar

from pydantic import Field, field_validator, model_validator

from sweeper import knobs
from sweeper.job import Frozen as _Frozen
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
