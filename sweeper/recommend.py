"""The recommendation: the cheapest completed trial of a study, for the CLI and the REST API."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sweeper.errors import NoResultError
from sweeper.store import Store, StudyRow, TrialRow


@dataclass(frozen=True, kw_only=True)
class Recommendation:
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


def rank_key(trial: TrialRow) -> tuple[float, int]:
    """Cheapest $/run first; ties go to the earlier trial, so the order is deterministic."""
    assert trial.cost_per_run_usd is not None
    return (trial.cost_per_run_usd, trial.number)


def best(store: Store, study: str) -> Recommendation:
    """The cheapest completed trial; raises NoResultError when none has completed."""
    study_row: StudyRow = store.get_study(study)
    completed = [
        t
        for t in store.list_trials(study, states=["complete"])
        if t.cost_per_run_usd is not None and t.samples_per_s is not None
    ]
    if not completed:
        raise NoResultError(f"study {study!r} has no completed trial yet")
    winner = min(completed, key=rank_key)
    assert winner.samples_per_s is not None and winner.cost_per_run_usd is not None
    return Recommendation(
        study=study,
        hardware_name=study_row.hardware_name,
        usd_per_hour=study_row.usd_per_hour,
        trial_number=winner.number,
        config=dict(winner.config),
        it_per_s=winner.it_per_s,
        samples_per_s=winner.samples_per_s,
        tokens_per_s=winner.tokens_per_s,
        hours_per_run=winner.hours_per_run,
        cost_per_run_usd=winner.cost_per_run_usd,
        peak_memory_bytes=winner.peak_memory_bytes,
        completed_trials=len(completed),
    )
