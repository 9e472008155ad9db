"""How sure a $/run is: a config's measurements pooled, its 95% interval, ties, drift and a
contended machine.

One trial measures a config once. Its timed window gives a 95% interval of throughput
(``throughput_ci95_rel``), which bounds $/run to first order, but only against step-to-step
noise. Measuring the same config again, later, also sees run-to-run noise (other processes,
clocks, where the allocator put things): on the 2-core CPU of bench/RESULTS.md five trials of
one config spread with a CV of 3-4.5% while each window claimed ±2%. So the sweep re-measures
(``SearchLoop``), and this module turns a config's measurements (``Sample``) into one estimate:

- a measurement taken while the machine was contended counts only when every measurement of
  the config was, and then only the fastest of them, as sharing only ever slows a trial
  (``Estimate.contended`` then says so);
- the machine's run-to-run noise is pooled over every config measured more than once
  (``machine_noise``): it is a property of the machine, and pooling gives it degrees of freedom
  that two measurements of one config never would;
- each measurement's relative variance is the larger of its window's and the machine's; the
  mean's interval uses Student's t with the pooled degrees of freedom when the machine's noise
  decides it.

Two configs tie when their $/run intervals overlap (``overlaps``). A reference config measured
again now and then shows drift (``drift``). Nothing here imports torch: the child calls
``contention`` with what it read from /proc and NVML.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import Any, Literal

# Two-sided 95% Student t quantiles by degrees of freedom; beyond the table, the normal value.
_T95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306,
        9: 2.262, 10: 2.228, 12: 2.179, 15: 2.131, 20: 2.086, 25: 2.060, 30: 2.042, 40: 2.021,
        60: 2.000, 120: 1.980}  # fmt: skip
Z95 = 1.960

SampleKind = Literal["trial", "rerun", "final", "drift"]
# why a config was measured again: the first time (trial), because the machine was contended
# (rerun), to separate the best configs at the end (final), as the drift reference (drift)

# A measurement is contended when other processes used at least this many CPUs' worth of the
# host during its window (and at least this share of the host's CPUs), when the hypervisor
# stole at least this share of CPU time, or when another process computed on its GPU.
CONTENDED_OTHERS_CPU = 0.5
CONTENDED_OTHERS_SHARE = 0.10
CONTENDED_STEAL_SHARE = 0.05


def t95(df: int) -> float:
    """Conservative t quantile: the table value at the largest tabulated df not above ``df``.

    >>> t95(1), t95(11), t95(500)
    (12.706, 2.228, 1.96)
    """
    if df < 1:
        return math.inf
    if df > 120:
        return Z95
    return _T95[max(k for k in _T95 if k <= df)]


def now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


@dataclass(frozen=True)
class Sample:
    """One measurement of a config, as a trial row keeps it (``TrialRow.remeasures``)."""

    kind: SampleKind
    cost_per_run_usd: float
    hours_per_run: float
    samples_per_s: float | None
    tokens_per_s: float | None
    it_per_s: float | None
    ci95_rel: float | None  # the window's interval of throughput (None: unknown)
    contended: bool = False
    contention: str | None = None  # why it was contended
    peak_memory_bytes: int | None = None
    at: str = ""  # when (ISO 8601, UTC)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Sample:
        return cls(**{k: data[k] for k in cls.__dataclass_fields__ if k in data})

    @property
    def window_var(self) -> float:
        """Relative variance of this measurement's mean, from its window (0: unknown)."""
        ci = self.ci95_rel
        if ci is None or not math.isfinite(ci) or ci < 0:
            return 0.0
        return (ci / Z95) ** 2


@dataclass(frozen=True)
class Noise:
    """The machine's run-to-run noise: relative variance of one measurement, and the degrees
    of freedom it was pooled from (0: unknown, no config was measured twice)."""

    rel_var: float = 0.0
    df: int = 0

    @property
    def cv(self) -> float:
        return math.sqrt(self.rel_var)


def machine_noise(groups: Iterable[Sequence[Sample]]) -> Noise:
    """Run-to-run noise pooled over every config measured at least twice (uncontended
    measurements, drift ones left out): the relative variance of a measurement about its
    config's mean.

    >>> a = [_s(1.00), _s(1.04)]; b = [_s(2.0), _s(1.96), _s(2.04)]
    >>> n = machine_noise([a, b]); (n.df, round(n.cv, 4))
    (3, 0.0229)
    """
    squares, df = 0.0, 0
    for group in groups:
        # drift measurements test whether the machine changed: they are not repeats of it
        costs = [s.cost_per_run_usd for s in group if not s.contended and s.kind != "drift"]
        if len(costs) < 2:
            continue
        mean = statistics.fmean(costs)
        squares += sum((c / mean - 1) ** 2 for c in costs)
        df += len(costs) - 1
    return Noise(squares / df, df) if df else Noise()


