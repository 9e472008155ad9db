"""Map sweeper's exceptions to HTTP responses, at this one boundary.

    StudyNotFoundError  → 404
    NoResultError       → 409  (the study exists but nothing completed yet); when every
                               completed trial truncates (TruncatesOnlyError), the body adds
                               ``fix`` and ``fallback``: the best truncating config, with its cut
    ConflictError       → 409  (e.g. deleting a running study)
    SpaceError          → 422  (a config that the study's space cannot run)
    CatalogError        → 422  (a GPU type the catalog lacks, or a space's catalog file is bad)
    StorageError        → 503  (the database is unreachable or broken; retry later)
    invalid request     → 422  (what is wrong and where; never the input echoed back)
    body over 1 MiB     → 413

No error body carries SQL, bind parameters or a database URL: a 503 says what failed in
general terms and the server's log has the details.

Under /api (and /static) the body is JSON ``{"detail": "<message>"}``; dashboard pages get the
same message as an HTML error page.
"""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exception_handlers import http_exception_handler
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import Response

from api.routes.pages import render_page
from sweeper.errors import (
    CatalogError,
    ConflictError,
    NoResultError,
    NothingMeetsError,
    SpaceError,
    StorageError,
    StudyNotFoundError,
    SweeperError,
    TruncatesOnlyError,
)

logger = logging.getLogger(__name__)

STATUS_BY_ERROR: dict[type[SweeperError], int] = {
    StudyNotFoundError: 404,
    NoResultError: 409,
    ConflictError: 409,
    SpaceError: 422,
    CatalogError: 422,
    StorageError: 503,
}
_MACHINE_PREFIXES = ("/api/", "/static/")


def install_error_handlers(app: FastAPI) -> None:
    for error_type in STATUS_BY_ERROR:
        app.add_exception_handler(error_type, _sweeper_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_exception_handler(RequestValidationError, _validation_error)


def wants_html(request: Request) -> bool:
    """Dashboard pages get HTML errors; the REST API and static files get JSON."""
    path = request.url.path.removeprefix(request.scope.get("root_path", ""))
    return not path.startswith(_MACHINE_PREFIXES) and path != "/openapi.json"


def error_page(request: Request, status_code: int, detail: str) -> Response:
    return render_page(
        request, "error.html", {"status_code": status_code, "detail": detail}, status_code
    )


STORAGE_DETAIL = (
    "the database failed or cannot be reached; try again shortly (the server's log says why)"
)


async def _sweeper_error(request: Request, exc: Exception) -> Response:
    status_code = next(STATUS_BY_ERROR[cls] for cls in type(exc).__mro__ if cls in STATUS_BY_ERROR)
    detail = str(exc)
    if status_code >= 500:
        logger.error("%s %s: %s", request.method, request.url.path, exc)
        detail = STORAGE_DETAIL  # the message names SQL, parameters and the database
    if wants_html(request):
        return error_page(request, status_code, detail)
    body: dict[str, object] = {"detail": detail}
    if isinstance(exc, TruncatesOnlyError):
        fallback = exc.fallback
        body["fix"] = exc.fix
        body["fallback"] = None if fallback is None else fallback.model_dump(mode="json")  # type: ignore[attr-defined]
    if isinstance(exc, NothingMeetsError) and exc.offers is not None:
        # the table still says how far each offer is from the limits (the study page keeps
        # it too): a walk's 409 had only the sentence
        body["offers"] = exc.offers.model_dump(mode="json")  # type: ignore[attr-defined]
    return JSONResponse(body, status_code=status_code)


_MAX_ERRORS = 20  # a request with more problems than this gets the first ones


async def _validation_error(request: Request, exc: Exception) -> Response:
    """FastAPI's 422 without the ``input`` it echoes back (a 5 MB body, a NaN that JSON
    cannot encode) or the ``ctx`` objects: where, what, and the error's type."""
    assert isinstance(exc, RequestValidationError)
    errors = [
        {
            "loc": [str(part) for part in error.get("loc", ())],
            "msg": str(error.get("msg", ""))[:300],
            "type": str(error.get("type", "")),
        }
        for error in exc.errors()[:_MAX_ERRORS]
    ]
    if wants_html(request):
        detail = "; ".join(f"{'.'.join(e['loc'])}: {e['msg']}" for e in errors)
        return error_page(request, 422, detail)
    return JSONResponse({"detail": errors}, status_code=422)


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, StarletteHTTPException)
    if wants_html(request) and exc.status_code >= 400:
        return error_page(request, exc.status_code, str(exc.detail))
    return await http_exception_handler(request, exc)
