"""One device-time budget for all the workers of a study (``budget.max_usd``,
``budget.max_device_hours``): what they used together is read back from the store, so K
workers (``launch --workers K``, ``sweeper worker`` on other machines) stop at the study's
budget, not at K times it.

What counts is the study's *run*: the workers whose lives overlap, one after another, up to
now (those of one launch, and any that joined while one of them was alive). A study launched
again after all its workers ended starts a new run with the whole budget, as one worker did
before. Each worker's device time is its wall time on one device plus ``(N - 1) ×`` the
seconds of its trials on N devices (``SweepClock``); another worker's running trial on N
devices counts its ``N - 1`` extra devices from its start. A worker may spend its share of
what is left, the time left divided by the run's live workers, so that the last trials the
workers start together fit in the budget.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from sweeper.errors import SweeperError
from sweeper.store import Store
from sweeper.store.models import WorkerRow
from sweeper.store.store import as_utc as _utc
from sweeper.sweep.clock import SweepClock

_FRESH_S = 1.0  # how long a read of the store stands


@dataclass(frozen=True)
class WorkerUse:
    """One worker's device-seconds, as charged to the store (``mine``: this worker's own,
    counted to the moment)."""

    worker_id: str
    host: str
    pid: int
    device_s: float
    alive: bool
    trials: int


@dataclass(frozen=True)
class RunUse:
    """What the run's workers used together, in device-seconds, and how many are alive."""

    used_s: float
    live: int
    workers: tuple[WorkerUse, ...]


def the_run(workers: Sequence[WorkerRow], worker_id: str | None, now: datetime) -> list[WorkerRow]:
    """The workers of ``worker_id``'s run: the chain of workers whose lives overlap that
    reaches it (the latest chain without ``worker_id``). A worker's life ends at its
    ``finished_at``, at its last heartbeat if it was lost, and at ``now`` while alive."""
    chains: list[list[WorkerRow]] = []
    end: datetime | None = None
    for worker in sorted(workers, key=lambda w: (_utc(w.started_at), w.id)):
        start = _utc(worker.started_at)
        ended = worker.finished_at or worker.heartbeat_at
        until = now if worker.state == "alive" else _utc(ended)
        if end is None or start > end:
            chains.append([])
            end = until
        chains[-1].append(worker)
        end = max(end, until)
    for chain in chains:
        if any(w.id == worker_id for w in chain):
            return chain
    return chains[-1] if chains else []


class StudyShare:
    """The study's device-time limit (``limit_s`` device-seconds) and what the workers of this
    worker's run used of it, read from the store; this worker's own time counted to the
    moment (its clock), not to its last charge. A store that cannot be read (the database
    away) leaves the last figure, with this worker's time since added."""

    def __init__(self, store: Store, study: str, clock: SweepClock, limit_s: float) -> None:
        assert clock.worker_id is not None, "a shared budget is counted per worker"
        self.store, self.study, self.clock, self.limit_s = store, study, clock, limit_s
        self._last: RunUse | None = None
        self._others_s = 0.0  # the other workers' device-seconds at the last read
        self._read_at = -_FRESH_S

    def use(self) -> RunUse:
        """What the run used, read from the store at most once a second (the loop asks
        several times per proposal); this worker's own time is always counted to now."""
        last = self._last
        if last is not None and time.monotonic() - self._read_at < _FRESH_S:
            return RunUse(self._others_s + self.clock.device_s(), last.live, last.workers)
        me = self.clock.worker_id
        try:
            rows = self.store.list_workers(self.study)
            running = self.store.list_trials(self.study, states=["running"])
        except SweeperError:
            live = 1 if last is None else last.live
            return RunUse(self._others_s + self.clock.device_s(), live, ())
        self._read_at = time.monotonic()
        now = datetime.now(UTC)
        trials = {w.id: n for w, n in rows}
        run = the_run([w for w, _ in rows], me, now)
        members = {w.id for w in run if w.state == "alive"}
        # another live worker's trial on N devices has run N - 1 devices beyond its wall time
        # (an ended worker's device time is all charged)
        in_flight: dict[str, float] = {}
        for trial in running:
            devices = int(trial.config.get("devices", 1) or 1)
            if trial.worker_id in members and trial.worker_id != me and devices > 1:
                seconds = max(0.0, (now - _utc(trial.started_at)).total_seconds())
                in_flight[trial.worker_id] = in_flight.get(trial.worker_id, 0.0) + (
                    (devices - 1) * seconds
                )
        uses = []
        for w in run:
            spent = self.clock.device_s() if w.id == me else w.device_seconds or 0.0
            spent += in_flight.get(w.id, 0.0)
            alive = w.state == "alive"
            uses.append(WorkerUse(w.id, w.host, w.pid, spent, alive, trials.get(w.id, 0)))
        used = sum(u.device_s for u in uses)
        live = max(1, sum(u.alive for u in uses))
        self._others_s = used - self.clock.device_s()
        self._last = RunUse(used, live, tuple(uses))
        return self._last

    def left_s(self) -> tuple[float, float, int]:
        """(device-seconds the study has left, this worker's share of them, live workers)."""
        use = self.use()
        left = self.limit_s - use.used_s
        return left, left / use.live, use.live


def plan_reached(
    store: Store,
    study: str,
    planned: int,
    worker_id: str,
    retry_waiting: Callable[[], bool] | None = None,
    *,
    fleet: bool = False,
) -> str | None:
    """Why a worker that joined a live run without a trial count of its own stops: the study
    has its ``planned`` trials, finished (lost and interrupted ones run again: not counted)
    or running on another worker. None: it may start one more, and always while a retry
    waits in the queue (``retry_waiting``: a preempted or lost trial's config, queued to run
    once more, is measured even when other configs have met the plan meanwhile). A store that
    cannot be read says nothing (the other limits still hold). ``fleet``: the worker is one of
    ``launch --workers`` (its share is a cap, and a worker that joined took part of the plan)."""
    if retry_waiting is not None and retry_waiting():
        return None
    try:
        trials = store.list_trials(study, states=["complete", "failed", "pruned", "running"])
    except SweeperError:
        return None
    taken = sum(
        t.failure_kind not in ("lost", "interrupted")
        if t.state != "running"
        else t.worker_id != worker_id
        for t in trials
    )
    if taken < planned:
        return None
    if fleet:
        return (
            f"the study has its {planned} planned trials ({taken} finished or running on the "
            "study's workers, a worker that joined the launch's run among them); this worker "
            "stops before its share"
        )
    return (
        f"the study has its {planned} planned trials ({taken} finished or running on the "
        "study's workers); this worker joined their run without --n-trials of its own"
    )
