"""The API and the study page at 10,000 trials in Postgres, side by side with optuna-dashboard.

    .venv/bin/python bench/dashboard_perf.py [--trials 10000] [--requests 200] [--profile]

1. Fills a fresh Postgres database (``--db``, dropped and recreated) with one study of
   spaces/h100.yaml: ``--trials`` distinct configs of its grid, ~85% complete with metrics
   from a simple throughput model (priced by sweeper.cost, as a sweep prices them), ~10%
   failed, ~5% pruned. The same trials go to Optuna's tables in the same database, with the
   user attributes a sweep copies there, so optuna-dashboard shows the identical study.
2. Starts ``sweeper serve`` and ``optuna-dashboard`` (its default server) on that database.
3. Times sequential HTTP requests over one client per server, round-robin over all endpoints
   so a drift of the machine hits every row alike: p50/p95/max, and optuna-dashboard ÷ ours
   for the comparable pairs, with the study unchanged. Both servers cache: optuna-dashboard
   keeps a study's trials for 10 s (its rows mix hits with the refetches meanwhile), and ours
   may cache results until the study changes. So it also times, for ``--changes`` samples,
   each of our endpoints' first request after a trial has finished (written as a sweep writes
   it, to both stores), and optuna-dashboard's poll with its cache expired (10.5 s apart).
4. Opens each study page in headless chromium (a fresh context per run, alternating): ours
   with the study unchanged, ours right after a trial finished, optuna-dashboard. First
   contentful paint, when the chart data arrived, when the optimization-history chart entered
   the DOM, the first animation frame in which it is drawn, and (ours) when every chart is.
5. With ``--profile``, calls our routes and their parts in this process: median times, and
   cProfile's top functions for the slow ones.

Prints markdown for bench/RESULTS.md (about 19 minutes at 10,000 trials on a 2-core VM, most
of it waiting on optuna-dashboard). Targets (issue): p95 < 50 ms for /best and /trials, study
page first paint < 1.5 s.
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import inspect
import io
import json
import math
import os
import platform
import pstats
import random
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import optuna
import psycopg
from sqlalchemy import insert

from sweeper.cost import RunPlan, project_run
from sweeper.measurement import COLUMN_METRICS, sample_measurement
from sweeper.space import Space, TrialConfig, load_space, optuna_params
from sweeper.store import Store, TrialRow
from sweeper.sweep.run import study_fields  # what a sweep records

REPO = Path(__file__).resolve().parent.parent
VENV_BIN = Path(sys.executable).parent
SPACE = REPO / "spaces" / "h100.yaml"
CHROMIUM = "/usr/bin/chromium"
BROWSER_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
TARGET_P95_MS = 50.0
TARGET_FIRST_PAINT_S = 1.5
# optuna_dashboard._storage.get_trials keeps a study's trials this long once it has >= 500.
OPTUNA_DASHBOARD_TTL_S = 10.0

# ------------------------------------------------------------------ a realistic study

DEVICE_NAME = "NVIDIA H100 80GB HBM3"
DEVICE_MEMORY_BYTES = 80 * 10**9
# A 1.1B Llama in bf16 on one H100: ~52k tokens/s at a full step is ~35% MFU.
PEAK_TOKENS_PER_S = 52_000.0
MODEL_FLOPS_PER_TOKEN = 6 * 1.1e9
H100_BF16_FLOPS = 989e12
ATTN_SPEED = {"eager": 0.62, "sdpa": 0.9, "flash_attention_2": 1.0}
COMPILE_SPEED = {"none": 1.0, "default": 1.12, "max-autotune": 1.17}
COMPILE_SECONDS = {"none": 0.0, "default": 75.0, "max-autotune": 420.0}
FAILURES = (  # kind, message, weight
    (
        "oom",
        "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of "
        "79.19 GiB of which 1.12 GiB is free. Of the allocated memory 74.61 GiB is allocated "
        "by PyTorch, and 2.31 GiB is reserved by PyTorch but unallocated.",
        0.5,
    ),
    ("timeout", "the trial did not finish within timeout_s=1800 s (still compiling)", 0.2),
    (
        "unsupported",
        "FlashAttention2 has been toggled on, but it cannot be used due to the following "
        "error: the package flash_attn seems to be not installed.",
        0.15,
    ),
    (
        "error",
        'Traceback (most recent call last):\n  File "sweeper/trial/measure.py", line 212, '
        "in timed_window\n    loss.backward()\nRuntimeError: NCCL error in: "
        "ProcessGroupNCCL.cpp:1970, unhandled cuda error",
        0.15,
    ),
)


def dataset_stats() -> dict[str, Any]:
    """Token lengths of a log-normal corpus (median 400, sigma 0.5): 2048 covers 99.9%."""
    z = statistics.NormalDist()
    percentiles = [
        max(1, round(400 * math.exp(0.5 * z.inv_cdf(min(max(q / 100, 1e-4), 1 - 1e-4)))))
        for q in range(101)
    ]
    percentiles[100] = 2020
    return {
        "samples_measured": 20_000,
        "tokens_mean": 453.2,
        "tokens_p50": percentiles[50],
        "tokens_p90": percentiles[90],
        "tokens_p99": percentiles[99],
        "tokens_max": percentiles[100],
        "token_percentiles": percentiles,
    }


@dataclass(frozen=True, kw_only=True)
class FakeTrial:
    """One trial as both stores hold it."""

    number: int
    state: str  # ours: complete / failed / pruned
    config: TrialConfig
    started_at: datetime
    finished_at: datetime
    wall_s: float
    columns: dict[str, Any] = field(default_factory=dict)  # our metric columns
    user_attrs: dict[str, Any] = field(default_factory=dict)  # Optuna's


def make_trials(space: Space, n_trials: int, seed: int) -> list[FakeTrial]:
    """``n_trials`` distinct configs of the space (the baseline first), measured or failed."""
    rng = random.Random(seed)
    baseline = space.baseline.as_config(space.search) if space.baseline else None
    grid = [c for c in space.search.grid() if c != baseline]
    rng.shuffle(grid)
    configs = ([baseline] if baseline else []) + grid
    while len(configs) < n_trials:  # a grid smaller than asked: repeat configs
        configs += grid
    stats = dataset_stats()
    plan = RunPlan(
        samples=space.workload.samples,
        epochs=space.workload.epochs,
        usd_per_hour=space.hardware.usd_per_hour,
        save_steps=space.workload.checkpoint.save_steps,
        tokens_per_sample=stats["tokens_mean"] + 1,
    )
    clock = datetime(2026, 11, 1, tzinfo=UTC)
    trials = []
    for number, config in enumerate(configs[:n_trials]):
        roll = rng.random()
        state = "complete" if roll < 0.85 or number == 0 else "failed" if roll < 0.95 else "pruned"
        if state == "complete":
            trial = _complete(number, config, plan, stats, clock, rng)
        elif state == "failed":
            kind, message, _ = rng.choices(FAILURES, weights=[f[2] for f in FAILURES])[0]
            wall_s = rng.uniform(20, 1800 if kind == "timeout" else 120)
            trial = FakeTrial(
                number=number,
                state=state,
                config=config,
                started_at=clock,
                finished_at=clock + timedelta(seconds=wall_s),
                wall_s=wall_s,
                columns={
                    "failure_kind": kind,
                    "failure_message": message,
                    "measurement": {"traceback": message, "log_tail": message[-400:]},
                },
                user_attrs={"failure_kind": kind, "failure_message": message[:2000]},
            )
        else:
            trial = FakeTrial(
                number=number,
                state=state,
                config=config,
                started_at=clock,
                finished_at=clock,
                wall_s=0.0,
                user_attrs={"skipped": "already measured"},
            )
        trials.append(trial)
        clock = trial.finished_at + timedelta(seconds=rng.uniform(1, 5))
    return trials


def _complete(
    number: int,
    config: TrialConfig,
    plan: RunPlan,
    stats: dict[str, Any],
    clock: datetime,
    rng: random.Random,
) -> FakeTrial:
    batch, seq = config.per_device_batch_size, config.max_seq_length
    step_tokens = batch * seq
    data_wait = (0.18 if config.num_workers == 0 else 0.04 / config.num_workers) * rng.uniform(
        0.7, 1.3
    )
    padded_tokens_per_s = (
        PEAK_TOKENS_PER_S
        * ATTN_SPEED[config.attn_implementation]
        * COMPILE_SPEED[config.compile_mode]
        * step_tokens
        / (step_tokens + 3000)  # small steps leave the GPU idle between kernels
        * (1 - data_wait)
        * rng.lognormvariate(0, 0.04)
    )
    if config.packing:
        tokens_per_s = padded_tokens_per_s * 0.995
        samples_per_s = tokens_per_s / (plan.tokens_per_sample or 1.0)
    else:
        samples_per_s = padded_tokens_per_s / seq
        kept = statistics.fmean(min(p + 1, seq) for p in stats["token_percentiles"])
        tokens_per_s = samples_per_s * kept
    it_per_s = samples_per_s / config.effective_batch
    compile_s = COMPILE_SECONDS[config.compile_mode] * rng.uniform(0.8, 1.2)
    startup_s, checkpoint_save_s = rng.uniform(25, 40), rng.uniform(60, 90)
    projection = project_run(
        plan,
        samples_per_s=samples_per_s,
        it_per_s=it_per_s,
        tokens_per_s=tokens_per_s,
        packing=config.packing,
        startup_s=startup_s,
        compile_s=compile_s,
        checkpoint_save_s=checkpoint_save_s,
    )
    activation = 2.4e5 + (1024 * seq if config.attn_implementation == "eager" else 0)
    peak_memory = min(int(18e9 + step_tokens * activation), int(0.97 * DEVICE_MEMORY_BYTES))
    step_s = config.effective_batch / samples_per_s
    step_times = [round(step_s * rng.lognormvariate(0, 0.02), 5) for _ in range(40)]
    wall_s = 30 + compile_s + sum(step_times) + rng.uniform(5, 20)
    measurement = sample_measurement(
        samples_per_s=samples_per_s,
        tokens_per_s=tokens_per_s,
        it_per_s=it_per_s,
        rows_per_s=padded_tokens_per_s / seq,
        padded_tokens_per_s=padded_tokens_per_s,
        padding_share=max(0.0, 1 - tokens_per_s / padded_tokens_per_s),
        data_wait_share=data_wait,
        mfu=tokens_per_s * MODEL_FLOPS_PER_TOKEN / H100_BF16_FLOPS,
        peak_memory_bytes=peak_memory,
        device_memory_bytes=DEVICE_MEMORY_BYTES,
        step_time_p50_s=statistics.median(step_times),
        step_time_p90_s=statistics.quantiles(step_times, n=10)[-1],
        step_time_mean_s=statistics.fmean(step_times),
        measured_steps=len(step_times),
        window_s=sum(step_times),
        step_times_s=step_times,
        startup_s=startup_s,
        compile_s=compile_s,
        checkpoint_save_s=checkpoint_save_s,
        loss_first=10.45 + rng.uniform(-0.05, 0.05),
        loss_last=9.6 + rng.uniform(-0.2, 0.2),
        effective_batch=config.effective_batch,
        packing=config.packing,
        env={"device_name": DEVICE_NAME},
    )
    return FakeTrial(
        number=number,
        state="complete",
        config=config,
        started_at=clock,
        finished_at=clock + timedelta(seconds=wall_s),
        wall_s=wall_s,
        columns=measurement.columns()
        | {
            "hours_per_run": projection.hours_per_run,
            "cost_per_run_usd": projection.cost_per_run_usd,
            "projection": projection.breakdown(),
            "measurement": measurement.model_dump(),
        },
        user_attrs=measurement.optuna_attrs()
        | {
            "hours_per_run": projection.hours_per_run,
            "effective_batch": config.effective_batch,
        },
    )


# ------------------------------------------------------------------ filling both stores


def recreate_database(admin_url: str, name: str) -> None:
    with psycopg.connect(admin_url, autocommit=True) as connection:
        connection.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        connection.execute(f'CREATE DATABASE "{name}"')


def drop_database(admin_url: str, name: str) -> None:
    with psycopg.connect(admin_url, autocommit=True) as connection:
        connection.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def analyze(database_url: str) -> None:
    """Planner statistics, as autovacuum would have gathered while a sweep wrote its trials."""
    with psycopg.connect(database_url, autocommit=True) as connection:
        connection.execute("ANALYZE")


def fill_ours(url: str, space: Space, trials: list[FakeTrial]) -> None:
    """Our two tables, trials in bulk (the per-trial Store API would take minutes)."""
    store = Store(url)
    try:
        store.migrate()
        study = store.upsert_study(
            space.study,
            state="finished",
            **study_fields(
                space,
                n_trials=len(trials),
                space_text=SPACE.read_text(),
                space_path="spaces/h100.yaml",
            ),
            dataset_stats=dataset_stats(),
            sweep_seconds=sum(t.wall_s for t in trials),
        )
        rows = [
            {
                "study_id": study.id,
                "number": t.number,
                "state": t.state,
                "config": t.config.model_dump(),
                "started_at": t.started_at,
                "finished_at": t.finished_at,
                "wall_s": t.wall_s,
            }
            | {column: t.columns.get(column) for column in _TRIAL_COLUMNS}
            for t in trials
        ]
        with store.session() as session:
            for start in range(0, len(rows), 1000):
                session.execute(insert(TrialRow), rows[start : start + 1000])
    finally:
        store.dispose()


_TRIAL_COLUMNS = (
    *(m.name for m in COLUMN_METRICS),
    "projection",
    "failure_kind",
    "failure_message",
    "measurement",
)
_OPTUNA_STATES = {
    "complete": optuna.trial.TrialState.COMPLETE,
    "failed": optuna.trial.TrialState.FAIL,
    "pruned": optuna.trial.TrialState.PRUNED,
}


def fill_optuna(url: str, space: Space, trials: list[FakeTrial], reference: int = 50) -> None:
    """Optuna's tables: the same study and trials, as a sweep tells them (objective $/run).

    ``study.add_trials`` makes ~50 queries per trial (about 0.1-0.2 s here, so half an hour for
    10,000): it adds the first ``reference`` trials, the rest are inserted in bulk through
    Optuna's own table models, row for row what add_trials writes, and every trial is then
    read back through Optuna's storage API and compared.
    """
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    storage = optuna.storages.RDBStorage(url)
    try:
        study = optuna.create_study(study_name=space.study, storage=storage, direction="minimize")
        frozen = [to_frozen(t, space) for t in trials]
        study.add_trials(frozen[:reference])
        study_id = storage.get_study_id_from_name(space.study)
        _bulk_add_trials(storage, study_id, frozen[reference:])
        _check_optuna_trials(storage, study_id, frozen)
    finally:
        storage.engine.dispose()


def to_frozen(t: FakeTrial, space: Space) -> optuna.trial.FrozenTrial:
    """The trial as the sweep tells it to Optuna: $/run as the value, the measurement as
    user attributes, the config as categorical params."""
    params = optuna_params(t.config, space.search)
    return optuna.trial.FrozenTrial(
        number=t.number,
        state=_OPTUNA_STATES[t.state],
        value=t.columns["cost_per_run_usd"] if t.state == "complete" else None,
        datetime_start=t.started_at,
        datetime_complete=t.finished_at,
        params=params,
        distributions={
            knob: optuna.distributions.CategoricalDistribution(getattr(space.search, knob))
            for knob in params
        },
        user_attrs=t.user_attrs,
        system_attrs={},
        intermediate_values={},
        trial_id=0,  # assigned by the storage
    )


class LiveWriter:
    """Finishes one more trial at a time, in both stores, as a running sweep does."""

    def __init__(self, url: str, space: Space, trials: list[FakeTrial]) -> None:
        self.space, self.pending = space, list(trials)
        self.store = Store(url)
        self.storage = optuna.storages.RDBStorage(url)
        self.study = optuna.load_study(study_name=space.study, storage=self.storage)

    def finish_one(self) -> None:
        t = self.pending.pop(0)
        self.store.start_trial(self.space.study, t.number, t.config.model_dump())
        self.study.add_trial(to_frozen(t, self.space))
        self.store.finish_trial(
            self.space.study,
            t.number,
            t.state,
            wall_s=t.wall_s,
            **{key: value for key, value in t.columns.items() if value is not None},
        )

    def close(self) -> None:
        self.store.dispose()
        self.storage.engine.dispose()


def live_trials(space: Space, n_trials: int, count: int, seed: int) -> list[FakeTrial]:
    """``count`` completed trials numbered from ``n_trials`` on, with configs not yet used."""
    extra = make_trials(space, n_trials + 4 * count + 10, seed)[n_trials:]
    done = [t for t in extra if t.state == "complete"][:count]
    return [replace(t, number=n_trials + i) for i, t in enumerate(done)]


def _bulk_add_trials(
    storage: optuna.storages.RDBStorage, study_id: int, frozen: list[optuna.trial.FrozenTrial]
) -> None:
    """What RDBStorage._get_prepared_new_trial writes per trial, for many trials at once."""
    from optuna.storages._rdb import models as rdb

    trial_table = rdb.TrialModel.__table__
    with storage.engine.begin() as connection:
        for start in range(0, len(frozen), 1000):
            chunk = frozen[start : start + 1000]
            ids = connection.execute(
                insert(trial_table).returning(trial_table.c.trial_id, sort_by_parameter_order=True),
                [
                    {
                        "number": t.number,
                        "study_id": study_id,
                        "state": t.state,
                        "datetime_start": _naive_utc(t.datetime_start),
                        "datetime_complete": _naive_utc(t.datetime_complete),
                    }
                    for t in chunk
                ],
            ).scalars()
            params, values, attrs = [], [], []
            for trial_id, t in zip(ids, chunk, strict=True):
                for name, value in t.params.items():
                    distribution = t.distributions[name]
                    params.append(
                        {
                            "trial_id": trial_id,
                            "param_name": name,
                            "param_value": distribution.to_internal_repr(value),
                            "distribution_json": optuna.distributions.distribution_to_json(
                                distribution
                            ),
                        }
                    )
                if t.value is not None:
                    stored, value_type = rdb.TrialValueModel.value_to_stored_repr(t.value)
                    values.append(
                        {
                            "trial_id": trial_id,
                            "objective": 0,
                            "value": stored,
                            "value_type": value_type,
                        }
                    )
                attrs += [
                    {"trial_id": trial_id, "key": key, "value_json": json.dumps(value)}
                    for key, value in t.user_attrs.items()
                ]
            connection.execute(insert(rdb.TrialParamModel.__table__), params)
            if values:
                connection.execute(insert(rdb.TrialValueModel.__table__), values)
            if attrs:
                connection.execute(insert(rdb.TrialUserAttributeModel.__table__), attrs)


def _naive_utc(moment: datetime | None) -> datetime | None:
    """Optuna's RDB columns hold naive UTC (optuna.storages._rdb.models.TrialModel)."""
    return None if moment is None else moment.astimezone(UTC).replace(tzinfo=None)


