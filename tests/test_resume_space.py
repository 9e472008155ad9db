"""A study launched again with other lists in its space (a user walk: after the first trials
timed out, the space was made lighter, batch [4, 8, 16] -> [2, 4], and `launch` again crashed
with Optuna's "CategoricalDistribution does not support dynamic value space" after preparing
and preflight, leaving a trial RUNNING). It is refused before anything is written, exit 2,
with the changed lists and what to do."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import optuna
import pytest

from sweeper.store import Store
from tests.helpers import REPO, TINY_SPACE
from tests.test_cli import env  # noqa: F401 (a fixture)


def _asked_batch_from_2_4_8(sqlite_url: str) -> None:
    """A study "tiny" whose earlier launch asked the batch from [2, 4, 8] (TINY_SPACE's list
    is [2, 4])."""
    storage = optuna.storages.RDBStorage(sqlite_url)
    try:
        study = optuna.create_study(study_name="tiny", storage=storage, direction="minimize")
        trial = study.ask()
        trial.suggest_categorical("per_device_batch_size", [2, 4, 8])
        study.tell(trial, 1.0)
    finally:
        storage.engine.dispose()


@pytest.mark.torch
def test_a_space_whose_lists_changed_is_refused_before_anything_is_written(
    tmp_path: Path,
    sqlite_url: str,
    env: dict[str, str],  # noqa: F811
) -> None:
    _asked_batch_from_2_4_8(sqlite_url)  # the study's earlier launch
    space = tmp_path / "tiny.yaml"
    space.write_text(TINY_SPACE.read_text())  # its batch list: [2, 4]
    done = subprocess.run(
        [sys.executable, "-m", "sweeper.cli", "launch", "--space", str(space)]
        + ["--storage", sqlite_url, "--n-trials", "1"],
        env=env, cwd=REPO, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 2, done.stdout + done.stderr
    said = " ".join(done.stderr.split())
    assert "Traceback" not in done.stdout + done.stderr
    assert (
        "study 'tiny' was searched with other lists: per_device_batch_size [2, 4, 8] (now [2, 4])"
        in said
    )
    assert f"study: tiny-2 in {space}" in said and "put those lists back" in said
    storage = optuna.storages.RDBStorage(sqlite_url)
    try:  # nothing written: Optuna's study has its one trial, nothing running or queued
        trials = optuna.load_study(study_name="tiny", storage=storage).get_trials()
        assert [t.state for t in trials] == [optuna.trial.TrialState.COMPLETE]
    finally:
        storage.engine.dispose()
    store = Store(sqlite_url)
    try:
        assert not store.has_study("tiny")
    finally:
        store.dispose()


@pytest.mark.torch
def test_launch_workers_relays_the_refusal_with_its_exit_status(
    tmp_path: Path,
    sqlite_url: str,
    env: dict[str, str],  # noqa: F811
) -> None:
    """A walk's `launch --workers 2` of a space whose lists changed read "worker 0 exited 2
    (see ...log); worker 1 exited 2 (see ...)", exit 1, the refusal only in the logs: the
    launcher says it as a single launch does, exit 2."""
    _asked_batch_from_2_4_8(sqlite_url)
    space = tmp_path / "tiny.yaml"
    space.write_text(TINY_SPACE.read_text())
    done = subprocess.run(
        [sys.executable, "-m", "sweeper.cli", "launch", "--space", str(space), "--workers", "2"]
        + ["--storage", sqlite_url, "--n-trials", "2"],
        env=env, cwd=REPO, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    said = " ".join((done.stdout + done.stderr).split())
    assert done.returncode == 2, said
    assert (
        "study 'tiny' was searched with other lists: per_device_batch_size [2, 4, 8] (now [2, 4])"
        in said
    ), said
    assert "exited 2" not in said, said


def test_a_one_value_list_is_a_list_of_the_study_and_every_change_is_named_before_the_data(
    tmp_path: Path,
    sqlite_url: str,
    env: dict[str, str],  # noqa: F811
) -> None:
    """A walk widened max_seq_length [512] to [256, 512]: no refusal, and its next launch was
    refused against [256, 512]; a refusal named only the first changed list, after 12-15 s of
    data preparation and preflight. A one-value list is the study's list too, every changed
    list is named, and the refusal comes before the data is prepared (no torch needed)."""
    from tests.helpers import STUDY_FIELDS

    store = Store(sqlite_url)
    try:  # launched with the tiny space: batch [2, 4] searched, length [64] once
        store.migrate()
        store.upsert_study("tiny", **(STUDY_FIELDS | {"space_yaml": TINY_SPACE.read_text()}))
    finally:
        store.dispose()
    storage = optuna.storages.RDBStorage(sqlite_url)
    try:
        study = optuna.create_study(study_name="tiny", storage=storage, direction="minimize")
        trial = study.ask()
        trial.suggest_categorical("per_device_batch_size", [2, 4])
        study.tell(trial, 1.0)
    finally:
        storage.engine.dispose()
    text = TINY_SPACE.read_text()
    space = tmp_path / "tiny.yaml"
    space.write_text(
        text.replace("per_device_batch_size: [2, 4]", "per_device_batch_size: [2, 4, 8]")
        .replace("max_seq_length: [64]", "max_seq_length: [32, 64]")
    )  # fmt: skip
    assert space.read_text().count("[2, 4, 8]") == 1 and "[32, 64]" in space.read_text()
    done = subprocess.run(
        [sys.executable, "-m", "sweeper.cli", "launch", "--space", str(space)]
        + ["--storage", sqlite_url, "--n-trials", "1"],
        env=env, cwd=REPO, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    said = " ".join((done.stdout + done.stderr).split())
    assert done.returncode == 2, said
    assert "per_device_batch_size [2, 4] (now [2, 4, 8])" in said, said
    assert "max_seq_length [64] (now [32, 64])" in said, said
    assert "data:" not in said and "preflight" not in said, said  # refused before preparing
