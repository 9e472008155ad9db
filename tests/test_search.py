"""The search loop (``sweeper.sweep.loop.SearchLoop``) with every sampler: what each proposal tells
Optuna, out-of-memory as a constraint, and a sampler per worker.

The trials here are a table of throughputs (the trial child is tested elsewhere; what is under
test is what the loop asks, skips and tells), on a real Optuna study in a real SQLite file.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import optuna
import pytest
from scipy import stats

from sweeper.errors import SpaceError
from sweeper.preflight import PreflightReport
from sweeper.samplers import DEFAULT_SAMPLER, SAMPLERS
from sweeper.search import (
    CONSTRAINT,
    REPEAT_ATTR,
    make_sampler,
    oom_dominated,
    worker_seed,
)
from sweeper.search_model import Posterior
from sweeper.space import Space, TrialConfig, parse_space
from sweeper.store import Store
from sweeper.sweep.executor import ChildExecutor
from sweeper.sweep.loop import SearchLoop
from sweeper.sweep.observer import SilentObserver, SweepObserver
from sweeper.sweep.outcome import Outcome
from sweeper.sweep.queue import enqueue_known
from tests.helpers import STUDY_FIELDS, Notes, tiny_space_without_baseline

SPACE = (
    tiny_space_without_baseline()
    .replace("per_device_batch_size: [2, 4]", "per_device_batch_size: [1, 2, 4, 8, 16]")
    .replace("max_seq_length: [64]", "max_seq_length: [64, 128]")
)


def _space(sampler: str, text: str = SPACE) -> Space:
    return parse_space(text.replace("search:\n", f"search:\n  sampler: {sampler}\n"))


def _samples_per_s(config: TrialConfig) -> float:
    """Throughput grows with the batch; eager attention is slower; seq 128 does half the
    samples of seq 64. Batch 8 at seq 128 and batch 16 run out of memory (None)."""
    batch, seq = config.per_device_batch_size, config.max_seq_length
    if batch * seq >= 1024:
        return -1.0
    speed = 100 * batch / (batch + 2) * (0.8 if config.attn_implementation == "eager" else 1.0)
    return speed * 64 / seq * (1 + 0.01 * config.gradient_accumulation_steps)


class _Table:
    """Looks each config up instead of running a child."""

    def __init__(self) -> None:
        self.ran: list[TrialConfig] = []
        self.predicted: list[tuple[int, str]] = []

    def stop_requested(self) -> bool:
        return False

    def record_predicted(self, trial: optuna.Trial, config: TrialConfig, message: str) -> None:
        self.predicted.append((trial.number, message))

    def claim(self, number: int, config: TrialConfig) -> int | None:
        return None  # one worker: every config is its own

    def execute(self, trial: optuna.Trial, config: TrialConfig, left_s: float | None) -> Outcome:
        self.ran.append(config)
        speed = _samples_per_s(config)
        if speed < 0:
            return Outcome(number=trial.number, failure_kind="oom")
        return Outcome(number=trial.number, cost=1000 / speed)


@pytest.fixture
def storage(sqlite_url: str) -> Iterator[optuna.storages.RDBStorage]:
    storage = optuna.storages.RDBStorage(sqlite_url)
    yield storage
    storage.engine.dispose()


def _loop(
    space: Space,
    storage: optuna.storages.RDBStorage,
    seed: int = 0,
    observer: SweepObserver | None = None,
    eligible: Callable[[TrialConfig], bool] | None = None,
) -> tuple[SearchLoop, optuna.Study, _Table]:
    study = optuna.create_study(study_name=space.study, storage=storage, direction="minimize")
    enqueue_known(study, space)
    table = _Table()
    loop = SearchLoop(
        space, study, table, PreflightReport(), observer or SilentObserver(), seed=seed,
        eligible=eligible,
    )  # fmt: skip
    return loop, study, table


@pytest.mark.parametrize("sampler", SAMPLERS)
def test_every_sampler_runs_distinct_configs_and_tells_the_truth(
    sampler: str, storage: optuna.storages.RDBStorage
) -> None:
    if sampler == "gp":
        pytest.importorskip("torch", reason="Optuna's GPSampler needs torch")
    space = _space(sampler)
    loop, study, table = _loop(space, storage)
    counts = loop.run(12)
    assert counts["run"] == len(table.ran) == len(set(table.ran)) > 0
    for trial in study.trials:
        # never "pruned": Optuna's samplers rank a pruned trial below every measured one
        assert trial.state in (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.FAIL)
        if trial.state != optuna.trial.TrialState.COMPLETE:
            continue
        if trial.constraints[CONSTRAINT] > 0:  # out of memory, measured or predicted
            assert trial.user_attrs["failure_kind"] == "oom"
            continue
        config = TrialConfig.model_validate({**_space_defaults(space), **trial.params})
        # a measured config, or one proposed again: told its own measured $/run either way
        assert trial.value == pytest.approx(1000 / _samples_per_s(config))
        if REPEAT_ATTR in trial.user_attrs:
            first = study.trials[trial.user_attrs[REPEAT_ATTR]]
            assert first.params == trial.params and REPEAT_ATTR not in first.user_attrs


def _space_defaults(space: Space) -> dict:
    from sweeper import knobs

    return {name: space.search.values(name)[0] for name in knobs.NAMES}


def test_a_config_as_heavy_as_an_oom_is_not_run_and_says_why(
    storage: optuna.storages.RDBStorage,
) -> None:
    loop, study, table = _loop(_space("grid"), storage)
    counts = loop.run(100)  # until every config is measured, run or predicted
    ooms = [c for c in table.ran if _samples_per_s(c) < 0]
    assert ooms and counts["predicted"] == len(table.predicted) > 0
    for i, config in enumerate(table.ran):  # nothing ran that an earlier OOM ruled out
        earlier = [(n, c.model_dump()) for n, c in enumerate(table.ran[:i]) if c in ooms]
        assert oom_dominated(config.model_dump(), earlier) is None, config
    number, message = table.predicted[0]
    assert message.startswith("not run: out of memory predicted")
    assert "which ran out of memory" in message
    told = study.trials[number]
    assert told.state == optuna.trial.TrialState.COMPLETE and told.constraints[CONSTRAINT] == 1
    assert told.user_attrs["skipped"] == message
    # every config of the grid was either measured or ruled out, each once
    assert len(table.ran) + len(table.predicted) == len(list(loop.search.grid()))


def test_predicted_oom_is_a_pruned_row_with_the_reason(
    sqlite_url: str, storage: optuna.storages.RDBStorage, tmp_path: Path
) -> None:
    """What `sweeper launch` records for a config it did not run, and reads back on resume."""
    space = _space("bayes")
    store = Store(sqlite_url)
    store.migrate()
    store.upsert_study(space.study, **STUDY_FIELDS)
    study = optuna.create_study(study_name=space.study, storage=storage)
    executor = ChildExecutor(space, store, None, tmp_path, SilentObserver())  # type: ignore[arg-type]
    trial = study.ask()
    config = TrialConfig.model_validate(_space_defaults(space) | {"per_device_batch_size": 16})
    executor.record_predicted(trial, config, "not run: out of memory predicted, because")
    (row,) = store.list_trials(space.study)
    assert (row.state, row.failure_kind) == ("pruned", "oom")
    assert row.failure_message == "not run: out of memory predicted, because"
    assert executor.earlier() == {config: Outcome(number=0, failure_kind="oom", predicted=True)}
    store.dispose()


def test_the_default_sampler_and_a_seed_per_worker() -> None:
    assert parse_space(SPACE).search.sampler == DEFAULT_SAMPLER
    seeds = {worker_seed(7, str(w)) for w in range(8)}
    assert len(seeds) == 8 and worker_seed(7, "0") == 7
    with pytest.raises(SpaceError, match=r"search\.sampler.*'bayes'.*'random'"):
        _space("simulated-annealing")


def test_patience_stops_when_nothing_beats_the_best_beyond_noise(
    storage: optuna.storages.RDBStorage,
) -> None:
    text = SPACE.replace("n_trials: 3", "n_trials: 40\n  patience: 4")
    space = _space("grid", text)
    loop, study, table = _loop(space, storage)
    counts = loop.run(space.budget.n_trials)
    assert counts["run"] < len(list(loop.search.grid()))
    assert "no trial in the last 4 beat the best $/run" in loop.stop_reason
    costs = [1000 / s if (s := _samples_per_s(c)) > 0 else None for c in table.ran]
    measured = [c for c in costs if c is not None]
    # the last 4 measured trials are no cheaper than the best before them
    assert min(measured[-4:]) >= min(measured[:-4])


def test_a_budget_in_dollars_or_device_hours_is_a_time_limit() -> None:
    space = parse_space(SPACE.replace("n_trials: 3", "n_trials: 3\n  max_usd: 0.05"))
    assert space.budget.minutes(space.hardware.usd_per_hour) == pytest.approx(30)  # $0.10/h
    both = SPACE.replace("n_trials: 3", "n_trials: 3\n  max_device_hours: 0.25\n  max_usd: 1")
    assert parse_space(both).budget.minutes(0.10) == pytest.approx(15)


def test_the_replay_benchmark_runs_the_sweeps_loop_on_a_table(tmp_path: Path) -> None:
    """bench/search_replay.py end to end on a cut-down table: a config the space allows but the
    table lacks is a failed trial, and the summary compares the default with random search."""
    import subprocess
    import sys

    from tests.helpers import REPO

    table = REPO / "bench" / "replay" / "oom-wall.jsonl"
    rows = table.read_text().splitlines()
    cut = tmp_path / "cut.jsonl"
    cut.write_text("\n".join(rows[:-40]) + "\n")
    result = subprocess.run(
        [sys.executable, str(REPO / "bench" / "search_replay.py"),
         "--space", str(REPO / "bench" / "replay" / "oom-wall.yaml"), "--table", str(cut),
         "--seeds", "3", "--jobs", "1", "--samplers", f"{DEFAULT_SAMPLER},random"],
        capture_output=True, text=True, timeout=300, cwd=REPO,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "448 configs in the space, 408 in the table (40 missing: failed trials)" in out
    assert f"| {DEFAULT_SAMPLER} (default) | 3 |" in out and "| random | 3 |" in out
    assert out.count(f"median trials to 5%, {DEFAULT_SAMPLER} ÷ random:") == 2


@pytest.mark.parametrize("sampler", ["bayes", "grid"])
@pytest.mark.parametrize("seed", range(5))
def test_a_config_another_worker_is_running_is_never_proposed(sampler: str, seed: int) -> None:
    """Two workers on one study: the second asks while the first's trial still runs."""
    candidates = [{"batch": b, "seq": s} for b in (1, 2) for s in (64, 128)]
    study = optuna.create_study(sampler=make_sampler(sampler, seed, candidates))

    def ask() -> optuna.Trial:
        trial = study.ask()
        trial.suggest_categorical("batch", [1, 2])
        trial.suggest_categorical("seq", [64, 128])
        return trial

    first = ask()  # running, never told
    for _ in range(3):
        other = ask()
        assert other.params != first.params
        study.tell(other, 1.0)
    assert sorted(map(str, [first.params, *[t.params for t in study.trials[1:]]])) == sorted(
        map(str, candidates)
    )


