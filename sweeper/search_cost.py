"""What a trial costs in seconds, and how ``bayes`` weighs it against its chance of improving
(issue 33 item 4: a max-autotune trial compiled for 345 s on an H100, a QLoRA trial's first
start-up took 202 s, an ordinary trial about a minute).

- **Expected seconds per compile mode** (``expected_seconds``): the compile dominates the
  difference between two configs' trials, so a config's trial is expected to take what earlier
  trials of its compile mode took; a mode not run yet, what the others took less their
  compile, plus its own (``COMPILE_S``).
- **What a trial needs to finish** (``fit_seconds``): the longest trial of its compile mode
  so far, the sweep's cold first trial aside (a mode whose trials all failed early: at least
  the others' longest less their compile, plus its own). Near the end of a time budget the
  sweep loop leaves out the configs whose trial would not finish in the time left
  (``bayes`` picks the best config that can; the other samplers' proposals that cannot are
  not run), and stops, saying so, when no config left can finish
  (``sweeper.sweep.loop.SearchLoop._fit_to_time``; bench/RESULTS.md Search Run 11).
  Before, a trial started when the time left held the longest trial so far, whatever its
  compile mode: after a long trial (a max-autotune compile, a cold first start-up) the
  sweep stopped with ordinary trials' time left.
- **At least its own steps' time** (``step_seconds_needed``): a config whose optimizer step
  holds many more rows than those measured needs its burn-in and window at the slowest
  rows/s measured for its shape, plus its mode's least overhead. The H200 lease of
  2026-11-28 started a bs32 x 8 trial with 49 s left, as its mode's longest trial had taken
  15 s; its steps needed about 65 s, and the budget cut it (49 s of a 475 s lease). It
  needs a trial's it/s, so the replay tables (per-mode trial times, no it/s) are unchanged.
- **A mode never measured is not put off** (``counted_log_seconds``): its first trial tells
  the model its effect on every config, information its time buys.
- **Only the seconds beyond the incumbent's count** (``pick``): a config whose trial is
  expected to take no longer than the best measured config's counts as free; a dearer one
  counts the ratio. The time weighing is a near-tie breaker (among the configs at least
  ``window`` as likely to run and improve as the likeliest), and counting seconds against the
  incumbent keeps it from steering the search away from an expensive mode once that mode
  holds the best config (interactions' best configs need max-autotune: counted against the
  cheapest mode, the same tie breaker took 0.5-1.5 more trials there; bench/RESULTS.md Run 9).

The weighing is off by default (``ImprovementGridSampler.cost_weight`` 0): it still lost
trials on the noisy replay table (15 against 13 to 5% on samples/s, 1.15x the seconds, 40
paired seeds), whose best configs also need max-autotune; it saves seconds only where it
saves trials. Two other forms (``cost_against`` "cheapest", ``cost_cooling``) lost too
(bench/RESULTS.md Run 10, paired seeds): the strict tie breaker (weight 10, window 0.95,
seconds beyond the cheapest candidate's) took 22 / 20.5 against 16 / 15.5 trials on
held-out (30 seeds, 1.43-1.59x the seconds) and 12 / 19.5 against 10.5 / 16.5 on noisy
(100), though it saved 7-18% of the seconds on qlora-24gb and oom-wall; CArBO's cooling
(weight 1 to 0 over 10 measured trials, window 0.5) took 17.5 against 13 on noisy's
samples/s (40).

Expected improvement per second (``cost_acquisition`` "ei": the expected improvement of log
$/run below the best less ``improvement``, times P(runs)^0.5, ÷ the seconds beyond the
incumbent's, among all configs: ``log_expected_improvement``) lost too (bench/RESULTS.md
Run 12, paired seeds): at weight 1 it took more trials to 5% on every table with compile
modes and both metrics (samples/s / tokens/s): 16 / 24 against 10.5 / 16.5 on noisy and
15 / 20.5 against 9.5 / 14 on interactions (100 seeds), 18 / 19.5 against 16 / 15.5 on
held-out, 14.5 / 17.5 against 10.5 / 12 on oom-wall, 21 / 21 against 15 / 15 on
held-out-lora, 20.5 / 20.5 against 18.5 / 17.5 on qlora-24gb (30), with 0.55-1.22x the
summed seconds. Cooled (CArBO: weight 1 to 0 over 10 measured trials) it lost on 11 of the
12 rows, and at weight 0.5 on held-out's tokens/s (19 against 15.5). The expected
improvement alone, time ignored (weight 0), took more trials than the probability of
improvement on interactions (11.5 / 21 against 9.5 / 14), noisy's tokens/s (24 against
16.5) and oom-wall's samples/s (14 against 10.5): on these tables the acquisition itself
costs trials, before the seconds are weighed. Drawing the first pick (and the light pick
after an out of memory) among the cheapest trials (``ImprovementGridSampler.cheap_draws``)
lost too (Run 16): oom-wall's tokens/s 13.5 against 12 trials, interactions's samples/s 1.26x
the summed seconds (30 paired seeds), since a changed first pick reshuffles every later one;
at 200 paired seeds (Run 17) it fails four rows, qlora-24gb's 17.5 / 18 against 15 trials.

From Run 19 on, a form is judged by a rule whose error rates are computed
(bench/replay/calibrated.py: a per-row one-sided sign test on paired trials at p < 0.005, and
the seconds' geometric mean with its interval below 1; a form that changes nothing fails it
5-7% of the time and passes it about 3%). **On by default since Run 19: the first picks learn
the other knobs in the cheapest compile mode** (``ImprovementGridSampler.cheap_first`` 3: a
phase, not a weight: up to 3 measured configs among the configs of the cheapest expected
trial, each by its chance of beating their best, then the whole space). Judged on fresh seeds
it took 0.906x the seconds to 5% [0.869, 0.946] and lost trials on no row (noisy's samples/s
came closest: 68 seeds worse, 52 better, p 0.085). With 6 such picks it saved more (0.868x) but
lost trials on the five rows whose best configs need max-autotune's interactions or sit at a
memory wall. The most any reordering could save at the same trials is 29-64% of the seconds
(bench/replay/room.py): the best configs compile on 11 of the 12 rows.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import scipy.special
from optuna.trial import FrozenTrial

from sweeper.space_trial import MeasureSettings, WarmupSettings

# user attr: the seconds the trial took, start-up and compile included (without it, the time
# from ask to tell)
SECONDS_ATTR = "trial_s"
ORDINARY_TRIAL_S = 60.0  # a trial without compiling: start-up, burn-in, the timed window
# compile seconds of each compile mode, until the sweep has run one: max-autotune compiled for
# 345 s on an H100 (issue 33); default and reduce-overhead compile in about a minute
COMPILE_S = {"none": 0.0, "default": 60.0, "reduce-overhead": 90.0, "max-autotune": 345.0}


def compile_s(mode: Any) -> float:
    """The prior compile seconds of a compile mode (an unknown mode: as ``default``)."""
    return COMPILE_S.get(mode, COMPILE_S["default"]) if isinstance(mode, str) else 0.0


def trial_seconds(trial: FrozenTrial) -> float | None:
    """The seconds a trial took (None: it did not run, or the time is unknown)."""
    if "skipped" in trial.user_attrs:
        return None
    seconds = trial.user_attrs.get(SECONDS_ATTR)
    if isinstance(seconds, (int, float)) and seconds > 0:
        return float(seconds)
    return trial.duration.total_seconds() if trial.duration is not None else None


def expected_seconds(modes: Sequence[Any], took: Sequence[tuple[Any, float]]) -> np.ndarray:
    """The expected seconds of a trial of each of ``modes`` (compile modes), from ``took``
    (compile mode, seconds) of the trials run: the mean of earlier trials of its mode, or for
    a mode not run yet the mean of the others less their modes' compile, plus its own."""
    if not took:
        return np.array([ORDINARY_TRIAL_S + compile_s(m) for m in modes])
    by_mode: dict[Any, list[float]] = {}
    for mode, seconds in took:
        by_mode.setdefault(mode, []).append(seconds)
    ordinary = float(np.mean([s - compile_s(m) for m, ss in by_mode.items() for s in ss]))
    ordinary = max(ordinary, 1.0)
    known = {m: float(np.mean(ss)) for m, ss in by_mode.items()}
    return np.array([known.get(m, ordinary + compile_s(m)) for m in modes])


