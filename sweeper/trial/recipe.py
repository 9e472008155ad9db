"""The measurement recipe, written once and fed by any engine: burn-in → timed window → done.

The recorder is push-driven: an engine that owns its loop (sweeper's plain loop, or a
``TrainerCallback`` inside ``transformers.Trainer``) tells it what happened — a micro-batch
arrived after so long a wait, an optimizer step ended — and asks whether to go on. The
recorder owns every timing rule:

- Burn-in steps are synchronized one by one: their times decide when the step time is steady
  (median of the last ``window`` steps within ``tolerance`` of the ``window`` before).
- A step's time runs from the end of the step before to its own end, so whatever the engine
  does between steps (fetching batches, logging, its callbacks) is inside it, as in the run.
- The timed window is synchronized only at its edges, as a real run is: per-step times come
  from device events (``CudaTimer``) or the host clock, so no step waits for the device more
  than training would. Losses stay on the device until an edge, where they are checked.
- Whatever burn-in cost beyond steady-state steps (torch.compile, autotuning, allocator
  warm-up) is reported apart and never enters the throughput: a real run pays it once.
- Time the host spends blocked waiting for a batch is kept apart (``data_wait_share``).

Nothing here imports torch: the clock and the device are injected (``HostTimer`` with a fake
clock in the tests).
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from sweeper.noise import t95
from sweeper.space_trial import MeasureSettings, WarmupSettings


def ci95_rel(step_times: list[float]) -> float:
    """Half-width of the 95% interval of the mean step time, relative to the mean.

    The same relative half-width bounds throughput (its reciprocal) to first order.

    >>> round(ci95_rel([1.0, 1.1, 0.9, 1.0, 1.0]), 4)
    0.0878
    """
    n = len(step_times)
    if n < 2:
        return math.inf
    mean = statistics.fmean(step_times)
    return t95(n - 1) * statistics.stdev(step_times) / math.sqrt(n) / mean if mean > 0 else math.inf


def is_steady(step_times: list[float], window: int, tolerance: float) -> bool:
    """Median of the last ``window`` steps within ``tolerance`` of the median of those before.

    >>> is_steady([30.0, 0.21, 0.20, 0.20, 0.21, 0.20], window=3, tolerance=0.05)
    True
    >>> is_steady([30.0, 9.0, 0.4, 0.20, 0.21, 0.20], window=3, tolerance=0.05)
    False
    """
    if len(step_times) < 2 * window:
        return False
    recent = statistics.median(step_times[-window:])
    before = statistics.median(step_times[-2 * window : -window])
    return abs(recent / before - 1) <= tolerance


def percentile(values: list[float], q: float) -> float:
    """Linear-interpolated percentile (numpy's default)."""
    ordered = sorted(values)
    position = (len(ordered) - 1) * q / 100
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


class Timer(Protocol):
    """The clock and the device, as the recorder sees them."""

    def now(self) -> float:
        """Host time in seconds (monotonic)."""

    def sync(self) -> None:
        """Wait until the device has finished all queued work."""

    def mark(self) -> Any:
        """A point in the device's work stream (a CUDA event; the host time on a CPU)."""

    def between(self, start: Any, end: Any) -> float | None:
        """Seconds from ``start`` to ``end``; None while the device has not reached ``end``."""


class HostTimer:
    """The host clock; the device is the host (CPU), or ``sync`` waits for it."""

    def __init__(
        self,
        clock: Callable[[], float] = time.perf_counter,
        sync: Callable[[], None] = lambda: None,
    ) -> None:
        self._clock, self._sync = clock, sync

    def now(self) -> float:
        return self._clock()

    def sync(self) -> None:
        self._sync()

    def mark(self) -> float:
        return self._clock()

    def between(self, start: float, end: float) -> float:
        return end - start


@dataclass
class Step:
    """One optimizer step as the engine reported it."""

    rows: int = 0  # rows of the batches (a packed row holds several samples)
    real_tokens: int = 0
    padded_tokens: int = 0
    data_wait_s: float = 0.0
    micro_batches: int = 0
    loss: Any = None  # a device tensor (or a float); read only at the edges
    time_s: float = 0.0


@dataclass
class Recording:
    """What the recorder saw: burn-in steps, window steps and the window's wall time."""

    burn_in: list[Step] = field(default_factory=list)
    window: list[Step] = field(default_factory=list)
    window_s: float = 0.0
    steady: bool = False
    target_ci: float = 0.0
    host: dict[str, Any] = field(default_factory=dict)  # the window's contention (HostWatch)

    @property
    def burn_in_times(self) -> list[float]:
        return [s.time_s for s in self.burn_in]

    @property
    def window_times(self) -> list[float]:
        return [s.time_s for s in self.window]

    def summary(self) -> dict[str, Any]:
        """Throughput and timing statistics of the window; burn-in cost kept apart."""
        times = self.window_times
        p50 = percentile(times, 50)
        mean_step = statistics.fmean(times)
        rows = int(sum(s.rows for s in self.window))  # device sums (padding-free rows) too
        padded = sum(s.padded_tokens for s in self.window)
        real = float(sum(s.real_tokens for s in self.window))  # device sums are read here
        ci = ci95_rel(times)
        excess = max(0.0, sum(self.burn_in_times) - len(self.burn_in) * p50)
        return {
            "it_per_s": len(times) / self.window_s,
            "rows_per_s": rows / self.window_s,
            "tokens_per_s": real / self.window_s,
            "padded_tokens_per_s": padded / self.window_s,
            "padding_share": 1 - real / padded if padded else 0.0,
            "data_wait_share": min(1.0, sum(s.data_wait_s for s in self.window) / self.window_s),
            "step_time_p50_s": p50,
            "step_time_p90_s": percentile(times, 90),
            "step_time_mean_s": mean_step,
            "step_time_cv": statistics.stdev(times) / mean_step if len(times) > 1 else 0.0,
            "throughput_ci95_rel": ci,
            "ci_target": self.target_ci,
            "ci_met": ci <= self.target_ci,
            "measured_steps": len(times),
            "window_s": self.window_s,
            "warmup_steps": len(self.burn_in),
            "warmup_steady": self.steady,
            "warmup_s": sum(self.burn_in_times),
            "warmup_excess_s": excess,
            "first_step_s": self.burn_in_times[0],
            "warmup_step_times_s": self.burn_in_times,
            "step_times_s": times,
            "data_wait_s": [s.data_wait_s for s in self.burn_in + self.window],
            "mean_row_tokens": padded / rows if rows else 0.0,
            # real tokens per sample (a packed row counts as one): the context each real token
            # attends over, the T of MFU's attention term
            "mean_sample_tokens": real / rows if rows else 0.0,
            **self.host,
        }


def merge(recordings: list[Recording]) -> Recording:
    """One recording of a group of ranks that stepped together: each step's rows and tokens
    summed over the ranks, its time the slowest rank's (a collective waits for it), as its
    data wait; the window as long as the longest rank's. The first rank's host reading and
    steadiness stand for the group.

    >>> a = Recording(window=[Step(rows=2, time_s=1.0)], window_s=1.0)
    >>> b = Recording(window=[Step(rows=2, time_s=1.5)], window_s=1.5)
    >>> merged = merge([a, b])
    >>> merged.window[0].rows, merged.window[0].time_s, merged.window_s
    (4, 1.5, 1.5)
    """
    first = recordings[0]
    for recording in recordings[1:]:
        if (len(recording.burn_in), len(recording.window)) != (
            len(first.burn_in),
            len(first.window),
        ):
            raise RuntimeError("the ranks timed different steps: their recorders disagreed")

    def combined(steps: list[Step]) -> Step:
        return Step(
            rows=sum(s.rows for s in steps),
            real_tokens=sum(s.real_tokens for s in steps),
            padded_tokens=sum(s.padded_tokens for s in steps),
            data_wait_s=max(s.data_wait_s for s in steps),
            micro_batches=steps[0].micro_batches,
            loss=steps[0].loss,
            time_s=max(s.time_s for s in steps),
        )

    return Recording(
        burn_in=[combined(list(s)) for s in zip(*(r.burn_in for r in recordings), strict=True)],
        window=[combined(list(s)) for s in zip(*(r.window for r in recordings), strict=True)],
        window_s=max(r.window_s for r in recordings),
        steady=first.steady,
        target_ci=first.target_ci,
        host=first.host,
    )


class Watch(Protocol):
    """Reads the machine at the window's edges (``sweeper.trial.contention.HostWatch``)."""

    def start(self) -> None: ...

    def stop(self) -> dict[str, Any]: ...


class Recorder:
    """Burn-in until steady, then a timed window until the interval target or a cap.

    Engines call ``start()`` once before the first step, ``batch()`` for each micro-batch
    (with the time they waited for it), ``loss()`` with the step's loss, and ``step_end()``
    after each optimizer step; ``step_end`` returns True when the measurement is done.
    """

    def __init__(
        self,
        warmup: WarmupSettings,
        measure: MeasureSettings,
        timer: Timer,
        watch: Watch | None = None,
        *,
        on_phase: Callable[..., None] | None = None,
        agree: Callable[[bool], bool] | None = None,
    ) -> None:
        self.warmup, self.measure, self.timer = warmup, measure, timer
        self.watch = watch
        # the ranks of a multi-device trial decide together (``sweeper.trial.ranks``): each
        # phase ends when one rank's rule says so, so every rank times the same steps and none
        # is left alone in a collective; given this rank's verdict, returns the group's
        self.agree = agree
        # told where the recorder is (``sweeper.trial.progress.mark``), never inside the window
        self.on_phase = on_phase
        self.phase = "idle"  # idle → burn_in → window → done
        self.recording = Recording(target_ci=measure.target_ci)
        self._current = Step()
        self._phase_started = 0.0
        self._step_started = 0.0
        self._marks: list[Any] = []
        self._known = 0  # window steps whose end the device has reached
        self._min_window_steps = measure.min_steps

    def start(self) -> None:
        if self.phase != "idle":
            raise RuntimeError("the recorder was started twice")
        self.timer.sync()
        self.phase = "burn_in"
        if self.on_phase is not None:
            self.on_phase("burn_in", step=0)
        self._phase_started = self._step_started = self.timer.now()

    def batch(self, *, rows: int, real_tokens: int, padded_tokens: int, data_wait_s: float) -> None:
        step = self._current
        step.rows += rows
        step.real_tokens += real_tokens
        step.padded_tokens += padded_tokens
        step.data_wait_s += data_wait_s
        step.micro_batches += 1

    def loss(self, value: Any) -> None:
        """The step's loss (summed over micro-batches by the engine, or one per call)."""
        current = self._current.loss
        self._current.loss = value if current is None else current + value

    @property
    def done(self) -> bool:
        return self.phase == "done"

    def step_end(self) -> bool:
        """Close the current optimizer step; True when the measurement is complete."""
        if self.phase == "burn_in":
            self._end_burn_in_step()
        elif self.phase == "window":
            self._end_window_step()
        elif self.phase == "idle":
            raise RuntimeError("step_end() before start()")
        return self.done

    def _end_burn_in_step(self) -> None:
        self.timer.sync()
        now = self.timer.now()
        step, self._current = self._current, Step()
        step.time_s = now - self._step_started
        self._step_started = now
        steps = self.recording.burn_in
        steps.append(step)
        rule = self.warmup
        steady = len(steps) >= rule.min_steps and is_steady(
            self.recording.burn_in_times, rule.window, rule.tolerance
        )
        capped = len(steps) >= rule.max_steps or now - self._phase_started >= rule.max_seconds
        if self._agreed(steady or capped):
            self.recording.steady = steady
            # the window is long enough that burn-in stays a small share of the trial
            self._min_window_steps = max(
                self.measure.min_steps, math.ceil(self.measure.warmup_multiple * len(steps))
            )
            self.phase = "window"
            if self.on_phase is not None:
                self.on_phase("window", steps=len(steps))
            if self.watch is not None:
                # read the host before the window opens, so the reading is not timed
                self.watch.start()
            if self.watch is not None or self.on_phase is not None:
                now = self._step_started = self.timer.now()
            self._phase_started = now
            self._marks = [self.timer.mark()]
            self._known = 0
        elif self.on_phase is not None:
            self.on_phase("burn_in", step=len(steps))
            self._step_started = self.timer.now()  # the write is not the next step's time

    def _end_window_step(self) -> None:
        step, self._current = self._current, Step()
        steps = self.recording.window
        steps.append(step)
        self._marks.append(self.timer.mark())
        self._resolve(wait=False)
        rule = self.measure
        elapsed = self.timer.now() - self._phase_started
        known = [s.time_s for s in steps[: self._known]]
        enough = (
            self._known >= self._min_window_steps
            and elapsed >= rule.min_seconds
            and ci95_rel(known) <= rule.target_ci
        )
        capped = len(steps) >= rule.max_steps or elapsed >= rule.max_seconds
        # the caps may cut the burn-in multiple short, never the space's own min_steps
        if self._agreed((enough or capped) and len(steps) >= rule.min_steps):
            self.timer.sync()
            self.recording.window_s = self.timer.now() - self._phase_started
            self._resolve(wait=True)
            if self.watch is not None:
                self.recording.host = self.watch.stop()
            self.phase = "done"
            if self.on_phase is not None:
                self.on_phase("finishing")

    @property
    def min_window_steps(self) -> int:
        """The steps the window needs: ``measure.min_steps``, and ``warmup_multiple`` × the
        burn-in once burn-in has ended."""
        return self._min_window_steps

    def settle_window(self) -> None:
        """Synchronize and read every window step's time (the program's run ended inside the
        window: nothing more will come)."""
        self.timer.sync()
        self._resolve(wait=True)

    def end_early(self) -> bool:
        """Close a window the program's own run ended inside: True, and done as a capped window
        is (the interval reached is the one kept), when it holds the steps it needs
        (``min_window_steps``); False, and left as it is, when it does not. Its time is its
        steps' own, up to the last step's end: what the program did after its loop is not in it.
        """
        if self.phase != "window":
            raise RuntimeError(f"end_early() in phase {self.phase}")
        self.settle_window()
        steps = self.recording.window
        if len(steps) < self._min_window_steps:
            return False
        self.recording.window_s = math.fsum(s.time_s for s in steps)
        if self.watch is not None:
            self.recording.host = self.watch.stop()
        self.phase = "done"
        if self.on_phase is not None:
            self.on_phase("finishing")
        return True

    def _agreed(self, verdict: bool) -> bool:
        return verdict if self.agree is None else self.agree(verdict)

    def _resolve(self, *, wait: bool) -> None:
        steps = self.recording.window
        while self._known < len(steps):
            seconds = self.timer.between(self._marks[self._known], self._marks[self._known + 1])
            if seconds is None:
                if not wait:
                    return
                raise RuntimeError("a device mark is unresolved after synchronizing")
            steps[self._known].time_s = seconds
            self._known += 1

    def losses(self) -> list[Any]:
        return [s.loss for s in self.recording.burn_in + self.recording.window]
