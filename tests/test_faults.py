"""Faults an operator meets, with real processes and a real Postgres: the server going away
under a running sweep."""

from __future__ import annotations

import subprocess
import time

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
