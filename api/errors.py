"""Map sweeper's exceptions to HTTP responses, at this one boundary.

    StudyNotFoundError  → 404
    NoResultError       → 409  (the study exists but nothing completed yet)
    ConflictError       → 409  (e.g. deleting a running study)
    SpaceError          → 422  (a config that the study's space cannot run)
    StorageError        → 503  (the database is unreachable or broken; retry later)

Under /api (and /static) the body is JSON ``{"detail": "<message>"}``; dashboard pages get the
same message as an HTML error page.
"""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exception_handlers import http_exception_handler
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import Response

from api.routes.pages import render_page
from sweeper.errors import (
    ConflictError,
    NoResultError,
    SpaceError,
    StorageError,
    StudyNotFoundError,
    SweeperError,
)

logger = logging.getLogger(__name__)

STATUS_BY_ERROR: dict[type[SweeperError], int] = {
    StudyNotFoundError: 404,
    NoResultError: 409,
    ConflictError: 409,
    SpaceError: 422,
    StorageError: 503,
}
_MACHINE_PREFIXES = ("/api/", "/static/")


def install_error_handlers(app: FastAPI) -> None:
    for error_type in STATUS_BY_ERROR:
        app.add_exception_handler(error_type, _sweeper_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)


def wants_html(request: Request) -> bool:
    """Dashboard pages get HTML errors; the REST API and static files get JSON."""
    path = request.url.path.removeprefix(request.scope.get("root_path", ""))
    return not path.startswith(_MACHINE_PREFIXES) and path != "/openapi.json"


def error_page(request: Request, status_code: int, detail: str) -> Response:
    return render_page(
        request, "error.html", {"status_code": status_code, "detail": detail}, status_code
    )


async def _sweeper_error(request: Request, exc: Exception) -> Response:
    status_code = next(STATUS_BY_ERROR[cls] for cls in type(exc).__mro__ if cls in STATUS_BY_ERROR)
    if status_code >= 500:
        logger.error("%s %s: %s", request.method, request.url.path, exc)
    if wants_html(request):
        return error_page(request, status_code, str(exc))
    return JSONResponse({"detail": str(exc)}, status_code=status_code)


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, StarletteHTTPException)
    if wants_html(request) and exc.status_code >= 400:
        return error_page(request, exc.status_code, str(exc.detail))
    return await http_exception_handler(request, exc)
