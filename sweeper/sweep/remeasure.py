"""Measuring configs again (``budget.remeasure``, ``sweeper.noise``): a trial taken while the
machine was shared, at once, and if still contended, later, after a trial that ran calm; a
reference config every ``drift_every`` trials, to see drift; and at the end the configs whose
$/run intervals overlap the best's, interleaved, until they separate.

Overlapping intervals decide what is measured again (a wide net: configs that may yet turn out
to tie); what the sweep then says of them is decided as the recommendation decides it
(``sweeper.noise.tie``: the interval of their $/run ratio holds 1, or lies within 2% of it),
so that the launch's last note never names a tie that ``sweeper best`` does not.

``Remeasure`` keeps every measurement of each measured config and pools them into the
loop's results; what the sampler should learn again it returns, and the loop tells it.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace

from sweeper.cost import money
from sweeper.noise import (
    Drift,
    Estimate,
    Sample,
    SampleKind,
    drift,
    machine_noise,
    overlaps,
    pool,
    tie,
)
from sweeper.preflight import PreflightReport
from sweeper.space import Space, TrialConfig
from sweeper.sweep.executor import TrialExecutor
from sweeper.sweep.observer import SweepObserver
from sweeper.sweep.outcome import Outcome
from sweeper.sweep.stopping import TimeBudget


class Remeasure:
    """The re-measure policy of one sweep, over the loop's ``results`` (config → outcome),
    whose cost and spread it keeps as the pooled estimates. ``eligible`` says which configs the
    recommendation may pick: only those are re-measured at the end."""

    def __init__(
        self,
        space: Space,
        preflight: PreflightReport,
        executor: TrialExecutor,
        observer: SweepObserver,
        results: dict[TrialConfig, Outcome],
        time_budget: TimeBudget,
        *,
        earlier_samples: Mapping[TrialConfig, Sequence[Sample]] | None = None,
        eligible: Callable[[TrialConfig], bool] | None = None,
    ) -> None:
        self.space, self.preflight, self.executor, self.observer = (
            space, preflight, executor, observer,
        )  # fmt: skip
        self.policy = space.budget.remeasure
        self.results, self.time = results, time_budget
        self.eligible = eligible or (lambda config: True)
        # every measurement of each measured config, in order (sweeper.noise)
        self.samples: dict[TrialConfig, list[Sample]] = {
            c: list(v) for c, v in (earlier_samples or {}).items() if c in results and v
        }
        self.noise = machine_noise(self.samples.values())
        # configs every measurement of which was contended: measured again after a calm trial
        later = self.policy.contended_later
        self.waiting: dict[TrialConfig, int] = {
            c: later for c, v in self.samples.items() if later and all(s.contended for s in v)
        }
        self.drift: Drift | None = None
        self.remeasured = 0  # measurements of configs already measured, this sweep
        # what the store holds for each config's interval: rows that did not move are not written
        self._written: dict[TrialConfig, tuple[float, bool]] = {}

    def take_in(
        self,
        results: Mapping[TrialConfig, Outcome],
        samples: Mapping[TrialConfig, Sequence[Sample]],
    ) -> list[int]:
        """The study's trials this sweep did not run or know (other workers', when this one
        re-measures for its run: ``sweeper.sweep.settler``), added to those it knows; its own
        estimates kept. Their numbers."""
        added = []
        for config, outcome in results.items():
            if config in self.results:
                continue
            self.results[config] = outcome
            if samples.get(config):
                self.samples[config] = list(samples[config])
            added.append(outcome.number)
        if added:
            self.noise = machine_noise(self.samples.values())
        return sorted(added)

    def calm_since_told(self) -> list[tuple[TrialConfig, float]]:
        """A resumed sweep's configs that Optuna was told while contended and that a later
        measurement found calm, with their $/run: the sampler should learn it."""
        revised = []
        for config, samples in self.samples.items():
            cost = self.results[config].cost
            if samples[0].contended and not all(s.contended for s in samples) and cost:
                revised.append((config, cost))
        return revised

    def measured(self, config: TrialConfig, sample: Sample) -> bool:
        """``config`` was measured for the first time: measure it again while the machine is
        shared (``contended_reruns``); whether a measurement of it ran calm. One that never did
        waits for a calm moment (``contended_later``)."""
        self.samples[config] = [sample]
        self._rerun_if_contended(config)
        calm = not all(s.contended for s in self.samples[config])
        if not calm and self.policy.contended_later:
            self.waiting[config] = self.policy.contended_later
        return calm

    def _remeasure(self, config: TrialConfig, kind: SampleKind) -> Sample | None:
        """Measure a config again if the time left holds it; fold it into the estimates."""
        left_s = self.time.left_s()
        if self.time.spent(left_s):
            return None
        if self.executor.stop_requested():
            return None
        number = self.results[config].number
        started = time.monotonic()
        left_s = None if left_s is None else self.time.left_s(config.devices)
        self.observer.remeasuring(number)
        # cleared when it returns, not on the way out of an interrupt: the CLI then says that
        # this measurement is dropped (a walk's Ctrl-C here read "nothing is lost")
        sample = self.executor.remeasure(number, config, kind, left_s)
        self.observer.remeasuring(None)
        self.time.took(time.monotonic() - started, config.devices)  # N devices: N × the time
        self.remeasured += 1
        if sample is not None:
            self.samples.setdefault(config, []).append(sample)
            self._update_estimates(changed=config)
        return sample

    def _update_estimates(self, changed: TrialConfig) -> None:
        """Pool again: the changed config's estimate, and every interval (the machine's noise
        is pooled over all configs, so one more measurement moves each of them)."""
        self.noise = machine_noise(self.samples.values())
        estimates: dict[int, tuple[Estimate, Sequence[Sample] | None]] = {}
        for config, samples in self.samples.items():
            estimate = pool(samples, self.noise)
            outcome = self.results[config]
            self.results[config] = replace(
                outcome, cost=estimate.cost_per_run_usd, spread=estimate.ci95_rel
            )
            written = (estimate.ci95_rel, estimate.contended)
            if config == changed or self._written.get(config) != written:
                estimates[outcome.number] = (estimate, samples if config == changed else None)
                self._written[config] = written
        self.executor.record_estimates(estimates)  # only what moved: one write per row changed

    def _rerun_if_contended(self, config: TrialConfig) -> None:
        """A measurement taken on a shared machine is taken again, at once, while reruns last."""
        for _ in range(self.policy.contended_reruns):
            last = self.samples[config][-1]
            if not last.contended:
                return
            self.observer.note(
                f"#{self.results[config].number} was measured while {last.contention}: "
                "measuring it again"
            )
            if self._remeasure(config, "rerun") is None:
                return
        if self.samples[config][-1].contended and all(s.contended for s in self.samples[config]):
            self.observer.note(
                f"#{self.results[config].number}: every measurement was contended; it is kept, "
                "flagged"
            )

    def measure_waiting(self) -> tuple[TrialConfig, float] | None:
        """The machine measured calm just now: measure again, of the configs every measurement
        of which was contended, the one with the lowest $/run so far. A calm measurement
        replaces them; returned with its $/run, the sampler should learn it (Optuna's trial
        keeps the value it was told, flagged contended)."""
        if not self.waiting:
            return None
        config = min(self.waiting, key=lambda c: self.results[c].cost or math.inf)
        tries = self.waiting.pop(config) - 1
        number = self.results[config].number
        sample = self._remeasure(config, "rerun")
        if sample is None:
            return None
        if sample.contended:
            if tries:
                self.waiting[config] = tries
            return None
        outcome = self.results[config]
        self.observer.note(
            f"#{number}, measured only on a shared machine so far, measured calm now: "
            f"{money(outcome.cost) if outcome.cost is not None else '—'}/run"
        )
        return (config, outcome.cost) if outcome.cost else None

    def _reference(self) -> TrialConfig | None:
        """The config re-measured for drift: the baseline as run here if it was measured,
        else the first config measured."""
        measured = [(o.number, c) for c, o in self.results.items() if c in self.samples]
        if not measured:
            return None
        baseline = self.space.known_configs()[:1] if self.space.baseline is not None else []
        if baseline:
            ran, _ = self.preflight.nearest(baseline[0])
            if ran in self.samples:
                return ran
        return min(measured, key=lambda pair: pair[0])[1]

    def check_drift(self, measured: int) -> bool:
        """After ``measured`` trials: every ``drift_every``, measure the reference again and
        say if the machine drifted. Whether it was measured."""
        every = self.policy.drift_every
        if every is None or measured % every != 0:
            return False
        reference = self._reference()
        if reference is None or self._remeasure(reference, "drift") is None:
            return False
        found = drift(self.samples[reference], self.noise)
        if found is not None and (self.drift is None or found.change != self.drift.change):
            self.drift = found
            self.observer.note(found.describe(self.results[reference].number))
        return True

    def _feasible(self) -> list[tuple[float, TrialConfig]]:
        """The eligible measured configs with their $/run, cheapest first."""
        return sorted(
            (
                (o.cost, c)
                for c, o in self.results.items()
                if o.cost is not None and c in self.samples and self.eligible(c)
            ),
            key=lambda pair: pair[0],
        )

    def contenders(self) -> list[TrialConfig]:
        """The eligible measured configs whose $/run intervals overlap the best's, cheapest
        first, at most ``remeasure.top`` of them (one alone: nothing to separate)."""
        feasible = self._feasible()
        if not feasible:
            return []
        best_cost, best = feasible[0]
        best_spread = self.results[best].spread
        near = [
            c
            for cost, c in feasible
            if overlaps(best_cost, best_spread, cost, self.results[c].spread)
        ]
        return near[: self.policy.top]

    def ties(self) -> list[TrialConfig]:
        """The eligible measured configs that tie with the cheapest by the recommendation's
        test (``sweeper.noise.tie``), the cheapest first: those ``sweeper best`` picks among
        (one alone: no tie)."""
        feasible = self._feasible()
        if not feasible:
            return []
        best_cost, best = feasible[0]
        best_spread = self.results[best].spread
        return [
            c for cost, c in feasible if tie(best_cost, best_spread, cost, self.results[c].spread)
        ]

    def _numbers(self, configs: list[TrialConfig]) -> str:
        return ", ".join(f"#{self.results[c].number}" for c in configs)

    def _standing(self, contenders: list[TrialConfig], *, still: bool, why_stop: str = "") -> str:
        """What the sweep says of the best configs when it stops measuring them: a tie by the
        recommendation's test, or, where their intervals still overlap without one, that the
        cheapest stands all the same; ``why_stop``: why no more rounds."""
        tied = self.ties()
        if len(tied) > 1:
            return (
                f"{self._numbers(tied)} {'still ' if still else ''}tie within the noise"
                f"{why_stop}; the recommendation picks the baseline if it is among them, else "
                "the one with the least peak memory among those within 5% of the cheapest"
            )
        return (
            f"{self._numbers(contenders)}: their $/run intervals {'still ' if still else ''}"
            f"overlap{why_stop}, but #{self.results[contenders[0]].number} is cheaper beyond "
            "the noise (the 95% interval of their $/run ratio leaves out 1 and the 2% that "
            "does not matter, the recommendation's test): it stands as the cheapest"
        )

    def settle(self, charge: Callable[[], None] = lambda: None) -> None:
        """Measure the best configs again, interleaved, until their intervals separate or
        ``remeasure.rounds`` rounds are spent; ``charge`` after each round."""
        rounds = self.policy.rounds
        for done in range(rounds):
            contenders = self.contenders()
            if len(contenders) < 2:
                if done:
                    self._clear(done)
                return
            numbers = self._numbers(contenders)
            if self.executor.stop_requested() or self._out_of_time():
                self.observer.note(
                    self._standing(
                        contenders,
                        still=False,
                        why_stop=", and the sweep's time budget leaves no time to measure "
                        "them again",
                    )
                    + " (a longer --max-minutes or budget.max_device_hours lets the sweep "
                    "measure them again)"
                )
                return
            self.observer.note(
                f"measuring {numbers} again (round {done + 1} of {rounds}): their $/run "
                "intervals overlap"
            )
            for config in contenders:  # interleaved: A, B, C, then A, B, C again
                if self._remeasure(config, "final") is None and (
                    self.executor.stop_requested() or self._out_of_time()
                ):
                    return
            charge()
        left = self.contenders()
        if len(left) > 1:
            self.observer.note(self._standing(left, still=rounds > 0))
        elif rounds:
            self._clear(rounds)

    def _clear(self, rounds: int) -> None:
        """The best config's interval overlaps no other's after ``rounds`` rounds: said, unless
        it still ties with one by the recommendation's test (a difference under 2%, measured
        closely: two intervals apart that no bill could tell)."""
        if len(self.ties()) > 1:
            self.observer.note(self._standing(self.ties(), still=True))
        else:
            self.observer.note(f"after {rounds} round(s) the best config stands clear")

    def _out_of_time(self) -> bool:
        return self.time.spent(self.time.left_s())