@pytest.mark.parametrize("n", [5, 40])  # fewer observations than features, then more
def test_the_posterior_is_exact_in_both_of_its_forms(n: int) -> None:
    rng = np.random.default_rng(n)
    x = rng.integers(0, 2, size=(n, 12)).astype(float)
    y = rng.normal(size=n)
    prior_var = rng.uniform(0.01, 1.0, size=12)
    new = rng.integers(0, 2, size=(7, 12)).astype(float)
    posterior = Posterior(x, y, prior_var, noise_sd=0.1)
    assert posterior.by_observation == (n <= 12)
    # the textbook form: covariance (P^-1 + X'X / s^2)^-1, mean covariance X'y / s^2
    covariance = np.linalg.inv(np.diag(1 / prior_var) + x.T @ x / 0.01)
    weights = covariance @ x.T @ (y - y.mean()) / 0.01
    np.testing.assert_allclose(posterior.weights, weights, rtol=1e-6, atol=1e-9)
    np.testing.assert_allclose(posterior.mean(new), new @ weights, rtol=1e-6, atol=1e-9)
    np.testing.assert_allclose(
        posterior.variance(new), np.einsum("if,fg,ig->i", new, covariance, new), rtol=1e-6
    )
    # the marginal likelihood (ImprovementGridSampler.interaction_prior_fit): y - mean(y) is
    # normal with covariance X P X' + s^2 I
    marginal = x @ np.diag(prior_var) @ x.T + 0.01 * np.eye(n)
    expected = stats.multivariate_normal(np.zeros(n), marginal).logpdf(y - y.mean())
    assert posterior.log_evidence == pytest.approx(expected, rel=1e-9)


