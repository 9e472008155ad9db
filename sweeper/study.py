"""The sweep: an Optuna study driven by ask/tell, one child process per trial.

Optuna owns the search state (its tables); each trial's typed measurement and projected cost go
into our tables in the same database. The objective is $/run (minimize), never it/s.
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import json
import logging
import math
import os
import socket
import statistics
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Protocol

import optuna
from sqlalchemy.exc import SQLAlchemyError

from sweeper import knobs
from sweeper.cost import RunPlan, RunProjection, project_run
from sweeper.errors import (
    ConflictError,
    SpaceError,
    StorageError,
    StudyNotFoundError,
    SweeperError,
)
from sweeper.launcher import ChildRun, ForkServer, run_child
from sweeper.measurement import Measurement, MeasurementError, parse_measurement
from sweeper.noise import (
    Drift,
    Estimate,
    Sample,
    SampleKind,
    drift,
    machine_noise,
    now_iso,
    overlaps,
    pool,
)
from sweeper.preflight import PROBED_KNOBS, PreflightReport, ProbeCache, run_preflight
from sweeper.recommend import Recommendation, StudyFacts, best, truncates
from sweeper.search import (
    CONSTRAINT,
    CONTENDED_ATTR,
    INFEASIBLE_KINDS,
    REPEAT_ATTR,
    make_sampler,
    oom_dominated,
    runnable_params,
    worker_seed,
)
from sweeper.settings import Settings
from sweeper.space import Space, TrialConfig, optuna_params, parse_space, suggest
from sweeper.store import Store, TrialRow, redact
from sweeper.store.retry import retried
from sweeper.store.store import schema_lock
from sweeper.trial.protocol import ChildRequest, PreparedData, tokens_per_sample

# Stop asking after this many consecutive configs that were measured or ruled out already.
_MAX_SKIPS_IN_A_ROW = 50


class SweepObserver(Protocol):
    """What the CLI (or a test) hears while a sweep runs."""

    def prepare_started(self) -> None: ...
    def prepare_done(self, prepared: PreparedData, wall_s: float) -> None: ...
    def trial_started(self, number: int, config: TrialConfig) -> None: ...
    def trial_done(self, row: TrialRow) -> None: ...
    def note(self, message: str) -> None: ...


class SilentObserver:
    def prepare_started(self) -> None:
        pass

    def prepare_done(self, prepared: PreparedData, wall_s: float) -> None:
        pass

    def trial_started(self, number: int, config: TrialConfig) -> None:
        pass

    def trial_done(self, row: TrialRow) -> None:
        pass

    def note(self, message: str) -> None:
        pass


@dataclass(frozen=True, kw_only=True)
class SweepReport:
    study: str
    storage_url: str
    trials_run: int
    completed: int
    failed: int
    wall_s: float
    best: Recommendation | None
    no_best_reason: str | None = None  # why there is no recommendation, when there is none
    predicted_oom: int = 0  # configs not run: as heavy as one that ran out of memory
    stop_reason: str = ""  # why the sweep ended
    remeasured: int = 0  # measurements of configs measured before (sweeper.noise)


class PrepareError(SweeperError):
    """The dataset or tokenizer could not be prepared, so no trial can run."""


def study_fields(
    space: Space, *, n_trials: int, space_text: str, space_path: str | None
) -> dict[str, Any]:
    """The study row's fields that come from the space (``Store.upsert_study`` keywords)."""
    return {
        "hardware_name": space.hardware.name,
        "usd_per_hour": space.hardware.usd_per_hour,
        "device": space.hardware.device,
        "samples": space.workload.samples,
        "epochs": space.workload.epochs,
        "n_trials_planned": n_trials,
        "space_yaml": space_text,
        "space_path": space_path,
        "baseline": None
        if space.baseline is None
        else space.baseline.as_config(space.search).model_dump(),
        "workload_hash": space.workload_hash(),
    }


def trials_done(store: Store, study: str) -> int:
    """Trials of ``study`` that count against its plan: finished, but not lost or interrupted
    (their configs run again). 0 for a study the storage does not hold."""
    try:
        trials = store.list_trials(study, states=["complete", "failed", "pruned"])
    except StudyNotFoundError:
        return 0
    return sum(t.failure_kind not in ("lost", "interrupted") for t in trials)


