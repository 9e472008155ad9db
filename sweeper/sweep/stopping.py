"""When a sweep stops asking: the time it has left (``TimeBudget``), and after each measured
trial, ``budget.patience`` and ``budget.planned_runs`` (``Stopping``). Each says why it stops;
the loop stops."""

from __future__ import annotations

import re
import statistics
import time
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING

from sweeper.errors import NOT_SHOWN, asked_and_ran
from sweeper.space import Space
from sweeper.space_budget import Budget
from sweeper.sweep.outcome import Outcome

if TYPE_CHECKING:
    from sweeper.sweep.share import StudyShare

# The stopping rule of budget.planned_runs looks at improvements over at least this many trials.
_SAVING_WINDOW = 10
# Stop once this many trials in a row, with nothing measured yet, failed the same way.
SAME_FAILURE_STOP = 3


def failure_signature(message: str) -> str:
    """A failure's message less what changes from config to config and run to run (numbers,
    addresses, temporary paths), so that one failure met by every config reads as one.

    >>> failure_signature("asked 4, ran 8 at 0x7f3a in /tmp/sweeper-trial-91-ab_c/x") == (
    ...     failure_signature("asked 16, ran 8 at 0x55e0 in /tmp/sweeper-trial-7-zz/x"))
    True
    """
    message = re.sub(r"/tmp/\S*", "<tmp>", message)
    message = re.sub(r"0x[0-9a-fA-F]+", "<addr>", message)
    return re.sub(r"\d+(\.\d+)?", "<n>", message)


def device_hours_limit(budget: Budget, usd_per_hour: float) -> float | None:
    """The space's limits on device time, in device-hours: ``budget.max_device_hours``, and
    ``budget.max_usd`` at ``usd_per_hour`` (one device's price); None: neither is set. A
    trial on N devices spends N device-hours per hour.

    >>> device_hours_limit(Budget(n_trials=9, max_usd=10, max_device_hours=5), 2.5)
    4.0
    """
    limits = [
        budget.max_device_hours,
        None if budget.max_usd is None else budget.max_usd / usd_per_hour,
    ]
    known = [h for h in limits if h is not None]
    return min(known) if known else None


class TimeBudget:
    """The sweep's deadlines (``time.monotonic()``; None: no limit) and how long its trials
    (and re-measures) took: a trial starts only if the time left holds the longest so far.

    Two clocks: ``deadline`` is wall time (``budget.max_minutes``); ``device_deadline`` is
    when one device's time would reach the space's device-time limit (``budget.max_usd``,
    ``budget.max_device_hours``). The sweep spends one device's time while it prepares,
    probes and runs one-device trials; a trial on N devices spends N: it brings the device
    deadline (N - 1) × its seconds nearer.

    ``shared`` (a sweep with a store) replaces ``device_deadline``: the device time is the
    study's, what all its workers used counted from the store, and this worker may spend its
    share of what is left (``sweeper.sweep.share``)."""

    def __init__(
        self,
        deadline: float | None = None,
        device_deadline: float | None = None,
        shared: StudyShare | None = None,
        now: Callable[[], float] = time.monotonic,
    ):
        self.now = now  # the clock of the deadlines (the replay bench's is simulated)
        self.deadline = deadline
        self.device_deadline = device_deadline
        self.shared = shared
        self.trial_seconds: list[float] = []
        self.trial_device_seconds: list[float] = []  # seconds × the trial's devices
        self.longest_s = 0.0
        self.longest_device_s = 0.0

    def left_s(self, devices: int = 1) -> float | None:
        """Wall seconds a trial on ``devices`` may still run (None: no limit)."""
        now = self.now()
        device_left = self.device_left_s()
        left = [
            None if self.deadline is None else self.deadline - now,
            None if device_left is None else device_left / devices,
        ]
        known = [s for s in left if s is not None]
        return min(known) if known else None

    def device_left_s(self) -> float | None:
        """Device-seconds this worker may still spend under the device-time limit (None: no
        limit): with ``shared``, its share of what the study's workers have left."""
        if self.shared is not None:
            return self.shared.left_s()[1]
        return None if self.device_deadline is None else self.device_deadline - self.now()

    def took(self, seconds: float, devices: int = 1) -> None:
        self.trial_seconds.append(seconds)
        self.trial_device_seconds.append(seconds * devices)
        self.longest_s = max(self.longest_s, seconds)
        self.longest_device_s = max(self.longest_device_s, seconds * devices)
        if self.shared is not None:
            self.shared.clock.add_device_seconds((devices - 1) * seconds)
        elif self.device_deadline is not None:
            self.device_deadline -= (devices - 1) * seconds

    def spent(self, left_s: float | None) -> bool:
        """Whether ``left_s`` (``left_s()``) cannot hold another trial as long as the longest,
        or the device time left cannot pay for another as costly as the costliest."""
        return self.why_spent(left_s) is not None

    def device_time_spent(self) -> str:
        """Why the device-time limit ends the sweep, in words (the study's, shared by its
        workers, or this sweep's)."""
        device_left = self.device_left_s() or 0.0
        if self.shared is not None:
            left, share, live = self.shared.left_s()
            limit = self.shared.limit_s
            return (
                f"the study's device-time budget is spent: its workers used "
                f"{limit - left:.0f} of {limit:.0f} device-seconds, this one "
                f"{self.shared.clock.device_s():.0f}; {max(0.0, share):.0f} left to this "
                f"worker ({live} live worker(s) share {max(0.0, left):.0f}), the costliest "
                f"trial took {self.longest_device_s:.0f} (budget.max_usd / "
                "max_device_hours, each device priced)"
            )
        return (
            f"the sweep's device-time budget is spent ({max(0.0, device_left):.0f} "
            f"device-seconds left, the costliest trial took {self.longest_device_s:.0f}: "
            "budget.max_usd / max_device_hours, each device priced)"
        )

    def why_spent(self, left_s: float | None) -> str | None:
        """Why no trial may start now (``spent``), in words; None: one may."""
        device_left = self.device_left_s()
        if device_left is not None and (device_left <= 0 or device_left < self.longest_device_s):
            return self.device_time_spent()
        if left_s is not None and (left_s <= 0 or left_s < self.longest_s):
            return (
                f"the sweep's time budget is spent ({max(0.0, left_s):.0f} s left, the "
                f"longest trial took {self.longest_s:.0f} s)"
            )
        return None