def _whole(config: TrialConfig) -> bool:
    """As a study whose data needs 128 tokens whole: 64 without packing truncates."""
    return config.max_seq_length >= 128 or config.packing


@pytest.mark.parametrize("sampler", ["bayes", "tpe", "random", "grid"])
def test_configs_the_recommendation_could_not_pick_are_never_run(
    sampler: str, storage: optuna.storages.RDBStorage
) -> None:
    """A config that cuts samples the coverage needs whole is left out by the recommendation;
    running it would spend a trial for nothing. It is not run: the samplers that pick from the
    grid never propose it, the others are told it is infeasible (the constraint), and the
    sweep says so once. The user's baseline runs whatever it truncates (it is the yardstick)."""
    text = SPACE + (
        "baseline:\n  per_device_batch_size: 2\n  gradient_accumulation_steps: 1\n"
        "  num_workers: 0\n  max_seq_length: 64\n"
        "  attn_implementation: eager\n"
    )
    space = _space(sampler, text)
    notes = Notes()
    loop, study, table = _loop(space, storage, observer=notes, eligible=_whole)  # type: ignore[arg-type]
    counts = loop.run(100)  # until every config it may run is measured
    baseline = space.baseline.as_config(space.search)
    assert table.ran[0] == baseline  # the one truncating config that runs
    assert all(_whole(c) for c in table.ran[1:]), [c for c in table.ran if not _whole(c)]
    assert "are not run: at max_seq_length 64 they cut samples" in " ".join(notes.notes)
    assert {c for c in loop.runnable if c != baseline} <= {c for c in loop.runnable if _whole(c)}
    assert counts["run"] == len(set(table.ran))
    ruled_out = [
        t for t in study.trials if "cuts samples" in t.user_attrs.get("skipped", "")
    ]  # proposed, ruled out: told infeasible, never run
    assert all(t.params["max_seq_length"] == 64 for t in ruled_out)  # packing: [false]
    assert all(t.constraints[CONSTRAINT] > 0 for t in ruled_out)
    # bayes and grid pick among the runnable configs only; TPE and random search propose
    # anything of the space, and learn from the constraint
    assert bool(ruled_out) == (sampler in ("tpe", "random")), len(ruled_out)