def run_sweep(
    space: Space,
    *,
    storage_url: str,
    cache_dir: Path,
    space_text: str,
    space_path: str | None = None,
    n_trials: int | None = None,
    max_minutes: float | None = None,
    observer: SweepObserver | None = None,
    worker: str | None = None,
) -> SweepReport:
    """Run ``n_trials`` measured trials (default: the space's budget) and record them; with
    ``max_minutes`` (default: the tightest of the space's ``budget`` limits), start no trial
    that the time left cannot hold. Preparation and preflight count against that time. ``worker``:
    which of the study's workers this is (each samples with its own seed; by default the first
    live worker is "0" and the others are named by their worker id)."""
    observer = observer or SilentObserver()
    n_trials = n_trials or space.budget.n_trials
    max_minutes = max_minutes or space.budget.minutes(space.hardware.usd_per_hour)
    deadline = None if max_minutes is None else time.monotonic() + 60 * max_minutes
    started = time.perf_counter()
    # a database out of reach at the start is more often a wrong URL or a server not started
    # than a restart: said after a short wait, not after the 2 minutes a sweep rides out
    store = Store(storage_url, retry_s=STARTUP_RETRY_S)
    store.migrate()
    store.retry_s = DATABASE_RETRY_S
    storage = optuna_storage(storage_url, retry_s=DATABASE_RETRY_S)
    study = _optuna_study(space, storage)
    # a resumed study plans what it has and what this launch adds (16 after two launches of 8)
    planned = trials_done(store, space.study) + n_trials
    store.upsert_study(
        space.study,
        state="running",
        **study_fields(space, n_trials=planned, space_text=space_text, space_path=space_path),
    )
    enqueue_known(study, space)
    enqueue_interrupted(store, study, space)
    clock = _SweepClock(store, space.study)
    settings = Settings()
    member = _Worker(store, study, space, settings.heartbeat_s, settings.worker_grace_s)
    member.start()
    # the study's first live worker samples with the space's seed; one that joins others
    # (launch --workers, sweeper worker, compose replicas) with one of its own
    live = store.live_workers(space.study, settings.worker_grace_s)
    first = min(live, key=lambda w: (w.started_at, w.id)).id if live else member.id
    worker = worker or ("0" if first == member.id else member.id)
    try:
        prepared = prepare_workload(space, cache_dir, observer)
        store.upsert_study(space.study, dataset_stats=prepared.stats)
        with workload_server(space, prepared, cache_dir) as server:
            preflight = PreflightReport()
            if space.trial.preflight:
                preflight = _preflight(space, prepared, cache_dir, observer, server)
                fields: dict[str, Any] = {"preflight": preflight.to_json()}
                if space.baseline is not None:  # what the baseline runs here (tf32 on a CPU)
                    fields["baseline"] = preflight.nearest(space.baseline.as_config(space.search))[
                        0
                    ].model_dump()
                store.upsert_study(space.study, **fields)
            executor = _ChildExecutor(
                space, store, prepared, cache_dir, observer, server, worker_id=member.id
            )
            facts = StudyFacts.of(store.get_study(space.study))
            loop = SearchLoop(
                space, study, executor, preflight, observer,
                earlier=executor.earlier(), earlier_samples=executor.earlier_samples(),
                seed=worker_seed(space.budget.seed, worker),
                eligible=lambda config: not truncates(facts, config.model_dump()),
            )  # fmt: skip
            counts = loop.run(n_trials, clock, deadline)
            if not loop.stopped:
                loop.settle(clock)
    except KeyboardInterrupt:
        member.stop("interrupted")
        raise
    except BaseException:
        member.stop("failed")
        raise
    finally:
        clock.charge()
        storage.engine.dispose()
    member.stop("stopped" if loop.stopped else "finished")
    no_best_reason = None
    try:
        recommendation: Recommendation | None = best(store, space.study)
    except SweeperError as e:
        recommendation, no_best_reason = None, str(e)
    store.dispose()
    return SweepReport(
        study=space.study,
        storage_url=storage_url,
        trials_run=counts["run"],
        completed=counts["complete"],
        failed=counts["failed"],
        wall_s=time.perf_counter() - started,
        best=recommendation,
        no_best_reason=no_best_reason,
        predicted_oom=counts["predicted"],
        stop_reason=loop.stop_reason,
        remeasured=loop.remeasured,
    )


def enqueue_known(study: optuna.Study, space: Space) -> None:
    """The user's current config runs first (every result is compared with it), then
    also_try's, before the sampler proposes anything."""
    for known in space.known_configs():
        study.enqueue_trial(optuna_params(known, space.search), skip_if_exists=True)


# ------------------------------------------------------------------ control (REST writes)


def enqueue_config(store: Store, name: str, config: TrialConfig) -> dict[str, Any]:
    """Queue ``config`` as a trial of study ``name``: the running sweep (or the next
    ``sweeper launch`` of it) runs it before asking the sampler. Returns Optuna's params.

    Raises SpaceError if the study's space cannot run it, ConflictError if it was measured.
    """
    row = store.get_study(name)
    try:
        space = parse_space(row.space_yaml, f"the stored space of study {name!r}")
    except SpaceError as e:
        raise ConflictError(f"cannot check the config against the study's space: {e}") from e
    reason = space.search.runnable(config)
    if reason is not None:
        raise SpaceError(f"config: {reason}")
    dumped = config.model_dump()
    for trial in store.list_trials(name, states=["complete", "failed", "running"]):
        if TrialConfig.model_validate(trial.config).model_dump() == dumped:
            raise ConflictError(
                f"trial {trial.number} of study {name!r} already ran this config "
                f"({trial.state}); a repeat would measure nothing new"
            )
    params = optuna_params(config, space.search)
    storage = optuna_storage(store.url)
    try:
        study = optuna.load_study(study_name=name, storage=storage)
        study.enqueue_trial(params, skip_if_exists=True)
    except (KeyError, SQLAlchemyError) as e:
        raise StorageError(f"cannot queue a trial in Optuna's study {name!r}: {e}") from e
    finally:
        storage.engine.dispose()
    return params


def delete_study(store: Store, name: str) -> None:
    """Delete a study that is not running: our rows and Optuna's."""
    row = store.get_study(name)
    grace_s = Settings().worker_grace_s
    store.reap(name, grace_s)  # workers that died mark their trials lost first
    alive = store.live_workers(name, grace_s)
    if alive:
        raise ConflictError(
            f"study {name!r} has {len(alive)} live worker(s) "
            f"({', '.join(f'{w.host} pid {w.pid}' for w in alive)}); stop the study first "
            "(POST .../stop) and delete it once they have ended"
        )
    row = store.get_study(name)
    if row.state in ("running", "stopping"):
        raise ConflictError(
            f"study {name!r} is {row.state}; stop it first (POST .../stop) and delete it "
            "once its running trial has ended"
        )
    storage = optuna_storage(store.url)
    try:
        delete_optuna_study(storage, name)
    finally:
        storage.engine.dispose()
    store.delete_study(name)


def delete_optuna_study(storage: optuna.storages.RDBStorage, name: str) -> None:
    """Delete Optuna's part of a study; nothing to do if it never reached Optuna."""
    try:
        optuna.delete_study(study_name=name, storage=storage)
    except KeyError:
        pass  # never reached Optuna (e.g. failed while preparing): only our rows exist
    except SQLAlchemyError as e:
        raise StorageError(f"cannot delete Optuna's study {name!r}: {e}") from e


# How long a sweep waits out a lost database connection (a Postgres restart or failover)
# before it gives up: the running trial's measurement is written once the database is back.
DATABASE_RETRY_S = 120.0
STARTUP_RETRY_S = 10.0  # the same, for the first connection of a sweep


class _RetryingRDBStorage(optuna.storages.RDBStorage):
    """Optuna's RDB storage whose calls ride out a lost connection for ``retry_s`` seconds
    (``sweeper.store.retry``); its pooled connections are checked before use."""

    retry_s = 0.0


