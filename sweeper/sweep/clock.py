"""The machine time a sweep uses, charged to its study as it goes."""

from __future__ import annotations

import time

from sweeper.errors import SweeperError
from sweeper.store import Store


class SweepClock:
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
