"""The end of a time budget (issue 33 item 4: "an expensive one runs when it can still pay
off"): a config whose trial would not finish in the time left is not proposed (``bayes``) or
not run (the other samplers), and the sweep stops, saying why, when no config left can finish.
Without a budget, or with plenty left, the picks are those of the search without the rule.

The trials are a table on a simulated clock (what is under test is what the loop proposes,
runs and stops on), on a real in-memory Optuna study.
"""

from __future__ import annotations

import sys
from pathlib import Path

import optuna
import pytest

from sweeper import search_cost
from sweeper.noise import Sample
from sweeper.preflight import PreflightReport
from sweeper.search import ImprovementGridSampler
from sweeper.search_cost import SECONDS_ATTR
from sweeper.space import Space, TrialConfig, parse_space
from sweeper.sweep.loop import SearchLoop
from sweeper.sweep.observer import SilentObserver
from sweeper.sweep.outcome import Outcome
from tests.helpers import tiny_space_without_baseline

BENCH = Path(__file__).resolve().parent.parent / "bench"
sys.path.insert(0, str(BENCH))
import search_replay  # noqa: E402

SEARCH = """search:
  sampler: {sampler}
  per_device_batch_size: [1, 2, 4, 8]
  max_seq_length: [256]
  gradient_checkpointing: [false, true]
  compile_mode: [none, max-autotune]
  num_workers: [0, 2]
"""
# a trial: a minute; max-autotune compiles for 345 s more (issue 33, an H100)
TRIAL_S = {"none": 60.0, "max-autotune": 405.0}


def _space(sampler: str) -> Space:
    text = tiny_space_without_baseline()
    head, rest = text.split("search:\n", 1)
    return parse_space(head + SEARCH.format(sampler=sampler) + rest[rest.index("trial:") :])


def _cost(c: TrialConfig) -> float:
    """$/run: bigger batches are cheaper, max-autotune three times cheaper again."""
    return 100.0 / c.per_device_batch_size / (3.0 if c.compile_mode == "max-autotune" else 1.0)


class _Clock:
    def __init__(self) -> None:
        self.now_s = 0.0

    def __call__(self) -> float:
        return self.now_s


class _ClockedTable:
    """The trial executor: a lookup whose trials move the clock by their seconds; a trial
    longer than the time left is cut there (as the real executor's timeout does)."""

    def __init__(self, clock: _Clock) -> None:
        self.clock = clock
        self.ran: list[TrialConfig] = []
        self.cut: list[TrialConfig] = []

    def stop_requested(self) -> bool:
        return False

    def record_predicted(self, trial: optuna.Trial, config: TrialConfig, message: str) -> None:
        pass

    def claim(self, number: int, config: TrialConfig) -> int | None:
        return None

    def seconds(self, config: TrialConfig) -> float:
        return TRIAL_S[config.compile_mode]

    def outcome(self, number: int, config: TrialConfig) -> Outcome:
        return Outcome(number=number, cost=_cost(config))

    def execute(self, trial: optuna.Trial, config: TrialConfig, left_s: float | None) -> Outcome:
        self.ran.append(config)
        seconds = self.seconds(config)
        if left_s is not None and seconds > left_s:
            self.clock.now_s += left_s
            self.cut.append(config)
            return Outcome(number=trial.number, failure_kind="interrupted")
        self.clock.now_s += seconds
        trial.set_user_attr(SECONDS_ATTR, seconds)
        return self.outcome(trial.number, config)


def _loop(sampler: str, seed: int = 0) -> tuple[SearchLoop, _ClockedTable, _Clock]:
    clock = _Clock()
    table = _ClockedTable(clock)
    study = optuna.create_study(direction="minimize")
    loop = SearchLoop(
        _space(sampler), study, table, PreflightReport(), SilentObserver(), seed=seed, now=clock
    )
    return loop, table, clock


@pytest.fixture(autouse=True)
def _quiet() -> None:
    optuna.logging.set_verbosity(optuna.logging.ERROR)


