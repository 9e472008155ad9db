"""The recommendation: the cheapest completed trial of a study, for the CLI and the REST API."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict

from sweeper.errors import NoResultError
from sweeper.store import Store, StudyRow, TrialRow


class Recommendation(BaseModel):
    """The cheapest completed trial of a study; also the REST API's response schema."""

    model_config = ConfigDict(frozen=True)

    study: str
    hardware_name: str
    usd_per_hour: float
    trial_number: int
    config: dict[str, Any]
    it_per_s: float | None
    samples_per_s: float
    tokens_per_s: float | None
    hours_per_run: float | None
    cost_per_run_usd: float
    peak_memory_bytes: int | None
    completed_trials: int
    truncated_samples_share: float | None = None
    warnings: tuple[str, ...] = ()
    baseline_trial_number: int | None = None
    baseline_hours_per_run: float | None = None
    baseline_cost_per_run_usd: float | None = None
    speedup_vs_baseline: float | None = None  # baseline hours ÷ recommended hours
    usd_saved_per_run: float | None = None
    constraints: str = "no constraint"


def truncation(stats: dict[str, Any] | None, max_seq_length: int) -> tuple[float, float] | None:
    """(share of samples, share of tokens) cut off at ``max_seq_length``, or None if unknown.

    Estimated from the dataset's token-length percentiles (0..100) measured by the prepare
    step; one EOS token per sample is counted, as the trial appends it.

    >>> samples, tokens = truncation({"token_percentiles": [99] * 50 + [199] * 51}, 100)
    >>> round(samples, 3), round(tokens, 3)  # the longer half loses 100 of its 200 tokens
    (0.505, 0.336)
    """
    points = (stats or {}).get("token_percentiles")
    if not points:
        return None
    lengths = [p + 1 for p in points]  # + EOS
    cut = [max(0, n - max_seq_length) for n in lengths]
    samples_share = sum(1 for c in cut if c > 0) / len(lengths)
    tokens_share = sum(cut) / max(1, sum(lengths))
    return samples_share, tokens_share


@dataclass(frozen=True, kw_only=True)
class Constraints:
    """What the user can live with; ``usd_per_hour`` re-prices without re-running."""

    usd_per_hour: float | None = None
    max_hours: float | None = None
    max_cost_usd: float | None = None

    def describe(self) -> str:
        parts = []
        if self.max_hours is not None:
            parts.append(f"within {self.max_hours:g} h")
        if self.max_cost_usd is not None:
            parts.append(f"at most ${self.max_cost_usd:,.2f}")
        return " and ".join(parts) or "no constraint"


@dataclass(frozen=True)
class _Priced:
    trial: TrialRow
    hours: float
    cost: float


def _priced(trials: list[TrialRow], usd_per_hour: float) -> list[_Priced]:
    """Completed trials with a finite projection, re-priced at ``usd_per_hour``.

    Hours per run do not depend on the price, so a new price needs no new measurement.
    """
    priced = []
    for t in trials:
        hours = t.hours_per_run
        if t.state != "complete" or t.samples_per_s is None or hours is None:
            continue
        if not math.isfinite(hours) or hours <= 0:
            continue
        priced.append(_Priced(t, hours, hours * usd_per_hour))
    return priced


def best(store: Store, study: str, constraints: Constraints | None = None) -> Recommendation:
    """The cheapest completed trial that meets ``constraints``, compared with the baseline.

    Raises NoResultError when no completed trial (or none within the constraints) exists.
    """
    constraints = constraints or Constraints()
    study_row: StudyRow = store.get_study(study)
    price = constraints.usd_per_hour or study_row.usd_per_hour
    priced = _priced(store.list_trials(study, states=["complete"]), price)
    if not priced:
        raise NoResultError(f"study {study!r} has no completed trial yet")
    allowed = [
        p
        for p in priced
        if (constraints.max_hours is None or p.hours <= constraints.max_hours)
        and (constraints.max_cost_usd is None or p.cost <= constraints.max_cost_usd)
    ]
    if not allowed:
        fastest = min(priced, key=lambda p: p.hours)
        cheapest = min(priced, key=lambda p: p.cost)
        raise NoResultError(
            f"no completed trial of {study!r} meets {constraints.describe()} at "
            f"${price:.2f}/h: the fastest takes {fastest.hours:,.1f} h, the cheapest costs "
            f"${cheapest.cost:,.2f}"
        )
    # cheapest first; ties go to the earlier trial, so the order is deterministic
    winner = min(allowed, key=lambda p: (p.cost, p.trial.number))
    baseline = _baseline(study_row, priced)
    warnings: list[str] = []
    max_seq_length = winner.trial.config.get("max_seq_length")
    cut = None if max_seq_length is None else truncation(study_row.dataset_stats, max_seq_length)
    if cut is not None and cut[0] > 0:
        # the full guard (never recommend silently, coverage percentile) is issue 4's
        warnings.append(
            f"max_seq_length {max_seq_length} truncates about "
            f"{cut[0]:.0%} of samples ({cut[1]:.0%} of tokens) of this dataset: it is cheaper "
            "partly because it trains on less text"
        )
    t = winner.trial
    assert t.samples_per_s is not None
    return Recommendation(
        study=study,
        hardware_name=study_row.hardware_name,
        usd_per_hour=price,
        trial_number=t.number,
        config=dict(t.config),
        it_per_s=t.it_per_s,
        samples_per_s=t.samples_per_s,
        tokens_per_s=t.tokens_per_s,
        hours_per_run=winner.hours,
        cost_per_run_usd=winner.cost,
        peak_memory_bytes=t.peak_memory_bytes,
        completed_trials=len(priced),
        truncated_samples_share=None if cut is None else cut[0],
        warnings=tuple(warnings),
        baseline_trial_number=None if baseline is None else baseline.trial.number,
        baseline_hours_per_run=None if baseline is None else baseline.hours,
        baseline_cost_per_run_usd=None if baseline is None else baseline.cost,
        speedup_vs_baseline=None if baseline is None else baseline.hours / winner.hours,
        usd_saved_per_run=None if baseline is None else baseline.cost - winner.cost,
        constraints=constraints.describe(),
    )


def _baseline(study_row: StudyRow, priced: list[_Priced]) -> _Priced | None:
    if not study_row.baseline:
        return None
    matches = [p for p in priced if p.trial.config == study_row.baseline]
    return min(matches, key=lambda p: p.trial.number) if matches else None
