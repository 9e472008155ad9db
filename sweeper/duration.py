"""How long a trial, and a sweep, will take: an estimate from the space's settings.

Before the first trial nobody knows a step's time, so this is a range, not a measurement:

- a trial lasts at least its timed window's floor (``trial.measure.min_seconds``, and at least
  ``min_steps`` steps) and at most its burn-in cap plus its window cap
  (``trial.warmup.max_seconds`` + ``trial.measure.max_seconds``), plus one checkpoint save
  (the model's weights, and the optimizer's state when ``checkpoint.save_optimizer``, written
  at the disk speed ``doctor`` measured); ``trial.timeout_s`` kills a longer one;
- a sweep runs ``budget.n_trials`` trials (fewer when the space has fewer configs), plus
  re-measures: the end's rounds
  (``remeasure.rounds`` × ``remeasure.top``) and a drift check every ``remeasure.drift_every``
  trials (a shared machine adds more: ``contended_reruns``); plus preparing the data and the
  preflight probes, as long as ``doctor`` just took for them; ``budget`` limits cap it.

>>> from sweeper.space import parse_space
>>> space = parse_space(
...     "study: s\\nhardware: {name: CPU, usd_per_hour: 1}\\nworkload:\\n"
...     "  model: {arch: llama, size: tiny}\\n  dataset: {generate: {samples: 64}}\\n"
...     "  samples: 10\\n  epochs: 1\\n")
>>> e = estimate(space)
>>> e.trial_low_s, e.trial_high_s, e.trials, e.remeasures
(5.0, 660.0, 12, 7)
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sweeper.space import Space

_BYTES_PER_PARAM_SAVED = 4  # fp32 weights, as the trials hold them
_OPTIMIZER_BYTES_PER_PARAM = 8  # AdamW's two moments


@dataclass(frozen=True, kw_only=True)
class Estimate:
    trial_low_s: float
    trial_high_s: float
    save_s: float | None  # one checkpoint save, when the model size and disk speed are known
    trials: int
    remeasures: int  # at most, on a quiet machine
    overhead_s: float  # preparing the data and the preflight probes
    budget_s: float | None  # the space's budget caps the sweep here

    @property
    def sweep_low_s(self) -> float:
        return self.overhead_s + self.trials * self.trial_low_s

    @property
    def sweep_high_s(self) -> float:
        high = self.overhead_s + (self.trials + self.remeasures) * self.trial_high_s
        return high if self.budget_s is None else min(high, self.budget_s)


def estimate(
    space: Space,
    *,
    params: int | None = None,
    write_bytes_per_s: float | None = None,
    overhead_s: float = 0.0,
) -> Estimate:
    """The range for ``space`` (see the module docstring); ``params`` and
    ``write_bytes_per_s`` price the checkpoint save, ``overhead_s`` is prepare + preflight."""
    warmup, measure = space.trial.warmup, space.trial.measure
    save_s = None
    if params and write_bytes_per_s and space.workload.checkpoint.save_steps is not None:
        per_param = _BYTES_PER_PARAM_SAVED + (
            _OPTIMIZER_BYTES_PER_PARAM if space.workload.checkpoint.save_optimizer else 0
        )
        save_s = params * per_param / write_bytes_per_s
    high = min(space.trial.timeout_s, warmup.max_seconds + measure.max_seconds + (save_s or 0.0))
    low = min(high, measure.min_seconds + (save_s or 0.0))
    budget = space.budget
    remeasure = budget.remeasure
    # a sweep stops once every config of the space is measured (auto: once the data is read)
    configs = sum(1 for _ in itertools.islice(space.search.grid(), budget.n_trials))
    trials = min(budget.n_trials, configs) if configs else budget.n_trials
    drift = 0 if remeasure.drift_every is None else trials // remeasure.drift_every
    minutes = budget.minutes(space.hardware.usd_per_hour)
    return Estimate(
        trial_low_s=low,
        trial_high_s=high,
        save_s=save_s,
        trials=trials,
        remeasures=remeasure.rounds * remeasure.top + drift,
        overhead_s=overhead_s,
        budget_s=None if minutes is None else 60 * minutes,
    )


def _span(seconds: float) -> str:
    """'45 s', '12 min', '2.2 h'."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def describe(space: Space, e: Estimate) -> str:
    """The estimate as doctor prints it, saying how it was made."""
    warmup, measure = space.trial.warmup, space.trial.measure
    save = (
        ""
        if e.save_s is None
        else f" + one checkpoint save (~{_span(e.save_s)} at the disk speed measured here)"
    )
    capped = "" if e.budget_s is None else f", capped by the budget at {_span(e.budget_s)}"
    return (
        f"each trial: {_span(e.trial_low_s)} to {_span(e.trial_high_s)} "
        f"(timed window at least trial.measure.min_seconds {measure.min_seconds:g} s; at most "
        f"burn-in trial.warmup.max_seconds {warmup.max_seconds:g} s + window "
        f"trial.measure.max_seconds {measure.max_seconds:g} s{save}; trial.timeout_s "
        f"{space.trial.timeout_s:g} s kills a longer one). The sweep: {e.trials} trials and up "
        f"to {e.remeasures} re-measures, plus {_span(e.overhead_s)} of data preparation and "
        f"probes: {_span(e.sweep_low_s)} to {_span(e.sweep_high_s)}{capped}. An estimate from "
        "the space's trial settings, not a measurement: where a trial lands in its range "
        "depends on its step time, known once it runs (fast steps stop at the window's "
        "interval, trial.measure.target_ci)"
    )
