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
  (``Estimate.contended`` then says so). Its interval is at least as wide as the spread of
  those measurements (slowest ÷ fastest − 1): sharing moved them that far apart, and nothing
  shows that it spared the fastest. ``Basis`` words which measurements a figure stands on
  ("fastest of 4 measurements, all on a shared machine"), never "pooled" for one of them;
- the machine's run-to-run noise is pooled over every config measured more than once
  (``machine_noise``): it is a property of the machine, and pooling gives it degrees of freedom
  that two measurements of one config never would;
- each measurement's relative variance is the larger of its window's and the machine's; the
  mean's interval uses Student's t with the pooled degrees of freedom when the machine's noise
  decides it.

Two configs tie when the interval of their $/run ratio holds 1 or lies within 2% of it
(``tie``, what the recommendation and its launch note decide by); the sweep measures again the
configs whose intervals merely overlap (``overlaps``), a wider net. A reference config measured
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
    n: int  # measurements the figures stand on: 1 (the fastest) when all were contended
    contended: bool  # every measurement was taken on a contended machine
    dropped: int  # measurements left out (contended ones)

    @property
    def measured(self) -> int:
        """Measurements taken, counted or not."""
        return self.n + self.dropped

    @property
    def basis(self) -> Basis:
        """Which measurements the figures stand on, in words (``Basis``)."""
        return Basis(self.measured, self.contended, 0 if self.contended else self.dropped)

    @property
    def low(self) -> float:
        return self.cost_per_run_usd * (1 - self.ci95_rel)

    @property
    def high(self) -> float:
        return self.cost_per_run_usd * (1 + self.ci95_rel)


