"""Faults an operator meets, with real processes and a real Postgres: the server going away
under a running sweep."""

from __future__ import annotations

import multiprocessing
import subprocess
import time
from typing import Any

import optuna
import pytest

from sweeper.store import Store
from tests.helpers import TINY_SPACE
from tests.test_cli import _launch, _wait_for_a_running_trial, env  # noqa: F401 (fixture)

PG_CTL = ["pg_ctlcluster", "--skip-systemctl-redirect", "15", "main"]


def _postgres(action: str) -> None:
    done = subprocess.run([*PG_CTL, action], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"pg_ctlcluster {action}: {done.stderr}"


@pytest.mark.torch
@pytest.mark.postgres
def test_a_postgres_outage_mid_sweep_loses_no_trial(
    postgres_url: str,
    env: dict[str, str],  # noqa: F811
) -> None:
    process = _launch(TINY_SPACE, postgres_url, env, "--n-trials", "3")
    store = Store(postgres_url, retry_s=120)
    try:
        _wait_for_a_running_trial(process, store)
        store.dispose()
        # down for longer than the trial has left: it ends while the server is away, and
        # its measurement must be written once the server is back
        _postgres("stop")
        time.sleep(12)
        _postgres("start")
        stdout, stderr = process.communicate(timeout=600)
        assert process.returncode == 0, stderr[-4000:]
        assert "Traceback" not in stderr + stdout
        trials = store.list_trials("tiny")
        assert [t.state for t in trials] == ["complete"] * 3, [
            (t.number, t.state, t.failure_message) for t in trials
        ]
        assert store.get_study("tiny").state == "finished"
        storage = optuna.storages.RDBStorage(postgres_url)
        try:
            states = [t.state for t in optuna.load_study(study_name="tiny", storage=storage).trials]
        finally:
            storage.engine.dispose()
        assert optuna.trial.TrialState.RUNNING not in states
    finally:
        subprocess.run([*PG_CTL, "start"], capture_output=True, timeout=120)  # if a step failed
        store.dispose()
        if process.poll() is None:
            process.kill()
            process.communicate()


def _start_worker(url: str, barrier: Any, results: Any) -> None:
    """What a worker does first on a database: our tables, then Optuna's."""
    from sweeper.store import Store
    from sweeper.study import optuna_storage

    barrier.wait()
    try:
        store = Store(url)
        store.migrate()
        optuna_storage(url).engine.dispose()
        store.dispose()
        results.put("ok")
    except Exception as e:  # reported to the test, which shows it
        results.put(f"{type(e).__name__}: {e}")


@pytest.mark.postgres
@pytest.mark.parametrize("attempt", [1, 2])
def test_workers_starting_together_on_an_empty_database_do_not_race(
    postgres_url: str, attempt: int
) -> None:
    context = multiprocessing.get_context("spawn")
    barrier, results = context.Barrier(6), context.Queue()
    workers = [
        context.Process(target=_start_worker, args=(postgres_url, barrier, results))
        for _ in range(6)
    ]
    for worker in workers:
        worker.start()
    outcomes = [results.get(timeout=120) for _ in workers]
    for worker in workers:
        worker.join(timeout=60)
    assert outcomes == ["ok"] * 6, outcomes
