"""Dashboard pages: the studies overview and one page per study, rendered server-side.

The study page fetches its figures as JSON; dashboards/static/study.js draws them with the
bundled plotly.js and keeps the page live by polling the trials API.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Any
from urllib.parse import urlencode

from fastapi import APIRouter, Query, Request
from fastapi.responses import FileResponse, HTMLResponse, Response
from starlette.templating import Jinja2Templates

from api.cache import EncodedJSON, StudyCache
from api.deps import INT32_MAX, CacheDep, StoreDep, StudyName
from api.routes.studies import study_detail, study_summaries
from api.schemas import BestConfig, TrialSummary
from dashboards import figures, path_segment, plotly_js_path
from dashboards import offers as offer_view
from sweeper import compare, importance, recommend, verdict
from sweeper.errors import ConflictError, NoResultError, NothingMeetsError, SweeperError
from sweeper.export import page_label, render, study_formats
from sweeper.knob_values import OWN_LABEL, UNREACHED_LABEL, UNREACHED_WHY, as_ran
from sweeper.knobs import KNOBS, describe
from sweeper.measurement import TABLE_METRICS
from sweeper.offers import OfferTable
from sweeper.store import Store, TrialMetrics
from sweeper.studyfile import padding_counted

router = APIRouter(include_in_schema=False)

COLOR_BY = "attn_implementation"


def render_page(
    request: Request, name: str, context: dict[str, Any], status_code: int = 200
) -> HTMLResponse:
    """A dashboard template rendered with the app's Jinja environment (autoescape on)."""
    templates: Jinja2Templates = request.app.state.templates
    return templates.TemplateResponse(
        request,
        name,
        context,
        status_code=status_code,
    )


@router.get("/static/plotly.min.js")
def plotly_js() -> FileResponse:
    """plotly.js from the installed plotly package: no CDN, works offline.

    Page URLs carry plotly's version (dashboards.ASSET_URLS), so a year-long cache is safe.
    """
    return FileResponse(
        plotly_js_path(),
        media_type="text/javascript",
        headers={"Cache-Control": "public, max-age=31536000, immutable"},
    )


@router.get("/", response_class=HTMLResponse)
def overview(request: Request, store: StoreDep, cache: CacheDep) -> HTMLResponse:
    studies = study_summaries(store)
    recommendations = {s.name: _recommendation(store, cache, s.name) for s in studies}
    return render_page(
        request,
        "index.html",
        {"studies": studies, "recommendations": recommendations, "config_text": describe},
    )


def _recommendation(store: Store, cache: StudyCache, name: str) -> BestConfig | None:
    """The study's recommendation as its page shows it (None: none yet, or none it can give)."""
    try:
        return cache.get(
            store, name, ("best", recommend.Constraints()), lambda: recommend.best(store, name)
        )
    except SweeperError:  # no eligible trial yet, a study of an older schema
        return None


# Columns of the trials table that sort, and the direction a first click sorts them in (the
# better end first).
SORTABLE = {"number": False} | {m.name: m.better == "higher" for m in TABLE_METRICS if m.sortable}
PAGE_SIZE = 100
# The table's metric columns: what a run costs first (the answer), then how it was measured.
_FIRST = ("cost_per_run_usd", "cost_ci95_rel", "hours_per_run")
TABLE_COLUMNS = tuple(
    sorted(TABLE_METRICS, key=lambda m: _FIRST.index(m.name) if m.name in _FIRST else len(_FIRST))
)


