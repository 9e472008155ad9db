"""REST: studies, their trials, and the recommended (cheapest) config, under /api/studies."""

from __future__ import annotations

import difflib
from datetime import timedelta
from typing import Annotated, Any, Literal, cast

from fastapi import APIRouter, Depends, HTTPException, Query, Request, Response
from fastapi.responses import PlainTextResponse
from pydantic import TypeAdapter, ValidationError

from api.deps import INT32_MAX, CacheDep, Offset, StoreDep, StudyName, TrialNumber
from api.schemas import (
    BestConfig,
    EnqueueRequest,
    EnqueueResponse,
    StopResponse,
    StudyDetail,
    StudySummary,
    TrialDetail,
    TrialState,
    TrialSummary,
    WorkerSummary,
    assume_utc,
)
from api.security import WriteAccess
from sweeper import compare, control, importance, recommend, verdict
from sweeper.catalog import OFFER_PATTERN
from sweeper.errors import FAILURE_KINDS, ConflictError
from sweeper.export import MEDIA_TYPES, ExportFormat, render
from sweeper.settings import Settings
from sweeper.space import TrialConfig
from sweeper.store import Store, StudyRow
from sweeper.store.models import TRIAL_STATES
from sweeper.store.store import TRIAL_SORT_KEYS, utcnow
from sweeper.studyfile import model_shape, real_token_mfu

SortKey = Literal[TRIAL_SORT_KEYS]  # type: ignore[valid-type]
FailureKind = Literal[FAILURE_KINDS]  # type: ignore[valid-type]
# Lax validation turns the query's text into the knob's type ("8" → 8, "true" → True).
_KNOB_TYPES = {
    name: TypeAdapter(f.annotation)
    for name, f in TrialConfig.model_fields.items()
    if f.annotation is not None
}

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
        # the later of the study row's last change and its last trial's start or finish
        "updated_at": totals.get("updated_at", study.updated_at),
        "remeasuring": totals.get("remeasuring", []),
    }


def study_summaries(store: Store) -> list[StudySummary]:
    """Every study, oldest first, with trial counts per state and best $/run."""
    return [
        StudySummary.model_validate(_summary_fields(study, totals))
        for study, totals in store.list_studies(Settings().worker_grace_s)
    ]


def study_detail(store: Store, name: str) -> StudyDetail:
    """One study's summary plus its space file; raises StudyNotFoundError."""
    study = store.get_study(name)
    totals: dict[str, Any] = next(
        (
            totals
            for row, totals in store.list_studies(Settings().worker_grace_s)
            if row.id == study.id
        ),
        {"trials": {}, "best_cost_per_run_usd": None},
    )
    return StudyDetail.model_validate(
        _summary_fields(study, totals)
        | {
            "space_yaml": study.space_yaml,
            "dataset_stats": study.dataset_stats,
            "preflight": study.preflight,
        }
    )


@router.get("", response_model=list[StudySummary])
def list_studies(store: StoreDep) -> list[StudySummary]:
    """All studies with trial counts per state and the best $/run found so far."""
    return study_summaries(store)


@router.get("/{name}", response_model=StudyDetail)
def get_study(name: StudyName, store: StoreDep) -> StudyDetail:
    """One study: its summary, the space YAML it ran, and its dataset statistics."""
    return study_detail(store, name)


@router.get("/{name}/trials", response_model=list[TrialSummary])
def list_trials(
    request: Request,
    name: StudyName,
    store: StoreDep,
    response: Response,
    after: Annotated[
        int | None,
        Query(ge=-1, le=INT32_MAX, description="only trials numbered above this (for polling)"),
    ] = None,
    state: Annotated[
        list[TrialState] | None, Query(description="keep these states; repeat to give several")
    ] = None,
    failure_kind: Annotated[
        list[FailureKind] | None,
        Query(description="keep failures of these kinds (oom, timeout, ...)"),
    ] = None,
    config: Annotated[
        list[str] | None,
        Query(
            description="keep trials whose knob has this value, as KNOB:VALUE, e.g. "
            "per_device_batch_size:8 or packing:true; repeat to combine"
        ),
    ] = None,
    sort: Annotated[
        SortKey, Query(description="order by this column; missing values last")
    ] = "number",
    descending: bool = False,
    limit: Annotated[int, Query(ge=1, le=10_000)] = 100,
    offset: Offset = 0,
) -> list[TrialSummary]:
    """Trials (default: in number order, 100 per page), without the raw measurement (see
    /trials/{number}). ``X-Total-Count`` says how many match the filters in all. A filter
    that is misspelt (``?stat=failed``) or names no failure kind is a 422, not every trial."""
    _no_unknown_query(request)
    filters: dict[str, Any] = {
        "after": after,
        "states": state,
        "failure_kinds": failure_kind,
        "config": _config_filter(config or []),
    }
    trials = store.list_trials(
        name, **filters, sort=sort, descending=descending, limit=limit, offset=offset
    )
    response.headers["X-Total-Count"] = str(store.count_trials(name, **filters))
    return [TrialSummary.model_validate(trial) for trial in trials]


