"""OpenAPI docs at /docs: Swagger UI from the installed fastapi-offline package (no CDN).

FastAPI's own /docs page loads Swagger UI from a CDN and starts it with an inline script, which
our Content-Security-Policy forbids; this one loads local files and starts it from
dashboards/static/docs.js.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse

SWAGGER_DIR = Path(str(resources.files("fastapi_offline") / "static"))

router = APIRouter(include_in_schema=False)


@router.get("/docs", response_class=HTMLResponse)
def swagger_ui(request: Request) -> HTMLResponse:
    from api.routes.pages import render_page

    return render_page(request, "docs.html", {"openapi_url": request.app.openapi_url})
