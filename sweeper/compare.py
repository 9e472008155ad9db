"""One job across machines: the studies that price the same workload (an H100, an A100, an RTX
4090, each at its own $/h) compared: the cheapest option under the constraints, each study's
recommendation (``sweeper.recommend``), and the Pareto front of $ against hours per run."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict

from sweeper.errors import NoResultError
from sweeper.recommend import Constraints, Recommendation, StudyFacts, decide
from sweeper.store import Store, TrialMetrics


class ParetoPoint(BaseModel):
    """A config no other beats on both hours and $ per run."""

    model_config = ConfigDict(frozen=True)

    study: str
    hardware_name: str
    usd_per_hour: float
    trial_number: int
    config: dict[str, Any]
    hours_per_run: float
    cost_per_run_usd: float


class Comparison(BaseModel):
    """The same job on several machines: the cheapest option, each study's best, the front."""

    model_config = ConfigDict(frozen=True)

    workload_hash: str | None
    cheapest: Recommendation
    fastest: ParetoPoint
    per_study: list[Recommendation]
    unavailable: dict[str, str]  # study → why it has no recommendation
    pareto: list[ParetoPoint]  # by hours, ascending (so by $, descending)
    constraints: str


def pareto_front(points: Iterable[ParetoPoint]) -> list[ParetoPoint]:
    """Points not dominated on (hours, $); equal points keep the first study/trial.

    >>> p = lambda n, h, c: ParetoPoint(study="s", hardware_name="h", usd_per_hour=1,
    ...     trial_number=n, config={}, hours_per_run=h, cost_per_run_usd=c)
    >>> [q.trial_number for q in pareto_front([p(0, 10, 5), p(1, 8, 6), p(2, 9, 7), p(3, 12, 4)])]
    [1, 0, 3]
    """
    ordered = sorted(
        points, key=lambda q: (q.hours_per_run, q.cost_per_run_usd, q.study, q.trial_number)
    )
    front: list[ParetoPoint] = []
    for point in ordered:
        if not front or point.cost_per_run_usd < front[-1].cost_per_run_usd:
            front.append(point)
    return front


def compare(
    store: Store,
    study: str,
    constraints: Constraints | None = None,
    *,
    loaded: Mapping[str, Sequence[TrialMetrics]] | None = None,
) -> Comparison:
    """Every study pricing the same workload as ``study`` (e.g. H100, A100, RTX 4090 at their
    own prices): the cheapest option under the constraints and the Pareto front of $ vs hours.

    ``constraints.usd_per_hour`` is ignored here: each machine keeps its own price.
    ``loaded``: trials a caller already has, by study name (only completed ones count); the
    other studies' trials are read from the store.
    """
    constraints = constraints or Constraints()
    per_study_constraints = Constraints(
        max_hours=constraints.max_hours,
        max_cost_usd=constraints.max_cost_usd,
        min_memory_headroom=constraints.min_memory_headroom,
        allow_truncation=constraints.allow_truncation,
    )
    anchor = store.get_study(study)
    rows = [anchor]
    if anchor.workload_hash:
        rows = store.studies_of_workload(anchor.workload_hash)
    recommendations: list[Recommendation] = []
    unavailable: dict[str, str] = {}
    points: list[ParetoPoint] = []
    for row in rows:
        facts = StudyFacts.of(row)
        if loaded is not None and row.name in loaded:
            trials = loaded[row.name]
        else:
            trials = store.trial_metrics(row.name, states=["complete"])
        try:
            recommendation, eligible = decide(facts, trials, per_study_constraints)
        except NoResultError as e:
            unavailable[row.name] = str(e)
            continue
        recommendations.append(recommendation)
        points += [
            ParetoPoint(
                study=row.name,
                hardware_name=row.hardware_name,
                usd_per_hour=row.usd_per_hour,
                trial_number=c.trial.number,
                config=dict(c.trial.config),
                hours_per_run=c.hours,
                cost_per_run_usd=c.cost,
            )
            for c in eligible
        ]
    if not recommendations:
        raise NoResultError(
            "no study of this workload has an eligible trial: "
            + "; ".join(f"{name}: {why}" for name, why in unavailable.items())
        )
    front = pareto_front(points)
    return Comparison(
        workload_hash=anchor.workload_hash,
        cheapest=min(
            recommendations, key=lambda r: (r.cost_per_run_usd, r.hours_per_run or 0.0, r.study)
        ),
        fastest=front[0],
        per_study=recommendations,
        unavailable=unavailable,
        pareto=front,
        constraints=per_study_constraints.describe(),
    )