def _config_filter(items: list[str]) -> dict[str, Any]:
    """``["packing:true", "per_device_batch_size:8"]`` → typed knob values (422 if invalid)."""
    parsed: dict[str, Any] = {}
    for item in items:
        knob, sep, raw = item.partition(":")
        if not sep or knob not in _KNOB_TYPES:
            raise HTTPException(
                status_code=422,
                detail=f"config filter {item!r}: write KNOB:VALUE with KNOB one of "
                f"{', '.join(_KNOB_TYPES)}",
            )
        try:
            parsed[knob] = None if raw == "null" else _KNOB_TYPES[knob].validate_python(raw)
        except ValidationError:
            raise HTTPException(
                status_code=422, detail=f"config filter {item!r}: {raw!r} is not a valid {knob}"
            ) from None
    return parsed


@router.get("/{name}/trials/{number}", response_model=TrialDetail)
def get_trial(name: StudyName, number: TrialNumber, store: StoreDep) -> TrialDetail:
    """One trial with its raw measurement (per-step times, stats)."""
    trial = store.get_trial(name, number)
    if trial is None:
        raise HTTPException(status_code=404, detail=f"study {name!r} has no trial {number}")
    detail = TrialDetail.model_validate(trial)
    shape = model_shape(store.get_study(name).space_yaml)
    return detail.model_copy(update={"real_token_mfu": real_token_mfu(trial.measurement, shape)})


def _query_names(dependant: Any) -> set[str]:
    """The query parameters a route takes, its dependencies' included."""
    names = {field.alias for field in dependant.query_params}
    for inner in dependant.dependencies:
        names |= _query_names(inner)
    return names


def _no_unknown_query(request: Request) -> None:
    """422 for a query parameter the route does not take: on the routes that answer within
    constraints, a misspelt limit (``max_costs=50``) silently gave the unconstrained answer."""
    route = request.scope.get("route")
    dependant = getattr(route, "dependant", None)
    if dependant is None:
        return
    known = _query_names(dependant)
    unknown = sorted(set(request.query_params) - known)
    if unknown:
        said = []
        for name in unknown:
            close = difflib.get_close_matches(name, known, n=1)
            said.append(f"{name!r}" + (f" (did you mean {close[0]!r}?)" if close else ""))
        raise HTTPException(
            status_code=422,
            detail=f"unknown query parameter {', '.join(said)}; this endpoint takes "
            f"{', '.join(sorted(known))}",
        )


def _constraints(
    request: Request,
    usd_per_hour: Annotated[
        float | None,
        Query(
            gt=0,
            allow_inf_nan=False,
            description="re-price at this $ per device-hour (no new measurement); a run on N "
            "devices costs hours × N × this",
        ),
    ] = None,
    max_hours: Annotated[
        float | None, Query(gt=0, allow_inf_nan=False, description="deadline for the run")
    ] = None,
    max_cost_usd: Annotated[
        float | None, Query(gt=0, allow_inf_nan=False, description="budget for the run")
    ] = None,
    max_cost: Annotated[
        float | None,
        Query(gt=0, allow_inf_nan=False, description="max_cost_usd by the CLI's name"),
    ] = None,
    min_memory_headroom: Annotated[
        float | None,
        Query(
            ge=0,
            lt=1,
            allow_inf_nan=False,
            description="share of device memory that must stay free at peak",
        ),
    ] = None,
    allow_truncation: Annotated[
        bool, Query(description="consider configs whose max_seq_length truncates the data")
    ] = False,
) -> recommend.Constraints:
    _no_unknown_query(request)
    if max_cost is not None and max_cost_usd is not None and max_cost != max_cost_usd:
        raise HTTPException(
            status_code=422,
            detail=f"max_cost ({max_cost:g}) and max_cost_usd ({max_cost_usd:g}) are the same "
            "limit and differ; give one of them",
        )
    return recommend.Constraints(
        usd_per_hour=usd_per_hour,
        max_hours=max_hours,
        max_cost_usd=max_cost_usd if max_cost_usd is not None else max_cost,
        min_memory_headroom=min_memory_headroom,
        allow_truncation=allow_truncation,
    )


