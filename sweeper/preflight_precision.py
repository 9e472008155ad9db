"""Preflight's verdict on a precision: its steps and fp32's timed in turns in one probe
(``sweeper.trial.probe``), refused only when every reading of that timing is beyond
``trial.slow_precision_factor`` (a shared machine only adds time), said with where the
precision came from and that source's fix. Split from ``sweeper.preflight``."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sweeper.space import Space


def precision_slowdown(payload: dict[str, Any]) -> float | None:
    """The probe's slowdown of its precision against fp32 (``precision_timing``'s factor), if
    the probe timed both."""
    timing = precision_timing(payload)
    return None if timing is None else timing.factor


@dataclass(frozen=True, kw_only=True)
class PrecisionTiming:
    """A precision's step time over fp32's, as a probe measured it (``probe.compare_precision``:
    their steps taken in turns). Another process on the machine only ever adds time to a step,
    so the fastest steps of each are the least disturbed; three figures, each a ratio of the
    precision's steps to fp32's: of the fastest step, of the lower quartiles (the fastest
    quarter: ``factor``) and of the medians. ``low`` and ``high`` are the least and greatest."""

    factor: float
    low: float
    high: float
    steps: int  # steps of each timed (0: one median of each, timed one after the other)
    contended: str | None = None  # what HostWatch read while it was timed, if shared

    def said(self) -> str:
        if not self.steps:
            return "one timing of each"
        return (
            f"{self.steps} steps of each taken in turns: {self.low:.1f}-{self.high:.1f}x from "
            "their fastest steps to their medians"
        )


def precision_timing(payload: dict[str, Any]) -> PrecisionTiming | None:
    """What a probe's payload says of its precision against fp32, if it timed both."""
    import statistics

    subject = sorted(t for t in payload.get("precision_step_times") or () if t > 0)
    fp32 = sorted(t for t in payload.get("fp32_step_times") or () if t > 0)
    if len(subject) >= 4 and len(fp32) >= 4:
        factor = quartiles(subject)[0] / quartiles(fp32)[0]
        figures = (
            subject[0] / fp32[0],
            factor,
            statistics.median(subject) / statistics.median(fp32),
        )
        return PrecisionTiming(
            factor=factor,
            low=min(figures),
            high=max(figures),
            steps=min(len(subject), len(fp32)),
            contended=payload.get("precision_contended"),
        )
    fp32_step_s = payload.get("fp32_step_s")
    if not fp32_step_s or not payload.get("step_s"):
        return None
    factor = payload["step_s"] / fp32_step_s
    return PrecisionTiming(factor=factor, low=factor, high=factor, steps=0)


def quartiles(values: list[float]) -> tuple[float, float, float]:
    """The lower quartile, the median and the upper quartile of ``values`` (sorted), each an
    interpolation between two of them (``statistics.quantiles``' inclusive method).

    >>> quartiles([1.0, 2.0, 3.0, 4.0, 5.0])
    (2.0, 3.0, 4.0)
    """
    import statistics

    low, median, high = statistics.quantiles(values, n=4, method="inclusive")
    return low, median, high


def precision_verdict(timing: PrecisionTiming, limit: float) -> str:
    """``refused``: slower than ``limit`` by every figure of its timing, the fastest steps'
    ratio and the medians' too (a shared machine that slowed the precision's steps more than
    fp32's leaves the fastest of them alone, and one that slowed fp32's pulls the medians'
    ratio down); ``unsure``: slower by some figure, not by all (said, not refused: the
    machine's load, or a precision near the limit); ``runs``: slower by none.

    >>> precision_verdict(PrecisionTiming(factor=10.2, low=9.1, high=11.0, steps=20), 3.0)
    'refused'
    >>> precision_verdict(PrecisionTiming(factor=3.9, low=1.4, high=6.0, steps=20), 3.0)
    'unsure'
    >>> precision_verdict(PrecisionTiming(factor=1.1, low=0.4, high=2.0, steps=20), 3.0)
    'runs'
    """
    if timing.low > limit:
        return "refused"
    return "unsure" if timing.high > limit else "runs"


