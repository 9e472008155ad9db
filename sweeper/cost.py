"""Hours and dollars per run of the real job, from one trial's measured throughput.

    hours_per_run    = samples × epochs ÷ samples_per_s ÷ 3600  +  compile_s ÷ 3600
    cost_per_run_usd = hours_per_run × usd_per_hour

Ranking is by these, never by it/s: an optimizer step holds batch × accumulation samples, so
it/s is not comparable across gradient accumulation (seed 001's trap). Compile time is paid once
per real run, so it is added once, not folded into the throughput.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True)
class RunProjection:
    hours_per_run: float
    cost_per_run_usd: float


def project_run(
    *,
    samples_per_s: float,
    samples: int,
    epochs: float,
    usd_per_hour: float,
    compile_s: float = 0.0,
) -> RunProjection:
    """Project the full run; a non-positive or non-finite throughput projects to infinity.

    >>> project_run(samples_per_s=100.0, samples=600_000, epochs=3, usd_per_hour=2.5)
    RunProjection(hours_per_run=5.0, cost_per_run_usd=12.5)
    """
    if not math.isfinite(samples_per_s) or samples_per_s <= 0:
        return RunProjection(hours_per_run=math.inf, cost_per_run_usd=math.inf)
    one_time_s = compile_s if math.isfinite(compile_s) and compile_s > 0 else 0.0
    hours = (samples * epochs / samples_per_s + one_time_s) / 3600.0
    return RunProjection(hours_per_run=hours, cost_per_run_usd=hours * usd_per_hour)