ConstraintsDep = Annotated[recommend.Constraints, Depends(_constraints)]


@router.get(
    "/{name}/best",
    response_model=BestConfig,
    responses={409: {"description": "no completed trial yet, or none meets the constraints"}},
)
def get_best(
    name: StudyName, store: StoreDep, cache: CacheDep, constraints: ConstraintsDep
) -> BestConfig:
    """The recommended config: the cheapest completed trial ($/run) within the constraints
    that does not truncate the data (unless allowed), ties to the earlier one, compared with
    the space's baseline and with what the sweep cost."""
    return cache.get(
        store, name, ("best", constraints), lambda: recommend.best(store, name, constraints)
    )


@router.get(
    "/{name}/knob-effects",
    response_model=verdict.KnobEffects,
    responses={409: {"description": "no completed trial yet, or none meets the constraints"}},
)
def get_knob_effects(
    name: StudyName, store: StoreDep, cache: CacheDep, constraints: ConstraintsDep
) -> verdict.KnobEffects:
    """What each knob the study varied is worth at the recommended config: for every other
    value measured, $/run with it ÷ $/run with the winner's, with a 95% interval, from a trial
    that differs from the winner in that knob alone, pairs elsewhere, or a main-effects model
    (``basis`` says which), and the words that follow from the interval. ``untold``: values
    the study cannot compare. About 1 s at 10,000 trials (cached until the study changes)."""
    return cache.get(
        store,
        name,
        ("knob-effects", constraints),
        lambda: verdict.study_knob_effects(store, name, constraints),
    )


@router.get(
    "/{name}/compare",
    response_model=compare.Comparison,
    responses={409: {"description": "no study of this workload has an eligible trial"}},
)
def compare_hardware(
    name: StudyName,
    store: StoreDep,
    constraints: ConstraintsDep,
    gpus: Annotated[
        list[str] | None,
        Query(
            description="catalog GPU types to price the job on (repeat it), each a key or "
            "N x key for N of them (2x h100-sxm, priced as N × its $/h); default: all. "
            f"Each matches {OFFER_PATTERN}; one that does not is refused with 422 in the "
            "CLI's words (what an offer is), not the pattern's"
        ),
    ] = None,
) -> compare.Comparison:
    """Every study of the same workload (other hardware at its own price): the recommended
    option (``recommended``: of the studies' recommendations, the lowest $/run; each is its
    study's pick among ties, so a point of the front may read cheaper; ``cheapest`` is its
    deprecated old name) and the Pareto front of $ against hours; and ``offers``: the job on
    every GPU type of the catalog (the space's ``hardware.catalog``, else the shipped one),
    measured where a study ran on it, else estimated with an error band, and the cheapest that meets
    ``max_hours`` and ``max_cost_usd``. ``usd_per_hour`` re-prices one study: refused here,
    as the CLI refuses ``--usd-per-hour`` with ``--across-hardware`` (it was ignored, and the
    answer came back unchanged with 200)."""
    if constraints.usd_per_hour is not None:
        raise HTTPException(
            status_code=422,
            detail="usd_per_hour re-prices one study (/studies/NAME/best?usd_per_hour=...); "
            "here each GPU is priced at its study's or the catalog's $/h: drop it, or change "
            "the price in the catalog (the space's hardware.catalog)",
        )
    return compare.compare(store, name, constraints, offers=True, gpus=gpus)


@router.get(
    "/{name}/export",
    response_class=PlainTextResponse,
    responses={409: {"description": "the study has no completed trial yet"}},
)
def export_best(
    name: StudyName,
    store: StoreDep,
    fmt: Annotated[ExportFormat, Query(alias="format")] = "trainer",
) -> PlainTextResponse:
    """The recommended config as a TrainingArguments, SFTConfig or DataLoader snippet, YAML or
    JSON; for a study of your own script, its command (format=command) or the DataLoader
    keywords its trials ran (format=dataloader)."""
    recommendation = recommend.best(store, name)
    text = render(recommendation, fmt, store.get_study(name).space_yaml)
    return PlainTextResponse(text, media_type=MEDIA_TYPES[fmt])