def test_when_every_config_truncates_all_are_measured_and_the_sweep_says_why(
    storage: optuna.storages.RDBStorage,
) -> None:
    notes = Notes()
    loop, _, table = _loop(_space("grid"), storage, observer=notes, eligible=lambda c: False)  # type: ignore[arg-type]
    loop.run(100)
    assert len(table.ran) + len(table.predicted) == len(loop.runnable) == 40
    assert "only `sweeper best --allow-truncation` can recommend one" in " ".join(notes.notes)


def test_a_real_spaces_grid_is_filtered_for_truncation_in_one_pass() -> None:
    """The H200 record of 2026-11-27 sat 4+ minutes after preflight without starting a trial:
    leaving out the configs that truncate compared each cut config with every kept one (a
    list's ``in``, pydantic equality), 74,880 configs of spaces/h200-llama-1b.yaml, hours of
    work. The filter must cost about what asking the rule once per config costs (a ratio
    measured side by side, so a loaded machine slows both)."""
    import time

    from sweeper.space import load_space
    from sweeper.sweep.loop import _recommendable_only
    from sweeper.sweep.rules import Ineligible

    space = load_space(Path(__file__).parents[1] / "spaces" / "h200-llama-1b.yaml")
    grid = list(space.search.grid())
    assert len(grid) > 70_000

    def whole(config: TrialConfig) -> bool:  # data whose p99 sample needs 1,536 tokens
        return config.packing or config.max_seq_length >= 1536

    rule = Ineligible(whole, 99)
    started = time.perf_counter()
    asked = [rule.check(c) is None for c in grid]
    ask_s = time.perf_counter() - started
    notes = Notes()
    started = time.perf_counter()
    kept, kept_rule = _recommendable_only(grid, rule, notes)  # type: ignore[arg-type]
    filter_s = time.perf_counter() - started
    assert kept == [c for c, ok in zip(grid, asked, strict=True) if ok] and kept_rule is rule
    assert len(kept) == len(grid) * 3 // 4  # cut: 512 and 1024 unpacked, 2 of 8 (length, packing)
    assert notes.notes == [
        f"{len(grid) - len(kept)} of the space's {len(grid)} configs are not run: at "
        "max_seq_length 512, 1024 they cut samples that workload.coverage_percentile (99) "
        "needs whole, so the recommendation could not pick them"
    ]
    assert filter_s < 3 * ask_s + 0.5, (filter_s, ask_s)


