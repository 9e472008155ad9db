"""The machine time a sweep uses, charged to its study and its worker as it goes."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

from sweeper.errors import SweeperError
from sweeper.store import Store


@dataclass
class _Owed:
    """Device time not yet charged to one account (the study, or the worker): the wall time
    since ``since`` plus ``extra`` device-seconds beyond it."""

    since: float
    extra: float = 0.0

    def at(self, now: float) -> float:
        return now - self.since + self.extra

    def paid(self, now: float) -> None:
        self.since, self.extra = now, 0.0


class SweepClock:
    """Charges the device time a sweep uses (preparation, probes, trials) to its study and to
    its worker, as it goes (the study after each trial, the worker from the heartbeat too), so
    an interrupted sweep is accounted for and the study's other workers see what this one spent
    (``sweeper.sweep.share``). The study's sum is what the sweep cost: price per device-hour ×
    device-hours (a trial on 2 GPUs pays for both).

    Device time is wall time on one device, plus ``(N - 1) ×`` the seconds of each trial
    that held N devices (``add_device_seconds`` when it ends). ``since``: when the sweep
    started (``time.perf_counter()``): its preparation counts. The study and the worker are
    owed apart: the heartbeat pays the worker between trials, the study only after each."""

    def __init__(
        self, store: Store, study: str, worker_id: str | None = None, since: float | None = None
    ) -> None:
        self.store, self.study, self.worker_id = store, study, worker_id
        start = time.perf_counter() if since is None else since
        self._worker, self._study = _Owed(start), _Owed(start)
        self.charged_device_s = 0.0  # what the worker was charged so far
        self._lock = threading.Lock()  # the heartbeat's thread charges too

    def add_device_seconds(self, seconds: float) -> None:
        """Device time beyond the wall clock's: a trial on N devices adds (N - 1) × its
        seconds."""
        with self._lock:
            self._worker.extra += max(0.0, seconds)
            self._study.extra += max(0.0, seconds)

    def device_s(self) -> float:
        """The device-seconds this sweep used so far, charged or not."""
        with self._lock:
            return self.charged_device_s + self._worker.at(time.perf_counter())

    def charge(self) -> None:
        """Charge the study and the worker their device time, up to now."""
        with self._lock:
            now = time.perf_counter()
            study, device = self._study.at(now), self._worker.at(now)
            try:
                self.store.add_sweep_seconds(self.study, study, self.worker_id, device)
            except SweeperError:
                return  # accounting never stops a sweep; the next charge carries the time
            self._study.paid(now)
            self._worker.paid(now)
            self.charged_device_s += device

    def charge_worker(self) -> None:
        """Charge the worker its device time up to now, and the study nothing yet (the
        heartbeat's: the study row changes after each trial, and the API's caches with it)."""
        if self.worker_id is None:
            return
        with self._lock:
            now = time.perf_counter()
            device = self._worker.at(now)
            try:
                self.store.add_worker_seconds(self.worker_id, device)
            except SweeperError:
                return
            self._worker.paid(now)
            self.charged_device_s += device