def _check_optuna_trials(
    storage: optuna.storages.RDBStorage, study_id: int, frozen: list[optuna.trial.FrozenTrial]
) -> None:
    stored = storage.get_all_trials(study_id, deepcopy=False)
    if len(stored) != len(frozen):
        raise RuntimeError(f"Optuna holds {len(stored)} trials, {len(frozen)} were written")
    for got, want in zip(sorted(stored, key=lambda t: t.number), frozen, strict=True):
        fields = ("number", "state", "value", "params", "distributions", "user_attrs")
        for name in fields:
            if getattr(got, name) != getattr(want, name):
                raise RuntimeError(
                    f"Optuna trial {want.number}: {name} is {getattr(got, name)!r}, "
                    f"{getattr(want, name)!r} was written"
                )
        local = want.datetime_start.astimezone().replace(tzinfo=None)
        if got.datetime_start != local:
            raise RuntimeError(f"Optuna trial {want.number}: start {got.datetime_start}")


# ------------------------------------------------------------------ servers


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextmanager
def server(command: list[str], ready_url: str, log: Path) -> Iterator[subprocess.Popen[bytes]]:
    """A server subprocess, yielded once ``ready_url`` answers 200; terminated afterwards."""
    with log.open("wb") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, cwd=REPO)
    try:
        deadline = time.monotonic() + 90
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"{command[0]} exited: {log.read_text()[-2000:]}")
            try:
                if httpx.get(ready_url, timeout=5).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"{command[0]} did not answer within 90 s")
            time.sleep(0.2)
        yield process
    finally:
        process.terminate()
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


