"""The FastAPI application: REST under /api, dashboard pages, static files, OpenAPI at /docs.

    uvicorn --factory 'api.app:create_app_from_env'     # or: sweeper serve

One Store per app, created (and migrated) here so a fresh database serves empty lists.
Secure by default (see api/security.py): read-only unless an API token is set, explicit CORS
origins only, a Content-Security-Policy on every response. /docs and /redoc use Swagger UI and
ReDoc files from the installed fastapi-offline package: no CDN, they work offline.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager

from fastapi import FastAPI
from fastapi.middleware.cors import CORSMiddleware
from fastapi.middleware.gzip import GZipMiddleware
from fastapi.staticfiles import StaticFiles
from starlette.templating import Jinja2Templates

import sweeper
from api.cache import GZIP_LEVEL, StudyCache
from api.errors import install_error_handlers
from api.routes import catalog, docs, pages, studies
from api.security import BodyLimit, NoNulBytes, SecurityHeaders
from dashboards import STATIC_DIR, template_environment
from sweeper.settings import Settings, normalize_storage_url, resolve_storage
from sweeper.store import Store


def create_app(
    storage_url: str, *, api_token: str | None = None, cors_origins: Sequence[str] = ()
) -> FastAPI:
    """An app serving the studies stored at ``storage_url`` (SQLite or Postgres).

    ``api_token`` enables the write endpoints (bearer auth); ``cors_origins`` lists the browser
    origins other than the app's own that may call the API. Raises StorageError when the
    database cannot be reached or migrated.
    """
    store = Store(normalize_storage_url(storage_url))
    store.migrate()

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        yield
        store.dispose()

    app = FastAPI(
        title="sweeper",
        version=sweeper.__version__,
        summary="Timed training trials, priced per run: which config is cheapest.",
        description="Reads are open; write endpoints need `Authorization: Bearer "
        "<SWEEPER_API_TOKEN>` and are disabled when the server has no token.",
        lifespan=lifespan,
        docs_url=None,  # served by api.routes.docs from local files
        redoc_url=None,
    )
    app.state.store = store
    app.state.cache = StudyCache()
    app.state.api_token = api_token
    app.state.templates = Jinja2Templates(env=template_environment())
    install_error_handlers(app)
    # plotly.min.js is ~4.8 MB; gzip brings it to about a third.
    app.add_middleware(GZipMiddleware, minimum_size=1024, compresslevel=GZIP_LEVEL)
    if cors_origins:
        app.add_middleware(
            CORSMiddleware,
            allow_origins=list(cors_origins),
            allow_methods=["GET", "POST", "DELETE"],
            allow_headers=["Authorization", "Content-Type"],
            expose_headers=["X-Total-Count"],
        )
    app.add_middleware(BodyLimit)
    app.add_middleware(NoNulBytes)
    app.add_middleware(SecurityHeaders)
    app.include_router(studies.router)
    app.include_router(catalog.router)
    app.include_router(docs.router)
    # pages.router serves /static/plotly.min.js, so it must come before the /static mount.
    app.include_router(pages.router)
    app.mount("/static/swagger", StaticFiles(directory=docs.SWAGGER_DIR), name="swagger")
    app.mount("/static", StaticFiles(directory=STATIC_DIR), name="static")
    return app


def create_app_from_env() -> FastAPI:
    """Factory for ``uvicorn --factory``: storage, token and CORS origins from SWEEPER_*."""
    settings = Settings()
    return create_app(
        resolve_storage(None),
        api_token=None if settings.api_token is None else settings.api_token.get_secret_value(),
        cors_origins=settings.cors_origins,
    )
