"""What one config gave, as the search loop keeps it, and how Optuna is told it."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import optuna

from sweeper.noise import Sample
from sweeper.search import CONSTRAINT, INFEASIBLE_KINDS
from sweeper.store import TrialRow


@dataclass(frozen=True)
class Outcome:
    """What one config gave: its $/run, or how it failed (``failure_kind``: FAILURE_KINDS)."""

    number: int
    cost: float | None = None
    failure_kind: str | None = None
    predicted: bool = False  # not run: known to fail from another trial (out of memory)
    spread: float = 0.0  # half-width of the $/run's 95% interval, relative (0: unknown)
    sample: Sample | None = None  # the measurement (``sweeper.noise``), when it was measured
    # what the failure said (``TrialRow.failure_message``): said, not part of what it gave
    message: str | None = field(default=None, compare=False)

    @classmethod
    def of_row(cls, row: TrialRow) -> Outcome:
        """What a finished trial of our table gave."""
        cost = row.cost_per_run_usd if row.state == "complete" else None
        return cls(
            number=row.number,
            cost=cost,
            failure_kind=None if cost is not None else (row.failure_kind or "error"),
            predicted=row.state == "pruned",
            spread=row.cost_ci95_rel or 0.0,
            message=row.failure_message if cost is None else None,
        )

    @property
    def feasible(self) -> bool:
        return self.cost is not None

    @property
    def infeasible(self) -> bool:
        return self.failure_kind in INFEASIBLE_KINDS


def worst_cost(costs: Iterable[float | None]) -> float:
    """What an infeasible config is told: the worst $/run measured so far (1.0 before any)."""
    measured = [c for c in costs if c is not None]
    return max(measured) if measured else 1.0


def tell(study: optuna.Study, trial: optuna.Trial, outcome: Outcome, worst_cost: float) -> None:
    """Tell Optuna ``outcome`` for ``trial`` (``sweeper.search``): a measured config its $/run;
    one that cannot run here (out of memory, unsupported) ``worst_cost`` with the constraint
    violated; anything else (timed out, killed, a bug) a failure the sampler does not learn
    from. A trial already told (by the reaper of another worker that found it orphaned, from
    the same record) is left as it is."""
    if outcome.feasible:
        trial.set_constraint(CONSTRAINT, 0.0)
        study.tell(trial, outcome.cost, skip_if_finished=True)
    elif outcome.infeasible:
        if outcome.failure_kind is not None:
            trial.set_user_attr("failure_kind", outcome.failure_kind)
        trial.set_constraint(CONSTRAINT, 1.0)
        # a value is required; samplers that read constraints rank it below every
        # feasible trial whatever it is: the worst $/run so far keeps it in scale
        study.tell(trial, worst_cost, skip_if_finished=True)
    else:
        study.tell(trial, state=optuna.trial.TrialState.FAIL, skip_if_finished=True)