@dataclass(frozen=True)
class Estimate:
    """A config's $/run and throughput over its measurements, with the $/run interval."""

    cost_per_run_usd: float
    hours_per_run: float
    samples_per_s: float | None
    tokens_per_s: float | None
    it_per_s: float | None
    ci95_rel: float  # half-width of the $/run's 95% interval, relative (0: unknown)
    n: int  # measurements pooled
    contended: bool  # every measurement was taken on a contended machine
    dropped: int  # measurements left out (contended ones)

    @property
    def low(self) -> float:
        return self.cost_per_run_usd * (1 - self.ci95_rel)

    @property
    def high(self) -> float:
        return self.cost_per_run_usd * (1 + self.ci95_rel)


def pool(samples: Sequence[Sample], noise: Noise = Noise()) -> Estimate:
    """One estimate from a config's measurements (see the module docstring).

    >>> e = pool([_s(1.0, ci=0.02), _s(1.1, ci=0.02, contended=True)])
    >>> (e.cost_per_run_usd, e.n, e.dropped, round(e.ci95_rel, 3))
    (1.0, 1, 1, 0.02)
    >>> e = pool([_s(1.3, ci=0.02, contended=True), _s(1.1, ci=0.02, contended=True)])
    >>> (e.cost_per_run_usd, e.contended)
    (1.1, True)
    >>> e = pool([_s(1.0, ci=0.02), _s(1.02, ci=0.02)], Noise(0.03**2, 8))
    >>> (round(e.cost_per_run_usd, 2), e.n, round(e.ci95_rel, 3))
    (1.01, 2, 0.049)
    """
    if not samples:
        raise ValueError("pool() needs at least one measurement")
    calm = [s for s in samples if not s.contended]
    # a shared machine only ever slows a trial: with nothing else, its fastest measurement
    kept = calm or [min(samples, key=lambda s: s.cost_per_run_usd)]
    n = len(kept)
    window = sum(s.window_var for s in kept) / n**2
    machine = noise.rel_var * n / n**2 if noise.df else 0.0
    if machine > window:
        half = t95(noise.df) * math.sqrt(sum(max(s.window_var, noise.rel_var) for s in kept)) / n
    else:
        half = Z95 * math.sqrt(window)
    return Estimate(
        cost_per_run_usd=statistics.fmean(s.cost_per_run_usd for s in kept),
        hours_per_run=statistics.fmean(s.hours_per_run for s in kept),
        samples_per_s=_mean(s.samples_per_s for s in kept),
        tokens_per_s=_mean(s.tokens_per_s for s in kept),
        it_per_s=_mean(s.it_per_s for s in kept),
        ci95_rel=half,
        n=n,
        contended=not calm,
        dropped=len(samples) - n,
    )


def _mean(values: Iterable[float | None]) -> float | None:
    known = [v for v in values if v is not None and math.isfinite(v)]
    return statistics.fmean(known) if known else None


def overlaps(a_cost: float, a_rel: float, b_cost: float, b_rel: float) -> bool:
    """Whether two $/run intervals overlap: the two configs tie within the noise.

    >>> overlaps(1.00, 0.02, 1.03, 0.02), overlaps(1.00, 0.01, 1.03, 0.01)
    (True, False)
    """
    return a_cost * (1 - a_rel) <= b_cost * (1 + b_rel) and b_cost * (1 - b_rel) <= a_cost * (
        1 + a_rel
    )


# a difference in $/run whose whole 95% interval lies within this of 1 does not matter to a
# bill (``sweeper.verdict``'s "no difference that matters")
NEGLIGIBLE = 0.02


def tie(a_cost: float, a_rel: float, b_cost: float, b_rel: float) -> bool:
    """Whether two configs' $/run tie: the 95% interval of their ratio (log scale, the two
    half-widths combined in quadrature) holds 1, or lies within ``NEGLIGIBLE`` of it. The
    test a knob's effect at the recommended config is read with (``sweeper.verdict``): two
    intervals that merely overlap may still differ beyond the noise (±20% each, 33% apart),
    and a recommendation that took such a config as a tie would pick one its own knob table
    calls dearer.

    >>> tie(1.00, 0.02, 1.025, 0.02), tie(1.00, 0.02, 1.034, 0.02), tie(1.0, 0.2, 1.33, 0.2)
    (True, False, False)
    >>> tie(16.52, 0.002, 16.57, 0.002)  # apart beyond the noise, by 0.3%: a bill cannot tell
    True
    >>> tie(1.0, 0.0, 1.0, 0.0), tie(1.0, 0.0, 1.03, 0.0)
    (True, False)
    """
    difference = abs(math.log(b_cost) - math.log(a_cost))
    half = math.hypot(math.log1p(max(a_rel, 0.0)), math.log1p(max(b_rel, 0.0)))
    # verdict's bounds: low >= 1 - NEGLIGIBLE and high <= 1 + NEGLIGIBLE, either way round
    negligible = min(math.log1p(NEGLIGIBLE), -math.log1p(-NEGLIGIBLE))
    return difference <= half or difference + half <= negligible