for _name in [n for n in vars(optuna.storages.BaseStorage) if not n.startswith("_")]:
    _method = getattr(optuna.storages.RDBStorage, _name, None)
    if inspect.isfunction(_method):

        def _call(self: _RetryingRDBStorage, *args: Any, _m: Any = _method, **kwargs: Any) -> Any:
            return retried(_m, lambda: self.retry_s, f"optuna.{_m.__name__}")(self, *args, **kwargs)

        setattr(_RetryingRDBStorage, _name, functools.wraps(_method)(_call))


def optuna_storage(storage_url: str, retry_s: float = 0.0) -> optuna.storages.RDBStorage:
    """Optuna's storage in the same database as our tables (dispose its engine when done);
    ``retry_s`` as ``Store``'s."""
    optuna.logging.set_verbosity(logging.WARNING)
    try:
        with schema_lock(storage_url):  # Optuna creates its tables here
            storage = _RetryingRDBStorage(storage_url, engine_kwargs={"pool_pre_ping": True})
    except SQLAlchemyError as e:
        raise StorageError(f"Optuna cannot use the storage {redact(storage_url)}: {e}") from e
    storage.retry_s = retry_s
    return storage


def _optuna_study(space: Space, storage: optuna.storages.RDBStorage) -> optuna.Study:
    try:
        return optuna.create_study(
            study_name=space.study,
            storage=storage,
            direction="minimize",
            # the search loop sets the space's sampler once preflight says what can run
            sampler=optuna.samplers.RandomSampler(seed=space.budget.seed),
            load_if_exists=True,
        )
    except SQLAlchemyError as e:
        raise StorageError(f"Optuna cannot create the study {space.study!r}: {e}") from e


def prepare_workload(
    space: Space, cache_dir: Path, observer: SweepObserver | None = None
) -> PreparedData:
    """Tokenizer, dataset and its token statistics, made once in a child for all trials."""
    observer = observer or SilentObserver()
    observer.prepare_started()
    run = run_child(
        ChildRequest.for_space("prepare", space, cache_dir, device="cpu"),
        timeout_s=max(600.0, space.trial.timeout_s),
    )
    if run.result.status != "ok" or run.result.payload is None:
        raise PrepareError(
            f"preparing the dataset and tokenizer failed ({run.result.failure_kind}): "
            f"{run.result.failure_message}\n{run.log_tail[-1500:]}"
        )
    prepared = PreparedData.model_validate(run.result.payload)
    observer.prepare_done(prepared, run.wall_s)
    return prepared


@contextmanager
def workload_server(space: Space, prepared: PreparedData, cache_dir: Path) -> Iterator[ForkServer]:
    """A fork server with the workload's tokenizer, data and model code loaded: probes and
    trials forked from it start in milliseconds."""
    with ForkServer(str(cache_dir)) as server:
        server.preload(ChildRequest.for_space("probe", space, cache_dir, prepared=prepared))
        yield server


def _preflight(
    space: Space,
    prepared: PreparedData,
    cache_dir: Path,
    observer: SweepObserver,
    server: ForkServer,
) -> PreflightReport:
    started = time.perf_counter()
    report = run_preflight(
        space, prepared, cache_dir, note=observer.note, server=server,
        probe_cache=ProbeCache(cache_dir),
    )  # fmt: skip
    kept = {
        knob: [v for v in space.search.values(knob) if str(v) not in report.dropped.get(knob, {})]
        for knob in (*PROBED_KNOBS, *report.fallbacks)
    }
    kept.update({knob: [value] for knob, value in report.fallbacks.items()})
    observer.note(
        f"preflight ({time.perf_counter() - started:.0f} s, {len(report.outcomes)} probes): "
        + "; ".join(f"{knob} {', '.join(map(str, values))}" for knob, values in kept.items())
    )
    return report


def json_key(config: Mapping[str, Any]) -> str:
    """A config as a comparable key (its JSON with sorted keys)."""
    return json.dumps(config, sort_keys=True, default=str)


LOST_RETRIES = 1  # a config whose worker died, or whose trial was interrupted, runs again once


def times_lost(trials: Sequence[TrialRow], config: Mapping[str, Any], kind: str = "lost") -> int:
    """How many of ``trials`` ran ``config`` and were lost with their worker (or ended with
    failure ``kind``: ``interrupted``)."""
    key = json_key(config)
    return sum(t.failure_kind == kind and json_key(t.config) == key for t in trials)


def enqueue_interrupted(store: Store, study: optuna.Study, space: Space) -> None:
    """Configs whose trial was interrupted (by the user, or when the time budget ran out) and
    that no other trial has measured run first at this launch, once more."""
    trials = store.list_trials(space.study)
    measured = {json_key(t.config) for t in trials if t.failure_kind != "interrupted"}
    queued = {
        t.user_attrs.get("retry_of")
        for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.WAITING,))
    }
    for t in trials:
        key = json_key(t.config)
        if t.failure_kind != "interrupted" or key in measured or t.number in queued:
            continue
        measured.add(key)
        if times_lost(trials, t.config, "interrupted") > LOST_RETRIES:
            continue
        config = TrialConfig.model_validate(t.config)
        study.enqueue_trial(optuna_params(config, space.search), user_attrs={"retry_of": t.number})