def _until_both_modes_measured(loop: SearchLoop, table: _ClockedTable) -> None:
    """Three trials, enqueued: small and big batches without compiling, then max-autotune."""
    for batch, mode in ((1, "none"), (8, "none"), (8, "max-autotune")):
        loop.study.enqueue_trial(
            {"per_device_batch_size": batch, "compile_mode": mode, "num_workers": 0,
             "gradient_checkpointing": False}
        )  # fmt: skip
    assert loop.run(3)["run"] == 3
    assert {c.compile_mode for c in table.ran} == set(TRIAL_S)


def test_fit_seconds_is_the_longest_of_each_mode_the_cold_first_trial_aside() -> None:
    took = [("none", 250.0), ("none", 60.0), ("none", 40.0), ("max-autotune", 405.0)]
    assert search_cost.fit_seconds(["none", "max-autotune"], took).tolist() == [60.0, 405.0]
    # a mode not run yet: the others' longest less their compile, plus its own
    assert search_cost.fit_seconds(["default"], took[:3]).tolist() == [60.0 + 60.0]
    assert search_cost.fit_seconds(["none"], [("none", 250.0)]).tolist() == [250.0]
    # a mode whose trials all failed early (out of memory at the first step, 95 s) needs at
    # least what a mode not run yet would: a config of it that runs takes longer
    oom = [("none", 105.0), ("none", 75.0), ("default", 95.0)]
    ran = [True, True, False]
    assert search_cost.fit_seconds(["default"], oom, ran).tolist() == [75.0 + 60.0]
    assert search_cost.fit_seconds(["default"], oom, [True] * 3).tolist() == [95.0]
    # the cold first trial, measured, does not make its mode's failures the measure of it
    # (qlora-24gb at 2,700 s: max-autotune 794 s cold and measured, then out of memory at
    # 552 and a compile error at 547; one that runs takes 592)
    cold = [("max-autotune", 794.0), ("max-autotune", 552.0), ("none", 247.0)]
    needs = search_cost.fit_seconds(["max-autotune"], cold, [True, False, True])
    assert needs.tolist() == [247.0 + 345.0]
    # the only trial of its mode, the cold first is the measure of it (held-out-lora at
    # 2,600 s: max-autotune failed to compile in 637.5 s; the prior would say 135 + 345)
    lora = [("max-autotune", 637.5), ("none", 105.0), ("default", 195.0)]
    needs = search_cost.fit_seconds(["max-autotune"], lora, [False, True, True])
    assert needs.tolist() == [637.5]
    # nothing measured yet, only compile errors (375 s: 30 past the prior's compile): a mode
    # not run needs at least an ordinary trial's prior, not 30 s (noisy at 1,200 s, seed 28:
    # a none trial of 75 s started with 45 s left)
    errors = [("max-autotune", 405.0), ("max-autotune", 375.0), ("max-autotune", 375.0)]
    needs = search_cost.fit_seconds(["none"], errors, [False] * 3)
    assert needs.tolist() == [search_cost.ORDINARY_TRIAL_S]


def test_bayes_picks_the_best_config_that_can_finish_and_runs_it() -> None:
    """With 200 s left, the pick without the rule is a max-autotune config (3x cheaper per
    run, 405 s a trial): it would be cut, seconds paid for nothing. The loop's pick is the
    best config whose trial fits, which runs to its end; nothing is proposed and declined."""
    loop, table, clock = _loop("bayes")
    twin, twin_table, _ = _loop("bayes")
    _until_both_modes_measured(loop, table)
    _until_both_modes_measured(twin, twin_table)
    assert table.ran == twin_table.ran  # the same seed, the same picks
    assert twin.run(1)["run"] == 1
    assert twin_table.ran[-1].compile_mode == "max-autotune"  # the pick without the rule
    counts = loop.run(1, deadline=clock() + 200)
    assert counts == counts | {"run": 1, "too_long": 0}
    assert table.ran[-1].compile_mode == "none" and table.cut == []
    assert isinstance(loop.study.sampler, ImprovementGridSampler)
    assert loop.study.sampler.fits is not None  # the sampler was told what can finish
    measured = [c for c in table.ran[:-1] if c.compile_mode == "none"]
    assert all(_cost(table.ran[-1]) <= _cost(c) for c in measured)  # a good one, not any