# ------------------------------------------------------------------ HTTP timings


@dataclass
class Endpoint:
    side: str  # "ours" or "optuna-dashboard"
    label: str
    path: str
    heavy: bool = False  # whole-study responses: fewer requests
    times_ms: list[float] = field(default_factory=list)  # the study unchanged
    after_change_ms: list[float] = field(default_factory=list)  # first request after a trial
    first_ms: float | None = None  # the first request after the server started
    size_bytes: int = 0  # decoded body


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100)."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)]


def time_get(client: httpx.Client, path: str) -> tuple[float, int]:
    started = time.perf_counter()
    response = client.get(path)
    elapsed = (time.perf_counter() - started) * 1000
    if response.status_code != 200:
        raise RuntimeError(f"GET {path}: HTTP {response.status_code}: {response.text[:300]}")
    return elapsed, len(response.content)


def measure_endpoints(
    clients: dict[str, httpx.Client], endpoints: list[Endpoint], requests: int, heavy: int
) -> None:
    """The study unchanged: first request of each, 5 warm-ups, then round-robin rounds."""
    for endpoint in endpoints:
        endpoint.first_ms, endpoint.size_bytes = time_get(clients[endpoint.side], endpoint.path)
    for _ in range(5):
        for endpoint in endpoints:
            time_get(clients[endpoint.side], endpoint.path)
    for round_number in range(requests):
        for endpoint in endpoints:
            if endpoint.heavy and round_number >= heavy:
                continue
            elapsed, _ = time_get(clients[endpoint.side], endpoint.path)
            endpoint.times_ms.append(elapsed)


