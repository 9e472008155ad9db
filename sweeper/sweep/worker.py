"""This sweep process as one worker of its study: membership, heartbeat and the reaper."""

from __future__ import annotations

import os
import socket
import threading
import uuid
from datetime import datetime

import optuna

from sweeper.errors import SweeperError
from sweeper.joining import gone_here, process_alive
from sweeper.search import WORKER_ATTR
from sweeper.space import Space
from sweeper.store import Store
from sweeper.store.optuna import fail_trial
from sweeper.store.retry import connection_lost
from sweeper.sweep.clock import SweepClock
from sweeper.sweep.outcome import Outcome, tell, worst_cost
from sweeper.sweep.queue import enqueue_lost


class Worker:
    """Registered, beating from a thread, and reaping the study's workers that went silent
    (their running trials are marked ``lost`` in both stores, and each such config is queued
    once more). The study's state follows its live workers: the last one to end sets it."""

    def __init__(
        self,
        store: Store,
        storage: optuna.storages.BaseStorage,
        study: optuna.Study,
        space: Space,
        heartbeat_s: float,
        grace_s: float,
    ) -> None:
        self.store, self.storage, self.study, self.space = store, storage, study, space
        self.heartbeat_s, self.grace_s = heartbeat_s, grace_s
        self.id = str(uuid.uuid4())
        # charged on each beat: the study's other workers see this one's time as it goes,
        # not only after each trial (``sweeper.sweep.share``)
        self.clock: SweepClock | None = None
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
                if self.clock is not None:
                    self.clock.charge_worker()
                self.reap()
            except Exception as e:
                if isinstance(e, SweeperError) or connection_lost(e):
                    continue  # the database is away: the next beat tries again
                raise

    def reap(self) -> None:
        # a worker of this host whose process is gone (killed, or stopped by a database it
        # lost) is reaped at once, not after the grace period
        gone = [
            w.id
            for w in self.store.live_workers(self.space.study, self.grace_s)
            if w.id != self.id and gone_here(w, self.heartbeat_s)
        ]
        for trial in self.store.reap(self.space.study, self.grace_s, gone):
            fail_trial(self.storage, self.space.study, trial.number)
            enqueue_lost(self.store, self.study, self.space, trial)
        self.settle_orphans()

    def settle_orphans(self) -> list[int]:
        """Tell Optuna the trials it still has RUNNING whose worker is no longer alive and
        whose row is not running (the reaper's business): the worker recorded the trial and
        lost the database before telling Optuna (told from our row now, as the worker would
        have), or lost it between asking and starting the trial (told failed, and the config's
        claim released). Without an owner to go by (a study from before ``WORKER_ATTR``), a
        trial asked more than the grace period ago. Returns the trial numbers told."""
        study = self.space.study
        running = self.study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,))
        if not running:
            return []
        live = {w.id for w in self.store.live_workers(study, self.grace_s)} | {self.id}
        study_id = self.storage.get_study_id_from_name(study)
        told: list[int] = []
        worst: float | None = None  # read once, and only if a trial needs telling
        for frozen in running:
            row = self.store.get_trial(study, frozen.number)
            if row is not None and row.state == "running":
                continue
            owner = (row.worker_id if row is not None else None) or frozen.user_attrs.get(
                WORKER_ATTR
            )
            if owner in live:
                continue  # telling it now, or about to
            if owner is None and _age_s(frozen.datetime_start) < self.grace_s:
                continue
            trial_id = self.storage.get_trial_id_from_study_id_trial_number(study_id, frozen.number)
            trial = optuna.trial.Trial(self.study, trial_id)
            if row is None:
                self.store.release_claim(study, frozen.number)
                trial.set_user_attr(
                    "skipped", "its worker stopped between asking for it and running it"
                )
                outcome = Outcome(number=frozen.number, failure_kind="lost")
            else:
                outcome = Outcome.of_row(row)
            if worst is None:
                completed = self.store.trial_metrics(study, states=["complete"])
                worst = worst_cost(t.cost_per_run_usd for t in completed)
            tell(self.study, trial, outcome, worst)
            told.append(frozen.number)
        return told

    def seed_name(self) -> str:
        """Which worker of the study this is, for its sampler's seed: the study's first live
        worker is "0" (it samples with the space's seed), one that joins others (launch
        --workers, sweeper worker, compose replicas) is named by its id."""
        live = self.store.live_workers(self.space.study, self.grace_s)
        first = min(live, key=lambda w: (w.started_at, w.id)).id if live else self.id
        return "0" if first == self.id else self.id

    def abandon(self) -> None:
        """Stop beating without a word to the database (it is away): this worker's row goes
        silent, and the next reaper (another worker's, or the study's next launch) marks its
        running trial lost and queues the config again."""
        self._stopped.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)

    def stop(self, state: str) -> None:
        """End this worker; the study takes ``state`` unless another worker is still alive."""
        self._stopped.set()
        if self._thread.is_alive():
            self._thread.join(timeout=30)
        self.store.end_worker(self.id)
        others = [w for w in self.store.live_workers(self.space.study, self.grace_s)]
        if not others:
            self.store.set_study_state(self.space.study, state)


def _age_s(started: datetime | None) -> float:
    """Seconds since ``started``, an Optuna time (naive, this machine's local time)."""
    return float("inf") if started is None else (datetime.now() - started).total_seconds()


def reap_killed(url: str, study: str, pids: list[int]) -> list[int]:
    """Mark the running trials of this host's workers ``pids``, which the caller saw die
    (``launch --workers``: a worker killed by a signal, its exit collected), lost and queue
    their configs again now, as a reaper does once a worker's heartbeats have aged. A walk's
    `kill -9` of one of two workers left its trial running and the study "running" after the
    launch ended: the other worker had finished before the dead one missed three heartbeats,
    and no worker was left to reap it. Returns the trial numbers marked lost."""
    from sweeper.settings import Settings
    from sweeper.space import parse_space
    from sweeper.store.optuna import optuna_storage
    from sweeper.sweep.prepare import resolve_lengths

    grace_s, here = Settings().worker_grace_s, socket.gethostname()
    store = Store(url)
    try:
        gone = [
            w.id
            for w in store.live_workers(study, grace_s)
            if w.host == here and w.pid in pids and not process_alive(w.pid)
        ]
        lost = store.reap(study, grace_s, gone)
        if not lost:
            return []
        row = store.get_study(study)
        space = resolve_lengths(parse_space(row.space_yaml, f"study {study!r}"), row.dataset_stats)
        storage = optuna_storage(url)
        try:
            optuna_study = optuna.load_study(study_name=study, storage=storage)
            for trial in lost:
                fail_trial(storage, study, trial.number)
                enqueue_lost(store, optuna_study, space, trial)
        finally:
            storage.engine.dispose()
        return [trial.number for trial in lost]
    finally:
        store.dispose()
