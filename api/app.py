"""The FastAPI application: REST under /api, dashboard pages, static files, OpenAPI at /docs.

    uvicorn --factory 'api.app:create_app_from_env'     # or: sweeper serve

One Store per app, created (and migrated) here so a fresh database serves empty lists.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI
from fastapi.middleware.gzip import GZipMiddleware
from fastapi.staticfiles import StaticFiles
from starlette.templating import Jinja2Templates

import sweeper
from api.errors import install_error_handlers
from api.routes import pages, studies
from dashboards import STATIC_DIR, template_environment
from sweeper.settings import normalize_storage_url, resolve_storage
from sweeper.store import Store


def create_app(storage_url: str) -> FastAPI:
    """An app serving the studies stored at ``storage_url`` (SQLite or Postgres).

    Raises StorageError when the database cannot be reached or migrated.
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
        lifespan=lifespan,
    )
    app.state.store = store
    app.state.templates = Jinja2Templates(env=template_environment())
    install_error_handlers(app)
    # plotly.min.js is ~4.8 MB; gzip brings it to about a third.
    app.add_middleware(GZipMiddleware, minimum_size=1024)
    app.include_router(studies.router)
    # pages.router serves /static/plotly.min.js, so it must come before the /static mount.
    app.include_router(pages.router)
    app.mount("/static", StaticFiles(directory=STATIC_DIR), name="static")
    return app


def create_app_from_env() -> FastAPI:
    """Factory for ``uvicorn --factory``: storage from SWEEPER_STORAGE (or the default file)."""
    return create_app(resolve_storage(None))