def measure_after_change(
    client: httpx.Client, endpoints: list[Endpoint], writer: LiveWriter, samples: int
) -> None:
    """Each of our endpoints' first request after a trial finished (a cache, if any, misses)."""
    for _ in range(samples):
        for endpoint in endpoints:
            writer.finish_one()
            endpoint.after_change_ms.append(time_get(client, endpoint.path)[0])


def measure_cold(client: httpx.Client, path: str, samples: int) -> list[float]:
    """optuna-dashboard with its trials cache expired: one request per 10.5 s."""
    times = []
    for _ in range(samples):
        time.sleep(OPTUNA_DASHBOARD_TTL_S + 0.5)
        times.append(time_get(client, path)[0])
    return times


# ------------------------------------------------------------------ first paint

# Records the first animation frame at which the chart holds points, in page time.
CHART_READY = """(id) => {
  const el = document.getElementById(id);
  const ready = !!(el && el.querySelector('.main-svg') && el.data
    && el.data.some((trace) => (trace.x || trace.y || []).length > 0));
  if (ready && window.__chartAt === undefined) window.__chartAt = performance.now();
  return ready;
}"""
# Installed before the page's own scripts: when the chart's SVG first enters the DOM. Mutation
# callbacks run between promise steps, so this fires even while drawing blocks every frame.
CHART_BUILT = """(() => {
  const id = %s;
  new MutationObserver((_, observer) => {
    const el = document.getElementById(id);
    if (el && el.querySelector('.main-svg') && el.data && el.data.length) {
      window.__builtAt = performance.now();
      observer.disconnect();
    }
  }).observe(document, {childList: true, subtree: true});
})();"""
PAGE_TIMINGS = """(dataPart) => {
  const nav = performance.getEntriesByType('navigation')[0];
  const fcp = performance.getEntriesByName('first-contentful-paint')[0];
  const data = performance.getEntriesByType('resource').find((e) => e.name.includes(dataPart));
  return {fcp: fcp ? fcp.startTime : null, ttfb: nav.responseStart,
          dcl: nav.domContentLoadedEventEnd, html_bytes: nav.decodedBodySize,
          chart: window.__chartAt, built: window.__builtAt,
          all: document.body.dataset.chartsDrawn
            ? Number(document.body.dataset.chartsDrawn) - performance.timeOrigin : null,
          data_start: data ? data.startTime : null, data_end: data ? data.responseEnd : null,
          data_bytes: data ? data.decodedBodySize : null};
}"""


@dataclass
class PageRuns:
    label: str
    url: str
    chart_id: str
    data_part: str  # a part of the URL the page fetches its chart data from
    before: Callable[[], None] | None = None  # run before each load, e.g. finish a trial
    marks_all_drawn: bool = False  # sets body[data-charts-drawn] once every chart is drawn
    runs: list[dict[str, float]] = field(default_factory=list)


