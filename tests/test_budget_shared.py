"""One device-time budget for all the workers of a study (``sweeper.sweep.share``, issue 35):
what they used together is read from the store, a trial on N devices counting N × its
seconds, so two workers stop at the study's budget, not at twice it; each says what it used.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import optuna
import pytest
from fastapi.testclient import TestClient

from api.app import create_app
from sweeper.preflight import PreflightReport
from sweeper.space import Space, TrialConfig, parse_space
from sweeper.store import Store
from sweeper.store.models import WorkerRow
from sweeper.sweep.clock import SweepClock
from sweeper.sweep.loop import SearchLoop
from sweeper.sweep.observer import SilentObserver
from sweeper.sweep.outcome import Outcome
from sweeper.sweep.run import run_sweep
from sweeper.sweep.share import StudyShare, plan_reached, the_run
from tests.helpers import REPO, STUDY_FIELDS, TINY_SPACE, tiny_space_without_baseline
from tests.test_budget_devices import _Timed
from tests.test_cli import env  # noqa: F401 (a fixture)
from tests.test_search import SPACE


def _worker(name: str, start: int, end: int | None) -> WorkerRow:
    """A worker that lived from ``start`` to ``end`` seconds (None: alive)."""
    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    return WorkerRow(
        id=name, study_id=1, host="h", pid=1, state="alive" if end is None else "done",
        started_at=t0 + timedelta(seconds=start), heartbeat_at=t0 + timedelta(seconds=start),
        finished_at=None if end is None else t0 + timedelta(seconds=end),
    )  # fmt: skip


def test_the_run_is_the_chain_of_overlapping_workers() -> None:
    now = datetime(2026, 1, 1, tzinfo=UTC) + timedelta(seconds=1000)
    earlier = [_worker("old-a", 0, 100), _worker("old-b", 50, 120)]  # a launch that ended
    run = [_worker("a", 500, 700), _worker("b", 510, None), _worker("late", 900, None)]
    chain = the_run([*earlier, *run], "late", now)
    # "late" joined while "b" was alive, which overlapped "a": one run; the old launch is not
    assert sorted(w.id for w in chain) == ["a", "b", "late"]
    assert sorted(w.id for w in the_run([*earlier, *run], "old-a", now)) == ["old-a", "old-b"]
    # a worker lost at its last heartbeat (no finished_at) ends there
    lost = _worker("lost", 200, None)
    lost.state = "lost"
    assert [w.id for w in the_run([lost, _worker("next", 300, None)], "next", now)] == ["next"]


def _study_with_workers(url: str, *ids: str) -> Store:
    store = Store(url)
    store.migrate()
    store.upsert_study("s", **STUDY_FIELDS)
    for worker_id in ids:
        store.register_worker("s", worker_id, "host", 1)
    return store


def test_the_workers_share_what_the_study_has_left(storage_url: str) -> None:
    """Two workers of one study, each with its clock: each one's share counts the other's
    charged device time and a 2-device trial it is running, and halves what is left."""
    store = _study_with_workers(storage_url, "a", "b")
    try:
        a = SweepClock(store, "s", "a")
        b = SweepClock(store, "s", "b", since=time.perf_counter() - 100)  # 100 s on one device
        b.add_device_seconds(50)  # ...and a trial of 50 s on 2 devices
        b.charge()
        # the study's sum prices the sweep: both devices of the 2-device trial are paid for
        assert store.get_study("s").sweep_seconds == pytest.approx(150, abs=1)
        share = StudyShare(store, "s", a, limit_s=1000)
        use = share.use()
        assert use.live == 2
        assert {w.worker_id: round(w.device_s) for w in use.workers} == {"a": 0, "b": 150}
        left, mine, live = share.left_s()
        assert left == pytest.approx(850, abs=1) and mine == pytest.approx(425, abs=1)
        # b starts a trial on 2 devices 40 s ago: its second device counts from the start
        store.start_trial("s", 0, {"devices": 2}, worker_id="b")
        with store.session() as s:
            from sweeper.store.models import TrialRow

            row = s.query(TrialRow).one()
            row.started_at = datetime.now(UTC) - timedelta(seconds=40)
        time.sleep(1.1)  # past the read that stands for a second
        (b_use,) = [w for w in share.use().workers if w.worker_id == "b"]
        assert b_use.device_s == pytest.approx(190, abs=2)
        # the heartbeat's charge: the worker's device time, not the study row (whose changes
        # the API's caches follow)
        before = store.version("s")
        a.charge_worker()
        assert store.version("s") == before
        (a_row,) = [w for w, _ in store.list_workers("s") if w.id == "a"]
        assert a.charged_device_s > 0
        assert a_row.device_seconds == pytest.approx(a.charged_device_s)
        # b ends (its time all charged): a has the whole of what is left
        store.end_worker("b")
        time.sleep(1.1)
        left, mine, live = share.left_s()
        assert live == 1 and mine == pytest.approx(left)
        assert left == pytest.approx(850 - a.device_s(), abs=0.5)
        # REST lists each worker's device time
        with TestClient(create_app(storage_url)) as client:
            listed = client.get("/api/studies/s/workers").json()
        used = {w["id"]: w["device_seconds"] for w in listed}
        assert used["b"] == pytest.approx(150, abs=1)
        assert used["a"] == pytest.approx(a.charged_device_s)
    finally:
        store.dispose()


class _Slow(_Timed):
    def execute(self, trial: optuna.Trial, config: TrialConfig, left_s: float | None) -> Outcome:
        time.sleep(3)
        return super().execute(trial, config, left_s)


def test_a_loop_of_two_device_trials_stops_at_the_studys_budget(sqlite_url: str) -> None:
    """The loop, with the store's shared budget: another worker used most of it; a trial on 2
    devices is charged 2 × its seconds, and the loop stops when its share cannot hold one."""
    space = parse_space(SPACE.replace("search:\n", "search:\n  devices: [2]\n"))
    store = _study_with_workers(sqlite_url, "me", "other")
    storage = optuna.storages.RDBStorage(sqlite_url)
    try:
        study = optuna.create_study(study_name=space.study, storage=storage)
        # the other worker used 90 of the study's 100 device-seconds
        other = SweepClock(store, "s", "other", since=time.perf_counter() - 90)
        other.charge()
        slow = _Slow()
        loop = SearchLoop(space, study, slow, PreflightReport(), SilentObserver())
        clock = SweepClock(store, "s", "me")
        loop.run(5, clock, shared=StudyShare(store, "s", clock, limit_s=100))
        # 10 left, halved between the two live workers: 5 device-seconds, 2.5 s on 2 devices;
        # the 3 s trial spends 6 or more: what is left cannot hold another
        assert len(slow.ran) == 1
        (left,) = slow.left
        assert left is not None and 1.5 < left <= 2.5
        (seconds,) = loop.time.trial_seconds
        assert clock.charged_device_s >= 2 * seconds >= 6  # the second device counted
        assert "the study's device-time budget is spent" in loop.stop_reason
        assert "2 live worker(s)" in loop.stop_reason
    finally:
        storage.engine.dispose()
        store.dispose()


@pytest.mark.torch
def test_two_workers_stop_at_the_studys_budget_not_twice_it(
    tmp_path: Path,
    sqlite_url: str,
    env: dict[str, str],  # noqa: F811
) -> None:
    """`launch --workers 2` with a device-time budget (budget.max_device_hours) and more
    trials and configs than it can pay for: the two workers together use about the budget
    (each alone would have used all of it: twice), both run trials, each stops saying the
    study's budget is spent, and the launch says what each worker used."""
    # each worker's preparation and first trial take 30-60 s at load 10: a budget that
    # holds a few trials more, so that what the sharing leaves over is a small part of it
    limit_s = 200.0
    # 256 configs, 400 trials and 6-step windows: on a quiet machine the budget still ends the
    # sweep, not the plan or the space running out of configs (with 128 configs and 3-step
    # windows an idle CI machine ran all 128 within the budget)
    text = tiny_space_without_baseline()
    text = text.replace("[2, 4]", "[1, 2, 3, 4, 5, 6, 7, 8]")
    text = text.replace(
        "gradient_accumulation_steps: [1, 2]",
        f"gradient_accumulation_steps: {list(range(1, 17))}",
    )
    assert "    min_steps: 3\n    max_steps: 3\n" in text
    text = text.replace(
        "    min_steps: 3\n    max_steps: 3\n", "    min_steps: 6\n    max_steps: 6\n"
    )
    text = text.replace("n_trials: 3", f"n_trials: 400\n  max_device_hours: {limit_s / 3600}")
    space = tmp_path / "budget.yaml"
    space.write_text(text)
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "sweeper.cli", "launch", "--space", str(space)]
        + ["--storage", sqlite_url, "--workers", "2"],
        env=env, cwd=REPO, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    wall_s = time.monotonic() - started
    logs = Path(env["SWEEPER_CACHE_DIR"]) / "workers"
    worker_logs = [p.read_text() for p in sorted(logs.glob("tiny-*.log"))]
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:] + str(worker_logs)
    store = Store(sqlite_url)
    try:
        workers = store.list_workers("tiny")
    finally:
        store.dispose()
    assert len(workers) == 2
    used = sum(w.device_seconds for w, _ in workers)
    print(f"2 workers used {used:.0f} of {limit_s:.0f} device-seconds ({used / limit_s:.2f}x)")
    # each worker alone would stop near the whole budget (2 × it together); shared, about it:
    # above it by at most the trials the two started when their shares could still hold one
    assert 0.6 * limit_s < used < 1.4 * limit_s, (used, wall_s, worker_logs)
    assert all(n >= 1 for _, n in workers), [n for _, n in workers]
    for log in worker_logs:
        assert "the study's device-time budget is spent" in log, log[-3000:]
        assert re.search(r"device time: this worker used [\d,]+ device-seconds \(\d+% of", log)
    lines = re.findall(r"worker \d: \d+ trial\(s\), [\d,]+ device-seconds, \d+% of", done.stdout)
    assert len(lines) == 2, done.stdout
    assert re.search(r"the 2 workers used [\d,]+ device-seconds of the budget's 200", done.stdout)