def expected_saving(
    gains: Sequence[tuple[int, float]], measured: int, window: int, best_cost: float, runs: int
) -> float:
    """Dollars the next trial is expected to save over ``runs`` runs: the chance that it
    improves on the best (improvements beyond noise in the last ``window`` trials, with one
    success and one failure added so that a quiet stretch never reads as certainty) times the
    mean relative gain of the improvements so far times the best $/run times ``runs``.

    >>> round(expected_saving([(3, 0.2), (8, 0.1)], 20, 10, 2.0, 5), 4)  # 0 in 10: (0+1)/(10+2)
    0.125
    >>> round(expected_saving([(3, 0.2), (18, 0.1)], 20, 10, 2.0, 5), 4)  # 1 in 10: (1+1)/(10+2)
    0.25
    """
    recent = sum(1 for at, _ in gains if at > measured - window)
    chance = (recent + 1) / (window + 2)
    gain = statistics.fmean(g for _, g in gains) if gains else 0.0
    return chance * gain * best_cost * runs


class Stopping:
    """Follows the best $/run beyond noise over the measured trials, and says when the next
    trial is not worth running (``budget.patience``, ``budget.planned_runs``)."""

    def __init__(self, space: Space, earlier: Iterable[Outcome], time_budget: TimeBudget) -> None:
        self.space, self.time = space, time_budget
        measured = [o for o in earlier if o.cost is not None]
        # the best measured so far, beyond noise (a resumed sweep starts from its earlier best)
        self.best: Outcome | None = min(measured, key=lambda o: o.cost or 0.0, default=None)
        self.since_best = 0  # measured trials since it
        self.gains: list[tuple[int, float]] = []  # (measured trials so far, relative gain)
        self.measured = 0  # measured trials (feasible or not) of this sweep
        # the signatures of this sweep's last trials in a row that failed as "error" while the
        # study had nothing measured (``_failing_alike``)
        self.alike: list[str] = []
        # (knob, value that ran) → {value asked: first trial}, from ``mismatch`` failures
        self.ignored: dict[tuple[str, str], dict[str, int]] = {}
        # (knob, asked, ran) → the trials that failed so, for a knob the space lists once
        self.one_value_ignored: dict[tuple[str, str, str], list[int]] = {}
        # the stop was the program's defect (it ignores a knob), not the search's end: the
        # sweep exits non-zero even with completed trials (``cli_sweep.outcome``)
        self.program_defect = False

    def after_trial(self, outcome: Outcome) -> str | None:
        """Count one more measured trial, which gave ``outcome``; why to stop now, if so."""
        self.measured += 1
        return (
            self._failing_alike(outcome)
            or self._ignoring_a_knob(outcome)
            or self._out_of_patience(outcome)
            or self._not_worth_it()
        )

    def _ignoring_a_knob(self, outcome: Outcome) -> str | None:
        """Whether the program ran one value of a knob whatever value was asked (two trials
        asked two other values, and both ran that one): every further trial that asks
        another fails as ``mismatch``, paying its start-up (a walk's script with the line
        alone, its DataLoader's batch size and workers its own: 7 of 8 trials). Said with
        what to do; the trials so far are kept."""
        if outcome.failure_kind != "mismatch":
            return None
        if NOT_SHOWN in (outcome.message or ""):  # every config would fail alike
            self.program_defect = True
            return (
                f"trial #{outcome.number} could not read back a knob the space lists from your "
                "program, and no config can: pass sweeper.step the object its failure names "
                "(loader= or optimizer=), or leave the knob out of search:; then launch again "
                "(the trials run so far are kept)"
            )
        for knob, asked, ran in asked_and_ran(outcome.message or ""):
            if asked == ran:
                continue
            seen = self.ignored.setdefault((knob, ran), {})
            seen.setdefault(asked, outcome.number)
            alike = self.one_value_ignored.setdefault((knob, asked, ran), [])
            alike.append(outcome.number)
            if len(alike) >= 2 and len(self.space.search.values(knob)) == 1:
                # the space lists one value: every config asks it, and every trial fails so
                # (a walk's script kept its own length, 512, where the space had 320: 4 of 4)
                self.program_defect = True
                return (
                    f"your program ran {knob} {ran} in #{alike[0]} and #{alike[1]}, where the "
                    f"space has only {asked} for it: every trial asks {asked} and would fail "
                    f"alike. List {ran} for {knob} in search: (what your program runs), or "
                    f"make the program take {knob} from sweeper (`sweeper.trial_config()`, or "
                    "the flags or environment the space's `knobs:` passes); then launch again "
                    "(the trials run so far are kept)"
                )
            if len(seen) >= 2:
                self.program_defect = True
                trials = ", ".join(f"asked {a} in #{n}" for a, n in list(seen.items())[:3])
                return (
                    f"your program ran {knob} {ran} whatever was asked ({trials}): it does "
                    "not take it from sweeper, so every trial asking another value fails "
                    f"alike. Make it read {knob} from `sweeper.trial_config()` (or the flags "
                    "or environment the space's `knobs:` passes) where it sets it, or list "
                    f"only {ran} for it in search:; then launch again (the trials run so far "
                    "are kept)"
                )
        return None

    def _failing_alike(self, outcome: Outcome) -> str | None:
        """Whether the last ``SAME_FAILURE_STOP`` trials, with nothing measured in the study,
        failed the same way whatever their configs (a crash at import, a missing file, a
        broken environment: failures of kind ``error`` whose messages differ only in numbers
        and paths). Each further trial would pay its start-up to fail the same; out of
        memory, a compile error and the other kinds a config causes are left to the search,
        which learns from them."""
        if self.best is not None or outcome.failure_kind != "error":
            self.alike = []
            return None
        self.alike.append(failure_signature(outcome.message or ""))
        if len(self.alike) < SAME_FAILURE_STOP or len(set(self.alike[-SAME_FAILURE_STOP:])) > 1:
            return None
        said = " ".join((outcome.message or "no message").split())
        return (
            f"the last {SAME_FAILURE_STOP} trials failed the same way whatever their config, "
            f"and none has been measured (error: {said[:600]}{'...' if len(said) > 600 else ''}); "
            "more trials would fail alike: fix that, then launch again (the trials run so far "
            "are kept)"
        )

    def _out_of_patience(self, outcome: Outcome) -> str | None:
        """Whether ``budget.patience`` measured trials in a row have not beaten the best $/run
        by more than both measurements' 95% intervals."""
        patience = self.space.budget.patience
        if not outcome.feasible:
            return None
        assert outcome.cost is not None
        best = self.best
        if (
            best is None
            or best.cost is None
            or (outcome.cost < best.cost * (1 - max(outcome.spread, best.spread)))
        ):
            if best is not None and best.cost:
                self.gains.append((self.measured, 1 - outcome.cost / best.cost))
            self.best, self.since_best = outcome, 0
            return None
        if outcome.cost < best.cost:  # cheaper, but within the noise: same best, kept
            self.best = outcome
        self.since_best += 1
        if patience is not None and self.since_best >= patience:
            return (
                f"no trial in the last {patience} beat the best $/run (trial {best.number}) "
                "by more than the measurements' noise (budget.patience)"
            )
        return None

    def _not_worth_it(self) -> str | None:
        """Whether the next trial is expected to cost more than it would save over
        ``budget.planned_runs`` runs of the real job (see ``expected_saving``)."""
        runs = self.space.budget.planned_runs
        if runs is None or self.best is None or self.best.cost is None:
            return None
        window = max(_SAVING_WINDOW, self.space.budget.patience or 0)
        if self.measured < window or not self.gains:
            return None  # no improvement seen yet: nothing to expect from (budget.patience is)
        saving = expected_saving(self.gains, self.measured, window, self.best.cost, runs)
        # a trial on N devices costs N devices' time
        trial_device_s = statistics.median(self.time.trial_device_seconds)
        trial_usd = trial_device_s / 3600 * self.space.hardware.usd_per_hour
        if saving >= trial_usd:
            return None
        recent = sum(1 for at, _ in self.gains if at > self.measured - window)
        return (
            f"the next trial is expected to save ${saving:,.4g} over {runs} planned run(s) "
            f"({recent} improvement(s) beyond noise in the last {window} trials) and to cost "
            f"${trial_usd:,.4g} of machine time (budget.planned_runs)"
        )