def pool(samples: Sequence[Sample], noise: Noise = Noise()) -> Estimate:
    """One estimate from a config's measurements (see the module docstring).

    A calm measurement and a contended one: the calm one alone counts.

    >>> e = pool([_s(1.0, ci=0.02), _s(1.1, ci=0.02, contended=True)])
    >>> (e.cost_per_run_usd, e.n, e.dropped, round(e.ci95_rel, 3))
    (1.0, 1, 1, 0.02)

    Two contended ones: the faster counts, and its ±2% window cannot be the interval of a figure
    that sharing moved by 18% between two runs: the interval reaches the slower run.

    >>> e = pool([_s(1.3, ci=0.02, contended=True), _s(1.1, ci=0.02, contended=True)])
    >>> (e.cost_per_run_usd, e.contended, e.n, e.measured, round(e.ci95_rel, 3))
    (1.1, True, 1, 2, 0.182)
    >>> e.basis.text()
    'fastest of 2 measurements, all on a shared machine'

    Two calm ones, on a machine whose run-to-run noise (3%, 8 df) exceeds their windows':
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
    if not calm:
        half = max(half, contended_spread(samples))
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


def contended_spread(samples: Sequence[Sample]) -> float:
    """How far sharing moved a config's measurements apart when every one was contended: the
    slowest's $/run over the fastest's, less 1 (0 for one measurement, or when any was calm,
    as then the calm ones decide). The least half-width an honest interval of the fastest
    has: the calm $/run lies below it by an amount the measurements do not show, and they
    show that sharing moves a run by this much.

    >>> contended_spread([_s(1.0, contended=True), _s(1.5, contended=True)])
    0.5
    >>> contended_spread([_s(1.0), _s(1.5, contended=True)])  # the calm one decides
    0.0
    >>> contended_spread([_s(1.0, contended=True)])
    0.0
    """
    costs = [s.cost_per_run_usd for s in samples if math.isfinite(s.cost_per_run_usd)]
    if len(costs) < 2 or any(not s.contended for s in samples) or min(costs) <= 0:
        return 0.0
    return max(costs) / min(costs) - 1


@dataclass(frozen=True)
class Basis:
    """Which measurements a config's figures stand on (``pool``), as every table and answer
    words it: how many were taken, whether every one was contended (then the figures are the
    fastest's alone), and how many contended ones a calm mean left out.

    >>> Basis(4, contended=True).text(), Basis(4, contended=True).mark()
    ('fastest of 4 measurements, all on a shared machine', 'fastest of 4')
    >>> Basis(3).text(), Basis(3).mark()
    ('mean of 3 measurements', '×3')
    >>> Basis(3, left_out=1).text(), Basis(3, left_out=1).mark()
    ('mean of 2 measurements (1 more, taken on a shared machine, left out)', '×2 of 3')
    >>> Basis(2, left_out=1).text()
    '1 measurement (1 more, taken on a shared machine, left out)'
    >>> Basis(1, contended=True).text(), Basis().text(), Basis().mark()
    ('1 measurement, on a shared machine', '1 measurement', '')
    """

    measured: int = 1  # measurements taken
    contended: bool = False  # every one on a shared machine: the fastest alone counts
    left_out: int = 0  # contended measurements a mean of calm ones left out

    def __post_init__(self) -> None:
        if self.measured < 1:
            raise ValueError(f"a basis needs at least one measurement, not {self.measured}")
        if not 0 <= self.left_out < self.measured or (self.contended and self.left_out):
            raise ValueError(
                f"{self.left_out} of {self.measured} measurements left out"
                + (" while every one was contended" if self.contended else "")
                + ": a mean keeps at least one calm measurement, and a contended basis keeps "
                "the fastest"
            )

    @classmethod
    def of(cls, samples: Sequence[Sample] | Sequence[Mapping[str, Any]]) -> Basis:
        """From a config's measurements (``Sample`` or their stored JSON: a trial row's
        ``remeasures``)."""
        if not samples:
            raise ValueError("a basis needs at least one measurement")
        busy = [s.contended if isinstance(s, Sample) else bool(s.get("contended")) for s in samples]
        every = all(busy)
        return cls(len(samples), every, 0 if every else sum(busy))

    @classmethod
    def stored(
        cls, remeasures: Sequence[Mapping[str, Any]] | None, contended: bool | None
    ) -> Basis:
        """From a trial row: its ``remeasures`` (each measurement, when there was more than
        one) and its ``contended`` flag (a single measurement's)."""
        return cls.of(remeasures) if remeasures else cls(1, bool(contended))

    @property
    def counted(self) -> int:
        """Measurements the figures stand on."""
        return 1 if self.contended else self.measured - self.left_out

    def text(self) -> str:
        """What the figures are, in words (see the class docstring)."""
        if self.contended:
            if self.measured == 1:
                return "1 measurement, on a shared machine"
            return f"fastest of {self.measured} measurements, all on a shared machine"
        kept = self.counted
        words = f"mean of {kept} measurements" if kept > 1 else "1 measurement"
        if self.left_out:
            words += f" ({self.left_out} more, taken on a shared machine, left out)"
        return words

    def mark(self) -> str:
        """A table cell's short form: '' for one calm measurement, '×3' for the mean of 3,
        '×2 of 3' when contended ones were left out, 'fastest of 4' when all were contended
        (a single contended measurement: '', the table's own flag says it)."""
        if self.contended:
            return f"fastest of {self.measured}" if self.measured > 1 else ""
        if self.measured == 1:
            return ""
        return f"×{self.counted}" + (f" of {self.measured}" if self.left_out else "")


def _mean(values: Iterable[float | None]) -> float | None:
    known = [v for v in values if v is not None and math.isfinite(v)]
    return statistics.fmean(known) if known else None


def overlaps(a_cost: float, a_rel: float, b_cost: float, b_rel: float) -> bool:
    """Whether two $/run intervals overlap: measuring the two again may tell them apart, or
    show that they tie. Not itself a tie: two intervals can overlap while the ratio of the
    two $/run is beyond the noise (``tie``, what the recommendation reads).

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