def fit_seconds(
    modes: Sequence[Any],
    took: Sequence[tuple[Any, float]],
    ran: Sequence[bool] | None = None,
) -> np.ndarray:
    """The seconds a trial of each of ``modes`` (compile modes) must have left to finish, from
    ``took`` (compile mode, seconds) of the trials run, in the order they ran: the longest
    trial of its mode; for a mode not run yet, the longest of the others less their modes'
    compile, plus its own (``COMPILE_S``). The longest, not the mean: a config that runs
    takes longer than one of its mode that fails at its first step (out of memory: 10-55%
    shorter on the replay tables), and a trial the budget cuts is all seconds lost. For the
    same reason a mode whose trials all failed (``ran``, beside ``took``: whether each trial
    was measured; None: all were) needs at least what a mode not run yet would. The sweep's
    first trial is left out while others of its mode have run: it reads the weights and the
    data cold (a QLoRA's first start-up took 202 s more); the only trial of its mode, it is
    the measure of it (held-out-lora's max-autotune compiles 1.5x the prior's 345 s). What a
    mode not run yet adds to its compile is read from the measured trials (a failure ends
    early); with none measured, at least ``ORDINARY_TRIAL_S``.

    >>> fit_seconds(["none", "max-autotune"], [("none", 449.0), ("none", 247.0), ("none", 207.0)])
    array([247., 592.])
    >>> fit_seconds(["default"], [("none", 105.0), ("none", 75.0), ("default", 95.0)],
    ...             [True, True, False])
    array([135.])
    """
    if not took:
        return np.array([ORDINARY_TRIAL_S + compile_s(m) for m in modes])
    first = 1 if len(took) > 1 else 0
    warm = list(took[first:])
    measured = [True] * len(took) if ran is None else list(ran)
    ran_modes = {m for (m, _), r in zip(warm, measured[first:], strict=True) if r}
    longest: dict[Any, float] = {}
    for mode, seconds in warm:
        longest[mode] = max(longest.get(mode, 0.0), seconds)
    # a trial without its compile: from the measured ones (a failure ends early: a compile
    # error where its compile ends, before the burn-in and the timed window); with none
    # measured, at least an ordinary trial's prior
    measured_warm = [t for t, r in zip(warm, measured[first:], strict=True) if r]
    ordinary = max(s - compile_s(m) for m, s in measured_warm or warm)
    ordinary = max(ordinary, 1.0 if measured_warm else ORDINARY_TRIAL_S)
    cold_mode, cold_s = took[0]
    if cold_mode not in longest:  # the only trial of its mode: cold, but what is known of it
        longest[cold_mode] = cold_s
        if measured[0]:
            ran_modes.add(cold_mode)
    out = []
    for mode in modes:
        unseen = ordinary + compile_s(mode)
        if mode not in longest:
            out.append(unseen)
        elif mode not in ran_modes:
            out.append(max(longest[mode], unseen))
        else:
            out.append(longest[mode])
    return np.array(out)