class _Worker:
    """This sweep process as one worker of its study: registered, beating from a thread, and
    reaping the study's workers that went silent (their running trials are marked ``lost``
    in both stores, and each such config is queued once more). The study's state follows its
    live workers: the last one to end sets it."""

    def __init__(
        self, store: Store, study: optuna.Study, space: Space, heartbeat_s: float, grace_s: float
    ) -> None:
        self.store, self.study, self.space = store, study, space
        self.heartbeat_s, self.grace_s = heartbeat_s, grace_s
        self.id = str(uuid.uuid4())
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._beat, name="sweeper-heartbeat", daemon=True)

    def start(self) -> None:
        self.reap()
        self.store.register_worker(
            self.space.study,
            self.id,
            socket.gethostname(),
            os.getpid(),
            os.environ.get("CUDA_VISIBLE_DEVICES"),
        )
        self._thread.start()

    def _beat(self) -> None:
        while not self._stopped.wait(self.heartbeat_s):
            try:
                self.store.beat(self.id)
                self.reap()
            except SweeperError:
                continue  # the database is away: the next beat tries again

    def reap(self) -> None:
        for trial in self.store.reap(self.space.study, self.grace_s):
            self._fail_in_optuna(trial.number)
            lost = self.store.list_trials(self.space.study, failure_kinds=["lost"])
            if times_lost(lost, trial.config) < LOST_RETRIES + 1:
                config = TrialConfig.model_validate(trial.config)
                self.study.enqueue_trial(
                    optuna_params(config, self.space.search), user_attrs={"retry_of": trial.number}
                )

    def _fail_in_optuna(self, number: int) -> None:
        storage = self.study._storage
        try:
            trial_id = storage.get_trial_id_from_study_id_trial_number(self.study._study_id, number)
            storage.set_trial_state_values(trial_id, optuna.trial.TrialState.FAIL)
        except (KeyError, RuntimeError, optuna.exceptions.UpdateFinishedTrialError):
            pass  # Optuna never had it running, or it already ended

    def stop(self, state: str) -> None:
        """End this worker; the study takes ``state`` unless another worker is still alive."""
        self._stopped.set()
        if self._thread.is_alive():
            self._thread.join(timeout=30)
        self.store.end_worker(self.id)
        others = [w for w in self.store.live_workers(self.space.study, self.grace_s)]
        if not others:
            self.store.set_study_state(self.space.study, state)


class _SweepClock:
    """Charges the machine time a sweep uses (preparation, probes, trials) to its study, as it
    goes, so an interrupted sweep is accounted for too."""

    def __init__(self, store: Store, study: str) -> None:
        self.store, self.study = store, study
        self.since = time.perf_counter()

    def charge(self) -> None:
        now = time.perf_counter()
        try:
            self.store.add_sweep_seconds(self.study, now - self.since)
        except SweeperError:
            return  # accounting never stops a sweep; the next charge carries the time
        self.since = now


@dataclass(frozen=True)
class Outcome:
    """What one config gave: its $/run, or how it failed (``failure_kind``: FAILURE_KINDS)."""

    number: int
    cost: float | None = None
    failure_kind: str | None = None
    predicted: bool = False  # not run: known to fail from another trial (out of memory)
    spread: float = 0.0  # half-width of the $/run's 95% interval, relative (0: unknown)
    sample: Sample | None = None  # the measurement (``sweeper.noise``), when it was measured

    @property
    def feasible(self) -> bool:
        return self.cost is not None

    @property
    def infeasible(self) -> bool:
        return self.failure_kind in INFEASIBLE_KINDS


class TrialExecutor(Protocol):
    """Runs one config as Optuna trial ``trial`` and records it; ``sweeper launch`` runs a
    child process (``_ChildExecutor``), bench/search_replay.py looks the config up in a table."""

    def execute(
        self, trial: optuna.Trial, config: TrialConfig, left_s: float | None
    ) -> Outcome: ...

    def record_predicted(self, trial: optuna.Trial, config: TrialConfig, message: str) -> None: ...

    def remeasure(
        self, number: int, config: TrialConfig, kind: SampleKind, left_s: float | None
    ) -> Sample | None:
        """Measure trial ``number``'s config again (no new trial); None if it failed."""
        ...

    def record_estimates(
        self, estimates: Mapping[int, tuple[Estimate, Sequence[Sample] | None]]
    ) -> None: ...

    def stop_requested(self) -> bool: ...

    def claim(self, number: int, config: TrialConfig) -> int | None:
        """Take ``config`` for trial ``number`` before running it; None when it is ours, else
        the trial (of any worker of the study) that took it first."""
        ...


