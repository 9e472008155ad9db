"""The search loop: ask → rule out → claim → execute → tell, until the budget is spent."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import optuna
from optuna.trial import FrozenTrial

from sweeper import knobs, search_cost
from sweeper.noise import Sample
from sweeper.preflight import PreflightReport
from sweeper.search import (
    CONTENDED_ATTR,
    REPEAT_ATTR,
    WORKER_ATTR,
    ImprovementGridSampler,
    make_sampler,
    runnable_params,
    trials_took,
)
from sweeper.space import Space, TrialConfig, optuna_params, suggest
from sweeper.sweep.clock import SweepClock
from sweeper.sweep.executor import TrialExecutor
from sweeper.sweep.observer import SweepObserver
from sweeper.sweep.outcome import Outcome, tell, worst_cost
from sweeper.sweep.remeasure import Remeasure
from sweeper.sweep.rules import (
    AlreadyMeasured,
    DoesNotFit,
    FailedPreflight,
    Ineligible,
    NoTime,
    OomDominated,
    OutsideSpace,
    PredictedOom,
    Repeat,
    Skip,
    SkipRule,
    first_skip,
)
from sweeper.sweep.share import StudyShare
from sweeper.sweep.stopping import Stopping, TimeBudget

# Stop asking after this many consecutive configs that were measured or ruled out already.
_MAX_SKIPS_IN_A_ROW = 50


class SearchLoop:
    """Ask, decide what a proposal is worth, run it (or not), tell — until the budget is spent;
    then measure the best configs again until they separate (``budget.remeasure``).

    What Optuna is told (``sweeper.search``): a measured config its $/run; a config proposed
    again its earlier result again; a config that failed by its own doing (out of memory,
    unsupported) or that the space's rules or preflight rule out, a completed trial with the
    constraint violated; a config at least as heavy as one that ran out of memory is not run
    (``sweeper.sweep.rules``).

    What is measured again, and when the loop stops, its collaborators decide
    (``sweeper.sweep.remeasure``, ``sweeper.sweep.stopping``). ``eligible`` says which configs
    the recommendation may pick (it leaves out configs that truncate the data): only those are
    re-measured at the end.

    Near the end of a time budget, a config whose trial would not finish in the time left is
    not proposed (``bayes``) or not run (the other samplers), and the sweep stops when no
    config left can finish (``_fit_to_time``). ``fit_to_budget`` False keeps the rule before
    it (a trial starts if the time left holds the longest trial so far), for the replay
    bench's comparison; ``now``: the clock of the deadlines (the bench's is simulated).
    """

    def __init__(
        self,
        space: Space,
        study: optuna.Study,
        executor: TrialExecutor,
        preflight: PreflightReport,
        observer: SweepObserver,
        *,
        earlier: Mapping[TrialConfig, Outcome] | None = None,
        earlier_samples: Mapping[TrialConfig, Sequence[Sample]] | None = None,
        seed: int | None = None,
        eligible: Callable[[TrialConfig], bool] | None = None,
        worker_id: str | None = None,
        now: Callable[[], float] = time.monotonic,
        fit_to_budget: bool = True,
    ) -> None:
        self.space, self.study, self.executor = space, study, executor
        self.worker_id = worker_id  # written on each trial asked: a reaper knows whose it was
        self.preflight, self.observer = preflight, observer
        self.stopped = False  # a stop was requested through the API
        self.stop_reason = ""
        self.known = set(space.known_configs())  # the user's named configs
        self.search = preflight.search(space)  # knobs that fell back have one value
        runnable = [c for c in self.search.grid() if preflight.allows(c) is None]
        ineligible = None
        if eligible is not None:
            exempt = self.known | {preflight.nearest(c)[0] for c in self.known}
            ineligible = Ineligible(eligible, space.workload.coverage_percentile, exempt)
            runnable, ineligible = _recommendable_only(runnable, ineligible, observer)
        self.runnable = runnable
        self._runnable = frozenset(self.runnable)
        # what this study measured before (a resumed sweep): told again if proposed again
        self.results: dict[TrialConfig, Outcome] = {
            c: o for c, o in (earlier or {}).items() if c in self._runnable
        }
        self.rules: list[SkipRule] = [
            OutsideSpace(self.search),
            FailedPreflight(preflight),
            *([] if ineligible is None else [ineligible]),
            AlreadyMeasured(self.results),
            OomDominated(self.results),
        ]
        self.fit_to_budget = fit_to_budget
        self.does_not_fit = DoesNotFit()
        self.rules.append(self.does_not_fit)  # last: a repeat or a predicted OOM costs nothing
        modes = {c.compile_mode for c in self.runnable}
        # a knob the space lists once is no Optuna parameter: the value every config has
        self._one_mode = next(iter(modes)) if len(modes) == 1 else "none"
        devices = {c.devices for c in self.runnable}
        self._one_devices = next(iter(devices)) if len(devices) == 1 else 1
        self._mode_devices = {(c.compile_mode, c.devices) for c in self.runnable}
        # the step's shape of a config the sampler names by its parameters: a knob the space
        # lists once is no parameter (the step-aware floor of ``_fit_to_time``)
        first = self.runnable[0] if self.runnable else None
        self._one_shape: dict[str, Any] = {
            k: getattr(first, k, None)
            for k in (
                "per_device_batch_size",
                "gradient_accumulation_steps",
                "max_seq_length",
                "packing",
            )
        }
        self.time = TimeBudget(now=now)
        self._plan: Callable[[], str | None] | None = None
        self.remeasure = Remeasure(
            space, preflight, executor, observer, self.results, self.time,
            earlier_samples=earlier_samples, eligible=eligible,
        )  # fmt: skip
        self.stopping = Stopping(space, self.results.values(), self.time)
        study.sampler = make_sampler(
            self.search.sampler,
            space.budget.seed if seed is None else seed,
            runnable_params(self.runnable, lambda c: optuna_params(c, self.search)),
        )
        for config, cost in self.remeasure.calm_since_told():
            self._revise(config, cost)

    def run(
        self,
        n_trials: int,
        clock: SweepClock | None = None,
        deadline: float | None = None,
        device_deadline: float | None = None,
        shared: StudyShare | None = None,
        plan: Callable[[], str | None] | None = None,
    ) -> dict[str, int]:
        """Run up to ``n_trials`` trials; with a ``deadline`` (``time.monotonic()``, or the
        loop's ``now``), start none that is not expected to finish in the time left
        (``_fit_to_time``), and cap each one's timeout at the time left; with a
        ``device_deadline`` (``TimeBudget``), the same in device time, a trial on N devices
        spending N; with ``shared`` instead, the study's device time, all its workers'
        together (``sweeper.sweep.share``). ``settle`` then measures the best configs again.
        ``plan``: why the study's plan is done (a worker that joined a
        live run shares its planned trials), asked before each proposal."""
        counts = {
            "run": 0, "complete": 0, "failed": 0, "predicted": 0, "repeats": 0, "claimed": 0,
            "ruled_out": 0, "too_long": 0,
        }  # fmt: skip
        skipped_in_a_row = 0
        self.time.deadline, self.time.device_deadline = deadline, device_deadline
        self.time.shared = shared
        self._plan = plan
        while counts["run"] < n_trials:
            left_s = self.time.left_s()
            reason = self._reason_not_to_ask(left_s)
            if reason is not None:
                self._stop(reason)
                break
            trial, config = self._propose()
            skip = first_skip(self.rules, config)
            if isinstance(skip, NoTime):
                trial.set_user_attr("skipped", skip.reason)
                self.study.tell(trial, state=optuna.trial.TrialState.FAIL)
                counts["too_long"] += 1
                skipped_in_a_row += 1
                if skipped_in_a_row >= _MAX_SKIPS_IN_A_ROW:
                    self._stop(
                        f"the sampler proposed {skipped_in_a_row} configs in a row whose trials "
                        f"would not finish in the {left_s or 0:.0f} s the time budget has left"
                    )
                    break
                continue
            if isinstance(skip, PredictedOom):
                self._predicted_oom(trial, config, skip.heavier_than)
                counts["predicted"] += 1
                continue
            if skip is None and self._claimed(trial, config):
                counts["claimed"] += 1
                skipped_in_a_row += 1
                if skipped_in_a_row >= _MAX_SKIPS_IN_A_ROW:
                    self._stop("the other workers have taken every config proposed")
                    break
                continue
            if skip is None:
                skipped_in_a_row = 0
                if self._measure(trial, config, left_s, counts, clock):
                    break
                continue
            self._tell_skipped(trial, skip, counts)
            skipped_in_a_row += 1
            if skipped_in_a_row >= _MAX_SKIPS_IN_A_ROW:
                self._stop("the sampler keeps proposing measured or ruled-out configs")
                break
        if not self.stop_reason and counts["run"] >= n_trials:
            self.stop_reason = (
                f"{n_trials} trial{'' if n_trials == 1 else 's'} run, the number asked for"
            )
        return counts

    def settle(self, clock: SweepClock | None = None) -> None:
        """Measure the best configs again, interleaved, until their intervals separate or
        ``remeasure.rounds`` rounds are spent (``Remeasure.settle``)."""
        self.remeasure.settle(clock.charge if clock is not None else lambda: None)

    # ------------------------------------------------------------------ one proposal

    def _reason_not_to_ask(self, left_s: float | None) -> str | None:
        if self.executor.stop_requested():
            self.stopped = True
            return "stop requested (REST); the sweep ends here"
        if self._runnable <= self.results.keys():
            return self._all_tried()
        if self.fit_to_budget and (left_s is None or left_s > 0):
            spent = self._fit_to_time(left_s)
        else:  # (without fitting: the time left must hold the longest trial so far)
            spent = self.time.why_spent(left_s)
        if spent is not None:
            return spent
        return None if self._plan is None else self._plan()

    def _all_tried(self) -> str:
        """Why no config is left to ask, naming those only interrupted: each ran twice and
        is not run again (a walk's worker said "all 8 runnable configs of the space are
        measured" of a config Ctrl-C'd twice, and nothing said it was dropped)."""
        said = f"all {len(self._runnable)} runnable configs of the space are measured"
        stopped = sorted(
            o.number
            for c, o in self.results.items()
            if c in self._runnable and o.failure_kind == "interrupted"
        )
        if not stopped:
            return said
        numbers = ", ".join(f"#{n}" for n in stopped)
        one = len(stopped) == 1
        was, it, is_ = ("was", "it", "is") if one else ("were", "they", "are")
        return (
            f"all {len(self._runnable)} runnable configs of the space are tried, but "
            f"{len(stopped)} {was} interrupted each time {it} ran and {is_} not run again "
            f"({numbers}: an interrupted config runs "
            "once more, not at every launch, so that a trial that outlasts the time budget "
            "does not run forever); `sweeper best` names them among what no trial measured"
        )

    def _fit_to_time(self, left_s: float | None) -> str | None:
        """Near the end of the time budget, leave out the configs whose trial would not finish
        in the time left (the longest trial of its compile mode so far, the sweep's cold first
        trial aside: ``search_cost.fit_seconds``; at least its own steps at the slowest
        speed measured for its shape: ``search_cost.step_seconds_needed``; a trial on N
        devices has the device time left ÷ N): ``bayes`` picks the best config that can
        finish, the other samplers' proposals that cannot are not run. Why to stop: no
        config left can finish. Nothing is left out before a trial has run, or while every
        config fits (the picks are then exactly those without a budget)."""
        self.does_not_fit.expected = None
        sampler = self.study.sampler
        if isinstance(sampler, ImprovementGridSampler):
            sampler.fits = None
        if left_s is None:
            return None
        trials = self.study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
        took, ran = trials_took(trials, self._one_mode)
        if not took:
            return None
        modes = sorted({m for m, _ in self._mode_devices}, key=repr)
        needs = dict(zip(modes, search_cost.fit_seconds(modes, took, ran).tolist(), strict=True))
        lefts: dict[object, float] = {}

        def need_left(mode: object, devices: object) -> tuple[float, float]:
            if mode not in needs:  # (a known config's mode that the grid does not list)
                needs[mode] = float(search_cost.fit_seconds([mode], took, ran)[0])
            if devices not in lefts:
                count = devices if isinstance(devices, int) else 1
                lefts[devices] = self.time.left_s(count) or 0.0
            return needs[mode], lefts[devices]

        refs = self._step_refs(trials)
        by_shape: dict[tuple[Any, ...], float | None] = {}

        def by_steps(mode: Any, seq: Any, packing: Any, rows: int) -> float:
            """The step-aware floor (``search_cost.step_seconds_needed``); 0: none known."""
            shape = (mode, seq, bool(packing), rows)
            if shape not in by_shape:
                by_shape[shape] = search_cost.step_seconds_needed(
                    compile_mode=mode,
                    max_seq_length=seq if isinstance(seq, int) else None,
                    packing=bool(packing),
                    rows_per_step=rows,
                    refs=refs,
                    warmup=self.space.trial.warmup,
                    measure=self.space.trial.measure,
                )
            return by_shape[shape] or 0.0

        def expected(config: TrialConfig) -> tuple[float, float]:
            need, has = need_left(config.compile_mode, config.devices)
            rows = config.per_device_batch_size * config.gradient_accumulation_steps
            floor = by_steps(config.compile_mode, config.max_seq_length, config.packing, rows)
            return max(need, floor), has

        def fits_params(params: Mapping[str, Any]) -> bool:
            mode = params.get("compile_mode", self._one_mode)
            need, has = need_left(mode, params.get("devices", self._one_devices))
            knob = {k: params.get(k, v) for k, v in self._one_shape.items()}
            rows = int(knob["per_device_batch_size"]) * int(knob["gradient_accumulation_steps"])
            floor = by_steps(mode, knob["max_seq_length"], knob["packing"], rows)
            return max(need, floor) <= has

        if all(n <= h for n, h in (need_left(m, d) for m, d in self._mode_devices)) and all(
            n <= h for n, h in map(expected, self.runnable)
        ):
            return None  # plenty left: every config can finish
        left = [c for c in self.runnable if c not in self.results]
        if not any(n <= s for n, s in map(expected, left)):
            cheapest = min(left, key=lambda c: expected(c)[0])
            need, has = expected(cheapest)
            expectation = (
                f"the cheapest expected takes ~{need:.0f} s (compile mode "
                f"{cheapest.compile_mode}, from the longest trials so far and its step's size)"
            )
            device_left = self.time.device_left_s()
            if device_left is not None and device_left / cheapest.devices <= has:
                # the device-time limit binds: its own words name it (the study's, a worker's),
                # even where its left still holds the costliest trial so far (why_spent's test)
                return f"{self.time.device_time_spent()}; no config left can finish: {expectation}"
            return (
                "the sweep's time budget is spent: no config left whose trial fits in the "
                f"{has:.0f} s left; {expectation}"
            )
        self.does_not_fit.expected = expected
        if isinstance(sampler, ImprovementGridSampler):
            sampler.fits = fits_params
        return None

    def _step_refs(self, trials: Sequence[FrozenTrial]) -> list[search_cost.StepRef]:
        """The measured trials with a speed, for the step-aware floor of a trial's time."""
        seconds = {t.number: search_cost.trial_seconds(t) for t in trials}
        refs = []
        for config, outcome in self.results.items():
            sample, took = outcome.sample, seconds.get(outcome.number)
            if sample is None or not sample.it_per_s or not took or outcome.predicted:
                continue
            refs.append(
                search_cost.StepRef(
                    compile_mode=config.compile_mode,
                    max_seq_length=config.max_seq_length
                    if isinstance(config.max_seq_length, int)
                    else None,
                    packing=bool(config.packing),
                    rows_per_step=config.per_device_batch_size * config.gradient_accumulation_steps,
                    step_s=1.0 / sample.it_per_s,
                    trial_s=took,
                )
            )
        return refs

    def _propose(self) -> tuple[optuna.Trial, TrialConfig]:
        """Ask; the config to run for the proposal (a known config's knob that cannot run here
        runs its fallback: tf32 on a CPU)."""
        trial = self.study.ask()
        if self.worker_id is not None:
            trial.set_user_attr(WORKER_ATTR, self.worker_id)
        proposed = suggest(trial, self.search)
        config = self.preflight.adapt(proposed)
        if proposed in self.known:  # the user's own config: measured as near as runs here
            config, changed = self.preflight.nearest(proposed)
            if changed:
                self.observer.note(
                    f"{knobs.describe(proposed.model_dump())} runs " + "; ".join(changed)
                )
        return trial, config

    def _claimed(self, trial: optuna.Trial, config: TrialConfig) -> bool:
        """Whether another worker proposed ``config`` first (this trial then ends, FAIL)."""
        taken_by = self.executor.claim(trial.number, config)
        if taken_by is None:
            return False
        if taken_by != trial.number:  # (the same queued trial, popped twice: it is the other's)
            trial.set_user_attr("claimed_by", taken_by)
            self.study.tell(trial, state=optuna.trial.TrialState.FAIL)
        return True

    def _tell_skipped(self, trial: optuna.Trial, skip: Skip, counts: dict[str, int]) -> None:
        # Optuna forbids changing a categorical's choices within a study: a config that
        # preflight or the space's rules rule out is told as infeasible without a trial
        if isinstance(skip, Repeat):
            trial.set_user_attr(REPEAT_ATTR, skip.earlier.number)
            self._tell(trial, skip.earlier)
            counts["repeats"] += 1
        else:
            assert not isinstance(skip, PredictedOom)
            trial.set_user_attr("skipped", skip.reason)
            counts["ruled_out"] += 1
            self._tell(trial, Outcome(number=trial.number, failure_kind="unsupported"))

    def _measure(
        self,
        trial: optuna.Trial,
        config: TrialConfig,
        left_s: float | None,
        counts: dict[str, int],
        clock: SweepClock | None,
    ) -> bool:
        """Run the trial and tell it; whether the sweep stops after it."""
        started = self.time.now()
        # N devices spend device time N times as fast: the timeout is capped accordingly
        left_s = self.time.left_s(config.devices) if left_s is not None else None
        outcome = self.executor.execute(trial, config, left_s)
        self.time.took(self.time.now() - started, config.devices)
        self.results[config] = outcome
        calm = False
        if outcome.sample is not None:
            calm = self.remeasure.measured(config, outcome.sample)
            if not calm:
                trial.set_user_attr(CONTENDED_ATTR, True)
        # told after the reruns: the sampler learns the calm measurement, not the
        # one a shared machine slowed (which would mark a good region as bad)
        self._tell(trial, self.results[config])
        if calm:
            revised = self.remeasure.measure_waiting()
            if revised is not None:
                self._revise(*revised)
        if clock is not None:
            clock.charge()
        counts["run"] += 1
        counts["complete" if outcome.feasible else "failed"] += 1
        reason = self.stopping.after_trial(self.results[config])
        if reason is not None:
            self._stop(reason)
            return True
        if self.remeasure.check_drift(self.stopping.measured) and clock is not None:
            clock.charge()
        return False

    def _stop(self, reason: str) -> None:
        self.stop_reason = reason
        self.observer.note(f"{reason}; stopping")

    # ------------------------------------------------------------------ Optuna

    def _revise(self, config: TrialConfig, cost: float) -> None:
        """Tell a sampler that can learn it (``bayes``) the calm $/run of a config that Optuna
        was told while it was contended."""
        revise = getattr(self.study.sampler, "revise", None)
        if revise is not None:
            revise(optuna_params(config, self.search), cost)

    def _predicted_oom(self, trial: optuna.Trial, config: TrialConfig, oom: int) -> None:
        heavier = knobs.describe(config.model_dump())
        message = (
            f"not run: out of memory predicted, {heavier} needs at least the memory of trial "
            f"{oom}, which ran out of memory (batch, sequence length and the other memory "
            "knobs the same or heavier)"
        )
        outcome = Outcome(number=trial.number, failure_kind="oom", predicted=True)
        self.results[config] = outcome
        trial.set_user_attr("skipped", message)
        self.executor.record_predicted(trial, config, message)
        self._tell(trial, outcome)
        self.observer.note(f"#{trial.number} {message}")

    def _tell(self, trial: optuna.Trial, outcome: Outcome) -> None:
        tell(self.study, trial, outcome, self._worst_cost())

    def _worst_cost(self) -> float:
        return worst_cost(o.cost for o in self.results.values())


def _recommendable_only(
    runnable: list[TrialConfig], rule: Ineligible, observer: SweepObserver
) -> tuple[list[TrialConfig], Ineligible | None]:
    """The configs the recommendation could pick, and the rule that rules out the others; all
    of them, and no rule, when it could pick none (only `best --allow-truncation` can then
    answer, and it needs them measured)."""
    kept: list[TrialConfig] = []
    cut_lengths: set[int] = set()
    for c in runnable:  # one pass: the grid of a real space holds tens of thousands of configs
        if rule.check(c) is None:
            kept.append(c)
        else:
            cut_lengths.add(c.max_seq_length)
    coverage = f"workload.coverage_percentile ({rule.coverage:g})"
    if not kept:
        observer.note(
            f"every config of the space cuts samples that {coverage} needs whole: all are "
            "measured, and only `sweeper best --allow-truncation` can recommend one"
        )
        return runnable, None
    if len(kept) < len(runnable):
        cut = sorted(cut_lengths)
        observer.note(
            f"{len(runnable) - len(kept)} of the space's {len(runnable)} configs are not run: "
            f"at max_seq_length {', '.join(map(str, cut))} they cut samples that {coverage} "
            "needs whole, so the recommendation could not pick them"
        )
    return kept, rule