def steps_floor_s(step_s: float, warmup: WarmupSettings, measure: MeasureSettings) -> float:
    """The least time a trial's own steps take at ``step_s`` seconds an optimizer step, as
    ``sweeper.trial.recipe`` runs them: the burn-in's ``min_steps`` (its ``max_seconds`` may
    end it after fewer, never before one), then a window of at least ``measure.min_steps``,
    ``warmup_multiple`` × the burn-in and ``min_seconds``, the last two cut at
    ``max_seconds``, the first never.

    >>> w, m = WarmupSettings(min_steps=3, max_steps=60), MeasureSettings(min_steps=10,
    ...     min_seconds=10, max_seconds=60)
    >>> steps_floor_s(0.2, w, m), steps_floor_s(4.0, w, m)  # 3 + 12 steps at 4 s
    (10.6, 60.0)
    >>> steps_floor_s(30.0, w, m)  # 3 + 10: the cap cuts the multiple, not min_steps
    390.0
    """
    burn_in = max(1, min(warmup.min_steps, math.ceil(warmup.max_seconds / step_s)))
    wanted = max(measure.min_steps, math.ceil(measure.warmup_multiple * burn_in)) * step_s
    window = max(
        measure.min_steps * step_s, min(max(wanted, measure.min_seconds), measure.max_seconds)
    )
    return round(burn_in * step_s + window, 6)


@dataclass(frozen=True, kw_only=True)
class StepRef:
    """A measured trial, as the step-aware bound reads it: its config's shape, how fast its
    optimizer steps went, and how long the whole trial took."""

    compile_mode: Any
    max_seq_length: int | None
    packing: bool
    rows_per_step: int  # per device: batch × accumulation
    step_s: float  # 1 / it/s
    trial_s: float


def step_seconds_needed(
    *,
    compile_mode: Any,
    max_seq_length: int | None,
    packing: bool,
    rows_per_step: int,
    refs: Sequence[StepRef],
    warmup: WarmupSettings,
    measure: MeasureSettings,
) -> float | None:
    """What a config's trial needs at least, from its step's size (the H200 lease of
    2026-11-28 lost its trial #8, 49 s of a 475 s lease, to the budget: bs32 × 8
    accumulation steps, 8-32x the rows of any earlier step, expected to take what the
    longest uncompiled trial had, 15 s). Its step time: its rows per step at the slowest
    rows/s measured on the same ``max_seq_length`` and packing (else the same length, else
    any, scaled by length): slowest, not median, as ``fit_seconds`` takes the longest, since
    a trial the budget cuts is all seconds lost. Its overhead (start-up, compile): the least
    a measured trial of its compile mode took beyond its own steps. None: no measured trial
    of its mode, or none with a speed (``fit_seconds`` alone then)."""
    own = [r for r in refs if r.compile_mode == compile_mode]
    if not own:
        return None
    overhead = max(0.0, min(r.trial_s - steps_floor_s(r.step_s, warmup, measure) for r in own))
    same = [r for r in refs if (r.max_seq_length, r.packing) == (max_seq_length, packing)]
    same = same or [r for r in refs if r.max_seq_length == max_seq_length]

    def rows_s(r: StepRef) -> float:  # rows/s, scaled to this length where it differs
        scale = (r.max_seq_length or 1) / (max_seq_length or 1) if r not in same else 1.0
        return r.rows_per_step / r.step_s * scale

    slowest = min(rows_s(r) for r in (same or refs))
    return overhead + steps_floor_s(rows_per_step / slowest, warmup, measure)


