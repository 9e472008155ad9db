"""REST: studies, their trials, and the recommended (cheapest) config, under /api/studies."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, HTTPException, Query
from fastapi.responses import PlainTextResponse

from api.deps import StoreDep
from api.schemas import BestConfig, StudyDetail, StudySummary, TrialDetail, TrialState, TrialSummary
from sweeper import recommend
from sweeper.export import MEDIA_TYPES, ExportFormat, render
from sweeper.store import Store, StudyRow
from sweeper.store.models import TRIAL_STATES

router = APIRouter(prefix="/api/studies", tags=["studies"])


def _summary_fields(study: StudyRow, totals: dict[str, Any]) -> dict[str, Any]:
    return {
        "name": study.name,
        "state": study.state,
        "hardware_name": study.hardware_name,
        "usd_per_hour": study.usd_per_hour,
        "device": study.device,
        "samples": study.samples,
        "epochs": study.epochs,
        "n_trials_planned": study.n_trials_planned,
        # Every state is listed, so clients need no "missing key means zero" rule.
        "trials": {state: 0 for state in TRIAL_STATES} | totals["trials"],
        "best_cost_per_run_usd": totals["best_cost_per_run_usd"],
        "created_at": study.created_at,
        "updated_at": study.updated_at,
    }


def study_summaries(store: Store) -> list[StudySummary]:
    """Every study, oldest first, with trial counts per state and best $/run."""
    return [
        StudySummary.model_validate(_summary_fields(study, totals))
        for study, totals in store.list_studies()
    ]


def study_detail(store: Store, name: str) -> StudyDetail:
    """One study's summary plus its space file; raises StudyNotFoundError."""
    study = store.get_study(name)
    totals: dict[str, Any] = next(
        (totals for row, totals in store.list_studies() if row.id == study.id),
        {"trials": {}, "best_cost_per_run_usd": None},
    )
    return StudyDetail.model_validate(
        _summary_fields(study, totals)
        | {"space_yaml": study.space_yaml, "dataset_stats": study.dataset_stats}
    )


@router.get("", response_model=list[StudySummary])
def list_studies(store: StoreDep) -> list[StudySummary]:
    """All studies with trial counts per state and the best $/run found so far."""
    return study_summaries(store)


@router.get("/{name}", response_model=StudyDetail)
def get_study(name: str, store: StoreDep) -> StudyDetail:
    """One study: its summary, the space YAML it ran, and its dataset statistics."""
    return study_detail(store, name)


@router.get("/{name}/trials", response_model=list[TrialSummary])
def list_trials(
    name: str,
    store: StoreDep,
    after: Annotated[
        int | None, Query(description="only trials numbered above this (for polling)")
    ] = None,
    state: Annotated[
        list[TrialState] | None, Query(description="keep these states; repeat to give several")
    ] = None,
    limit: Annotated[int | None, Query(ge=1, le=10_000)] = None,
    offset: Annotated[int, Query(ge=0)] = 0,
) -> list[TrialSummary]:
    """Trials in number order, without the raw measurement (see /trials/{number})."""
    trials = store.list_trials(name, after=after, states=state, limit=limit, offset=offset)
    return [TrialSummary.model_validate(trial) for trial in trials]


@router.get("/{name}/trials/{number}", response_model=TrialDetail)
def get_trial(name: str, number: int, store: StoreDep) -> TrialDetail:
    """One trial with its raw measurement (per-step times, stats)."""
    trial = store.get_trial(name, number)
    if trial is None:
        raise HTTPException(status_code=404, detail=f"study {name!r} has no trial {number}")
    return TrialDetail.model_validate(trial)


def _constraints(
    usd_per_hour: Annotated[
        float | None, Query(gt=0, description="re-price at this $/h (no new measurement)")
    ] = None,
    max_hours: Annotated[float | None, Query(gt=0, description="deadline for the run")] = None,
    max_cost_usd: Annotated[float | None, Query(gt=0, description="budget for the run")] = None,
    min_memory_headroom: Annotated[
        float | None,
        Query(ge=0, lt=1, description="share of device memory that must stay free at peak"),
    ] = None,
    allow_truncation: Annotated[
        bool, Query(description="consider configs whose max_seq_length truncates the data")
    ] = False,
) -> recommend.Constraints:
    return recommend.Constraints(
        usd_per_hour=usd_per_hour,
        max_hours=max_hours,
        max_cost_usd=max_cost_usd,
        min_memory_headroom=min_memory_headroom,
        allow_truncation=allow_truncation,
    )


ConstraintsDep = Annotated[recommend.Constraints, Depends(_constraints)]


@router.get(
    "/{name}/best",
    response_model=BestConfig,
    responses={409: {"description": "no completed trial yet, or none meets the constraints"}},
)
def get_best(name: str, store: StoreDep, constraints: ConstraintsDep) -> BestConfig:
    """The recommended config: the cheapest completed trial ($/run) within the constraints
    that does not truncate the data (unless allowed), ties to the earlier one, compared with
    the space's baseline and with what the sweep cost."""
    return BestConfig.model_validate(recommend.best(store, name, constraints))


@router.get(
    "/{name}/compare",
    response_model=recommend.Comparison,
    responses={409: {"description": "no study of this workload has an eligible trial"}},
)
def compare_hardware(
    name: str, store: StoreDep, constraints: ConstraintsDep
) -> recommend.Comparison:
    """Every study of the same workload (other hardware at its own price): the cheapest
    option and the Pareto front of $ against hours. ``usd_per_hour`` is ignored here."""
    return recommend.compare(store, name, constraints)


@router.get(
    "/{name}/export",
    response_class=PlainTextResponse,
    responses={409: {"description": "the study has no completed trial yet"}},
)
def export_best(
    name: str,
    store: StoreDep,
    fmt: Annotated[ExportFormat, Query(alias="format")] = "trainer",
) -> PlainTextResponse:
    """The recommended config as a TrainingArguments or DataLoader snippet, YAML or JSON."""
    recommendation = recommend.best(store, name)
    text = render(recommendation, fmt, store.get_study(name).space_yaml)
    return PlainTextResponse(text, media_type=MEDIA_TYPES[fmt])
