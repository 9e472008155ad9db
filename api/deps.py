"""Request dependencies: the one Store the app was created with, and its result cache."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from api.cache import StudyCache
from sweeper.store import Store


def get_store(request: Request) -> Store:
    return request.app.state.store


def get_cache(request: Request) -> StudyCache:
    return request.app.state.cache


StoreDep = Annotated[Store, Depends(get_store)]
CacheDep = Annotated[StudyCache, Depends(get_cache)]
