"""A space file's validation errors as ``file:line: field: problem`` lines.

pydantic names a field by its path in the model; this finds the YAML line that wrote it
(``sweeper.yamllines``), says where an unknown key that is a real key one level off belongs
(``sweeper.spacekeys``), and points a check of the whole space that names what it looked at
(``baseline: ...``, ``also_try[1]: ...``) at that entry's line.
"""

from __future__ import annotations

import re
from typing import Any

from pydantic import BaseModel, ValidationError

from sweeper import yamllines
from sweeper.spacekeys import misplaced_key, spelled_like


def _named_loc(message: str) -> tuple[Any, ...]:
    """Where a message of a whole-space check points: ``baseline: per_device_batch_size = 3
    ...`` -> ("baseline", "per_device_batch_size"); ``also_try[1]: ...`` -> ("also_try", 1)."""
    found = re.match(r"(baseline|also_try\[(\d+)\]): (?:(\w+) = )?", message)
    if found is None:
        return ()
    where: tuple[Any, ...] = (
        ("baseline",) if found.group(2) is None else ("also_try", int(found.group(2)))
    )
    return where + ((found.group(3),) if found.group(3) else ())


_AUTO_TAG = "literal['auto']"  # pydantic's name of the `auto` branch of a union


def _plain(loc: tuple[Any, ...]) -> tuple[Any, ...]:
    """``loc`` without pydantic's names of union branches (``list[constrained-int]``)."""
    return tuple(p for p in loc if not (isinstance(p, str) and "[" in p))


def problem_lines(
    error: ValidationError, model: type[BaseModel], source: str, lines: yamllines.Lines
) -> list[str]:
    """Each of ``error``'s problems as ``source:line: field: problem``, in the file's line order
    (pydantic reports them in the model's field order: a walk's `search:` written above
    `hardware:` read line 7 before line 3); ``model``: the space's class, whose tree says where
    a misplaced key belongs."""
    problems: list[tuple[int, str]] = []
    errors = error.errors()
    # a list or `auto` (search.max_seq_length): pydantic says both branches' errors, and a
    # walk read "Input should be a valid integer (got 'auto')" beside "Input should be 'auto'
    # (got ['auto', 100000])" with no word of what to write. The `auto` branch's error goes;
    # the list branch's says both forms
    auto_fields = {_plain(e["loc"]) for e in errors if _AUTO_TAG in e["loc"]}
    for err in errors:
        loc = _plain(err["loc"])
        if _AUTO_TAG in err["loc"]:
            continue
        if not loc:  # a check of the whole space that names where it looked
            loc = _named_loc(err["msg"].removeprefix("Value error, "))
        field = yamllines.dotted(loc)
        if loc in auto_fields or loc[:-1] in auto_fields and isinstance(loc[-1], int):
            head = (
                "auto stands alone, not in a list"
                if err.get("input") == "auto"
                else f"{err['msg']} (got {err.get('input')!r})"
            )
            message = (
                f"{head}: write `{loc[-1] if loc in auto_fields else loc[-2]}: auto` (the "
                "lengths picked from the data), or a list of whole numbers, e.g. [512, 1024]"
            )
        elif err["type"] == "extra_forbidden":
            message = (
                misplaced_key(model, loc)
                or spelled_like(model, loc)
                or "unknown key; remove it or check its spelling"
            )
        elif err["type"] == "missing":
            message = "required key is missing"
        elif err["type"] == "value_error":
            message = err["msg"].removeprefix("Value error, ")
            if err["loc"] == () and loc:  # the field now says where: once is enough
                message = re.sub(r"^(baseline|also_try\[\d+\]): ", "", message)
            if loc and not isinstance(err.get("input"), dict | list):
                message += f" (got {err.get('input')!r})"
        else:
            message = f"{err['msg']} (got {err.get('input')!r})"
        if loc[-1:] == ("max_seq_length",) and loc[0] in ("baseline", "also_try"):
            # a walk wrote `auto` there, as the search says it: a known config is one run's
            message += (
                "; a known config is the length a run uses (a number, e.g. your run's "
                "max_length); search.max_seq_length: auto picks the lengths to try from the "
                "data, and `sweeper doctor --space` shows what it picks"
            )
        line = yamllines.line_for(loc, lines)
        problems.append((line, f"{source}:{line}: {field}: {message}"))
    return [said for _, said in sorted(problems, key=lambda problem: problem[0])]