def counted_log_seconds(
    modes: Sequence[Any],
    took: Sequence[tuple[Any, float]],
    measured_modes: Sequence[Any],
    after: int,
) -> np.ndarray:
    """log of each of ``modes``' expected seconds as the weighing counts them: a compile mode
    measured fewer than ``after`` times counts as the cheapest mode that has been."""
    log_seconds = np.log(expected_seconds(modes, took))
    counts: dict[Any, int] = {}
    for mode in measured_modes:
        counts[mode] = counts.get(mode, 0) + 1
    new = np.array([counts.get(m, 0) < after for m in modes], dtype=bool)
    if new.all():
        return np.zeros(len(modes))
    return np.where(new, log_seconds[~new].min(), log_seconds)


def cooled_weight(weight: float, measured: int, cooling: int) -> float:
    """``weight`` falling linearly to 0 over the first ``cooling`` measured trials (CArBO's cost
    cooling: time counts while the model knows little, then the chance alone; 0: no cooling)."""
    if cooling <= 0:
        return weight
    return weight * max(0.0, 1.0 - measured / cooling)


def log_expected_improvement(z: np.ndarray) -> np.ndarray:
    """log of z Φ(z) + φ(z): the expected improvement below a target of a Gaussian value, in
    units of its sd (z = (target − mean) / sd; EI = sd (z Φ(z) + φ(z))). Finite far into
    the tail, where the sum itself underflows:
    φ(z) (1 + z Φ(z)/φ(z)) with the Mills ratio from ``erfcx``, and its asymptote
    −z²/2 − log √(2π) − 2 log |z| beyond z = −1e4.

    >>> [round(float(v), 4) for v in np.exp(log_expected_improvement(np.array([0.0, 1.0])))]
    [0.3989, 1.0833]
    """
    z = np.asarray(z, dtype=float)
    out = np.empty_like(z)
    high = z > -1.0
    # z Φ(z) + φ(z) directly where it does not cancel
    zh = z[high]
    out[high] = np.log(zh * scipy.special.ndtr(zh) + np.exp(-0.5 * zh**2) / _SQRT_2PI)
    low = ~high
    zl = np.maximum(z[low], -1e4)
    mills = math.sqrt(math.pi / 2) * scipy.special.erfcx(-zl / math.sqrt(2))  # Φ(z)/φ(z)
    tail = np.log(np.maximum(1 + zl * mills, 1e-300))
    far = z[low] < -1e4  # 1 + z Φ/φ ~ 1/z², where float cancellation would lose it
    tail = np.where(far, -2 * np.log(-z[low]), tail)
    out[low] = -0.5 * z[low] ** 2 - math.log(_SQRT_2PI) + tail
    return out


_SQRT_2PI = math.sqrt(2 * math.pi)


def pick(
    log_p: np.ndarray,
    log_seconds: np.ndarray,
    incumbent_log_s: float,
    weight: float,
    window: float,
    against: str = "incumbent",
) -> int:
    """The index of the config to run next: among the configs whose log chance of running
    and improving (``log_p``) is at least log ``window`` below the highest, the one with the
    most of it per second of trial beyond ``incumbent_log_s`` (the best measured config's
    expected log seconds; ``against`` "cheapest": beyond the cheapest candidate's), to the
    power ``weight`` (0: the likeliest, time ignored). ``window`` 0: among all the configs
    (expected improvement per second, ``ImprovementGridSampler.cost_acquisition`` "ei")."""
    if weight == 0:
        return int(np.argmax(log_p))
    if against not in ("incumbent", "cheapest"):
        raise ValueError(f"against must be 'incumbent' or 'cheapest', not {against!r}")
    promising = log_p >= log_p.max() + math.log(window) if window > 0 else np.ones_like(log_p, bool)
    base = incumbent_log_s if against == "incumbent" else float(log_seconds.min())
    extra = np.maximum(log_seconds - base, 0.0)  # a cheaper trial is not a gain
    return int(np.argmax(np.where(promising, log_p - weight * extra, -np.inf)))
