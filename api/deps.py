"""Request dependencies: the one Store the app was created with, and its result cache."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Path, Query, Request

from api.cache import StudyCache
from sweeper.store import Store


def get_store(request: Request) -> Store:
    return request.app.state.store


def get_cache(request: Request) -> StudyCache:
    return request.app.state.cache


StoreDep = Annotated[Store, Depends(get_store)]
CacheDep = Annotated[StudyCache, Depends(get_cache)]

# The largest trial number, offset or page the database's 4-byte integers hold: anything above
# is a 422 here, not a database error (Postgres) or a silent empty answer (SQLite).
INT32_MAX = 2**31 - 1

# A study name as a path parameter: Postgres text cannot hold NUL.
StudyName = Annotated[
    str, Path(min_length=1, max_length=500, pattern=r"^[^\x00]+$", description="the study's name")
]
TrialNumber = Annotated[int, Path(ge=0, le=INT32_MAX, description="the trial's number")]
Offset = Annotated[int, Query(ge=0, le=INT32_MAX, description="skip this many")]
