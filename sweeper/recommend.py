"""The recommendation: the cheapest completed trial of a study, for the CLI and the REST API."""

from __future__ import annotations

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
    warnings: list[str] = []
    max_seq_length = winner.config.get("max_seq_length")
    cut = None if max_seq_length is None else truncation(study_row.dataset_stats, max_seq_length)
    if cut is not None and cut[0] > 0:
        # the full guard (never recommend silently, coverage percentile) is issue 4's
        warnings.append(
            f"max_seq_length {max_seq_length} truncates about "
            f"{cut[0]:.0%} of samples ({cut[1]:.0%} of tokens) of this dataset: it is cheaper "
            "partly because it trains on less text"
        )
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
        truncated_samples_share=None if cut is None else cut[0],
        warnings=tuple(warnings),
    )
