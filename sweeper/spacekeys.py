"""Where a key of a space file belongs, for the error about a key written in the wrong place.

A key that is unknown where it stands is often a real key one level off (``loss:`` straight
under ``workload:`` instead of under ``workload.dataset:``). The error then says where it goes
instead of "unknown key".
"""

from __future__ import annotations

import typing
from functools import cache
from typing import Any

from pydantic import BaseModel


def _models(annotation: Any) -> list[type[BaseModel]]:
    """The pydantic models a field's annotation holds directly (``X | None``, not ``list[X]``:
    a list's items are not a place a single key belongs)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    if typing.get_origin(annotation) in (list, tuple, dict):
        return []
    return [m for arg in typing.get_args(annotation) for m in _models(arg)]


@cache
def key_places(model: type[BaseModel]) -> dict[str, tuple[tuple[str, ...], ...]]:
    """Every key of ``model``'s tree → the sections that hold it, e.g. ``"loss"`` →
    ``(("workload", "dataset"),)``."""
    places: dict[str, list[tuple[str, ...]]] = {}

    def walk(current: type[BaseModel], section: tuple[str, ...]) -> None:
        for name, field in current.model_fields.items():
            places.setdefault(name, []).append(section)
            for inner in _models(field.annotation):
                walk(inner, (*section, name))

    walk(model, ())
    return {name: tuple(sections) for name, sections in places.items()}


def misplaced_key(model: type[BaseModel], loc: tuple[Any, ...]) -> str | None:
    """The message for an unknown key at ``loc`` that is a known key elsewhere (None when it
    is known nowhere: a typo).

    >>> from sweeper.space import Space
    >>> misplaced_key(Space, ("workload", "loss"))
    "not a key of workload: 'loss' belongs under workload.dataset; move it there"
    """
    if not loc or not isinstance(loc[-1], str):
        return None
    key, here = loc[-1], tuple(p for p in loc[:-1] if isinstance(p, str))
    sections = [s for s in key_places(model).get(key, ()) if s != here]
    if not sections:
        return None
    where = " or ".join(".".join(s) if s else "the top level" for s in sections[:2])
    return (
        f"not a key of {'.'.join(here) or 'the top level'}: {key!r} belongs under {where}; "
        "move it there"
    )


def spelled_like(model: type[BaseModel], loc: tuple[Any, ...]) -> str | None:
    """The message for an unknown key at ``loc`` that looks like a key of its section (a
    typo), naming that key; None when none is close.

    >>> from sweeper.space import Space
    >>> spelled_like(Space, ("search", "per_device_batch_sise"))
    "unknown key; did you mean 'per_device_batch_size'? (or remove it)"
    """
    import difflib

    if not loc or not isinstance(loc[-1], str):
        return None
    here = tuple(p for p in loc[:-1] if isinstance(p, str))
    keys = [name for name, sections in key_places(model).items() if here in sections]
    close = difflib.get_close_matches(loc[-1], keys, n=1, cutoff=0.75)
    return f"unknown key; did you mean {close[0]!r}? (or remove it)" if close else None