def measure_pages(pages: list[PageRuns], runs: int) -> None:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=BROWSER_ARGS)
        try:
            for _ in range(runs):
                for page_runs in pages:
                    if page_runs.before is not None:
                        page_runs.before()
                    # a fresh context: empty browser cache, as a first visit
                    context = browser.new_context(viewport={"width": 1280, "height": 900})
                    context.add_init_script(CHART_BUILT % json.dumps(page_runs.chart_id))
                    try:
                        page = context.new_page()
                        page.goto(page_runs.url, wait_until="commit", timeout=120_000)
                        page.wait_for_function(
                            CHART_READY, arg=page_runs.chart_id, polling="raf", timeout=180_000
                        )
                        page.wait_for_function(
                            "() => performance.getEntriesByName('first-contentful-paint')"
                            ".length > 0",
                            timeout=30_000,
                        )
                        if page_runs.marks_all_drawn:
                            page.wait_for_function(
                                "() => !!document.body.dataset.chartsDrawn", timeout=180_000
                            )
                        page_runs.runs.append(page.evaluate(PAGE_TIMINGS, page_runs.data_part))
                    finally:
                        context.close()
        finally:
            browser.close()


# ------------------------------------------------------------------ our routes, in-process


@dataclass
class Timed:
    label: str
    median_ms: float = math.nan
    profile: str | None = None  # cProfile's top functions, for the routes worth reading
    error: str | None = None


def profile_routes(url: str, study: str, n_trials: int) -> list[Timed]:
    """Our routes and their parts called in this process: median of 5 calls each, and
    cProfile's top functions for the slow routes.

    Routes are found by path and called with their dependencies by parameter name, so this
    keeps working while their signatures change. Where the app caches results, each route is
    timed twice: with a warm cache (the study unchanged) and with an empty one (after a
    change).
    """
    from fastapi import Response
    from starlette.requests import Request

    from api.app import create_app
    from api.cache import EncodedJSON
    from api.routes.pages import study_figures
    from sweeper import recommend

    app = create_app(url)
    store: Store = app.state.store
    endpoints = _route_endpoints(app.routes)
    cache = getattr(app.state, "cache", None)

    def page_request() -> Request:
        path = f"/studies/{quote(study, safe='')}"
        return Request(
            {
                "type": "http",
                "app": app,
                "method": "GET",
                "path": path,
                "raw_path": path.encode(),
                "query_string": b"",
                "headers": [(b"accept-encoding", b"gzip")],
                "router": app.router,
                "scheme": "http",
                "server": ("127.0.0.1", 80),
            }
        )

    def route(path: str, cold: bool = False, **query: Any) -> Callable[[], Any]:
        endpoint = endpoints[path]

        def call() -> Any:
            available = {
                "name": study,
                "store": store,
                "request": page_request(),
                "response": Response(),
                "constraints": recommend.Constraints(),
                "cache": type(cache)() if cold and cache is not None else cache,
            }
            arguments: dict[str, Any] = {}
            for parameter in inspect.signature(endpoint).parameters.values():
                if parameter.name in query:
                    arguments[parameter.name] = query[parameter.name]
                elif parameter.name in available:
                    arguments[parameter.name] = available[parameter.name]
                elif parameter.default is inspect.Parameter.empty:
                    raise TypeError(f"{endpoint.__name__} needs {parameter.name!r}")
                else:
                    default = parameter.default
                    arguments[parameter.name] = getattr(default, "default", default)
            return endpoint(**arguments)

        return call

    def best_without_gc() -> Any:
        gc.disable()
        try:
            return recommend.best(store, study)
        finally:
            gc.enable()

    complete = store.trial_metrics(study, states=["complete"])
    facts = recommend.StudyFacts.of(store.get_study(study))
    best, trials = "/api/studies/{name}/best", "/api/studies/{name}/trials"
    page, charts = "/studies/{name}", "/studies/{name}/figures.json"
    importance_chart = "/studies/{name}/importance-figure.json"
    hit = " (cache warm)" if cache is not None else ""
    miss = " (cache empty)" if cache is not None else ""
    calls: list[tuple[str, Callable[[], Any], bool]] = [
        (f"route GET /best{miss}", route(best, cold=True), True),
        (
            "  part: StudyFacts.of(store.get_study()) (parses space_yaml)",
            lambda: recommend.StudyFacts.of(store.get_study(study)),
            False,
        ),
        (
            f"  part: store.trial_metrics(states=[complete]) ({len(complete):,} plain rows)",
            lambda: store.trial_metrics(study, states=["complete"]),
            False,
        ),
        (
            "  for scale: store.list_trials(states=[complete]) (the same trials as ORM rows)",
            lambda: store.list_trials(study, states=["complete"]),
            False,
        ),
        (
            "  part: recommend.choose() on those rows (pure Python)",
            lambda: recommend.choose(facts, complete),
            False,
        ),
        ("  recommend.best() with the garbage collector off", best_without_gc, False),
        (
            "  for scale: the cheapest complete row in SQL (one indexed query)",
            lambda: cheapest_in_sql(store, study),
            False,
        ),
        ("route GET /trials (default page)", route(trials), True),
        (
            "  part: store.list_trials(limit=100)",
            lambda: store.list_trials(study, limit=100),
            False,
        ),
        ("  part: store.count_trials() (X-Total-Count)", lambda: store.count_trials(study), False),
        ("route GET /trials?limit=100", route(trials, limit=100), False),
        (f"route GET /trials?after={n_trials - 5}", route(trials, after=n_trials - 5), False),
        (f"route GET /studies/{{name}}{miss}", route(page, cold=True), True),
        (f"route GET /studies/{{name}}/figures.json{miss}", route(charts, cold=True), True),
        ("  part: store.trial_metrics() (every trial)", lambda: store.trial_metrics(study), False),
        (
            f"route GET /studies/{{name}}/importance-figure.json{miss}",
            route(importance_chart, cold=True),
            True,
        ),
    ]
    if cache is not None:
        calls += [
            (f"route GET /best{hit}", route(best), False),
            (f"route GET /studies/{{name}}{hit}", route(page), False),
            (f"route GET /studies/{{name}}/figures.json{hit}", route(charts), False),
        ]
        version = getattr(store, "version", None)
        if version is not None:
            calls.append(("  part: store.version() (the cache key)", lambda: version(study), False))
        charts_content = study_figures(study, store)
        calls.append(
            (
                "  part: EncodedJSON.of(the charts) (JSON + gzip, once per study version)",
                lambda: EncodedJSON.of(charts_content),
                False,
            )
        )
    results = []
    for label, call, profile in calls:
        timed = Timed(label)
        results.append(timed)
        try:
            call()  # warm: connection pool, imports, caches
            plain = []
            for _ in range(5):
                started = time.perf_counter()
                call()
                plain.append(time.perf_counter() - started)
            timed.median_ms = statistics.median(plain) * 1000
            if profile:
                profiler = cProfile.Profile()
                profiler.enable()
                call()
                profiler.disable()
                text = io.StringIO()
                stats = pstats.Stats(profiler, stream=text)
                stats.sort_stats("cumulative").print_stats(20)
                stats.sort_stats("tottime").print_stats(6)
                timed.profile = text.getvalue()
        except Exception as e:  # the routes change under this benchmark: say so, go on
            timed.error = repr(e)[:300]
    store.dispose()
    return results


