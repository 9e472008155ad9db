"""Request dependencies: the one Store the app was created with."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from sweeper.store import Store


def get_store(request: Request) -> Store:
    return request.app.state.store


StoreDep = Annotated[Store, Depends(get_store)]
