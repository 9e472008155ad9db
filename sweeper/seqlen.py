"""``max_seq_length: auto``: the sequence lengths a space searches, read off the data.

A length guessed by hand is either too short (every config truncates, and the sweep ends with
nothing to recommend) or too long (every row pays for padding). The prepare step measures the
rendered token length of the user's samples; from it:

- the **coverage length**: tokens (with EOS) that hold ``workload.coverage_percentile`` % of
  the samples whole, rounded up to a multiple of 64 (128 from 1024 tokens on), which tensor
  cores and kernels tile well. A config at that length truncates nothing, so a space that
  says ``auto`` (or leaves the knob out) always holds one;
- with packing among the choices, a few shorter rows as well (½ and ¼ of it): packed rows
  that continue a long sample in the next row (``packing_strategy: wrapped`` or ``bfd_split``)
  cut nothing at any length, and shorter rows cost less attention;
- the lengths of the baseline and ``also_try`` configs, so the user's own config still runs.

>>> stats = {"token_percentiles": list(range(100, 301, 2)), "tokens_max": 300}
>>> candidates(stats, 100, packed=False), candidates(stats, 100, packed=True)
([320], [128, 192, 320])
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from sweeper.errors import SpaceError

if TYPE_CHECKING:
    from sweeper.space import Space

AUTO = "auto"
KNOB = "max_seq_length"
_SMALLEST = 64


def hardware_friendly(tokens: int) -> int:
    """``tokens`` rounded up to a multiple of 64 (of 128 from 1024 on).

    >>> [hardware_friendly(n) for n in (1, 65, 1000, 1025)]
    [64, 128, 1024, 1152]
    """
    step = 128 if tokens > 1024 else 64
    return max(_SMALLEST, math.ceil(tokens / step) * step)


def candidates(
    stats: Mapping[str, Any] | None, coverage_percentile: float, packed: bool
) -> list[int]:
    """The lengths ``auto`` stands for (see the module docstring), ascending."""
    from sweeper.recommend import coverage_length  # the guard's own measure of "whole"

    cover = coverage_length(dict(stats or {}), coverage_percentile)
    if cover is None:
        raise SpaceError(
            "search.max_seq_length: auto needs the token lengths of the data, and the prepare "
            "step measured none; list the lengths instead, e.g. max_seq_length: [512, 1024]"
        )
    top = hardware_friendly(cover)
    lengths = {top}
    if packed:
        lengths |= {hardware_friendly(top // 2), hardware_friendly(top // 4)}
    return sorted(lengths)


def resolve(space: Space, stats: Mapping[str, Any] | None) -> Space:
    """``space`` with ``search.max_seq_length: auto`` replaced by the lengths it stands for
    (the space as it is when it lists lengths)."""
    if getattr(space.search, KNOB) != AUTO:
        return space
    packed = True in space.search.values("packing")
    lengths = set(candidates(stats, space.workload.coverage_percentile, packed))
    lengths |= {getattr(known, KNOB) for _, known in space.named_known_configs()}
    values = sorted(lengths)
    if len(values) == 1 and KNOB not in space.search.model_fields_set:
        # one length the data chose, not one the user listed: a script that keeps its own
        # length runs it and the trial records it as the script's own (``trial.script.owned``),
        # as for any knob the space does not list; a walk's 4 trials each failed as a
        # mismatch (asked 320, ran 512), every config alike
        search = type(space.search).model_construct(
            _fields_set=set(space.search.model_fields_set),
            **(dict(space.search) | {KNOB: values}),
        )
    else:
        search = space.search.model_copy(update={KNOB: values})
    return space.model_copy(update={"search": search})


def describe(space: Space, resolved: Space) -> str | None:
    """What ``auto`` became, for the sweep's log (None when the space listed its lengths)."""
    if getattr(space.search, KNOB) != AUTO:
        return None
    lengths = resolved.search.values(KNOB)
    return (
        f"max_seq_length: auto → {lengths} (from the data's token lengths: "
        f"{space.workload.coverage_percentile:g}% of samples fit in {max(lengths)} tokens)"
    )
