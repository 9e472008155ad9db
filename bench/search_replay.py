"""How many trials does each search need? The sweep's own loop, replayed on measured tables.

    .venv/bin/python bench/search_replay.py --space bench/replay/cpu-grid.yaml \\
        --table bench/replay/cpu-grid.jsonl [--seeds 200] [--samplers default,random,tpe]

The search runs exactly the code `sweeper launch` runs (``sweeper.sweep.loop.SearchLoop``: the
sampler the space names, what each proposal tells it, the out-of-memory rule), on an in-memory
Optuna study; only the trial executor is replaced by a lookup in the table.

The table is JSONL, one object per config: the space's knob names as keys, ``samples_per_s``,
``tokens_per_s``, optionally ``peak_memory_bytes`` and ``noise`` (the relative spread of one
measurement: each lookup then draws a log-normal measurement around the value), optionally
``contended_share`` and ``slowdown`` (a machine shared with other work: each lookup is, with
that probability, slowed by that factor and flagged contended, as the child's host watch flags
it; the loop then measures it again), ``status`` (``ok``, or a failure kind such as
``oom``), and optionally ``trial_s``, the seconds one trial of the config takes (start-up,
compile, burn-in and the timed window; a failing config until it fails), and ``first_trial_s``,
the same config as the sweep's first trial (weights and data read cold;
bench/replay/make_tables.py). A table without ``trial_s`` gets it from the config's compile
mode (``trial_seconds``). A knob the table leaves out takes the space's value. A config the
space allows but the table lacks is a failed trial.

For each metric (samples/s, tokens/s) the search minimizes $/run computed from that metric, and
the bench prints, over the seeds, the number of distinct configs run until one within 5% and
10% of the table's best (median and p90, with 95% bootstrap intervals), and the regret (1 -
best found / best) after 10, 20 and 40 trials. A config not run because it would run out of
memory costs nothing and is not counted. Beside trials, the seconds of measurement until one
within 5% (every trial, failed ones and re-measurements included: what the rented machine was
busy for).

    .venv/bin/python bench/search_replay.py --export-study NAME --storage URL --out FILE.jsonl

writes a study's measured trials as such a table.

**Budget mode** (``--budget-s S[,S...]``): each seed runs until its measurement-seconds are
spent, on a simulated clock that the table's trial times move (the loop's deadline is S);
a trial that would pass the budget is cut at it and its seconds are wasted (the real loop's
timeout is the time left). Each seed runs twice, with the budget-aware pick (a config whose
trial cannot finish in the time left is not proposed, and the sweep stops when none can:
``SearchLoop.fit_to_budget``) and without it (the rule before: a trial starts if the time
left holds the longest so far), and the bench prints per sampler and budget: the regret at
the budget (1 - best found / best; mean, and seeds within 5%), seeds better / worse with the
aware pick, seconds wasted on cut trials, trials measured.

    .venv/bin/python bench/search_replay.py --space bench/replay/qlora-24gb.yaml \
        --table bench/replay/qlora-24gb.jsonl --budget-s 2700,5400,10800 --seeds 30 \
        --samplers bayes,random --metrics samples_per_s --jobs 1

A long run can be split: ``--save FILE`` appends every replay (one JSON line each, with the
table's name, sampler, metric and seed) as it ends; ``--load FILE`` (repeatable) adds a
file's replays of the same table to the summary, so samplers run by separate processes are
reported side by side (``--samplers ''`` runs none).
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import multiprocessing
import statistics
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import optuna

from sweeper import knobs
from sweeper.noise import Estimate, Sample, SampleKind
from sweeper.preflight import PreflightReport
from sweeper.samplers import DEFAULT_SAMPLER, SAMPLERS
from sweeper.search import COMPILE_S, SECONDS_ATTR, ImprovementGridSampler
from sweeper.space import Space, TrialConfig, load_space
from sweeper.sweep.loop import SearchLoop
from sweeper.sweep.observer import SilentObserver
from sweeper.sweep.outcome import Outcome
from sweeper.sweep.queue import enqueue_known

METRICS = ("samples_per_s", "tokens_per_s")
THRESHOLDS = (0.05, 0.10)
REGRET_AT = (10, 20, 40)


# ------------------------------------------------------------------ the table


@dataclass(frozen=True)
class Row:
    samples_per_s: float | None
    tokens_per_s: float | None
    status: str
    noise: float = 0.0
    contended_share: float = 0.0  # the chance that a measurement is taken under load
    slowdown: float = 1.0  # what the load does to a measurement
    peak_memory_bytes: int | None = None
    # cuts samples the coverage needs whole: the recommendation cannot pick it
    truncates: bool = False
    trial_s: float = 0.0  # the seconds one trial of the config takes
    first_trial_s: float = 0.0  # as the sweep's first trial (cold start-up); 0: trial_s

    def value(self, metric: str) -> float | None:
        return self.samples_per_s if metric == "samples_per_s" else self.tokens_per_s


def read_table(path: Path, space: Space) -> dict[TrialConfig, Row]:
    """The table's rows by config (knobs it leaves out take the space's single value)."""
    defaults = {name: space.search.values(name)[0] for name in knobs.NAMES}
    rows: dict[TrialConfig, Row] = {}
    for line_number, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            data = json.loads(line)
            values = {name: data.get(name, defaults[name]) for name in knobs.NAMES}
            config = TrialConfig.model_validate(knobs.normalize(values))
        except (ValueError, TypeError) as e:
            sys.exit(f"{path}:{line_number}: not a config of the space's knobs: {e}")
        rows[config] = Row(
            samples_per_s=data.get("samples_per_s"),
            tokens_per_s=data.get("tokens_per_s"),
            status=data.get("status", "ok"),
            noise=float(data.get("noise", 0.0)),
            contended_share=float(data.get("contended_share", 0.0)),
            slowdown=float(data.get("slowdown", 1.0)),
            peak_memory_bytes=data.get("peak_memory_bytes"),
            truncates=bool(data.get("truncates", False)),
            trial_s=float(data.get("trial_s") or trial_seconds(config, data.get("status", "ok"))),
            first_trial_s=float(data.get("first_trial_s") or 0.0),
        )
    return rows


# A table without trial times (all but qlora-24gb, which has its own) gets them from this
# model: an ordinary trial takes a minute (15 s of start-up, 45 of burn-in and the timed
# window), a compile mode adds its compile (sweeper.search.COMPILE_S: max-autotune 345 s, as
# measured on an H100), and a failing config ends where it fails: out of memory at the first
# step after compiling, a compile error at the end of the compile, the others at start-up.
START_S, WINDOW_S, FIRST_STEP_S = 15.0, 45.0, 5.0


def trial_seconds(config: TrialConfig, status: str) -> float:
    """The seconds one trial of ``config`` takes, by the model above."""
    compile_s = COMPILE_S.get(config.compile_mode, 0.0)
    if status == "ok":
        return START_S + compile_s + WINDOW_S
    if status == "oom":
        return START_S + compile_s + FIRST_STEP_S
    return START_S + (compile_s if status == "compile" else FIRST_STEP_S)


def eligible_best(table: dict[TrialConfig, Row], metric: str) -> float:
    """The best value the recommendation could pick (no truncating config)."""
    return max(
        v
        for r in table.values()
        if r.status == "ok" and not r.truncates
        for v in [r.value(metric)]
        if v
    )


class ReplayClock:
    """The budget mode's clock: a trial's seconds (the table's) pass when it runs."""

    def __init__(self) -> None:
        self.now_s = 0.0

    def __call__(self) -> float:
        return self.now_s


class LookupExecutor:
    """The replay's trial executor: a table lookup (with the row's noise, if any). With a
    ``clock`` (budget mode), a trial moves it by its seconds, and one longer than the time
    left (``left_s``, the loop's timeout) is cut there: its seconds are wasted, its outcome
    ``interrupted`` (as the real executor records a trial the budget ended)."""

    def __init__(
        self,
        table: dict[TrialConfig, Row],
        metric: str,
        price: float,
        units: float,
        seed: int,
        clock: ReplayClock | None = None,
    ) -> None:
        self.table, self.metric, self.price, self.units = table, metric, price, units
        self.rng = np.random.default_rng(seed)
        self.run: list[TrialConfig] = []  # distinct configs, in the order they ran
        self.measurements = 0  # every lookup: trials, reruns, drift checks, the final rounds
        self.measured_at: list[int] = []  # per distinct config: measurements when it ran
        self.seconds = 0.0  # of every lookup, by the table's trial times
        self.seconds_at: list[float] = []  # per distinct config: seconds when it had run
        self.clock = clock
        self.cut = 0  # trials and re-measures the budget cut
        self.wasted_s = 0.0  # their seconds
        self.finished = 0  # trials that ran to their end (measured, or failed by the config)
        self.cut_runs: set[int] = set()  # which of ``run`` the budget cut (index)

    def _spend(self, seconds: float, left_s: float | None) -> bool:
        """Spend a trial's ``seconds``; whether the budget cut it (at ``left_s``)."""
        cut = self.clock is not None and left_s is not None and seconds > left_s
        if cut:
            seconds = max(0.0, left_s or 0.0)
            self.cut += 1
            self.wasted_s += seconds
        self.seconds += seconds
        if self.clock is not None:
            self.clock.now_s += seconds
        return cut

    def stop_requested(self) -> bool:
        return False

    def record_predicted(self, trial: optuna.Trial, config: TrialConfig, message: str) -> None:
        pass

    def claim(self, number: int, config: TrialConfig) -> int | None:
        return None  # one worker: every config is its own

    def execute(self, trial: optuna.Trial, config: TrialConfig, left_s: float | None) -> Outcome:
        self.run.append(config)
        self.measurements += 1
        self.measured_at.append(self.measurements)
        row = self.table.get(config)
        seconds = row.trial_s if row is not None else trial_seconds(config, "error")
        if row is not None and row.first_trial_s and len(self.run) == 1:
            seconds = row.first_trial_s  # the sweep's first start-up is cold
        if self._spend(seconds, left_s):
            self.seconds_at.append(self.seconds)
            self.cut_runs.add(len(self.run) - 1)
            return Outcome(number=trial.number, failure_kind="interrupted")
        self.finished += 1
        self.seconds_at.append(self.seconds)
        trial.set_user_attr(SECONDS_ATTR, seconds)  # the lookup itself takes no time
        if row is None:
            return Outcome(number=trial.number, failure_kind="error")
        value = row.value(self.metric)
        if row.status != "ok" or value is None or value <= 0:
            return Outcome(number=trial.number, failure_kind=row.status or "error")
        if row.peak_memory_bytes:  # as a launched trial carries it (Measurement.optuna_attrs)
            trial.set_user_attr("peak_memory_bytes", row.peak_memory_bytes)
        sample = self._sample(row, "trial")
        assert sample is not None
        return Outcome(
            number=trial.number,
            cost=sample.cost_per_run_usd,
            spread=sample.ci95_rel or 0.0,
            sample=sample,
        )

    def remeasure(
        self, number: int, config: TrialConfig, kind: SampleKind, left_s: float | None
    ) -> Sample | None:
        self.measurements += 1
        row = self.table.get(config)
        if row is None:
            return None
        if self._spend(row.trial_s, left_s):  # a measurement again is a trial again
            return None
        return self._sample(row, kind)

    def record_estimates(
        self, estimates: Mapping[int, tuple[Estimate, Sequence[Sample] | None]]
    ) -> None:
        pass

    def _sample(self, row: Row, kind: SampleKind) -> Sample | None:
        """One measurement of the row: its value, with the row's noise and load drawn afresh."""
        value = row.value(self.metric)
        if row.status != "ok" or value is None or value <= 0:
            return None
        if row.noise:
            value *= math.exp(self.rng.normal(0.0, row.noise))
        loaded = bool(row.contended_share) and self.rng.random() < row.contended_share
        if loaded:
            value *= row.slowdown
        # $/run of the job counted in this metric's units (samples or tokens)
        cost = self.price * self.units / value / 3600
        return Sample(
            kind=kind,
            cost_per_run_usd=cost,
            hours_per_run=cost / self.price,
            samples_per_s=value if self.metric == "samples_per_s" else None,
            tokens_per_s=value if self.metric == "tokens_per_s" else None,
            it_per_s=None,
            ci95_rel=1.96 * row.noise,  # one measurement's 95% interval
            contended=loaded,
            contention="the table's load" if loaded else None,
            peak_memory_bytes=row.peak_memory_bytes,
        )


# ------------------------------------------------------------------ one replay


@dataclass
class Replay:
    """One search on a table: the true value of each distinct config it ran, in order (None:
    failed), the measurements taken when each ran (a config measured again counts each time),
    and what the search did before it first ran a config within 5% of the best: trials that
    failed, and proposals it did not run (out of memory predicted, ruled out as ineligible)."""

    values: list[float | None]
    measured_at: list[int]
    seconds_at: list[float]
    failed_to_5: float  # inf: never reached
    skips_to_5: float


def replay(
    space: Space, table: dict[TrialConfig, Row], sampler: str, metric: str, seed: int
) -> Replay:
    space = space.model_copy(
        update={"search": space.search.model_copy(update={"sampler": sampler})}
    )
    study = optuna.create_study(direction="minimize", sampler=optuna.samplers.RandomSampler())
    enqueue_known(study, space)
    executor = LookupExecutor(
        table, metric, space.hardware.usd_per_hour, space.workload.samples, seed
    )
    truncating = {c for c, r in table.items() if r.truncates}
    loop = SearchLoop(
        space, study, executor, PreflightReport(), SilentObserver(), seed=seed,
        eligible=(lambda c: c not in truncating) if truncating else None,
    )  # fmt: skip
    best = eligible_best(table, metric)
    failed = skips = 0
    failed_to_5 = skips_to_5 = math.inf
    while True:
        counts = loop.run(1)
        skips += counts["predicted"] + counts["ruled_out"]
        if counts["run"] == 0:
            break  # every config ran, or the sampler keeps proposing what it has seen
        run = executor.run
        last = table.get(run[-1])
        value = None if last is None or last.status != "ok" else last.value(metric)
        failed += value is None
        if math.isinf(failed_to_5) and value is not None and value >= 0.95 * best:
            failed_to_5, skips_to_5 = failed, skips
        if math.isfinite(failed_to_5) and len(run) >= max(REGRET_AT):  # reached 5%
            break
    values = [
        None if c not in table or table[c].status != "ok" else table[c].value(metric)
        for c in executor.run
    ]
    return Replay(
        values, executor.measured_at, executor.seconds_at, float(failed_to_5), float(skips_to_5)
    )


@dataclass
class BudgetReplay:
    """One search on a table until its measurement-seconds are spent: the true value of each
    distinct config it ran (None: failed, or cut by the budget), the trials that ran to their
    end, those the budget cut and their seconds, the seconds spent, and why it stopped."""

    values: list[float | None]
    finished: int
    cut: int
    wasted_s: float
    spent_s: float
    stop_reason: str


def replay_budget(
    space: Space,
    table: dict[TrialConfig, Row],
    sampler: str,
    metric: str,
    seed: int,
    budget_s: float,
    fit: bool,
) -> BudgetReplay:
    """``replay`` until ``budget_s`` measurement-seconds are spent, with the budget-aware pick
    (``fit``) or the rule before it."""
    space = space.model_copy(
        update={"search": space.search.model_copy(update={"sampler": sampler})}
    )
    study = optuna.create_study(direction="minimize", sampler=optuna.samplers.RandomSampler())
    enqueue_known(study, space)
    clock = ReplayClock()
    executor = LookupExecutor(
        table, metric, space.hardware.usd_per_hour, space.workload.samples, seed, clock
    )
    truncating = {c for c, r in table.items() if r.truncates}
    loop = SearchLoop(
        space, study, executor, PreflightReport(), SilentObserver(), seed=seed,
        eligible=(lambda c: c not in truncating) if truncating else None,
        now=clock, fit_to_budget=fit,
    )  # fmt: skip
    while loop.run(1, deadline=budget_s)["run"]:
        pass
    values = [
        None
        if c not in table or table[c].status != "ok" or i in executor.cut_runs
        else table[c].value(metric)
        for i, c in enumerate(executor.run)
    ]
    return BudgetReplay(
        values, executor.finished, executor.cut, executor.wasted_s, executor.seconds,
        loop.stop_reason,
    )  # fmt: skip


def _job(
    args: tuple[str, str, str, str, int, dict[str, Any]],
) -> tuple[str, str, int, Replay]:
    space_path, table_path, sampler, metric, seed, overrides = args
    for name, value in overrides.items():  # (a forked worker: the class is this process's own)
        setattr(ImprovementGridSampler, name, value)
    space = load_space(Path(space_path))
    table = read_table(Path(table_path), space)
    return sampler, metric, seed, replay(space, table, sampler, metric, seed)


BudgetKey = tuple[str, str, float, bool]  # sampler, metric, budget seconds, budget-aware pick


def _budget_job(
    args: tuple[str, str, str, str, int, float, bool],
) -> tuple[BudgetKey, int, BudgetReplay]:
    space_path, table_path, sampler, metric, seed, budget_s, fit = args
    space = load_space(Path(space_path))
    table = read_table(Path(table_path), space)
    replayed = replay_budget(space, table, sampler, metric, seed, budget_s, fit)
    return (sampler, metric, budget_s, fit), seed, replayed


def save_budget_replay(path: Path, table: str, key: BudgetKey, seed: int, r: BudgetReplay) -> None:
    """Appends one budget replay to ``path`` as a JSON line."""
    sampler, metric, budget_s, fit = key
    record = {
        "table": table, "sampler": sampler, "metric": metric, "seed": seed,
        "budget_s": budget_s, "fit": fit,
    } | vars(r)  # fmt: skip
    with path.open("a") as f:
        f.write(json.dumps(record) + "\n")


def load_budget_replays(
    paths: Sequence[Path], table: str
) -> dict[BudgetKey, dict[int, BudgetReplay]]:
    """The budget replays of ``table`` saved in ``paths`` (other lines are left out)."""
    out: dict[BudgetKey, dict[int, BudgetReplay]] = {}
    for where, record in _saved(paths, table, budget=True):
        try:
            replayed = BudgetReplay(**{k: record[k] for k in BudgetReplay.__dataclass_fields__})
            key = (
                record["sampler"], record["metric"], float(record["budget_s"]),
                bool(record["fit"]),
            )  # fmt: skip
            seed = int(record["seed"])
        except (ValueError, KeyError, TypeError) as e:
            sys.exit(f"{where}: not a saved budget replay ({e}); write it with --save")
        out.setdefault(key, {})[seed] = replayed
    return out


def saved_path(path: Path) -> Path:
    """``path``, or its gzip beside it (``NAME.gz``: the committed replays are kept
    compressed) where only that exists."""
    packed = path.with_name(path.name + ".gz")
    return packed if not path.exists() and packed.exists() else path


def read_saved(path: Path) -> str:
    """The text of a saved replay file, read through gzip where it is compressed."""
    path = saved_path(path)
    if path.suffix == ".gz":
        return gzip.decompress(path.read_bytes()).decode()
    return path.read_text()


def _saved(
    paths: Sequence[Path], table: str, *, budget: bool
) -> Iterator[tuple[str, dict[str, Any]]]:
    """``(path:line, record)`` of each line saved in ``paths`` for ``table``: the budget
    replays (``budget``) or the others."""
    kind = "saved budget replay" if budget else "saved replay"
    for path in paths:
        for number, line in enumerate(read_saved(path).splitlines(), 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
                if record["table"] != table or ("budget_s" in record) != budget:
                    continue
            except (ValueError, KeyError, TypeError) as e:
                sys.exit(f"{path}:{number}: not a {kind} ({e}); write it with --save")
            yield f"{path}:{number}", record


def summarize_budget(
    results: dict[BudgetKey, dict[int, BudgetReplay]],
    table: dict[TrialConfig, Row],
    table_name: str,
) -> str:
    """One row per metric, budget and sampler: the budget-aware pick against the rule before
    it, on the same seeds."""
    rng = np.random.default_rng(0)
    lines = [
        "| table | metric | budget s | sampler | seeds | regret at the budget, mean: aware / "
        "before | paired diff (aware - before), mean [95% CI] | seeds within 5%: aware / before "
        "| seeds better / worse | wasted s on cut trials, mean: aware / before | seeds with a cut "
        "trial: aware / before | trials run to their end, median: aware / before | seconds left "
        "unspent at the stop, mean: aware / before |",
        "|---|---|---:|---|---:|---|---|---|---|---|---|---|---|",
    ]
    keys = sorted({(m, b, s) for s, m, b, _ in results}, key=lambda k: (k[0], k[1], k[2]))
    for metric, budget_s, sampler in keys:
        aware, before = (
            results.get((sampler, metric, budget_s, True), {}),
            results.get((sampler, metric, budget_s, False), {}),
        )
        seeds = sorted(set(aware) & set(before))
        if not seeds:
            continue
        best = eligible_best(table, metric)
        ra = [regret_after(aware[s].values, best, len(aware[s].values)) for s in seeds]
        rb = [regret_after(before[s].values, best, len(before[s].values)) for s in seeds]
        diff = bootstrap([a - b for a, b in zip(ra, rb, strict=True)], np.mean, rng)
        better = sum(a < b for a, b in zip(ra, rb, strict=True))
        worse = sum(a > b for a, b in zip(ra, rb, strict=True))
        within = [sum(r <= 0.05 for r in rs) for rs in (ra, rb)]
        wasted = [statistics.mean(x[s].wasted_s for s in seeds) for x in (aware, before)]
        cut = [sum(x[s].cut > 0 for s in seeds) for x in (aware, before)]
        finished = [statistics.median(x[s].finished for s in seeds) for x in (aware, before)]
        unspent = [statistics.mean(budget_s - x[s].spent_s for s in seeds) for x in (aware, before)]
        lines.append(
            f"| {table_name} | {metric} | {budget_s:,.0f} | {sampler} | {len(seeds)} | "
            f"{statistics.mean(ra):.1%} / {statistics.mean(rb):.1%} | {diff[0]:+.1%} "
            f"[{diff[1]:+.1%}, {diff[2]:+.1%}] | {within[0]} / {within[1]} | {better} / {worse} "
            f"| {wasted[0]:,.0f} / {wasted[1]:,.0f} | {cut[0]} / {cut[1]} | "
            f"{_fmt(finished[0])} / {_fmt(finished[1])} | {unspent[0]:,.0f} / {unspent[1]:,.0f} |"
        )
    return "\n".join(lines)


def save_replay(path: Path, table: str, sampler: str, metric: str, seed: int, r: Replay) -> None:
    """Appends one replay to ``path`` as a JSON line (infinity as JSON's Infinity)."""
    record = {"table": table, "sampler": sampler, "metric": metric, "seed": seed} | vars(r)
    with path.open("a") as f:
        f.write(json.dumps(record) + "\n")


def load_replays(paths: Sequence[Path], table: str) -> dict[tuple[str, str], dict[int, Replay]]:
    """The replays of ``table`` saved in ``paths``, by (sampler, metric) and seed (a seed saved
    twice: the last one)."""
    out: dict[tuple[str, str], dict[int, Replay]] = {}
    for where, record in _saved(paths, table, budget=False):  # budget ones: load_budget_replays
        try:
            replayed = Replay(**{k: record[k] for k in Replay.__dataclass_fields__})
            key, seed = (record["sampler"], record["metric"]), int(record["seed"])
        except (ValueError, KeyError, TypeError) as e:
            sys.exit(f"{where}: not a saved replay ({e}); write it with --save")
        out.setdefault(key, {})[seed] = replayed
    return out


# ------------------------------------------------------------------ statistics


def trials_until(values: Sequence[float | None], target: float) -> float:
    """Distinct configs run until one reached ``target`` (inf: never)."""
    for i, value in enumerate(values, 1):
        if value is not None and value >= target:
            return float(i)
    return math.inf


def regret_after(values: Sequence[float | None], best: float, n: int) -> float:
    found = [v for v in values[:n] if v is not None]
    return 1 - max(found) / best if found else 1.0


def bootstrap(
    samples: Sequence[float], statistic: Any, rng: np.random.Generator, n: int = 2000
) -> tuple[float, float, float]:
    """The statistic and its 95% percentile-bootstrap interval."""
    data = np.array(samples, dtype=float)
    estimates = [statistic(rng.choice(data, size=len(data))) for _ in range(n)]
    low, high = np.percentile(estimates, [2.5, 97.5])
    return float(statistic(data)), float(low), float(high)


def _fmt(value: float) -> str:
    return "never" if math.isinf(value) else f"{value:.1f}".rstrip("0").rstrip(".")


def _seconds(value: float) -> str:
    return "never" if math.isinf(value) else f"{value:,.0f}"


def summarize(
    results: dict[tuple[str, str], list[Replay]],
    table: dict[TrialConfig, Row],
    samplers: Sequence[str],
    size: int,
) -> str:
    rng = np.random.default_rng(0)
    median = lambda a: float(np.median(a))  # noqa: E731
    p90 = lambda a: float(np.percentile(a, 90, method="inverted_cdf"))  # noqa: E731
    lines = []
    for metric in [m for m in METRICS if any(k[1] == m for k in results)]:
        oks = [r.value(metric) for r in table.values() if r.status == "ok" and not r.truncates]
        best = eligible_best(table, metric)
        within = {t: sum(1 for v in oks if v and v >= (1 - t) * best) for t in THRESHOLDS}
        lines += [
            f"\n**{metric}** (best {best:,.4g}; configs within 5%: {within[0.05]}, within 10%: "
            f"{within[0.10]}, of {size})\n",
            "| search | seeds | to 5%: median [95% CI] | p90 [95% CI] | to 10%: median [95% CI] "
            "| p90 [95% CI] | regret @10 | @20 | @40 | measurements to 5%: median "
            "| failed trials to 5%: median | not run (skips) to 5%: median "
            "| measurement-seconds to 5%: median [95% CI] |",
            "|---|---:|---|---|---|---|---:|---:|---:|---:|---:|---:|---|",
        ]
        medians, seconds_medians = {}, {}
        for sampler in samplers:
            replayed = results.get((sampler, metric), [])
            if not replayed:
                continue
            runs = [r.values for r in replayed]
            cells = []
            for t in THRESHOLDS:
                counts = [trials_until(r, (1 - t) * best) for r in runs]
                m, ml, mh = bootstrap(counts, median, rng)
                q, ql, qh = bootstrap(counts, p90, rng)
                if t == 0.05:
                    medians[sampler] = m
                cells += [
                    f"{_fmt(m)} [{_fmt(ml)}, {_fmt(mh)}]",
                    f"{_fmt(q)} [{_fmt(ql)}, {_fmt(qh)}]",
                ]
            regrets = [
                f"{statistics.mean(regret_after(r, best, n) for r in runs):.1%}" for n in REGRET_AT
            ]
            # what reaching it cost: every measurement (reruns, drift checks) up to that config
            costs = [
                float(r.measured_at[int(n) - 1])
                if math.isfinite(n := trials_until(r.values, 0.95 * best)) else math.inf
                for r in replayed
            ]  # fmt: skip
            regrets.append(_fmt(float(np.median(costs))))
            # what it spent on the way: trials that failed (out of memory, a compile error),
            # and proposals it did not run (out of memory predicted, truncating)
            regrets.append(_fmt(float(np.median([r.failed_to_5 for r in replayed]))))
            regrets.append(_fmt(float(np.median([r.skips_to_5 for r in replayed]))))
            seconds = [
                r.seconds_at[int(n) - 1]
                if math.isfinite(n := trials_until(r.values, 0.95 * best)) else math.inf
                for r in replayed
            ]  # fmt: skip
            s, sl, sh = bootstrap(seconds, median, rng)
            seconds_medians[sampler] = s
            regrets.append(f"{_seconds(s)} [{_seconds(sl)}, {_seconds(sh)}]")
            name = f"{sampler} (default)" if sampler == DEFAULT_SAMPLER else sampler
            lines.append(f"| {name} | {len(runs)} | " + " | ".join(cells + regrets) + " |")
        if DEFAULT_SAMPLER in medians and "random" in medians:
            ratio = medians[DEFAULT_SAMPLER] / medians["random"]
            verdict = "meets" if ratio <= 0.5 else "misses"
            lines.append(
                f"\nmedian trials to 5%, {DEFAULT_SAMPLER} ÷ random: {ratio:.2f} ({verdict} the "
                "goal of at most 0.5)"
            )
            lines.append(
                f"median measurement-seconds to 5%, {DEFAULT_SAMPLER} ÷ random: "
                f"{seconds_medians[DEFAULT_SAMPLER] / seconds_medians['random']:.2f}"
            )
        lines += _in_noise_units(results, table, samplers, metric, best)
    return "\n".join(lines)


def _in_noise_units(
    results: dict[tuple[str, str], list[Replay]],
    table: dict[TrialConfig, Row],
    samplers: Sequence[str],
    metric: str,
    best: float,
) -> list[str]:
    """Where one measurement's spread is as wide as "within 5% of the best", reaching it is
    partly a lottery: the regret after 20 trials in units of that spread (the median row's
    ``noise``; a regret under 1 is within one measurement's spread of the best)."""
    noises = [r.noise for r in table.values() if r.status == "ok" and r.noise > 0]
    if not noises:
        return []
    noise = float(np.median(noises))
    within = sum(
        1
        for r in table.values()
        if r.status == "ok" and not r.truncates and (r.value(metric) or 0) >= best * (1 - noise)
    )
    cells = []
    for sampler in samplers:
        replayed = results.get((sampler, metric), [])
        if replayed:
            regret = float(np.median([regret_after(r.values, best, 20) for r in replayed]))
            cells.append(f"{sampler} {regret / noise:.2f}")
    return [
        f"\none measurement's spread is {noise:.1%} here ({within} configs lie within it of the "
        f"best): median regret after 20 trials in units of it: {', '.join(cells)}"
    ]


# ------------------------------------------------------------------ export


def export_study(name: str, storage: str, out: Path) -> None:
    from sweeper.store import Store

    store = Store(storage)
    try:
        trials = store.list_trials(name)
    finally:
        store.dispose()
    searched = [k.name for k in knobs.KNOBS]
    with out.open("w") as f:
        for t in trials:
            if t.state not in ("complete", "failed"):
                continue
            row = {k: t.config.get(k) for k in searched if t.config.get(k) is not None}
            row |= {
                "samples_per_s": t.samples_per_s,
                "tokens_per_s": t.tokens_per_s,
                "peak_memory_bytes": t.peak_memory_bytes,
                "status": "ok" if t.state == "complete" else (t.failure_kind or "error"),
            }
            f.write(json.dumps(row) + "\n")
    print(f"wrote {len([t for t in trials if t.state in ('complete', 'failed')])} rows to {out}")


# ------------------------------------------------------------------ main


# the bayes sampler's settings a replay can change, each ImprovementGridSampler's attribute of
# its name and the flag --the-name: (name, add_argument's type, choices or action, what it does)
_SAMPLER_FLAGS: tuple[tuple[str, dict[str, Any], str], ...] = (
    (
        "cost_weight",
        {"type": float},
        "weigh the chance of improving per second of trial, to this power "
        "(ImprovementGridSampler.cost_weight; default: the sampler's own)",
    ),
    (
        "cost_window",
        {"type": float},
        "weigh time only among configs at least this share as likely to improve as the "
        "likeliest (ImprovementGridSampler.cost_window)",
    ),
    (
        "cost_after",
        {"type": int},
        "measured trials of a compile mode before its time counts "
        "(ImprovementGridSampler.cost_after)",
    ),
    (
        "cost_against",
        {"choices": ("incumbent", "cheapest")},
        "count a trial's seconds beyond the best measured config's or the cheapest "
        "candidate's (ImprovementGridSampler.cost_against)",
    ),
    (
        "cost_cooling",
        {"type": int},
        "the cost weight falls linearly to 0 over this many measured trials "
        "(ImprovementGridSampler.cost_cooling; 0: no cooling)",
    ),
    (
        "cost_acquisition",
        {"choices": ("pi", "ei")},
        "weigh time against the probability of improving (pi) or the expected improvement "
        "(ei: EI per second; use --cost-window 0) (ImprovementGridSampler.cost_acquisition)",
    ),
    (
        "cheap_draws",
        {"action": argparse.BooleanOptionalAction, "default": None},
        "the draws before anything is measured are among the configs of the cheapest expected"
        " trial (ImprovementGridSampler.cheap_draws)",
    ),
    (
        "cost_explore_below",
        {"type": float},
        "weigh time only while no config is at least this likely to run and improve "
        "(ImprovementGridSampler.cost_explore_below; 0: always)",
    ),
    (
        "cheap_first",
        {"type": int},
        "the first picks, up to this many measured, among the cheapest compile mode's configs"
        " (ImprovementGridSampler.cheap_first; 0: off)",
    ),
    (
        "cheap_first_below",
        {"type": float},
        "leave the cheapest mode once none of its configs is this likely to beat its best "
        "(ImprovementGridSampler.cheap_first_below)",
    ),
    (
        "incumbent",
        {"choices": ("measured", "posterior")},
        "the best a pick must beat: the lowest measured log $/run, or the lowest posterior "
        "mean over the measured configs (ImprovementGridSampler.incumbent)",
    ),
    (
        "interaction_prior_fit",
        {"type": lambda v: tuple(float(x) for x in v.split(","))},
        "comma-separated sds; at each pick the interaction prior's sd is the one of these "
        "with the highest marginal likelihood (ImprovementGridSampler.interaction_prior_fit)",
    ),
    (
        "explore_below",
        {"type": float},
        "when no config is this likely to improve, pick the one the model knows least "
        "(ImprovementGridSampler.explore_below; 0: never)",
    ),
    (
        "explore_by",
        {"choices": ("spread", "random")},
        "with --explore-below, the config the model knows least, or one at random "
        "(ImprovementGridSampler.explore_by)",
    ),
    (
        "explore_first",
        {"type": int},
        "the first N measured picks cover what the model knows least under a wide interaction"
        " prior (ImprovementGridSampler.explore_first)",
    ),
    (
        "expected_pairs_sd",
        {"type": float},
        "the interaction prior's sd of the knob pairs expected to interact "
        "(sweeper.search_model.EXPECTED_PAIRS; ImprovementGridSampler.expected_pairs_sd; 0: "
        "off; with --expected-pairs-fit '', the fit being the default)",
    ),
    (
        "expected_pairs_fit",
        {"type": lambda v: tuple(float(x) for x in v.split(",") if x)},
        "comma-separated sds; at each pick the expected pairs' interaction prior sd is the "
        "one of these with the highest marginal likelihood "
        "(ImprovementGridSampler.expected_pairs_fit; the default 0.05,0.1,0.2,0.4; '': off, "
        "--expected-pairs-sd)",
    ),
    (
        "noise_fit",
        {"type": lambda v: tuple(float(x) for x in v.split(","))},
        "comma-separated noise sds, chosen at each pick by the marginal likelihood jointly "
        "with the fitted priors (ImprovementGridSampler.noise_fit)",
    ),
)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--space", type=Path)
    parser.add_argument("--table", type=Path)
    parser.add_argument("--seeds", type=int, default=200)
    parser.add_argument(
        "--seed-from", type=int, default=0,
        help="the first seed (seeds seed-from .. seed-from + seeds - 1): to extend a saved run",
    )  # fmt: skip
    parser.add_argument(
        "--samplers", default=f"{DEFAULT_SAMPLER},random,tpe",
        help=f"comma-separated, of {', '.join(SAMPLERS)}",
    )  # fmt: skip
    parser.add_argument("--metrics", default=",".join(METRICS))
    for name, kwargs, what in _SAMPLER_FLAGS:
        parser.add_argument("--" + name.replace("_", "-"), help=f"bayes: {what}", **kwargs)
    parser.add_argument(
        "--budget-s",
        help="comma-separated measurement-seconds budgets: each seed runs until its budget is "
        "spent, with the budget-aware pick and without it (see the module's docstring)",
    )  # fmt: skip
    parser.add_argument("--jobs", type=int, default=multiprocessing.cpu_count())
    parser.add_argument("--save", type=Path, help="append each replay to this JSONL file")
    parser.add_argument(
        "--load", type=Path, action="append", default=[],
        help="add the replays of this table saved in this file (repeatable)",
    )  # fmt: skip
    parser.add_argument("--export-study")
    parser.add_argument("--storage")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    if args.export_study:
        if not args.storage or not args.out:
            sys.exit("--export-study needs --storage URL and --out FILE.jsonl")
        export_study(args.export_study, args.storage, args.out)
        return
    if not args.space or not args.table:
        sys.exit("give --space FILE.yaml and --table FILE.jsonl (or --export-study)")
    space = load_space(args.space)
    table = read_table(args.table, space)
    samplers = [s.strip() for s in args.samplers.split(",") if s.strip()]
    unknown = [s for s in samplers if s not in SAMPLERS]
    if unknown:
        sys.exit(f"unknown sampler {', '.join(unknown)}; use {', '.join(SAMPLERS)}")
    metrics = [m for m in args.metrics.split(",") if m]
    if args.budget_s is not None:
        _main_budget(args, table, samplers, metrics)
        return
    grid = list(space.search.grid())
    missing = sum(1 for c in grid if c not in table)
    overrides = {
        name: value for name, *_ in _SAMPLER_FLAGS if (value := getattr(args, name)) is not None
    }
    jobs = [
        (str(args.space), str(args.table), sampler, metric, seed, overrides)
        for sampler in samplers
        for metric in metrics
        for seed in range(args.seed_from, args.seed_from + args.seeds)
    ]
    weight = ImprovementGridSampler.cost_weight if args.cost_weight is None else args.cost_weight
    started = time.perf_counter()
    missing_files = [str(p) for p in args.load if not saved_path(p).is_file()]
    if missing_files:
        sys.exit(f"--load: no such file {', '.join(missing_files)}")
    by_seed = load_replays(args.load, args.table.name)
    with multiprocessing.get_context("fork").Pool(max(1, args.jobs)) as pool:
        for sampler, metric, seed, values in pool.imap_unordered(_job, jobs, chunksize=4):
            by_seed.setdefault((sampler, metric), {})[seed] = values
            if args.save:
                save_replay(args.save, args.table.name, sampler, metric, seed, values)
    results = {key: [r for _, r in sorted(seeds.items())] for key, seeds in by_seed.items()}
    loaded = [s for s, _ in results if s not in samplers]
    samplers += sorted(set(loaded), key=lambda s: (s != DEFAULT_SAMPLER, s))
    seeds = sorted({len(v) for v in results.values()})
    print(
        f"### {args.table.name}: {len(grid)} configs in the space, {len(table)} in the table "
        f"({missing} missing: failed trials), {sum(r.status != 'ok' for r in table.values())} "
        f"failing; {'/'.join(map(str, seeds)) or 0} seeds, {time.perf_counter() - started:.0f} s "
        f"({args.seeds} seeds run here, the rest loaded); bayes's cost "
        f"weight {weight:g}"
        + "".join(f", {name} {value}" for name, value in overrides.items() if name != "cost_weight")
    )
    print(summarize(results, table, samplers, len(grid)))


def _main_budget(
    args: argparse.Namespace,
    table: dict[TrialConfig, Row],
    samplers: Sequence[str],
    metrics: Sequence[str],
) -> None:
    try:
        budgets = [float(b) for b in args.budget_s.split(",") if b.strip()]
    except ValueError:
        sys.exit(f"--budget-s {args.budget_s!r}: give seconds, comma-separated (e.g. 1800,3600)")
    if not budgets or any(b <= 0 for b in budgets):
        sys.exit(f"--budget-s {args.budget_s!r}: give one or more positive numbers of seconds")
    missing_files = [str(p) for p in args.load if not saved_path(p).is_file()]
    if missing_files:
        sys.exit(f"--load: no such file {', '.join(missing_files)}")
    jobs = [
        (str(args.space), str(args.table), sampler, metric, seed, budget, fit)
        for budget in budgets
        for sampler in samplers
        for metric in metrics
        for seed in range(args.seed_from, args.seed_from + args.seeds)
        for fit in (True, False)
    ]
    started = time.perf_counter()
    results = load_budget_replays(args.load, args.table.name)
    with multiprocessing.get_context("fork").Pool(max(1, args.jobs)) as pool:
        for key, seed, replayed in pool.imap_unordered(_budget_job, jobs, chunksize=2):
            results.setdefault(key, {})[seed] = replayed
            if args.save:
                save_budget_replay(args.save, args.table.name, key, seed, replayed)
    print(
        f"### {args.table.name}, budget mode: {args.seeds} seeds run here, "
        f"{time.perf_counter() - started:.0f} s"
    )
    print(summarize_budget(results, table, args.table.name))


if __name__ == "__main__":
    main()