@router.get("/studies/{name}", response_class=HTMLResponse)
def study_page(
    name: StudyName,
    request: Request,
    store: StoreDep,
    cache: CacheDep,
    sort: str = "number",
    descending: bool = False,
    page: Annotated[int, Query(ge=1, le=INT32_MAX)] = 1,
    # the offers form's fields, REST /compare's names (max_cost: the CLI's); read as text so
    # that a bad one re-shows the form with what is wrong, not a bare 422
    max_hours: str | None = None,
    max_cost_usd: str | None = None,
    max_cost: str | None = None,
    gpus: Annotated[list[str] | None, Query()] = None,
) -> HTMLResponse:
    study = study_detail(store, name)
    if sort not in SORTABLE:
        sort = "number"
    total = store.count_trials(name)
    pages = max(1, -(-total // PAGE_SIZE))
    page = min(page, pages)
    trials = [
        TrialSummary.model_validate(trial)
        for trial in store.list_trials(
            name, sort=sort, descending=descending, limit=PAGE_SIZE, offset=(page - 1) * PAGE_SIZE
        )
    ]
    no_best: NoResultError | None = None  # why there is no answer (and the truncating best)
    try:
        best: BestConfig | None = cache.get(
            store, name, ("best", recommend.Constraints()), lambda: recommend.best(store, name)
        )
    except NoResultError as e:
        best, no_best = None, e
    exports: dict[str, tuple[str, str]] = {}
    effects = None
    if best is not None:
        # the same cache entry as REST's /knob-effects without constraints
        effects = cache.get(
            store,
            name,
            ("knob-effects", recommend.Constraints()),
            lambda: verdict.study_knob_effects(store, name),
        )
        # rendered once per state of the study (the three took 180 ms at 10,000 trials: each
        # reads the stored space), cached beside the recommendation they come from
        exports = cache.get(
            store, name, ("page-exports",), lambda: _exports(store, best, study.space_yaml)
        )
    # running; measured only while the machine was shared (the page warns once, above the
    # figures); and numbers with no row: Optuna numbers the proposals, and one that repeated a
    # measured config (or one another worker had taken) ran nothing, which the page says
    marks = store.trial_marks(name, rows=total)
    offers = _offers_asked(store, cache, name, max_hours, max_cost_usd or max_cost, gpus)
    context: dict[str, Any] = {
        "offers": offers,
        "study": study,
        "trials": trials,
        "best": best,
        "knob_effects": effects,
        # trials recorded before MFU counted real tokens only: their MFU counts padding
        "mfu_padding": cache.get(
            store,
            name,
            ("mfu-padding", sort, descending, page),
            lambda: padding_counted(store, name, trials),
        ),
        "no_best": no_best,
        "no_best_line": describe(no_best.fallback.config)  # type: ignore[union-attr]
        if getattr(no_best, "fallback", None) is not None
        else None,
        "contended": marks.contended,
        "skipped": marks.skipped,
        "exports": exports,
        "config_keys": _config_keys(trials),
        "knob_labels": {knob.name: knob.label for knob in KNOBS},
        "config_text": describe,
        "own_label": OWN_LABEL,
        "unreached_label": UNREACHED_LABEL,
        "unreached_why": UNREACHED_WHY,
        "color_by": COLOR_BY,
        "slice_points": figures.SLICE_POINTS_PER_VALUE,
        "table": {
            "sort": sort,
            "descending": descending,
            "page": page,
            "pages": pages,
            "total": total,
            "sortable": SORTABLE,
            "metrics": TABLE_COLUMNS,
        },
        # Read by study.js: where to poll, what the page already shows, where the figures are.
        "live": {
            "trials_url": f"/api/studies/{path_segment(name)}/trials",
            "figures_url": f"/studies/{path_segment(name)}/figures.json",
            "importance_url": f"/studies/{path_segment(name)}/importance-figure.json",
            "study_state": study.state,
            "highest": marks.highest,
            "running": marks.running,
        },
    }
    failed = offers is not None and offers["query"].errors
    return render_page(request, "study.html", context, status_code=422 if failed else 200)


def _offers_asked(
    store: Store,
    cache: StudyCache,
    name: str,
    max_hours: str | None,
    max_cost_usd: str | None,
    gpus: Sequence[str] | None,
) -> dict[str, Any] | None:
    """The offers section: the form as asked, and the table under its constraints, each row
    marked and the cheapest that meets named (``compare.compare``'s answer, as REST and the
    CLI give it); None when the study has nothing to price yet."""
    everything = cache.get(store, name, ("offers",), lambda: _offers(store, name))
    if everything is None:
        return None
    catalog = {c.key: c.name for c in offer_view.gpu_choices(everything, offer_view.OfferQuery())}
    query = offer_view.read_query(max_hours, max_cost_usd, gpus, catalog, everything.catalog)
    table: OfferTable | None = everything
    measured_meets = True
    if query.errors:
        table = None
    elif query.asked:
        table, measured_meets = cache.get(
            store,
            name,
            ("offers", query.constraints, query.gpus),
            lambda: _offers_under(store, name, query),
        )
    constraints = query.constraints
    limits = {"max_hours": query.max_hours, "max_cost_usd": query.max_cost_usd}
    rest = [(k, f"{v:g}") for k, v in limits.items() if v is not None]
    rest += [("gpus", key) for key in query.gpus or ()]
    return {
        "query": query,
        "choices": offer_view.gpu_choices(everything, query),
        "table": table,
        "rows": [] if table is None else offer_view.marked_rows(table, constraints),
        "notes": {} if table is None else offer_view.shared_notes(table),
        "lines": []
        if table is None
        else offer_view.headline(table, constraints, measured_meets=measured_meets),
        "constrained": constraints.describe() if query.asked else "",
        # REST's /compare answers 409 only when neither a measured config nor an offer meets
        "rest_refuses": table is not None and table.cheapest is None and not measured_meets,
        "rest_url": f"/api/studies/{path_segment(name)}/compare"
        + (f"?{urlencode(rest)}" if rest else ""),
        # kept by the trials table's sort and page links, so a click there keeps the limits
        "params": f"&{urlencode(rest)}" if rest and not query.errors else "",
    }


def _offers_under(
    store: Store, name: str, query: offer_view.OfferQuery
) -> tuple[OfferTable | None, bool]:
    """The table under the form's constraints, and whether a measured config meets them
    (REST's ``recommended`` is not null); when nothing meets, the table that says so."""
    try:
        comparison = compare.compare(store, name, query.constraints, offers=True, gpus=query.gpus)
    except NothingMeetsError as e:
        return (e.offers if isinstance(e.offers, OfferTable) else None), False
    except SweeperError:  # a catalog this server cannot read
        return None, False
    return comparison.offers, comparison.recommended is not None


def _offers(store: Store, name: str) -> OfferTable | None:
    """The job on every GPU of the catalog (``best --across-hardware``'s table); None when
    the study has nothing to price yet, or its space names a catalog this server cannot read."""
    try:
        return compare.compare(store, name, offers=True).offers
    except SweeperError:
        return None


def _exports(store: Store, best: BestConfig, space_yaml: str) -> dict[str, tuple[str, str]]:
    """The copy buttons' texts, format → (label, text), in the order the page offers them:
    the forms that apply to the study (``page_formats``; a script's, as its winner's recorder
    said what the script is)."""
    exports: dict[str, tuple[str, str]] = {}
    for fmt in study_formats(store, best, space_yaml):
        try:
            text = render(best, fmt, space_yaml)
        except (KeyError, ValueError, SweeperError) as e:  # e.g. a config from an old schema
            text = f"# cannot export this config: {e!r}"
        exports[fmt] = (page_label(fmt, space_yaml), text)
    return exports


@router.get("/studies/{name}/figures.json")
def study_figures_json(
    name: StudyName, request: Request, store: StoreDep, cache: CacheDep
) -> Response:
    """The study page's charts but importance, as Plotly JSON (fetched after first paint)."""
    body = cache.get(store, name, "figures", lambda: EncodedJSON.of(study_figures(name, store)))
    return body.response(request)


@router.get("/studies/{name}/importance-figure.json")
def importance_figure_json(
    name: StudyName, request: Request, store: StoreDep, cache: CacheDep
) -> Response:
    """The importance chart alone: the slowest to compute (seconds at 10,000 trials), so the
    page draws the others first."""
    body = cache.get(
        store, name, "importance-figure", lambda: EncodedJSON.of(importance_figure(name, store))
    )
    return body.response(request)


def study_figures(name: str, store: Store) -> dict[str, Any]:
    """The study page's charts but importance, computed from the store."""
    trials = store.trial_metrics(name)
    return {
        "history": figures.history_figure(figures.history_rows(trials)),
        "throughput": figures.throughput_figure(
            figures.throughput_rows(trials, color_by=COLOR_BY), color_by=COLOR_BY
        ),
        "parallel": figures.parallel_figure(figures.parallel_rows(trials)),
        "slice": figures.slice_figure(figures.slice_rows(trials)),
        "failures": figures.failure_figure(figures.failure_rows(trials)),
        "pareto": _pareto(store, name, trials),
    }


def importance_figure(name: str, store: Store) -> dict[str, Any]:
    """``{"importance": figure}``: each knob's share of the $/run variation (PED-ANOVA)."""
    try:
        ranked = [k.model_dump() for k in importance.importances(store, name)]
        figure = figures.importance_figure(ranked)
    except NoResultError:
        figure = figures.importance_figure(
            None, note="needs two completed trials that differ in a knob"
        )
    except ConflictError:
        figure = figures.importance_figure(
            None, note="needs the study's space file, which is not valid"
        )
    return {"importance": figure}


def _pareto(store: Store, name: str, trials: Sequence[TrialMetrics]) -> dict[str, Any]:
    """Each study of this workload (its hardware at its price) and the front across them;
    ``trials`` are study ``name``'s own."""
    anchor = store.get_study(name)
    studies = compare.same_workload(store, anchor)
    loaded = {
        row.name: trials if row.name == name else store.trial_metrics(row.name, states=["complete"])
        for row in studies
    }
    try:
        front = [p.model_dump() for p in compare.compare(store, name, loaded=loaded).pareto]
    except NoResultError:
        front = []
    points = {
        row.name: [
            {
                "hardware_name": row.hardware_name,
                "trial_number": t.number,
                "config": as_ran(t.config, t.own_values),
                "hours_per_run": t.hours_per_run,
                "cost_per_run_usd": t.cost_per_run_usd,
            }
            for t in loaded[row.name]
            if t.state == "complete"
            and t.hours_per_run is not None
            and t.cost_per_run_usd is not None
        ]
        for row in studies
    }
    return figures.pareto_figure(figures.pareto_rows(points, front))


def _config_keys(trials: list[TrialSummary]) -> list[str]:
    """The knobs whose values differ between trials, in the registry's order (a knob every
    trial sets alike says nothing in a table); then unknown keys of older configs."""
    values: dict[str, set[str]] = {}
    for trial in trials:
        for key, value in trial.ran_config.items():
            values.setdefault(key, set()).add(repr(value))
    varying = [k for k, seen in values.items() if len(seen) > 1 or len(trials) == 1]
    known = [knob.name for knob in KNOBS if knob.name in varying]
    return known + [k for k in varying if k not in known]
