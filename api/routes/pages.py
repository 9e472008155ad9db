"""Dashboard pages: the studies overview and one page per study, rendered server-side.

The study page embeds its figures as JSON; dashboards/static/study.js draws them with the
bundled plotly.js and keeps the page live by polling the trials API.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import FileResponse, HTMLResponse
from starlette.templating import Jinja2Templates

from api.deps import StoreDep
from api.routes.studies import study_detail, study_summaries
from api.schemas import BestConfig, TrialSummary
from dashboards import figures, path_segment, plotly_js_path
from sweeper import recommend
from sweeper.errors import NoResultError

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
def overview(request: Request, store: StoreDep) -> HTMLResponse:
    return render_page(request, "index.html", {"studies": study_summaries(store)})


@router.get("/studies/{name}", response_class=HTMLResponse)
def study_page(name: str, request: Request, store: StoreDep) -> HTMLResponse:
    study = study_detail(store, name)
    trials = [TrialSummary.model_validate(trial) for trial in store.list_trials(name)]
    try:
        best: BestConfig | None = BestConfig.model_validate(recommend.best(store, name))
    except NoResultError:
        best = None
    context: dict[str, Any] = {
        "study": study,
        "trials": trials,
        "best": best,
        "config_keys": _config_keys(trials),
        "color_by": COLOR_BY,
        # Read by study.js: the figures to draw and what the page already shows.
        "live": {
            "trials_url": f"/api/studies/{path_segment(name)}/trials",
            "study_state": study.state,
            "trials": [{"number": t.number, "state": t.state} for t in trials],
            "figures": {
                "history": figures.history_figure(figures.history_rows(trials)),
                "throughput": figures.throughput_figure(
                    figures.throughput_rows(trials, color_by=COLOR_BY), color_by=COLOR_BY
                ),
            },
        },
    }
    return render_page(request, "study.html", context)


def _config_keys(trials: list[TrialSummary]) -> list[str]:
    """Every knob that appears in any trial's config, in first-seen order."""
    keys: dict[str, None] = {}
    for trial in trials:
        keys.update(dict.fromkeys(trial.config))
    return list(keys)
