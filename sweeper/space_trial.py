"""The ``trial:`` section of a space: how each trial burns in, how long it measures, and its limits.

``sweeper.trial.recipe`` runs the burn-in (``WarmupSettings``) and the timed window
(``MeasureSettings``) as these say; the launcher kills a child after ``timeout_s``, and
preflight's probes run before any trial unless ``preflight`` is false.
"""

from __future__ import annotations

from pydantic import Field, model_validator

from sweeper.job import Frozen as _Frozen


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