@dataclass(frozen=True)
class Drift:
    """The reference config measured again moved beyond the noise."""

    change: float  # relative change of $/run from its first measurement (+: costlier now)
    at: str
    kind_of: str  # "slower" | "faster"

    def describe(self, number: int) -> str:
        return (
            f"the reference config (trial #{number}) measured {abs(self.change):.1%} "
            f"{self.kind_of} at {self.at} than when first measured: the machine drifted, so "
            "trials measured in between may be off by as much"
        )


def drift(samples: Sequence[Sample], noise: Noise = Noise()) -> Drift | None:
    """The largest move of the reference's drift measurements from its first one, when it is
    beyond both measurements' intervals; None otherwise (or when either was contended).

    >>> drift([_s(1.0, ci=0.01), _s(1.2, ci=0.01, kind="drift")]).kind_of
    'slower'
    >>> drift([_s(1.0, ci=0.01), _s(1.01, ci=0.01, kind="drift")]) is None
    True
    """
    first = next((s for s in samples if s.kind == "trial"), None)
    if first is None or first.contended:
        return None
    worst: Drift | None = None
    for s in samples:
        if s.kind != "drift" or s.contended:
            continue
        change = s.cost_per_run_usd / first.cost_per_run_usd - 1
        var = max(first.window_var, noise.rel_var) + max(s.window_var, noise.rel_var)
        quantile = t95(noise.df) if noise.df and noise.rel_var > first.window_var else Z95
        if abs(change) > quantile * math.sqrt(var) and (
            worst is None or abs(change) > abs(worst.change)
        ):
            worst = Drift(change, s.at, "slower" if change > 0 else "faster")
    return worst


def contention(
    *,
    others_cpu: float | None,
    cpu_count: int | None,
    steal_share: float | None,
    gpu_other_processes: int | None,
) -> str | None:
    """Why a window's measurement was contended, or None: what the child read during it.

    >>> contention(others_cpu=1.9, cpu_count=2, steal_share=0.0, gpu_other_processes=None)
    'other processes used 1.9 of the 2 CPUs'
    >>> contention(others_cpu=0.9, cpu_count=16, steal_share=0.0, gpu_other_processes=0) is None
    True
    """
    reasons = []
    floor = max(CONTENDED_OTHERS_CPU, CONTENDED_OTHERS_SHARE * (cpu_count or 1))
    if others_cpu is not None and others_cpu >= floor:
        reasons.append(f"other processes used {others_cpu:.1f} of the {cpu_count or '?'} CPUs")
    if steal_share is not None and steal_share >= CONTENDED_STEAL_SHARE:
        reasons.append(f"the hypervisor stole {steal_share:.0%} of CPU time")
    if gpu_other_processes:
        s = "" if gpu_other_processes == 1 else "es"
        reasons.append(f"{gpu_other_processes} other process{s} computed on the GPU")
    return "; ".join(reasons) or None


def _s(cost: float, *, ci: float = 0.0, contended: bool = False, kind: str = "trial") -> Sample:
    """A sample for the doctests."""
    return Sample(kind, cost, cost, None, None, None, ci, contended)  # type: ignore[arg-type]


def pooled_run(
    projection: Mapping[str, Any] | None, estimate: Estimate, samples: Sequence[Sample]
) -> tuple[float, float]:
    """Hours and $ of the run from a config's pooled measurements: the first measurement's
    one-time costs (start-up, compile, saves: a real run pays them once, cold, as the trial
    did; a re-measure's start from a warm cache is shorter) plus its training time scaled by
    the pooled throughput. The mean of each measurement's hours mixed the re-measures'
    shorter start-ups into the run, and its training part came out short, or 0 when the
    start-up was most of a small job (6.8 s start-up, 0.22 s of training, stored as 0).

    >>> first = Sample("trial", 0.0007, 7.02 / 3600, 180.0, None, None, None)
    >>> again = Sample("rerun", 0.0006, 5.2 / 3600, 185.5, None, None, None)
    >>> est = Estimate(0.00065, 6.11 / 3600, 182.75, None, None, 0.02, 2, False, 0)
    >>> hours, cost = pooled_run({"one_time_s": 6.8}, est, [first, again])
    >>> round(hours * 3600, 3), round(cost / est.cost_per_run_usd * est.hours_per_run * 3600, 3)
    (7.017, 7.017)
    """
    hours, cost = estimate.hours_per_run, estimate.cost_per_run_usd
    first = next((s for s in samples if s.kind == "trial"), None)
    if (
        not projection
        or first is None
        or not first.samples_per_s
        or not estimate.samples_per_s
        or not (math.isfinite(hours) and hours > 0)
    ):
        return hours, cost
    one_time_h = float(projection.get("one_time_s") or 0.0) / 3600
    train_h = max(0.0, first.hours_per_run - one_time_h)
    pooled = train_h * first.samples_per_s / estimate.samples_per_s + one_time_h
    return pooled, cost * pooled / hours