def test_the_sweep_stops_saying_why_when_no_config_can_finish() -> None:
    loop, table, clock = _loop("bayes")
    _until_both_modes_measured(loop, table)
    ran = len(table.ran)
    counts = loop.run(5, deadline=clock() + 50)
    assert counts["run"] == 0 and len(table.ran) == ran and table.cut == []
    assert loop.stop_reason.startswith("the sweep's time budget is spent"), loop.stop_reason
    assert "no config left whose trial fits in the 50 s left" in loop.stop_reason
    assert "the cheapest expected takes ~60 s (compile mode none" in loop.stop_reason


def test_a_device_time_limit_that_ends_the_sweep_is_named_as_one() -> None:
    """Only a device-time limit (budget.max_device_hours): when no config can finish in what
    it leaves, the stop names that limit, also where what is left still holds the costliest
    trial the loop timed but not what a trial of the cheapest mode needs (its recorded
    seconds: CI at f4782ae, a shared budget: "the sweep's time budget is spent", which
    test_budget_shared's workers must not say)."""
    loop, table, clock = _loop("bayes")
    execute = table.execute

    def reports_more(trial: optuna.Trial, config: TrialConfig, left_s: float | None) -> Outcome:
        outcome = execute(trial, config, left_s)
        trial.set_user_attr(SECONDS_ATTR, trial.user_attrs[SECONDS_ATTR] + 5.0)  # start-up
        return outcome

    table.execute = reports_more  # type: ignore[method-assign]
    for batch in (1, 8):
        loop.study.enqueue_trial(
            {"per_device_batch_size": batch, "compile_mode": "none", "num_workers": 0,
             "gradient_checkpointing": False}
        )  # fmt: skip
    assert loop.run(2)["run"] == 2
    counts = loop.run(5, device_deadline=clock() + 62)  # the loop timed 60 s, a trial needs 65
    assert counts["run"] == 0 and table.cut == []
    assert loop.stop_reason.startswith("the sweep's device-time budget is spent (62 "), (
        loop.stop_reason
    )
    assert "no config left can finish: the cheapest expected takes ~65 s" in loop.stop_reason


def test_random_search_does_not_run_a_proposal_that_cannot_finish() -> None:
    """Random search proposes without knowing the time: a proposal that cannot finish is
    told as not run (a failed trial, which samplers do not learn from), and the loop asks
    again; it runs the ones that fit until none can."""
    loop, table, clock = _loop("random", seed=3)
    _until_both_modes_measured(loop, table)
    ran = len(table.ran)
    counts = loop.run(20, deadline=clock() + 200)
    assert table.cut == []
    assert [c.compile_mode for c in table.ran[ran:]] == ["none"] * 3  # 3 x 60 s of the 200
    assert counts["run"] == 3 and counts["too_long"] >= 1
    declined = [t for t in loop.study.trials if "budget would cut it" in str(t.user_attrs)]
    assert len(declined) == counts["too_long"]
    assert all(t.state == optuna.trial.TrialState.FAIL for t in declined)
    assert all(t.params["compile_mode"] == "max-autotune" for t in declined)
    assert "no config left whose trial fits in the 20 s left" in loop.stop_reason


@pytest.mark.parametrize("sampler", ["bayes", "random"])
def test_without_a_budget_or_with_plenty_left_the_picks_are_unchanged(sampler: str) -> None:
    """The same seed with no deadline, a deadline far off, and the rule before this one
    (``fit_to_budget`` False): the same configs in the same order."""
    runs = []
    for deadline, fit in ((None, True), (10**9, True), (10**9, False)):
        clock = _Clock()
        table = _ClockedTable(clock)
        loop = SearchLoop(
            _space(sampler), optuna.create_study(direction="minimize"), table,
            PreflightReport(), SilentObserver(), seed=5, now=clock, fit_to_budget=fit,
        )  # fmt: skip
        loop.run(12, deadline=deadline)
        runs.append(table.ran)
    assert len(runs[0]) == 12 and runs[0] == runs[1] == runs[2]