class SearchLoop:
    """Ask, decide what a proposal is worth, run it (or not), tell — until the budget is spent;
    then measure the best configs again until they separate (``budget.remeasure``).

    What Optuna is told (``sweeper.search``): a measured config its $/run; a config proposed
    again its earlier result again; a config that failed by its own doing (out of memory,
    unsupported) or that the space's rules or preflight rule out, a completed trial with the
    constraint violated; a config at least as heavy as one that ran out of memory is not run.

    What is measured again (``sweeper.noise``): a trial taken while the machine was shared, at
    once, and if still contended, later, after a trial that ran calm; a reference config every
    ``drift_every`` trials, to see drift; and at the end the configs whose $/run intervals
    overlap the best's, interleaved, so that the recommendation can tell a real winner from
    noise. ``eligible`` says which configs the recommendation may pick (it leaves out configs
    that truncate the data): only those are re-measured at the end.
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
    ) -> None:
        self.space, self.study, self.executor = space, study, executor
        self.preflight, self.observer = preflight, observer
        self.eligible = eligible or (lambda config: True)
        self.stopped = False  # a stop was requested through the API
        self.stop_reason = ""
        self.known = set(space.known_configs())  # the user's named configs
        self.search = preflight.search(space)  # knobs that fell back have one value
        self.runnable = [c for c in self.search.grid() if preflight.allows(c) is None]
        runnable = set(self.runnable)
        # what this study measured before (a resumed sweep): told again if proposed again
        self.results: dict[TrialConfig, Outcome] = {
            c: o for c, o in (earlier or {}).items() if c in runnable
        }
        # every measurement of each measured config, in order (sweeper.noise)
        self.samples: dict[TrialConfig, list[Sample]] = {
            c: list(v) for c, v in (earlier_samples or {}).items() if c in self.results and v
        }
        self.noise = machine_noise(self.samples.values())
        # configs every measurement of which was contended: measured again after a calm trial
        later = space.budget.remeasure.contended_later
        self.waiting: dict[TrialConfig, int] = {
            c: later for c, v in self.samples.items() if later and all(s.contended for s in v)
        }
        self.drift: Drift | None = None
        self.remeasured = 0  # measurements of configs already measured, this sweep
        # what the store holds for each config's interval: rows that did not move are not written
        self._written: dict[TrialConfig, tuple[float, bool]] = {}
        measured = [o for o in self.results.values() if o.cost is not None]
        # the best measured so far, beyond noise (a resumed sweep starts from its earlier best)
        self.best: Outcome | None = min(measured, key=lambda o: o.cost or 0.0, default=None)
        self.since_best = 0  # measured trials since it
        self.gains: list[tuple[int, float]] = []  # (measured trials so far, relative gain)
        self.measured = 0  # measured trials (feasible or not) of this sweep
        self.trial_seconds: list[float] = []
        self.longest_s = 0.0
        study.sampler = make_sampler(
            self.search.sampler,
            space.budget.seed if seed is None else seed,
            runnable_params(self.runnable, lambda c: optuna_params(c, self.search)),
        )
        # a resumed sweep: configs told contended that a later measurement found calm
        for config, samples in self.samples.items():
            cost = self.results[config].cost
            if samples[0].contended and not all(s.contended for s in samples) and cost:
                self._revise(config, cost)

    def oom_configs(self) -> list[tuple[int, dict[str, Any]]]:
        return [
            (o.number, c.model_dump())
            for c, o in self.results.items()
            if o.failure_kind == "oom" and not o.predicted
        ]

    def run(
        self, n_trials: int, clock: _SweepClock | None = None, deadline: float | None = None
    ) -> dict[str, int]:
        """Run up to ``n_trials`` trials; with a ``deadline`` (``time.monotonic()``), start none
        with less time left than the longest trial so far took, and cap each one's timeout
        at the time left. ``settle`` then measures the best configs again."""
        counts = {"run": 0, "complete": 0, "failed": 0, "predicted": 0, "repeats": 0, "claimed": 0}
        runnable = set(self.runnable)
        skipped_in_a_row = 0
        self.deadline = deadline
        while counts["run"] < n_trials:
            if self.executor.stop_requested():
                self._stop("stop requested (REST); the sweep ends here")
                self.stopped = True
                break
            if runnable <= self.results.keys():
                self._stop(f"all {len(runnable)} runnable configs of the space are measured")
                break
            left_s = self._left_s()
            if left_s is not None and (left_s <= 0 or left_s < self.longest_s):
                self._stop(
                    f"the sweep's time budget is spent ({max(0.0, left_s):.0f} s left, the "
                    f"longest trial took {self.longest_s:.0f} s)"
                )
                break
            trial = self.study.ask()
            # a known config's knob that cannot run here runs its fallback (tf32 on a CPU)
            proposed = suggest(trial, self.search)
            config = self.preflight.adapt(proposed)
            if proposed in self.known:  # the user's own config: measured as near as runs here
                config, changed = self.preflight.nearest(proposed)
                if changed:
                    self.observer.note(
                        f"{knobs.describe(proposed.model_dump())} runs " + "; ".join(changed)
                    )
            # Optuna forbids changing a categorical's choices within a study: a config that
            # preflight or the space's rules rule out is told as infeasible without a trial
            reason = self.search.admits(config) or self.preflight.allows(config)
            if reason is not None:
                trial.set_user_attr("skipped", reason)
                self._tell(trial, Outcome(number=trial.number, failure_kind="unsupported"))
            elif config in self.results:
                earlier = self.results[config]
                trial.set_user_attr(REPEAT_ATTR, earlier.number)
                self._tell(trial, earlier)
                counts["repeats"] += 1
            else:
                oom = oom_dominated(config.model_dump(), self.oom_configs())
                if oom is not None:
                    self._predicted_oom(trial, config, oom)
                    counts["predicted"] += 1
                    continue
                taken_by = self.executor.claim(trial.number, config)
                if taken_by is not None:  # another worker proposed it first
                    if taken_by != trial.number:  # (the same queued trial, popped twice:
                        trial.set_user_attr("claimed_by", taken_by)  # it is the other's)
                        self.study.tell(trial, state=optuna.trial.TrialState.FAIL)
                    counts["claimed"] += 1
                    skipped_in_a_row += 1
                    if skipped_in_a_row >= _MAX_SKIPS_IN_A_ROW:
                        self._stop("the other workers have taken every config proposed")
                        break
                    continue
                skipped_in_a_row = 0
                started = time.monotonic()
                outcome = self.executor.execute(trial, config, left_s)
                self._took(time.monotonic() - started)
                self.results[config] = outcome
                if outcome.sample is not None:
                    self.samples[config] = [outcome.sample]
                    self._rerun_if_contended(config)
                # told after the reruns: the sampler learns the calm measurement, not the
                # one a shared machine slowed (which would mark a good region as bad)
                calm = not all(s.contended for s in self.samples.get(config, []))
                if not calm and outcome.sample:
                    trial.set_user_attr(CONTENDED_ATTR, True)
                    if self.space.budget.remeasure.contended_later:
                        self.waiting[config] = self.space.budget.remeasure.contended_later
                self._tell(trial, self.results[config])
                if calm and outcome.sample:
                    self._measure_waiting()
                if clock is not None:
                    clock.charge()
                counts["run"] += 1
                counts["complete" if outcome.feasible else "failed"] += 1
                self.measured += 1
                if self._out_of_patience(self.results[config]) or self._not_worth_it():
                    break
                self._check_drift(clock)
                continue
            skipped_in_a_row += 1
            if skipped_in_a_row >= _MAX_SKIPS_IN_A_ROW:
                self._stop("the sampler keeps proposing measured or ruled-out configs")
                break
        if not self.stop_reason and counts["run"] >= n_trials:
            self.stop_reason = (
                f"{n_trials} trial{'' if n_trials == 1 else 's'} run, the number asked for"
            )
        return counts

    # ------------------------------------------------------------------ measuring again

    def _left_s(self) -> float | None:
        return None if self.deadline is None else self.deadline - time.monotonic()

    def _took(self, seconds: float) -> None:
        self.trial_seconds.append(seconds)
        self.longest_s = max(self.longest_s, seconds)

    def _remeasure(self, config: TrialConfig, kind: SampleKind) -> Sample | None:
        """Measure a config again if the time left holds it; fold it into the estimates."""
        left_s = self._left_s()
        if left_s is not None and (left_s <= 0 or left_s < self.longest_s):
            return None
        if self.executor.stop_requested():
            return None
        number = self.results[config].number
        started = time.monotonic()
        sample = self.executor.remeasure(number, config, kind, left_s)
        self._took(time.monotonic() - started)
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
        for _ in range(self.space.budget.remeasure.contended_reruns):
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

    def _measure_waiting(self) -> None:
        """The machine measured calm just now: measure again, of the configs every measurement
        of which was contended, the one with the lowest $/run so far. A calm one
        replaces them, and the sampler learns it (``revise``: Optuna's trial keeps the value it
        was told, flagged contended)."""
        if not self.waiting:
            return
        config = min(self.waiting, key=lambda c: self.results[c].cost or math.inf)
        tries = self.waiting.pop(config) - 1
        number = self.results[config].number
        sample = self._remeasure(config, "rerun")
        if sample is None:
            return
        if sample.contended:
            if tries:
                self.waiting[config] = tries
            return
        outcome = self.results[config]
        self.observer.note(
            f"#{number}, measured only on a shared machine so far, measured calm now: "
            f"${outcome.cost:,.2f}/run"
        )
        if outcome.cost:
            self._revise(config, outcome.cost)

    def _revise(self, config: TrialConfig, cost: float) -> None:
        """Tell a sampler that can learn it (``bayes``) the calm $/run of a config that Optuna
        was told while it was contended."""
        revise = getattr(self.study.sampler, "revise", None)
        if revise is not None:
            revise(optuna_params(config, self.search), cost)

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

    def _check_drift(self, clock: _SweepClock | None) -> None:
        every = self.space.budget.remeasure.drift_every
        if every is None or self.measured % every != 0:
            return
        reference = self._reference()
        if reference is None or self._remeasure(reference, "drift") is None:
            return
        if clock is not None:
            clock.charge()
        found = drift(self.samples[reference], self.noise)
        if found is not None and (self.drift is None or found.change != self.drift.change):
            self.drift = found
            self.observer.note(found.describe(self.results[reference].number))

    def contenders(self) -> list[TrialConfig]:
        """The eligible measured configs whose $/run intervals overlap the best's, cheapest
        first, at most ``remeasure.top`` of them (one alone: nothing to separate)."""
        feasible = sorted(
            (
                (o.cost, c)
                for c, o in self.results.items()
                if o.cost is not None and c in self.samples and self.eligible(c)
            ),
            key=lambda pair: pair[0],
        )
        if not feasible:
            return []
        best_cost, best = feasible[0]
        best_spread = self.results[best].spread
        near = [
            c
            for cost, c in feasible
            if overlaps(best_cost, best_spread, cost, self.results[c].spread)
        ]
        return near[: self.space.budget.remeasure.top]

    def settle(self, clock: _SweepClock | None = None) -> None:
        """Measure the best configs again, interleaved, until their intervals separate or
        ``remeasure.rounds`` rounds are spent."""
        rounds = self.space.budget.remeasure.rounds
        for done in range(rounds):
            contenders = self.contenders()
            if len(contenders) < 2:
                if done:
                    self.observer.note(f"after {done} round(s) the best config stands clear")
                return
            numbers = ", ".join(f"#{self.results[c].number}" for c in contenders)
            if self.executor.stop_requested() or self._out_of_time():
                self.observer.note(
                    f"{numbers} tie within the noise, and the sweep's time budget leaves no "
                    "time to measure them again; the recommendation picks the baseline if it "
                    "is among them, else the one with the least peak memory (a longer "
                    "--max-minutes or budget.max_device_hours lets the sweep separate them)"
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
            if clock is not None:
                clock.charge()
        left = self.contenders()
        if len(left) > 1:
            self.observer.note(
                f"{', '.join(f'#{self.results[c].number}' for c in left)} still tie within the "
                "noise; the recommendation picks the baseline if it is among them, else the "
                "one with the least peak memory"
            )

    def _out_of_time(self) -> bool:
        left_s = self._left_s()
        return left_s is not None and (left_s <= 0 or left_s < self.longest_s)

    # ------------------------------------------------------------------ stopping

    def _stop(self, reason: str) -> None:
        self.stop_reason = reason
        self.observer.note(f"{reason}; stopping")

    def _out_of_patience(self, outcome: Outcome) -> bool:
        """Whether ``budget.patience`` measured trials in a row have not beaten the best $/run
        by more than both measurements' 95% intervals."""
        patience = self.space.budget.patience
        if not outcome.feasible:
            return False
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
            return False
        if outcome.cost < best.cost:  # cheaper, but within the noise: same best, kept
            self.best = outcome
        self.since_best += 1
        if patience is not None and self.since_best >= patience:
            self._stop(
                f"no trial in the last {patience} beat the best $/run (trial {best.number}) "
                "by more than the measurements' noise (budget.patience)"
            )
            return True
        return False

    def _not_worth_it(self) -> bool:
        """Whether the next trial is expected to cost more than it would save over
        ``budget.planned_runs`` runs of the real job (see ``expected_saving``)."""
        runs = self.space.budget.planned_runs
        if runs is None or self.best is None or self.best.cost is None:
            return False
        window = max(_SAVING_WINDOW, self.space.budget.patience or 0)
        if self.measured < window or not self.gains:
            return False  # no improvement seen yet: nothing to expect from (budget.patience is)
        saving = expected_saving(self.gains, self.measured, window, self.best.cost, runs)
        trial_usd = statistics.median(self.trial_seconds) / 3600 * self.space.hardware.usd_per_hour
        if saving >= trial_usd:
            return False
        recent = sum(1 for at, _ in self.gains if at > self.measured - window)
        self._stop(
            f"the next trial is expected to save ${saving:,.4g} over {runs} planned run(s) "
            f"({recent} improvement(s) beyond noise in the last {window} trials) and to cost "
            f"${trial_usd:,.4g} of machine time (budget.planned_runs)"
        )
        return True

    # ------------------------------------------------------------------ Optuna

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
        if outcome.feasible:
            trial.set_constraint(CONSTRAINT, 0.0)
            self.study.tell(trial, outcome.cost)
        elif outcome.infeasible:
            if outcome.failure_kind is not None:
                trial.set_user_attr("failure_kind", outcome.failure_kind)
            trial.set_constraint(CONSTRAINT, 1.0)
            # a value is required; samplers that read constraints rank it below every
            # feasible trial whatever it is: the worst $/run so far keeps it in scale
            self.study.tell(trial, self._worst_cost())
        else:  # timed out, killed, a bug: nothing the sampler should learn from
            self.study.tell(trial, state=optuna.trial.TrialState.FAIL)

    def _worst_cost(self) -> float:
        costs = [o.cost for o in self.results.values() if o.cost is not None]
        return max(costs) if costs else 1.0