def test_the_plan_counts_finished_trials_and_the_others_running_ones(sqlite_url: str) -> None:
    store = _study_with_workers(sqlite_url, "me", "other")
    try:
        for number, (state, kind) in enumerate(
            [("complete", None), ("failed", "oom"), ("failed", "lost"), ("failed", "interrupted")]
        ):
            store.start_trial("s", number, {}, worker_id="other")
            store.finish_trial("s", number, state, failure_kind=kind)
        # lost and interrupted trials run again: 2 of a plan of 3 taken
        assert plan_reached(store, "s", 3, "me") is None
        store.start_trial("s", 4, {}, worker_id="me")  # this worker's own: about to end
        assert plan_reached(store, "s", 3, "me") is None
        store.start_trial("s", 5, {}, worker_id="other")  # another's running trial counts
        reason = plan_reached(store, "s", 3, "me")
        assert reason is not None and "has its 3 planned trials (3 finished or running" in reason
        # a preempted trial's config queued to run once more runs beyond the plan
        assert plan_reached(store, "s", 3, "me", retry_waiting=lambda: True) is None
        assert plan_reached(store, "s", 3, "me", retry_waiting=lambda: False) == reason
    finally:
        store.dispose()


@pytest.mark.torch
def test_a_fleet_worker_stops_at_the_plan_when_a_joiner_took_part_of_it(
    tiny_space: Space, sqlite_url: str, cache_dir: Path
) -> None:
    """A worker of `launch --workers` (its share 2 of a fleet's 2) beside a worker that joined
    the run and is running a trial of its own: the study's plan (1 done + 2) is met after one
    trial of the fleet's worker, which stops before its share (the walk's 10 trials of a plan
    of 8: the joiner's trials came on top)."""
    text = TINY_SPACE.read_text()
    first = run_sweep(
        tiny_space, storage_url=sqlite_url, cache_dir=cache_dir, space_text=text, n_trials=1
    )
    assert first.completed == 1
    store = Store(sqlite_url)
    beating = threading.Event()

    def beat() -> None:  # the joiner stays alive: not reaped, its trial not taken for lost
        while not beating.wait(1.0):
            store.beat("joiner")

    heart = threading.Thread(target=beat, daemon=True)
    try:  # the joiner: alive (this process) and running a trial of the plan
        store.register_worker("tiny", "joiner", socket.gethostname(), os.getpid())
        assert tiny_space.baseline is not None
        config = tiny_space.baseline.as_config(tiny_space.search).model_dump()
        store.start_trial("tiny", 50, config, worker_id="joiner")
        heart.start()
        fleet = run_sweep(
            tiny_space, storage_url=sqlite_url, cache_dir=cache_dir, space_text=text,
            n_trials=2, fleet_trials=2,
        )  # fmt: skip
        assert fleet.trials_run == 1, fleet.stop_reason
        assert "the study has its 3 planned trials (3 finished or running" in fleet.stop_reason
        assert "stops before its share" in fleet.stop_reason
        assert store.get_study("tiny").n_trials_planned == 3
    finally:
        beating.set()
        if heart.is_alive():
            heart.join()
        store.dispose()


@pytest.mark.torch
def test_a_worker_joining_a_live_run_shares_its_planned_trials(
    tiny_space: Space, sqlite_url: str, cache_dir: Path
) -> None:
    """`sweeper worker --study` without --n-trials beside a live worker: it runs what the run's
    plan lacks, here nothing (1 planned, 1 done), instead of the space's 3 more of its own."""
    text = TINY_SPACE.read_text()
    first = run_sweep(
        tiny_space, storage_url=sqlite_url, cache_dir=cache_dir, space_text=text, n_trials=1
    )
    assert first.completed == 1
    store = Store(sqlite_url)
    try:  # a worker of the run still alive (this process: not taken for a dead one)
        store.register_worker("tiny", "alive", socket.gethostname(), os.getpid())
        joined = run_sweep(tiny_space, storage_url=sqlite_url, cache_dir=cache_dir, space_text=text)
        assert joined.trials_run == 0, joined.stop_reason
        assert "the study has its 1 planned trials" in joined.stop_reason
        assert store.get_study("tiny").n_trials_planned == 1  # shared, not added to
    finally:
        store.dispose()