def test_the_replay_bench_cuts_a_trial_at_its_budget() -> None:
    """bench/search_replay.py's budget mode: a trial longer than the time left is cut there
    and its seconds are wasted; each seed spends at most its budget."""
    space = search_replay.load_space(BENCH / "replay" / "held-out.yaml")
    table = search_replay.read_table(BENCH / "replay" / "held-out.jsonl", space)
    clock = search_replay.ReplayClock()
    executor = search_replay.LookupExecutor(table, "samples_per_s", 1.0, 1000.0, 0, clock)
    study = optuna.create_study()
    config = next(c for c, r in table.items() if r.status == "ok" and r.trial_s > 100)
    outcome = executor.execute(study.ask(), config, left_s=100.0)
    assert outcome.failure_kind == "interrupted"
    assert (executor.cut, executor.wasted_s, clock()) == (1, 100.0, 100.0)
    for fit in (True, False):
        replayed = search_replay.replay_budget(
            space, table, "bayes", "samples_per_s", 0, budget_s=900.0, fit=fit
        )
        assert 0 < replayed.spent_s <= 900.0 and replayed.finished >= 3
        assert "time budget is spent" in replayed.stop_reason


# the H200 lease of 2026-11-28 (spaces/h200-llama-1b.yaml's trial section): 3 burn-in steps
# at least, then a window of at least 10 steps, 4x the burn-in and 10 s, cut at 60 s
H200_TRIAL = """trial:
  warmup: {min_steps: 3, max_steps: 60, max_seconds: 900}
  measure: {min_steps: 10, min_seconds: 10, max_seconds: 60, target_ci: 0.02}
  timeout_s: 1800
  preflight: false
"""
STEPS_SEARCH = """search:
  sampler: bayes
  per_device_batch_size: [8, 32]
  gradient_accumulation_steps: [1, 8]
  max_seq_length: [512]
  packing: [true]
  compile_mode: [none]
  num_workers: [0, 2]
"""
ROWS_PER_S = 60.0  # packed rows of 512 tokens a second, whatever the batch
START_S = 3.0  # the fork server's start-up, as the H200's uncompiled trials had it


class _StepTable(_ClockedTable):
    """Trials whose time is their steps' (``search_cost.steps_floor_s``) at one speed, and
    which report it (it/s), as a launched trial does; bigger steps are cheaper per run."""

    def __init__(self, clock: _Clock, space: Space) -> None:
        super().__init__(clock)
        self.trial = space.trial

    def _step_s(self, config: TrialConfig) -> float:
        return config.per_device_batch_size * config.gradient_accumulation_steps / ROWS_PER_S

    def seconds(self, config: TrialConfig) -> float:
        step_s = self._step_s(config)
        return START_S + search_cost.steps_floor_s(step_s, self.trial.warmup, self.trial.measure)

    def outcome(self, number: int, config: TrialConfig) -> Outcome:
        rows = config.per_device_batch_size * config.gradient_accumulation_steps
        cost = 100.0 / rows**0.1 + (config.num_workers == 0)
        sample = Sample(
            kind="trial", cost_per_run_usd=cost, hours_per_run=cost / 3.5,
            samples_per_s=ROWS_PER_S, tokens_per_s=None, it_per_s=1.0 / self._step_s(config),
            ci95_rel=0.01,
        )  # fmt: skip
        return Outcome(number=number, cost=cost, sample=sample)