@router.get(
    "/{name}/pareto",
    response_model=list[compare.ParetoPoint],
    responses={409: {"description": "no study of this workload has an eligible trial"}},
)
def pareto_front(
    name: StudyName, store: StoreDep, constraints: ConstraintsDep
) -> list[compare.ParetoPoint]:
    """The Pareto front of $/run against hours/run over every study of this workload (each
    hardware at its own price): no point on it is both cheaper and faster than another."""
    return compare.compare(store, name, constraints).pareto


@router.get(
    "/{name}/importance",
    response_model=list[importance.KnobImportance],
    responses={409: {"description": "fewer than two completed trials that differ"}},
)
def knob_importance(
    name: StudyName,
    store: StoreDep,
    cache: CacheDep,
    target: importance.Target = "cost_per_run_usd",
    evaluator: importance.Evaluator = "ped_anova",
) -> list[importance.KnobImportance]:
    """How much each knob explains of the target (Optuna's PED-ANOVA or fANOVA evaluator over
    the completed trials), most important first; shares sum to 1. fANOVA is slow on large
    studies (a random forest: 18 s for 8,500 trials on 2 cores, PED-ANOVA 0.3 s)."""
    return cache.get(
        store,
        name,
        ("importance", target, evaluator),
        lambda: importance.importances(store, name, target=target, evaluator=evaluator),
    )


@router.get("/{name}/workers", response_model=list[WorkerSummary])
def list_workers(name: StudyName, store: StoreDep) -> list[WorkerSummary]:
    """The sweep processes that worked on the study, oldest first: host, pid, GPUs, state and
    how many trials each ran. A worker whose heartbeat is older than
    ``SWEEPER_WORKER_GRACE_S`` is ``silent`` (killed, or its machine lost)."""
    silent_before = utcnow() - timedelta(seconds=Settings().worker_grace_s)
    return [
        WorkerSummary(
            id=worker.id,
            host=worker.host,
            pid=worker.pid,
            devices=worker.devices,
            state="silent"
            if worker.state == "alive" and assume_utc(worker.heartbeat_at) < silent_before
            else cast(Any, worker.state),  # alive, done or lost: the model checks it
            trials=trials,
            device_seconds=worker.device_seconds or 0.0,
            started_at=worker.started_at,
            heartbeat_at=worker.heartbeat_at,
            finished_at=worker.finished_at,
        )
        for worker, trials in store.list_workers(name)
    ]


# ------------------------------------------------------------------ writes (bearer token)

_WRITE_RESPONSES: dict[int | str, dict[str, Any]] = {
    401: {"description": "missing or wrong bearer token"},
    403: {"description": "the server is read-only (no SWEEPER_API_TOKEN)"},
}


@router.post(
    "/{name}/trials",
    response_model=EnqueueResponse,
    status_code=202,
    dependencies=[WriteAccess],
    responses=_WRITE_RESPONSES
    | {409: {"description": "already measured"}, 422: {"description": "not in the space"}},
)
def enqueue_trial(name: StudyName, body: EnqueueRequest, store: StoreDep) -> EnqueueResponse:
    """Queue a config to measure: the running sweep runs it next (or the next ``sweeper
    launch`` of this study does). It must be a config of the study's space."""
    params = control.enqueue_config(store, name, body.config)
    running = store.get_study(name).state == "running"
    return EnqueueResponse(
        study=name,
        queued=params,
        note="the running sweep picks it up after its current trial"
        if running
        else "queued; it runs when this study's sweep is launched again",
    )


@router.post(
    "/{name}/stop",
    response_model=StopResponse,
    status_code=202,
    dependencies=[WriteAccess],
    responses=_WRITE_RESPONSES | {409: {"description": "the study is not running"}},
)
def stop_study(name: StudyName, store: StoreDep) -> StopResponse:
    """Ask the running sweep to stop: its running trial finishes and is recorded, then the
    sweep ends with state ``stopped``. Finished trials and the recommendation stay."""
    if not store.request_stop(name):
        state = store.get_study(name).state
        raise ConflictError(f"study {name!r} is {state}, not running: nothing to stop")
    return StopResponse(
        study=name, state="stopping", note="the sweep stops after its running trial"
    )


@router.delete(
    "/{name}",
    status_code=204,
    dependencies=[WriteAccess],
    responses=_WRITE_RESPONSES | {409: {"description": "the study is running"}},
)
def delete_study(name: StudyName, store: StoreDep) -> Response:
    """Delete a study that is not running, with its trials (ours and Optuna's)."""
    control.delete_study(store, name, grace_s=Settings().worker_grace_s)
    return Response(status_code=204)
