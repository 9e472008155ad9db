"""A job's speed on a GPU it was not measured on, from one measured trial: always an estimate,
with an error band. Pure functions of the trial's own breakdown and the catalog's figures.

The model (a roofline split of the measured step; every figure is the trial's own)::

    step      = the window's mean optimizer step                    (step_time_mean_s)
    data      = step × data_wait_share        host time: the loader, collation, the feed
    gpu       = step − data
    compute   = min(gpu, step × MFU' ÷ η)     matmul time: the model's FLOPs at η of the peak,
                                              MFU' counting the padding the GPU computes
    memory    = gpu − compute                 the rest: optimizer, norms, softmax, copies —
                                              memory-bound kernels, and launch gaps
    target    = compute × peak_src ÷ peak_tgt + memory × bandwidth_src ÷ bandwidth_tgt + data

η (``MATMUL_EFFICIENCY`` = 0.7) is the share of the dense peak a training matmul reaches (large
bf16 GEMMs reach 70-80% on A100/H100): the compute part keeps its efficiency on the target, as
MFU would. The peak is the one the matmuls run at (``sweeper.hardware.math_mode``: bf16 autocast
→ bf16; fp32 with TF32 → tf32). The data part is kept as measured: the target is assumed to
have the same host (CPU, disk) as the measured machine. Start-up, compile and checkpoint saves
are kept too (host and disk, not the GPU's peak). Throughput scales by step ÷ target; hours per
run are the trial's training hours × target ÷ step plus its one-time hours.

Memory: the measured peak (the caching allocator's reserved bytes where recorded, else the
allocated peak) plus ``CONTEXT_BYTES`` (the CUDA context and library workspaces, which torch does
not count) must fit the target's datasheet memory (decimal GB, a little under what the device
reports): otherwise the config is predicted to run out of memory; within ``TIGHT`` of it, it may.

The error band: with no calibration records, the stated prior ``PRIOR_BAND`` (±25%). Each time
a GPU type is measured in a study of the same workload, each config both studies measured is a
record (predicted against measured samples/s); with fewer than ``CALIBRATED_AFTER`` records the
band is the larger of the prior and the worst error seen, from then on twice their root mean
square (about a 95% band for normal errors), never below ``FLOOR_BAND``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from sweeper.catalog import Gpu
from sweeper.hardware import math_mode

MATMUL_EFFICIENCY = 0.7
PRIOR_BAND = 0.25
FLOOR_BAND = 0.05
CALIBRATED_AFTER = 5
CONTEXT_BYTES = 1e9
TIGHT = 0.9

Fit = Literal["fits", "tight", "oom"]


class Unpredictable(ValueError):
    """The trial holds too little to scale from (a CPU trial, no MFU, no step time)."""


@dataclass(frozen=True, kw_only=True)
class Observed:
    """What a prediction reads of one measured trial (``Observed.of`` builds it)."""

    device_name: str
    step_s: float
    data_wait_share: float
    mfu: float
    math_mode: str
    peak_memory_bytes: float
    samples_per_s: float
    tokens_per_s: float
    train_hours: float
    one_time_hours: float
    # the MFU of what the GPU computed, padding included: the matmul share of the step
    # (``mfu`` counts real tokens only since issue 36); None: ``mfu`` itself
    computed_mfu: float | None = None

    @classmethod
    def of(
        cls,
        measurement: Mapping[str, Any],
        config: Mapping[str, Any],
        projection: Mapping[str, Any] | None,
    ) -> Observed:
        """From a stored trial: its measurement (``Measurement.model_dump()``), config and
        projection. Raises Unpredictable saying what is missing."""
        env = measurement.get("env") or {}
        device = str(env.get("device_name") or "?")
        if env.get("device_type") != "cuda":
            raise Unpredictable(
                f"measured on {device}, not a GPU: no peak FLOP/s or bandwidth to scale from; "
                "measure the job on one GPU of the catalog first"
            )
        mfu, step = measurement.get("mfu"), measurement.get("step_time_mean_s")
        if not _positive(mfu) or not _positive(step):
            raise Unpredictable(
                f"the trial on {device} recorded no MFU (its device has no peak in "
                "sweeper/hardware.py): the compute share of its step is unknown"
            )
        part = projection or {}
        train_hours = part.get("train_hours")
        if not _positive(train_hours):
            raise Unpredictable("the trial has no projection of its run's training hours")
        peak = measurement.get("peak_memory_reserved_bytes") or measurement.get("peak_memory_bytes")
        one_time_s = part.get("one_time_s")
        return cls(
            computed_mfu=_computed_mfu(measurement, float(mfu or 0)),
            device_name=device,
            step_s=float(step or 0),
            data_wait_share=min(1.0, max(0.0, float(measurement.get("data_wait_share") or 0.0))),
            mfu=float(mfu or 0),
            math_mode=math_mode(
                str(config.get("precision", "fp32")), bool(measurement.get("tf32_matmul"))
            ),
            peak_memory_bytes=float(peak or 0),
            samples_per_s=float(measurement.get("samples_per_s") or math.nan),
            tokens_per_s=float(measurement.get("tokens_per_s") or math.nan),
            train_hours=float(train_hours or 0),
            one_time_hours=float(one_time_s or 0) / 3600,
        )


@dataclass(frozen=True, kw_only=True)
class StepSplit:
    """Seconds of one optimizer step, by what bounds them."""

    compute_s: float
    memory_s: float
    data_s: float

    @property
    def step_s(self) -> float:
        return self.compute_s + self.memory_s + self.data_s


@dataclass(frozen=True, kw_only=True)
class Prediction:
    """One config of a measured trial on a target GPU: an estimate, never a measurement."""

    source: StepSplit
    target: StepSplit
    samples_per_s: float
    tokens_per_s: float
    mfu: float  # the model FLOPs ÷ the target's peak at the predicted step
    hours_per_run: float
    band: float  # relative half-width of the estimate
    fit: Fit
    memory_needed_bytes: float
    memory_bytes: float

    @property
    def speedup(self) -> float:
        """Measured step ÷ predicted step: above 1, the target is faster."""
        return self.source.step_s / self.target.step_s


def split_step(observed: Observed) -> StepSplit:
    """The measured step by what bounds it (see the module docstring).

    >>> o = Observed(device_name="H100", step_s=1.0, data_wait_share=0.1, mfu=0.35,
    ...              math_mode="bf16", peak_memory_bytes=0, samples_per_s=8, tokens_per_s=0,
    ...              train_hours=10, one_time_hours=0.5)
    >>> s = split_step(o)
    >>> round(s.compute_s, 3), round(s.memory_s, 3), round(s.data_s, 3)
    (0.5, 0.4, 0.1)
    """
    data = observed.step_s * observed.data_wait_share
    gpu = observed.step_s - data
    mfu = observed.mfu if observed.computed_mfu is None else observed.computed_mfu
    compute = min(gpu, observed.step_s * mfu / MATMUL_EFFICIENCY)
    return StepSplit(compute_s=compute, memory_s=gpu - compute, data_s=data)


def memory_fit(peak_bytes: float, target: Gpu) -> tuple[Fit, float]:
    """Whether the measured peak (plus the CUDA context) fits the target, and the bytes needed.

    >>> from sweeper.catalog import load_catalog
    >>> gpus = load_catalog().gpus
    >>> memory_fit(30 * 2**30, gpus["a100-40gb"])[0], memory_fit(40e9, gpus["a100-40gb"])[0]
    ('fits', 'oom')
    """
    needed = peak_bytes + CONTEXT_BYTES
    has = target.memory_bytes
    if needed > has:
        return "oom", needed
    return ("tight" if needed > TIGHT * has else "fits"), needed


def predict(observed: Observed, source: Gpu, target: Gpu, *, band: float) -> Prediction:
    """``observed`` (measured on ``source``) predicted on ``target``.

    >>> from sweeper.catalog import load_catalog
    >>> gpus = load_catalog().gpus
    >>> o = Observed(device_name="H100", step_s=1.0, data_wait_share=0.1, mfu=0.35,
    ...              math_mode="bf16", peak_memory_bytes=30e9, samples_per_s=8,
    ...              tokens_per_s=8000, train_hours=10, one_time_hours=0.5)
    >>> p = predict(o, gpus["h100-sxm"], gpus["h200-sxm"], band=0.25)
    >>> round(p.target.step_s, 3), round(p.samples_per_s, 2), round(p.hours_per_run, 2)
    (0.879, 9.1, 9.29)
    """
    peak_src, peak_tgt = (
        source.tflops.peak(observed.math_mode),
        target.tflops.peak(observed.math_mode),
    )
    if peak_src is None or peak_tgt is None:
        raise Unpredictable(f"no {observed.math_mode} peak in the catalog for both GPUs")
    split = split_step(observed)
    scaled = StepSplit(
        compute_s=split.compute_s * peak_src / peak_tgt,
        memory_s=split.memory_s * source.memory_bandwidth_gbs / target.memory_bandwidth_gbs,
        data_s=split.data_s,
    )
    ratio = scaled.step_s / split.step_s
    fit, needed = memory_fit(observed.peak_memory_bytes, target)
    return Prediction(
        source=split,
        target=scaled,
        samples_per_s=observed.samples_per_s / ratio,
        tokens_per_s=observed.tokens_per_s / ratio,
        mfu=observed.mfu * peak_src / peak_tgt / ratio,
        hours_per_run=observed.train_hours * ratio + observed.one_time_hours,
        band=band,
        fit=fit,
        memory_needed_bytes=needed,
        memory_bytes=target.memory_bytes,
    )


@dataclass(frozen=True, kw_only=True)
class Band:
    """The relative half-width of an estimate, and how it was derived."""

    rel: float
    records: int
    basis: str


def error_band(errors: Sequence[float]) -> Band:
    """The band from calibration errors (predicted ÷ measured − 1); see the module docstring.

    >>> error_band([]).rel, error_band([0.1, -0.31]).rel
    (0.25, 0.31)
    >>> round(error_band([0.02, -0.03, 0.05, 0.01, -0.04]).rel, 3)
    0.066
    """
    found = [e for e in errors if math.isfinite(e)]
    if not found:
        return Band(
            rel=PRIOR_BAND,
            records=0,
            basis=f"no calibration yet: a stated prior of ±{PRIOR_BAND:.0%} (no GPU type of "
            "this catalog has been measured beside another with this model; published step-time "
            "predictors with finer models err 2-12% on average)",
        )
    worst = max(abs(e) for e in found)
    if len(found) < CALIBRATED_AFTER:
        return Band(
            rel=max(PRIOR_BAND, worst),
            records=len(found),
            basis=f"{len(found)} calibration record(s), worst error {worst:.0%}: the larger of "
            f"that and the prior ±{PRIOR_BAND:.0%} until {CALIBRATED_AFTER} records",
        )
    rms = math.sqrt(sum(e * e for e in found) / len(found))
    return Band(
        rel=max(FLOOR_BAND, 2 * rms),
        records=len(found),
        basis=f"{len(found)} calibration records: twice their root mean square error "
        f"({rms:.1%}), at least ±{FLOOR_BAND:.0%}",
    )


def _computed_mfu(measurement: Mapping[str, Any], mfu: float) -> float:
    """The MFU of the tokens the GPU computed, padding included: the matmuls run on every
    padded row. A measurement recorded since issue 36 (it has ``mean_sample_tokens``) counts
    real tokens in ``mfu``: scaled by padded ÷ real tokens (the attention term stays at the
    real length: a little under). One recorded before counted padding already.

    Taken as the matmul share with real tokens alone, a padded config's matmuls (70% of its
    rows padding on the H200 of 2026-11-28) went to the bandwidth-bound rest: predicted from
    that H200, the H100 came out 18-21% slow on the three padded configs.

    >>> _computed_mfu({"mean_sample_tokens": 600, "tokens_per_s": 300.0,
    ...                "padded_tokens_per_s": 1000.0}, 0.08)
    0.26666666666666666
    >>> _computed_mfu({"tokens_per_s": 300.0, "padded_tokens_per_s": 1000.0}, 0.26)
    0.26
    """
    real: Any = measurement.get("tokens_per_s")
    padded: Any = measurement.get("padded_tokens_per_s")
    if measurement.get("mean_sample_tokens") is None or not (_positive(real) and _positive(padded)):
        return mfu
    return mfu * max(1.0, float(padded) / float(real))


def _positive(value: Any) -> bool:
    return isinstance(value, int | float) and math.isfinite(value) and value > 0