def test_a_trial_of_big_steps_is_not_started_where_only_small_ones_fit() -> None:
    """The H200 lease lost its trial #8 (49 s of a 475 s lease) to the budget: bs32 x 8
    accumulation steps, 8-32x the rows of any step before it, started with 49 s left because
    the longest uncompiled trial had taken 15 s. A trial needs at least its steps' time: 3
    burn-in steps and a window of 12 at 4.3 s a step is 64 s. With the small-step trials
    measured (13-15 s each) and 40 s left, the big-step config is not run; one that fits is,
    and nothing is cut."""
    space = parse_space(
        tiny_space_without_baseline().split("search:\n", 1)[0] + STEPS_SEARCH + H200_TRIAL
    )
    clock = _Clock()
    table = _StepTable(clock, space)
    loop = SearchLoop(
        space, optuna.create_study(direction="minimize"), table, PreflightReport(),
        SilentObserver(), seed=0, now=clock,
    )  # fmt: skip
    for batch, workers in ((8, 0), (32, 0), (8, 2)):
        loop.study.enqueue_trial(
            {"per_device_batch_size": batch, "gradient_accumulation_steps": 1,
             "num_workers": workers}
        )  # fmt: skip
    assert loop.run(3)["run"] == 3
    took = [t.user_attrs[SECONDS_ATTR] for t in loop.study.trials]
    assert max(took) < 16  # what the mode-only rule expects of any uncompiled trial
    big = TrialConfig.model_validate(
        table.ran[0].model_dump() | {"per_device_batch_size": 32, "gradient_accumulation_steps": 8}
    )
    counts = loop.run(5, deadline=clock() + 40)
    assert table.cut == [], "a trial was started that the budget cut"
    assert big not in table.ran
    # the configs that fit still ran (up to 64 rows a step: 19 s at most)
    assert counts["run"] >= 1
    assert all(c.per_device_batch_size * c.gradient_accumulation_steps <= 64 for c in table.ran)
    assert "no config left whose trial fits" in loop.stop_reason, loop.stop_reason
    floor = search_cost.steps_floor_s(256 / ROWS_PER_S, space.trial.warmup, space.trial.measure)
    assert floor == pytest.approx(15 * 256 / ROWS_PER_S)  # 3 + 12 steps of 4.3 s
    # without speeds (the replay tables: per-mode trial times, no it/s), the rule is the
    # mode's longest trial, as before (test_bayes_picks_the_best_config_that_can_finish...)


def test_the_h200_leases_cut_trial_would_not_have_started() -> None:
    """The recorded study (studies/h200-llama-1b.json): its trials 0-7 as the loop read them
    when it proposed #8 (bs32 x 8, seq 512, packed, uncompiled), which started 48.7 s before
    the budget's end and was cut there. The mode's longest trial said 15 s; its steps, at the
    slowest rows/s measured on packed 512-token rows (#7's), say 65 s."""
    import datetime as dt
    import json

    from sweeper.space_trial import MeasureSettings, WarmupSettings

    study = json.loads((BENCH.parent / "studies" / "h200-llama-1b.json").read_text())
    refs, took = [], []
    for frozen, trial in zip(study["optuna"]["trials"], study["trials"], strict=True):
        if trial["state"] != "complete":
            continue
        seconds = (
            dt.datetime.fromisoformat(frozen["datetime_complete"])
            - dt.datetime.fromisoformat(frozen["datetime_start"])
        ).total_seconds()
        config = trial["config"]
        took.append((config["compile_mode"], seconds))
        refs.append(
            search_cost.StepRef(
                compile_mode=config["compile_mode"],
                max_seq_length=config["max_seq_length"],
                packing=config["packing"],
                rows_per_step=config["per_device_batch_size"]
                * config["gradient_accumulation_steps"],
                step_s=1.0 / trial["it_per_s"],
                trial_s=seconds,
            )
        )
    cut = study["trials"][8]
    assert (
        cut["failure_kind"] == "interrupted" and cut["config"]["gradient_accumulation_steps"] == 8
    )
    had = 48.7  # the seconds it ran before the budget cut it
    assert search_cost.fit_seconds(["none"], took).tolist()[0] < 15 < had  # the rule then
    warmup = WarmupSettings(min_steps=3, max_steps=60, max_seconds=900)  # the space's
    measure = MeasureSettings(min_steps=10, min_seconds=10, max_seconds=60, target_ci=0.02)
    needs = search_cost.step_seconds_needed(
        compile_mode="none", max_seq_length=512, packing=True, rows_per_step=256, refs=refs,
        warmup=warmup, measure=measure,
    )  # fmt: skip
    assert needs is not None and 60 < needs < 70 and needs > had