@dataclass(frozen=True, kw_only=True)
class PrecisionJudgement:
    """A precision found slower than ``trial.slow_precision_factor``: what was measured, where
    the precision came from (the space, or the script's command) and the fix for that."""

    precision: str
    refused: bool  # False: slower by some figures of its timing, not all: said, not refused
    text: str
    fix: str

    @property
    def message(self) -> str:
        return (
            f"{self.text}; " + ("fix: " if self.refused else "if it is that slow here: ") + self.fix
        )


def precision_source(space: Space, precision: str) -> tuple[str, str]:
    """Where the space's ``precision`` comes from, and how to train fp32 instead there.

    A script's knob that ``search:`` leaves out runs at the value its command gives
    (``sweeper.script_defaults``): its flag, its launcher's ``--mixed_precision``, or
    SFTConfig's own default bf16."""
    listed = space.search.values("precision")
    native = f"or run on hardware with native {precision}"
    if len(listed) > 1:
        return (
            f"search.precision: {precision}",
            f"remove {precision} from search.precision (the sweep skips it), {native}",
        )
    if space.workload.precision:
        return (
            f"workload.precision: {precision}",
            f"set 'precision: fp32' in the space file's workload, {native}",
        )
    script = space.workload.script
    if space.workload.engine == "script" and script is not None:
        from sweeper import script_defaults

        given = script_defaults.said(script.command, script.knobs).get("precision")
        if given is not None and given[0] == precision:
            words = given[1]
            if words.startswith("SFTConfig's default"):
                where = f"{precision} (from your command: {words}; no --bf16 False in it)"
                change = "pass --bf16 False in workload.script.command"
            elif "mixed_precision" in words:
                where = f"{precision} (from your command: {words})"
                change = "say --mixed_precision no to accelerate in workload.script.command"
            else:
                where = f"{precision} (from your command: {words})"
                flag = "--fp16" if precision == "fp16" else "--bf16"
                change = f"pass {flag} False in workload.script.command instead"
            return where, f"{change}, or list 'precision: [fp32]' under search:, {native}"
    return (
        f"search.precision: {precision}",
        f"set 'precision: fp32' under search: in the space file (or add fp32 to "
        f"search.precision), {native}",
    )


def precision_judgement(
    space: Space,
    precision: str,
    payload: dict[str, Any],
    *,
    measured_at: float | None = None,
    cache_folder: Path | None = None,
) -> PrecisionJudgement | None:
    """What to say of ``precision`` from its probe's timing against fp32 (None: within
    ``trial.slow_precision_factor``, or not timed). ``measured_at``: when a reused probe result
    was measured (its cache entry in ``cache_folder``)."""
    timing = precision_timing(payload)
    limit = space.trial.slow_precision_factor
    if timing is None:
        return None
    verdict = precision_verdict(timing, limit)
    if verdict == "runs":
        return None
    device = "this CPU" if payload.get("device_type") == "cpu" else "this device"
    where, fix = precision_source(space, precision)
    how = f"{timing.said()}; limit trial.slow_precision_factor = {limit:g}"
    if verdict == "refused":
        text = f"{where} trains {timing.factor:.1f}x slower than fp32 on {device} ({how})"
        if timing.contended:
            text += (
                f"; the machine was shared while it was timed ({timing.contended}), but even "
                "the fastest steps of each, the least disturbed, are beyond the limit"
            )
    else:
        text = (
            f"{where} is {timing.low:.1f}-{timing.high:.1f}x slower than fp32 on {device} "
            f"({how}): beyond the limit by some figures, not by all"
            + (
                f"; the machine was shared while it was timed ({timing.contended})"
                if timing.contended
                else ""
            )
            + "; not refused, its trials measure it"
        )
    if measured_at is not None:
        at = time.strftime("%H:%M", time.localtime(measured_at))
        again = f"; delete {cache_folder} to measure again" if cache_folder else ""
        text += f" (measured at {at}, reused{again})"
    return PrecisionJudgement(precision=precision, refused=verdict == "refused", text=text, fix=fix)


def check_precision(space: Space, precision: str, payload: dict[str, Any]) -> str | None:
    """Why ``precision`` is refused (pathologically slower than fp32), or None."""
    judgement = precision_judgement(space, precision, payload)
    return judgement.message if judgement is not None and judgement.refused else None
