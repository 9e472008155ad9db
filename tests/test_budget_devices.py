"""The sweep's own budget in dollars (``budget.max_usd``) and device-hours counts every device
a trial holds: a trial on N devices spends N × the device price for its duration (issue 35).
The search loop runs on a real Optuna study in SQLite with a table for trials (as in
tests/test_search.py); what is under test is the accounting and what the loop does with it."""

from __future__ import annotations

import time
from collections.abc import Iterator

import optuna
import pytest

from sweeper.preflight import PreflightReport
from sweeper.space import TrialConfig, parse_space
from sweeper.space_budget import Budget
from sweeper.sweep.loop import SearchLoop
from sweeper.sweep.observer import SilentObserver
from sweeper.sweep.outcome import Outcome
from sweeper.sweep.stopping import TimeBudget, device_hours_limit
from tests.test_search import SPACE, _Table


def test_a_trial_on_n_devices_spends_n_devices_time() -> None:
    now = time.monotonic()
    one, four = TimeBudget(device_deadline=now + 1000), TimeBudget(device_deadline=now + 1000)
    for _ in range(2):
        one.took(100, devices=1)
        four.took(100, devices=4)
    # one device: 200 of 1000 device-seconds spent by trials (the wall clock spends the rest)
    assert one.device_left_s() == pytest.approx(1000, abs=5)
    assert one.why_spent(one.left_s()) is None
    # four devices: 3 × 100 more per trial; 400 left cannot pay for another 400
    assert four.device_left_s() == pytest.approx(400, abs=5)
    assert four.longest_device_s == 400 and four.longest_s == 100
    assert four.left_s(devices=4) == pytest.approx(100, abs=2)  # wall seconds 4 devices may run
    reason = four.why_spent(four.left_s())
    assert reason is not None and "device-time budget is spent" in reason, reason
    assert "the costliest trial took 400" in reason


def test_the_budgets_limit_in_device_hours() -> None:
    assert device_hours_limit(Budget(n_trials=3, max_usd=5), 2.5) == 2.0
    assert device_hours_limit(Budget(n_trials=3, max_usd=5, max_device_hours=1), 2.5) == 1.0
    assert device_hours_limit(Budget(n_trials=3, max_minutes=30), 2.5) is None


class _Timed(_Table):
    """The table, noting the time limit each trial was given."""

    def __init__(self) -> None:
        super().__init__()
        self.left: list[float | None] = []

    def execute(self, trial: optuna.Trial, config: TrialConfig, left_s: float | None) -> Outcome:
        self.left.append(left_s)
        time.sleep(0.05)
        return super().execute(trial, config, left_s)


@pytest.fixture
def storage(sqlite_url: str) -> Iterator[optuna.storages.RDBStorage]:
    storage = optuna.storages.RDBStorage(sqlite_url)
    yield storage
    storage.engine.dispose()


def _two_device_loop(storage: optuna.storages.RDBStorage) -> tuple[SearchLoop, _Timed]:
    space = parse_space(SPACE.replace("search:\n", "search:\n  devices: [2]\n"))
    study = optuna.create_study(study_name=space.study, storage=storage, direction="minimize")
    timed = _Timed()
    return SearchLoop(space, study, timed, PreflightReport(), SilentObserver()), timed


def test_the_loop_caps_a_two_device_trial_at_half_the_device_time_left(
    storage: optuna.storages.RDBStorage,
) -> None:
    loop, timed = _two_device_loop(storage)
    loop.run(1, device_deadline=time.monotonic() + 100)
    (left,) = timed.left
    assert left is not None and 40 < left <= 50  # 100 device-seconds ÷ 2 devices
    (seconds,) = loop.time.trial_seconds
    assert loop.time.trial_device_seconds == [pytest.approx(2 * seconds)]


def test_the_loop_stops_when_the_device_time_is_spent(
    storage: optuna.storages.RDBStorage,
) -> None:
    loop, timed = _two_device_loop(storage)
    counts = loop.run(5, device_deadline=time.monotonic() - 1)
    assert counts["run"] == 0 and timed.ran == []
    assert "device-time budget is spent" in loop.stop_reason