def _get_routes(routes: list[Any]) -> dict[str, Any]:
    """Path → GET route, also inside included routers (FastAPI wraps them lazily)."""
    found: dict[str, Any] = {}
    for route in routes:
        if hasattr(route, "endpoint") and "GET" in (getattr(route, "methods", None) or ()):
            found.setdefault(route.path, route)
        inner = getattr(route, "original_router", None)
        if inner is not None:
            found.update(_get_routes(inner.routes))
    return found


def _route_endpoints(routes: list[Any]) -> dict[str, Callable[..., Any]]:
    return {path: route.endpoint for path, route in _get_routes(routes).items()}


def cheapest_in_sql(store: Store, study: str) -> TrialRow | None:
    """One row through the (study_id, state, cost_per_run_usd) index: what /best could read."""
    from sqlalchemy import select

    from sweeper.store import StudyRow

    with store.session() as session:
        study_id = session.scalar(select(StudyRow.id).where(StudyRow.name == study))
        return session.scalar(
            select(TrialRow)
            .where(TrialRow.study_id == study_id, TrialRow.state == "complete")
            .order_by(TrialRow.cost_per_run_usd, TrialRow.number)
            .limit(1)
        )


# ------------------------------------------------------------------ the run


@dataclass
class Report:
    endpoints: list[Endpoint]
    pairs: list[tuple[str, Endpoint | None, Endpoint | None]]
    targeted: list[Endpoint]  # ours, held to the p95 target
    cold_theirs: tuple[str, list[float]] | None
    pages: list[PageRuns]


def run_servers(
    args: argparse.Namespace, url: str, space: Space, n_trials: int, writer: LiveWriter
) -> Report:
    ours_port, theirs_port = free_port(), free_port()
    ours_base, theirs_base = f"http://127.0.0.1:{ours_port}", f"http://127.0.0.1:{theirs_port}"
    logs = Path(tempfile.mkdtemp(prefix="dashboard_perf_"))
    ours_cmd = [str(VENV_BIN / "sweeper"), "serve", "--storage", url, "--port", str(ours_port)]
    theirs_cmd = [
        str(VENV_BIN / "optuna-dashboard"),
        url,
        "--host",
        "127.0.0.1",
        "--port",
        str(theirs_port),
        "--quiet",
    ]
    name = quote(space.study, safe="")
    with (
        server(ours_cmd, f"{ours_base}/api/studies", logs / "ours.log"),
        server(theirs_cmd, f"{theirs_base}/api/meta", logs / "optuna-dashboard.log"),
        httpx.Client(base_url=ours_base, timeout=180) as ours,
        httpx.Client(base_url=theirs_base, timeout=180) as theirs,
    ):
        summaries = theirs.get("/api/studies").json()["study_summaries"]
        study_id = next(s["study_id"] for s in summaries if s["study_name"] == space.study)
        poll_after = n_trials - 5

        def our(label: str, path: str, heavy: bool = False) -> Endpoint:
            return Endpoint("ours", label, f"/api/studies/{name}{path}", heavy)

        def their(after: int, heavy: bool = False) -> Endpoint:
            path = f"/api/studies/{study_id}?after={after}"
            return Endpoint("optuna-dashboard", path, path, heavy)

        best = our("/best", "/best")
        page100 = our("/trials?limit=100", "/trials?limit=100")
        page500 = our("/trials (default page)", "/trials")
        poll = our(f"/trials?after={poll_after}", f"/trials?after={poll_after}")
        detail = our("/api/studies/{name}", "")
        everything = our("/trials?limit=10000", "/trials?limit=10000", True)
        listing = Endpoint("ours", "/api/studies", "/api/studies")
        page_html = Endpoint("ours", "/studies/{name} (HTML)", f"/studies/{name}", True)
        charts = Endpoint(
            "ours", "/studies/{name}/figures.json", f"/studies/{name}/figures.json", True
        )
        importance_chart = Endpoint(
            "ours",
            "/studies/{name}/importance-figure.json",
            f"/studies/{name}/importance-figure.json",
            True,
        )
        their_listing = Endpoint("optuna-dashboard", "/api/studies", "/api/studies")
        their_best, their_poll, their_all = their(n_trials), their(poll_after), their(0, True)
        their_page = Endpoint(
            "optuna-dashboard",
            f"/dashboard/studies/{study_id} (HTML)",
            f"/dashboard/studies/{study_id}",
        )
        ours_endpoints = [best, page100, page500, poll, listing, detail, everything]
        ours_endpoints += [page_html, charts, importance_chart]
        theirs_endpoints = [their_listing, their_best, their_poll, their_all, their_page]
        measure_endpoints(
            {"ours": ours, "optuna-dashboard": theirs},
            ours_endpoints + theirs_endpoints,
            args.requests,
            args.heavy_requests,
        )
        cold = None
        if args.changes:
            measure_after_change(ours, ours_endpoints, writer, args.changes)
            cold = (their_poll.label, measure_cold(theirs, their_poll.path, args.changes))
        pages = [
            PageRuns(
                "ours, study unchanged",
                f"{ours_base}/studies/{name}",
                "chart-history",
                "figures.json",
                marks_all_drawn=True,
            ),
            PageRuns(
                "ours, a trial just finished",
                f"{ours_base}/studies/{name}",
                "chart-history",
                "figures.json",
                before=writer.finish_one if writer.pending else None,
                marks_all_drawn=True,
            ),
            PageRuns(
                "optuna-dashboard",
                f"{theirs_base}/dashboard/studies/{study_id}",
                "plot-history",
                f"/api/studies/{study_id}?after=0",
            ),
        ]
        measure_pages(pages, args.paint_runs)
    pairs = [
        ("study list", listing, their_listing),
        ("best trial (theirs: study detail with no trials)", best, their_best),
        ("live poll: the last 5 trials", poll, their_poll),
        ("whole study: every trial", everything, their_all),
        ("study page HTML (theirs: a static shell)", page_html, their_page),
        ("the data the study page draws its charts from", charts, their_all),
        ("the importance chart (its own request, drawn last)", importance_chart, None),
        ("a page of 100 trials", page100, None),
        ("the default page (no parameters)", page500, None),
        ("one study's summary and space", detail, None),
    ]
    return Report(
        ours_endpoints + theirs_endpoints, pairs, [best, page100, page500, poll], cold, pages
    )