# The stopping rule of budget.planned_runs looks at improvements over at least this many trials.
_SAVING_WINDOW = 10


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


class _ChildExecutor:
    """Runs each trial in a child process (forked from the workload server) and records it
    in our tables."""

    def __init__(
        self,
        space: Space,
        store: Store,
        prepared: PreparedData,
        cache_dir: Path,
        observer: SweepObserver,
        server: ForkServer | None = None,
        worker_id: str | None = None,
    ) -> None:
        self.space, self.store, self.worker_id = space, store, worker_id
        self.prepared, self.cache_dir, self.observer, self.server = (
            prepared, cache_dir, observer, server,
        )  # fmt: skip

    def stop_requested(self) -> bool:
        return self.store.stop_requested(self.space.study)

    def earlier(self) -> dict[TrialConfig, Outcome]:
        """What the study's earlier trials gave (a resumed sweep)."""
        results = {}
        trials = self.store.list_trials(self.space.study, states=["complete", "failed", "pruned"])
        for t in trials:
            if t.failure_kind == "lost" and times_lost(trials, t.config) <= LOST_RETRIES:
                continue  # its worker died: the config is tried once more
            if (
                t.failure_kind == "interrupted"
                and times_lost(trials, t.config, "interrupted") <= LOST_RETRIES
            ):
                continue  # stopped before it measured anything: tried once more
            cost = t.cost_per_run_usd if t.state == "complete" else None
            results[TrialConfig.model_validate(t.config)] = Outcome(
                number=t.number,
                cost=cost,
                failure_kind=None if cost is not None else (t.failure_kind or "error"),
                predicted=t.state == "pruned",
                spread=t.cost_ci95_rel or 0.0,
            )
        return results

    def earlier_samples(self) -> dict[TrialConfig, list[Sample]]:
        """Each measurement of the study's earlier completed trials (a resumed sweep)."""
        samples: dict[TrialConfig, list[Sample]] = {}
        for t in self.store.list_trials(self.space.study, states=["complete"]):
            config = TrialConfig.model_validate(t.config)
            if t.remeasures:
                samples[config] = [Sample.from_json(s) for s in t.remeasures]
            elif t.cost_per_run_usd is not None and t.hours_per_run is not None:
                samples[config] = [
                    Sample(
                        kind="trial",
                        cost_per_run_usd=t.cost_per_run_usd,
                        hours_per_run=t.hours_per_run,
                        samples_per_s=t.samples_per_s,
                        tokens_per_s=t.tokens_per_s,
                        it_per_s=t.it_per_s,
                        ci95_rel=t.cost_ci95_rel,
                        contended=bool(t.contended),
                        peak_memory_bytes=t.peak_memory_bytes,
                    )
                ]
        return samples

    def claim(self, number: int, config: TrialConfig) -> int | None:
        key = hashlib.sha256(json_key(config.model_dump()).encode()).hexdigest()
        return self.store.claim(self.space.study, key, number, self.worker_id)

    def record_predicted(self, trial: optuna.Trial, config: TrialConfig, message: str) -> None:
        self.store.start_trial(self.space.study, trial.number, config.model_dump())
        self.store.finish_trial(
            self.space.study, trial.number, "pruned", failure_kind="oom", failure_message=message
        )

    def record_estimates(
        self, estimates: Mapping[int, tuple[Estimate, Sequence[Sample] | None]]
    ) -> None:
        self.store.record_estimates(self.space.study, estimates)

    def execute(self, trial: optuna.Trial, config: TrialConfig, left_s: float | None) -> Outcome:
        row, sample = self._run_one(trial, config, left_s)
        if row.state == "complete" and row.cost_per_run_usd is not None and sample is not None:
            return Outcome(
                number=row.number,
                cost=row.cost_per_run_usd,
                spread=row.cost_ci95_rel or 0.0,
                sample=sample,
            )
        return Outcome(number=row.number, failure_kind=row.failure_kind or "error")

    def remeasure(
        self, number: int, config: TrialConfig, kind: SampleKind, left_s: float | None
    ) -> Sample | None:
        measured = self._measure(config, left_s)
        if measured.measurement is None or measured.projection is None:
            reason = measured.invalid or measured.run.result.failure_message or "no message"
            self.observer.note(
                f"#{number} could not be measured again ({kind}): "
                f"{measured.run.result.failure_kind or 'error'}: {reason}"
            )
            return None
        sample = measured.sample(kind)
        if not math.isfinite(sample.cost_per_run_usd):
            self.observer.note(f"#{number} measured again ({kind}): no usable throughput")
            return None
        self.observer.note(
            f"#{number} measured again ({_KIND_WORDS[kind]}): {sample.samples_per_s or 0:,.1f} "
            f"samples/s, ${sample.cost_per_run_usd:,.2f}/run"
            + (f" (contended: {sample.contention})" if sample.contended else "")
        )
        return sample

    def _measure(self, config: TrialConfig, left_s: float | None) -> _Measured:
        """Run ``config`` in a child and project its run; no trial is recorded."""
        space = self.space
        request = ChildRequest.for_space(
            "trial", space, self.cache_dir, prepared=self.prepared, config=config,
            settings=space.trial,
        )  # fmt: skip
        timeout_s = space.trial.timeout_s
        if left_s is not None and left_s < timeout_s:
            timeout_s = max(30.0, left_s)
        run = run_child(request, timeout_s=timeout_s, server=self.server)
        result = run.result
        measurement, invalid = _measurement_of(result.payload if result.status == "ok" else None)
        if measurement is None:
            return _Measured(run, timeout_s, None, invalid, None)
        measurement = measurement.with_inherited_startup(run.inherited_startup_s)
        projection = project_run(
            run_plan(space, self.prepared.stats),
            samples_per_s=measurement.samples_per_s,
            it_per_s=measurement.it_per_s,
            tokens_per_s=measurement.tokens_per_s,
            packing=config.packing,
            startup_s=measurement.startup_s,
            compile_s=measurement.compile_s,
            checkpoint_save_s=measurement.checkpoint_save_s,
        )
        return _Measured(run, timeout_s, measurement, None, projection)

    def _run_one(
        self, trial: optuna.Trial, config: TrialConfig, left_s: float | None = None
    ) -> tuple[TrialRow, Sample | None]:
        space, store, observer = self.space, self.store, self.observer
        store.start_trial(space.study, trial.number, config.model_dump(), self.worker_id)
        observer.trial_started(trial.number, config)
        try:
            measured = self._measure(config, left_s)
        except KeyboardInterrupt:
            _record_failure(
                store, trial, space.study, "interrupted", "the sweep was stopped by the user"
            )
            trial.study.tell(trial, state=optuna.trial.TrialState.FAIL)
            raise
        run, measurement, projection = measured.run, measured.measurement, measured.projection
        sample = None
        if measurement is not None and projection is not None:
            if math.isfinite(projection.cost_per_run_usd):
                sample = measured.sample("trial")
            for key, value in measurement.optuna_attrs().items():
                trial.set_user_attr(key, value)
            trial.set_user_attr("hours_per_run", projection.hours_per_run)
            trial.set_user_attr("effective_batch", config.effective_batch)
            if measurement.contended:
                trial.set_user_attr("contention", measurement.contention)
            row = store.finish_trial(
                space.study,
                trial.number,
                "complete",
                wall_s=run.wall_s,
                hours_per_run=projection.hours_per_run,
                cost_per_run_usd=projection.cost_per_run_usd,
                projection=projection.breakdown(),
                measurement=measurement.model_dump(),
                cost_ci95_rel=None if sample is None else sample.ci95_rel,
                contended=measurement.contended,
                **measurement.columns(),
            )
        elif measured.invalid is not None:
            # a child of another version, or an engine's typo: this trial fails, the sweep goes on
            row = _record_failure(
                store,
                trial,
                space.study,
                "error",
                measured.invalid,
                wall_s=run.wall_s,
                details={"payload": run.result.payload, "log_tail": run.log_tail},
            )
        else:
            result = run.result
            kind, message = result.failure_kind or "error", result.failure_message or "no message"
            if result.failure_kind == "timeout" and measured.timeout_s < space.trial.timeout_s:
                # the budget, not the config, ended it: a timeout would read as the config's
                kind = "interrupted"
                message = (
                    f"the sweep's time budget ran out {measured.timeout_s:.0f} s into this trial "
                    f"(trial.timeout_s is {space.trial.timeout_s:.0f} s): it says nothing about "
                    "the config, and the study's next launch runs it again"
                )
            row = _record_failure(
                store,
                trial,
                space.study,
                kind,
                message,
                wall_s=run.wall_s,
                details={"traceback": result.traceback, "log_tail": run.log_tail},
            )
        observer.trial_done(row)
        return row, sample


