"""A Ctrl-C that arrives twice (a user walk: the terminal's SIGINT reaches `launch --workers`
and each worker, and the launcher passes it on): the interrupted trial's recording is not cut
half-way, its claim does not outlive it, and a worker killed but not yet reaped by its parent
is not taken for a live one."""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import time

import optuna
import pytest

from sweeper.joining import process_alive
from sweeper.space import Space
from sweeper.store import Store
from sweeper.sweep.executor import interrupt_held
from sweeper.sweep.queue import enqueue_interrupted, json_key
from tests.helpers import STUDY_FIELDS


def test_a_second_interrupt_waits_while_a_stop_is_recorded() -> None:
    # as sweeper's CLI does (a background job's suite runs with SIGINT ignored: the CI's)
    outside = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        recorded = []
        with interrupt_held():
            os.kill(os.getpid(), signal.SIGINT)  # the second Ctrl-C, mid-recording
            time.sleep(0.05)
            recorded.append("the trial's row, its claim, Optuna's state")
        assert recorded  # reached: no KeyboardInterrupt cut it
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
        with pytest.raises(KeyboardInterrupt):  # and afterwards Ctrl-C stops as before
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(1)
    finally:
        signal.signal(signal.SIGINT, outside)


def test_a_retried_interrupted_trial_releases_the_claim_it_kept(
    storage_url: str, tiny_space: Space
) -> None:
    """Trial #12 was interrupted and its recording cut before it released its claim: the
    launch that queues its config again releases it, so the retry is not refused as
    "claimed by #12" (Optuna-only FAIL, the config never measured)."""
    assert tiny_space.baseline is not None
    config = tiny_space.baseline.as_config(tiny_space.search).model_dump()
    store = Store(storage_url)
    store.migrate()
    try:
        store.upsert_study(tiny_space.study, **STUDY_FIELDS)
        key = hashlib.sha256(json_key(config).encode()).hexdigest()  # as a worker claims
        assert store.claim(tiny_space.study, key, 12, "w") is None
        store.start_trial(tiny_space.study, 12, config, worker_id="w")
        store.finish_trial(tiny_space.study, 12, "failed", failure_kind="interrupted")
        assert store.claim(tiny_space.study, key, 14, "w2") == 12  # kept: the defect
        study = optuna.create_study()
        enqueue_interrupted(store, study, tiny_space)
        waiting = study.get_trials(states=(optuna.trial.TrialState.WAITING,))
        assert [t.user_attrs["retry_of"] for t in waiting] == [12]
        assert store.claim(tiny_space.study, key, 14, "w2") is None  # the retry takes it
    finally:
        store.dispose()


def test_a_killed_worker_not_yet_reaped_is_not_alive() -> None:
    child = subprocess.Popen(["sleep", "60"])
    try:
        assert process_alive(child.pid)
        os.kill(child.pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while process_alive(child.pid) and time.monotonic() < deadline:
            time.sleep(0.05)  # a zombie now: its exit not collected (no wait yet)
        assert not process_alive(child.pid)
        assert os.path.exists(f"/proc/{child.pid}")  # still in the process table
    finally:
        child.kill()
        child.wait()
    assert not process_alive(child.pid)