# ------------------------------------------------------------------ report


def fmt_ms(value: float) -> str:
    return f"{value:,.1f}" if value < 100 else f"{value:,.0f}"


def _spread(times: list[float]) -> str:
    return (
        f"{fmt_ms(percentile(times, 50))} / {fmt_ms(percentile(times, 95))} / {fmt_ms(max(times))}"
    )


def print_http_table(pairs: list[tuple[str, Endpoint | None, Endpoint | None]]) -> None:
    print(
        "| what | ours: endpoint | ours p50 / p95 / max ms | optuna-dashboard: endpoint "
        "| theirs p50 / p95 / max ms | theirs ÷ ours (p50, p95) |"
    )
    print("|---|---|---:|---|---:|---:|")
    for label, ours, theirs in pairs:
        cells = [label]
        for endpoint in (ours, theirs):
            if endpoint is None:
                cells += ["—", "—"]
                continue
            cells.append(
                f"`{endpoint.label}` ({len(endpoint.times_ms)} req, "
                f"{endpoint.size_bytes / 1024:,.0f} KiB)"
            )
            cells.append(_spread(endpoint.times_ms))
        if ours is not None and theirs is not None:
            ratio50 = percentile(theirs.times_ms, 50) / percentile(ours.times_ms, 50)
            ratio95 = percentile(theirs.times_ms, 95) / percentile(ours.times_ms, 95)
            cells.append(f"{ratio50:.2f}×, {ratio95:.2f}×")
        else:
            cells.append("—")
        print("| " + " | ".join(cells) + " |")


def print_after_change(endpoints: list[Endpoint], cold: tuple[str, list[float]] | None) -> None:
    ours = [e for e in endpoints if e.after_change_ms]
    if not ours:
        return
    print(
        f"\n#### The first request after a trial finished ({len(ours[0].after_change_ms)} "
        "samples each; a trial was written to both stores before each request)\n"
    )
    print("| ours: endpoint | median / max ms | study unchanged: median ms |")
    print("|---|---:|---:|")
    for e in ours:
        times = e.after_change_ms
        print(
            f"| `{e.label}` | {fmt_ms(statistics.median(times))} / {fmt_ms(max(times))} "
            f"| {fmt_ms(percentile(e.times_ms, 50))} |"
        )
    if cold:
        print(
            f"\noptuna-dashboard `{cold[0]}` with its trials cache expired (requests "
            f"{OPTUNA_DASHBOARD_TTL_S + 0.5:g} s apart; it shows trials up to "
            f"{OPTUNA_DASHBOARD_TTL_S:g} s old otherwise): "
            + ", ".join(fmt_ms(v) for v in cold[1])
            + " ms."
        )