class _Smooth(_Table):
    """A 1B-like job: samples/s grows with the batch and falls with the length, packing pays,
    batch × length past 32,768 tokens runs out of memory."""

    def execute(self, trial: optuna.Trial, config: TrialConfig, left_s: float | None) -> Outcome:
        self.ran.append(config)
        tokens = config.per_device_batch_size * config.max_seq_length
        if tokens > 32_768 and not config.gradient_checkpointing:
            return Outcome(number=trial.number, failure_kind="oom")
        speed = 40 * tokens / (tokens + 4096) * 1024 / config.max_seq_length
        return Outcome(number=trial.number, cost=1000 / (speed * (1.6 if config.packing else 1)))


def test_the_h200_space_reaches_its_search_in_the_time_its_grid_takes_to_list(
    storage: optuna.storages.RDBStorage,
) -> None:
    """The shipped GPU space, as a sweep on the H200 met it (2026-11-27): its 74,880 configs,
    data whose samples need 1,536 tokens whole, the six named configs first, then the default
    search's picks. The H200 lease was lost to a loop that never reached its first trial; here
    the loop's set-up and nine trials must cost a few times what listing the grid costs (a
    ratio measured side by side), and every pick after the named configs must be one the
    recommendation could pick."""
    import time

    from sweeper.space import load_space

    space = load_space(Path(__file__).parents[1] / "spaces" / "h200-llama-1b.yaml")
    started = time.perf_counter()
    assert len(list(space.search.grid())) == 74_880
    grid_s = time.perf_counter() - started

    def whole(config: TrialConfig) -> bool:
        return config.packing or config.max_seq_length >= 1536

    study = optuna.create_study(study_name=space.study, storage=storage, direction="minimize")
    enqueue_known(study, space)
    table = _Smooth()
    notes = Notes()
    started = time.perf_counter()
    loop = SearchLoop(space, study, table, PreflightReport(), notes, seed=0, eligible=whole)
    counts = loop.run(9)
    loop_s = time.perf_counter() - started
    assert counts["run"] == 9 and len(set(table.ran)) == 9
    named = space.known_configs()
    assert table.ran[:6] == named
    assert all(whole(c) for c in table.ran[6:]), table.ran[6:]
    assert "configs are not run: at max_seq_length 512, 1024" in " ".join(notes.notes)
    assert loop_s < 10 * grid_s + 5, (loop_s, grid_s)
