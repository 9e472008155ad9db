"""Hours and dollars per run of the real job, from one trial's measurements.

    train_s          = samples × epochs ÷ samples_per_s
                       (packing: samples × epochs × tokens_per_sample ÷ tokens_per_s)
    one_time_s       = startup_s + compile_s + saves × checkpoint_save_s
    saves            = ⌊optimizer steps of the run ÷ save_steps⌋,  steps = train_s × it_per_s
    hours_per_run    = (train_s + one_time_s) ÷ 3600
    cost_per_run_usd = hours_per_run × devices × usd_per_hour

``usd_per_hour`` is the price of one device-hour (``hardware.usd_per_hour``, a catalog GPU's
price): a trial on N devices rents N of them for the run's hours, so a 1-device run prices as
the machine's hour did before N-device trials existed.

Ranking is by these, never by it/s: an optimizer step holds batch × accumulation samples, so
it/s is not comparable across gradient accumulation (seed 001's trap). Start-up and compile are
paid once per run; checkpoint saves once per ``save_steps`` optimizer steps, so a config with a
larger effective batch also saves fewer checkpoints.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any


@dataclass(frozen=True, kw_only=True)
class RunPlan:
    """The real job: how much it trains, how often it saves, what a device-hour costs and
    how many devices it rents."""

    samples: int
    epochs: float
    usd_per_hour: float  # one device's
    devices: int = 1
    save_steps: int | None = None
    tokens_per_sample: float | None = None  # mean, with EOS; counts the work when packing


@dataclass(frozen=True, kw_only=True)
class RunProjection:
    hours_per_run: float
    cost_per_run_usd: float
    train_hours: float = math.inf
    optimizer_steps: float = math.inf
    startup_s: float = 0.0
    compile_s: float = 0.0
    checkpoint_saves: int = 0
    checkpoint_s: float = 0.0

    @property
    def one_time_s(self) -> float:
        return self.startup_s + self.compile_s + self.checkpoint_s

    def breakdown(self) -> dict[str, float | int]:
        """JSON-ready parts of the projection, for storage and the API."""
        return {
            "train_hours": self.train_hours,
            "optimizer_steps": self.optimizer_steps,
            "startup_s": self.startup_s,
            "compile_s": self.compile_s,
            "checkpoint_saves": self.checkpoint_saves,
            "checkpoint_s": self.checkpoint_s,
            "one_time_s": self.one_time_s,
        }


_NEVER = RunProjection(hours_per_run=math.inf, cost_per_run_usd=math.inf)


def _seconds(value: float | None) -> float:
    return value if value is not None and math.isfinite(value) and value > 0 else 0.0


def project_run(
    plan: RunPlan,
    *,
    samples_per_s: float,
    it_per_s: float | None = None,
    tokens_per_s: float | None = None,
    packing: bool = False,
    startup_s: float | None = None,
    compile_s: float | None = None,
    checkpoint_save_s: float | None = None,
) -> RunProjection:
    """Project the full run; a non-positive or non-finite throughput projects to infinity.

    >>> plan = RunPlan(samples=600_000, epochs=3, usd_per_hour=2.5)
    >>> project_run(plan, samples_per_s=100.0).cost_per_run_usd
    12.5
    >>> with_saves = RunPlan(samples=600_000, epochs=3, usd_per_hour=2.5, save_steps=1000)
    >>> p = project_run(with_saves, samples_per_s=100.0, it_per_s=12.5, checkpoint_save_s=90)
    >>> p.optimizer_steps, p.checkpoint_saves, round(p.hours_per_run, 3)  # 225 saves × 90 s
    (225000.0, 225, 10.625)
    >>> two = RunPlan(samples=600_000, epochs=3, usd_per_hour=2.5, devices=2)
    >>> round(project_run(two, samples_per_s=180.0).cost_per_run_usd, 2)  # 2.78 h × 2 × $2.50
    13.89
    """
    if packing:
        if plan.tokens_per_sample is None or tokens_per_s is None:
            return _NEVER
        rate, work = tokens_per_s, plan.samples * plan.epochs * plan.tokens_per_sample
    else:
        rate, work = samples_per_s, plan.samples * plan.epochs
    if not math.isfinite(rate) or rate <= 0:
        return _NEVER
    train_s = work / rate
    steps = train_s * it_per_s if it_per_s and math.isfinite(it_per_s) else math.nan
    save_s = _seconds(checkpoint_save_s)
    saves = (
        math.floor(steps / plan.save_steps)
        if plan.save_steps and save_s > 0 and math.isfinite(steps)
        else 0
    )
    projection = RunProjection(
        hours_per_run=0.0,
        cost_per_run_usd=0.0,
        train_hours=train_s / 3600,
        optimizer_steps=steps,
        startup_s=_seconds(startup_s),
        compile_s=_seconds(compile_s),
        checkpoint_saves=saves,
        checkpoint_s=saves * save_s,
    )
    hours = (train_s + projection.one_time_s) / 3600
    return replace(
        projection,
        hours_per_run=hours,
        cost_per_run_usd=run_cost(hours, plan.usd_per_hour, plan.devices),
    )


def run_cost(hours: float, usd_per_device_hour: float, devices: int | None = 1) -> float:
    """$ of a run of ``hours`` on ``devices`` devices at ``usd_per_device_hour`` each.

    >>> run_cost(10.0, 2.5, 4)
    100.0
    """
    return hours * usd_per_device_hour * device_count(devices)


def device_count(value: object) -> int:
    """A config's ``devices`` (or the value itself) as a count: 1 where it is not told (a
    config stored before the knob).

    >>> device_count({"devices": 4}), device_count({}), device_count(None), device_count(2)
    (4, 1, 1, 2)
    """
    if isinstance(value, Mapping):
        value = value.get("devices")
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 1


def one_off_text(projection: Mapping[str, Any] | None) -> str:
    """Where a projection's checkpoint and compile figures come from (stored beside it from
    ``Measurement.one_off_sources``); "" for projections stored before that.

    >>> text = one_off_text({"checkpoint_source": "reused", "compile_cache": "warm",
    ...                      "compile_measured_s": 4.2})
    >>> text.split("; ")[0]
    'checkpoint save timed by an earlier trial with the same state and disk'
    >>> text.split("; ")[1].split(" (")[1]
    'this one compiled warm in 4.2 s)'
    >>> one_off_text({"checkpoint_source": "reused", "checkpoint_saves": 0})
    ''
    """
    if not projection:
        return ""
    parts = []
    # a run that saves no checkpoint prices none: where the save's figure came from is moot
    source = (
        projection.get("checkpoint_source") if projection.get("checkpoint_saves") != 0 else None
    )
    if source == "reused":
        parts.append("checkpoint save timed by an earlier trial with the same state and disk")
    elif source == "measured":
        parts.append("checkpoint save timed in this trial")
    cache = projection.get("compile_cache")
    if cache == "warm":
        warm = projection.get("compile_measured_s")
        parts.append(
            "compile: the cold figure of an earlier trial with the same graphs"
            + (f" (this one compiled warm in {warm:.2g} s)" if warm is not None else "")
        )
    elif cache == "cold":
        parts.append("compile measured cold in this trial")
    return "; ".join(parts)


def money(usd: float) -> str:
    """Dollars as the CLI, the REST texts and the dashboard show them: cents from $0.10, two
    significant digits below (a small job's run costs a fraction of a cent, and '$0.00' for
    every config hides which is cheapest).

    >>> money(1234.567), money(0.5), money(0.0013272), money(0.0), money(-0.0421)
    ('$1,234.57', '$0.50', '$0.0013', '$0.00', '$-0.042')
    """
    if usd == 0 or abs(usd) >= 0.1:
        return f"${usd:,.2f}"
    return f"${usd:.2g}"


def hours_figure(hours: float) -> str:
    """Hours with one decimal from 1 h, two significant digits below (a 48-second run reads
    0.013 h, not 0.0).

    >>> hours_figure(38.04), hours_figure(1.0), hours_figure(0.013271), hours_figure(0.0)
    ('38.0', '1.0', '0.013', '0.0')
    """
    if hours == 0 or abs(hours) >= 0.95:
        return f"{hours:,.1f}"
    return f"{hours:.2g}"