_KIND_WORDS = {
    "trial": "first measurement",
    "rerun": "the machine was shared",
    "final": "to separate the best",
    "drift": "drift reference",
}


@dataclass(frozen=True)
class _Measured:
    """One child run of a config: its measurement and projection, or why there is none."""

    run: ChildRun
    timeout_s: float
    measurement: Measurement | None
    invalid: str | None  # the payload was not a Measurement
    projection: RunProjection | None

    def sample(self, kind: SampleKind) -> Sample:
        m, p = self.measurement, self.projection
        assert m is not None and p is not None
        ci = m.throughput_ci95_rel
        return Sample(
            kind=kind,
            cost_per_run_usd=p.cost_per_run_usd,
            hours_per_run=p.hours_per_run,
            samples_per_s=m.samples_per_s,
            tokens_per_s=m.tokens_per_s,
            it_per_s=m.it_per_s,
            ci95_rel=ci if math.isfinite(ci) else None,
            contended=m.contended,
            contention=m.contention,
            peak_memory_bytes=m.peak_memory_bytes,
            at=now_iso(),
        )


def _record_failure(
    store: Store,
    trial: optuna.Trial,
    study_name: str,
    kind: str,
    message: str,
    *,
    wall_s: float | None = None,
    details: dict[str, Any] | None = None,
) -> TrialRow:
    trial.set_user_attr("failure_kind", kind)
    trial.set_user_attr("failure_message", message[:2000])
    row = store.finish_trial(
        study_name,
        trial.number,
        "failed",
        wall_s=wall_s,
        failure_kind=kind,
        failure_message=message,
        measurement=details,
    )
    if kind == "interrupted":  # nothing was measured: the config may run again
        store.release_claim(study_name, trial.number)
    return row


def _measurement_of(payload: dict[str, Any] | None) -> tuple[Measurement | None, str | None]:
    """A finished child's payload as a Measurement, or why it is not one (None, None: the
    child failed and said why itself)."""
    if payload is None:
        return None, None
    try:
        return parse_measurement(payload), None
    except MeasurementError as e:
        return None, str(e)


def run_plan(space: Space, dataset_stats: dict[str, Any] | None) -> RunPlan:
    """The real job of ``space``, as the cost model needs it."""
    return RunPlan(
        samples=space.workload.samples,
        epochs=space.workload.epochs,
        usd_per_hour=space.hardware.usd_per_hour,
        save_steps=space.workload.checkpoint.save_steps,
        tokens_per_sample=tokens_per_sample(dataset_stats),
    )