def summarize_pages(pages: list[PageRuns]) -> None:
    print(
        "| page | runs | first contentful paint median / max s | history chart drawn "
        "median / max s | TTFB median s | chart data requested → arrived, median s "
        "| history chart in the DOM, median s | every chart drawn, median s "
        "| HTML / chart data KiB |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for p in pages:

        def seconds(key: str, runs: list[dict[str, float]] = p.runs) -> list[float]:
            return [r[key] / 1000 for r in runs if r.get(key) is not None]

        fcp, chart, ttfb, built, every = (
            seconds(k) for k in ("fcp", "chart", "ttfb", "built", "all")
        )
        start, end = seconds("data_start"), seconds("data_end")
        data = f"{statistics.median(start):.2f} → {statistics.median(end):.2f}" if end else "—"
        data_kib = (p.runs[0].get("data_bytes") or 0) / 1024
        print(
            f"| {p.label}: `{p.url.split('/', 3)[3]}` | {len(p.runs)} "
            f"| {statistics.median(fcp):.2f} / {max(fcp):.2f} "
            f"| {statistics.median(chart):.2f} / {max(chart):.2f} "
            f"| {statistics.median(ttfb):.2f} | {data} "
            f"| {f'{statistics.median(built):.2f}' if built else '—'} "
            f"| {f'{statistics.median(every):.2f}' if every else '—'} "
            f"| {p.runs[0]['html_bytes'] / 1024:,.0f} / {data_kib:,.0f} |"
        )


def _median_ratio(theirs: PageRuns, ours: PageRuns, key: str) -> float:
    return statistics.median(r[key] for r in theirs.runs) / statistics.median(
        r[key] for r in ours.runs
    )


def print_report(
    args: argparse.Namespace,
    report: Report,
    profiles: list[Timed],
    fill: dict[str, Any],
    whole_s: float,
    load_before: tuple[float, float, float],
    load_after: tuple[float, float, float],
) -> None:
    print(
        f"### Dashboard and API at {args.trials:,} trials (Postgres), "
        f"{datetime.now(UTC):%Y-%m-%d}\n"
    )
    flags = f" --trials {args.trials} --requests {args.requests}"
    flags += " --profile" if args.profile else ""
    print(
        f"Command: `.venv/bin/python bench/dashboard_perf.py{flags}`; whole run {whole_s:.0f} s "
        f"on {platform.machine()} ({os.cpu_count()} cores), Python {platform.python_version()}, "
        f"PostgreSQL on 127.0.0.1, optuna {optuna.__version__}, optuna-dashboard "
        f"{_version('optuna-dashboard')} (its default server: "
        f"{'gunicorn' if _has('gunicorn') else 'wsgiref'}), ours `sweeper serve` (uvicorn, "
        f"1 worker), code at {_revision()}. Load average (1/5/15 min) {_load(load_before)} "
        f"before, {_load(load_after)} after.\n"
    )
    counts = fill["counts"]
    print(
        f"Fill: {counts['complete']:,} complete, {counts['failed']:,} failed, "
        f"{counts['pruned']:,} pruned; our tables in {fill['ours_s']:.1f} s (bulk insert), "
        f"Optuna's in {fill['optuna_s']:.1f} s (add_trials, then bulk through Optuna's "
        "models, read back and compared).\n"
    )
    print(
        f"#### HTTP with the study unchanged: sequential, one keep-alive client per server "
        f"({args.requests} requests per endpoint, {args.heavy_requests} for whole-study ones, "
        "round-robin)\n"
    )
    print_http_table(report.pairs)
    print(
        "\nFirst request after the server started (ms): "
        + ", ".join(f"{e.side} `{e.label}` {fmt_ms(e.first_ms or 0)}" for e in report.endpoints)
    )
    print_after_change(report.endpoints, report.cold_theirs)
    print(
        f"\n#### Study page in headless chromium ({args.paint_runs} runs each, a fresh browser "
        "context per run)\n"
    )
    summarize_pages(report.pages)
    theirs_page = report.pages[-1]
    print(
        "\nRatios (optuna-dashboard ÷ ours, medians): "
        + "; ".join(
            f"{p.label}: first contentful paint {_median_ratio(theirs_page, p, 'fcp'):.2f}×, "
            f"history chart drawn {_median_ratio(theirs_page, p, 'chart'):.2f}×"
            for p in report.pages[:-1]
        )
        + ".\n"
    )
    print("#### Targets\n")
    for endpoint in report.targeted:
        p95 = percentile(endpoint.times_ms, 95)
        verdict = "PASS" if p95 < TARGET_P95_MS else "FAIL"
        line = f"- `{endpoint.label}` p95 {fmt_ms(p95)} ms < {TARGET_P95_MS:g} ms: **{verdict}**"
        if endpoint.after_change_ms:
            line += (
                f" (first request after a trial finished: median "
                f"{fmt_ms(statistics.median(endpoint.after_change_ms))} ms)"
            )
        print(line)
    for p in report.pages[:-1]:
        fcp = [r["fcp"] / 1000 for r in p.runs]
        verdict = "PASS" if max(fcp) < TARGET_FIRST_PAINT_S else "FAIL"
        print(
            f"- study page first contentful paint, {p.label}: median "
            f"{statistics.median(fcp):.2f} s, max {max(fcp):.2f} s < "
            f"{TARGET_FIRST_PAINT_S:g} s: **{verdict}**"
        )
    if profiles:
        print(
            "\n#### Where our time goes: routes and their parts called in-process "
            "(median of 5 calls, no HTTP)\n"
        )
        print("| call | median ms |")
        print("|---|---:|")
        for timed in profiles:
            value = f"failed: {timed.error}" if timed.error else fmt_ms(timed.median_ms)
            print(f"| {timed.label.replace('  ', '↳ ')} | {value} |")
    for timed in profiles:
        if timed.profile:
            print(f"\n#### cProfile: {timed.label}\n")
            print("```\n" + _trim_profile(timed.profile) + "\n```")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--trials", type=int, default=10_000)
    parser.add_argument("--requests", type=int, default=200, help="per light endpoint")
    parser.add_argument("--heavy-requests", type=int, default=20, help="per whole-study endpoint")
    parser.add_argument("--paint-runs", type=int, default=5)
    parser.add_argument(
        "--changes", type=int, default=5, help="samples of the first request after a change"
    )
    parser.add_argument("--db", default="sweeper_bench")
    parser.add_argument("--postgres", default="postgresql+psycopg://postgres@127.0.0.1:5432")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--profile", action="store_true", help="time and profile our routes")
    parser.add_argument("--keep", action="store_true", help="keep the database afterwards")
    args = parser.parse_args()

    started = time.perf_counter()
    load_before = os.getloadavg()
    server_url = args.postgres.replace("postgresql+psycopg://", "postgresql://")
    url = f"{args.postgres}/{args.db}"
    space = load_space(SPACE)
    recreate_database(f"{server_url}/postgres", args.db)
    try:
        trials = make_trials(space, args.trials, args.seed)
        # a trial per (our endpoint, change sample) and per page load after a change; spare
        later = live_trials(space, args.trials, 12 * args.changes + args.paint_runs, args.seed)
        fill_started = time.perf_counter()
        fill_ours(url, space, trials)
        ours_s = time.perf_counter() - fill_started
        fill_started = time.perf_counter()
        fill_optuna(url, space, trials)
        optuna_s = time.perf_counter() - fill_started
        analyze(f"{server_url}/{args.db}")
        counts = {s: sum(t.state == s for t in trials) for s in ("complete", "failed", "pruned")}
        print(
            f"filled {args.trials} trials {counts}: our tables {ours_s:.1f} s, Optuna's "
            f"{optuna_s:.1f} s",
            file=sys.stderr,
        )
        writer = LiveWriter(url, space, later)
        try:
            report = run_servers(args, url, space, len(trials), writer)
        finally:
            writer.close()
        profiles = profile_routes(url, space.study, len(trials)) if args.profile else []
    finally:
        if not args.keep:
            drop_database(f"{server_url}/postgres", args.db)
    print_report(
        args,
        report,
        profiles,
        {"counts": counts, "ours_s": ours_s, "optuna_s": optuna_s},
        time.perf_counter() - started,
        load_before,
        os.getloadavg(),
    )


def _revision() -> str:
    """The commit measured, and whether the served code differed from it (read-only git)."""
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True
        ).stdout.strip()
        changed = subprocess.run(
            ["git", "status", "--porcelain", "--", "api", "dashboards", "sweeper"],
            cwd=REPO,
            capture_output=True,
            text=True,
        ).stdout.split()
    except OSError:
        return "an unknown commit"
    files = [f for f in changed if "/" in f]
    return f"commit {head}" + (f" plus uncommitted changes to {', '.join(files)}" if files else "")


def _load(load: tuple[float, float, float]) -> str:
    return " / ".join(f"{v:.2f}" for v in load)


def _version(distribution: str) -> str:
    from importlib.metadata import version

    return version(distribution)


def _has(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


def _trim_profile(text: str) -> str:
    """pstats' tables with paths shortened, without its preamble and blank lines."""
    keep = []
    for line in text.splitlines():
        if "ncalls" in line or line.startswith("   Ordered by"):
            keep.append(line.strip())
        elif line.strip() and line[:1] == " " and "function calls" not in line:
            keep.append(line.rstrip().replace(str(REPO) + "/", "").replace(_SITE, ""))
    return "\n".join(keep)


_SITE = str(Path(optuna.__file__).parent.parent) + "/"


if __name__ == "__main__":
    main()
