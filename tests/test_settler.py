"""The end re-measure, once for a study's run (``sweeper.sweep.settler``; a user walk found
three workers of one launch re-measuring three different "top 3" sets, each its own trials,
side by side on one machine).

The store side is real (SQLite and Postgres: the marks are claims, atomic as claims are); the
loop side runs the sweep's own loop on a real in-memory Optuna study with scripted
measurements (what is under test is which configs it measures again).
"""

from __future__ import annotations

import os
import socket

import optuna

from sweeper.preflight import PreflightReport
from sweeper.store import Store
from sweeper.sweep import settler
from sweeper.sweep.loop import SearchLoop
from sweeper.sweep.outcome import Outcome
from tests.helpers import STUDY_FIELDS, Notes
from tests.test_noise import _sample, _Script, _space, storage  # noqa: F401 (a fixture)


def _workers(url: str, *ids: str) -> Store:
    """A study with live workers ``ids``: this host, this process (not taken for dead)."""
    store = Store(url)
    store.migrate()
    store.upsert_study("s", **STUDY_FIELDS)
    for worker_id in ids:
        store.register_worker("s", worker_id, socket.gethostname(), os.getpid())
    return store


def test_a_lone_worker_measures_again_itself(storage_url: str) -> None:
    store = _workers(storage_url, "only")
    try:
        assert settler.leaves_it(store, "s", "only", grace_s=60) is None
    finally:
        store.dispose()


def test_the_last_worker_to_finish_searching_measures_again_for_the_run(
    storage_url: str,
) -> None:
    store = _workers(storage_url, "a", "b", "c")
    try:
        why = settler.leaves_it(store, "s", "a", grace_s=60)  # b and c still search
        assert why is not None and why.startswith("2 other workers of this study are still")
        why = settler.leaves_it(store, "s", "b", grace_s=60)  # c still searches
        assert why is not None and why.startswith("1 other worker of this study is still")
        assert settler.leaves_it(store, "s", "c", grace_s=60) is None  # the last: it does
        # a worker that ended (a, b exit after leaving it) is no longer waited for
        store.end_worker("a")
        store.end_worker("b")
        assert settler.leaves_it(store, "s", "c", grace_s=60) is None  # asked again: still it
    finally:
        store.dispose()


def test_two_workers_that_finish_together_measure_again_once(storage_url: str) -> None:
    store = _workers(storage_url, "a", "b")
    try:  # b's search ended a moment before a asks: both see both marks, one settles
        store.claim("s", settler.SEARCHED + "b", settler.MARK, "b")
        assert settler.leaves_it(store, "s", "a", grace_s=60) is None
        why = settler.leaves_it(store, "s", "b", grace_s=60)
        assert why == "another worker of this study's run measures its best configs again"
    finally:
        store.dispose()


def test_a_worker_that_died_searching_is_not_waited_for(storage_url: str) -> None:
    store = _workers(storage_url, "a")
    try:  # b's process is gone (a pid of this host that no process has)
        store.register_worker("s", "b", socket.gethostname(), 2**22 + 12345)
        assert settler.leaves_it(store, "s", "a", grace_s=60) is None
    finally:
        store.dispose()


def test_the_settling_worker_measures_the_best_of_every_workers_trials(
    storage: optuna.storages.RDBStorage,  # noqa: F811
) -> None:
    """This worker measured batches 1 and 8 (12.00 and 9.00: nothing to separate); another
    worker measured 2 and 4 (5.00 and 5.15, ±2%: their intervals overlap). Taken in, those
    two are measured again, under the other worker's trial numbers."""
    space = _space("  remeasure: {rounds: 2, top: 3, drift_every: null, contended_reruns: 0}\n")
    script = _Script({1: [12.0], 2: [4.95], 4: [5.2], 8: [9.0]}, ci=0.02)
    study = optuna.create_study(study_name=space.study, storage=storage, direction="minimize")
    for batch in (1, 8):
        study.enqueue_trial(
            {"per_device_batch_size": batch, "gradient_accumulation_steps": 1,
             "attn_implementation": "eager"}
        )  # fmt: skip
    notes = Notes()
    loop = SearchLoop(space, study, script, PreflightReport(), notes, seed=0)  # type: ignore[arg-type]
    loop.run(2)
    assert sorted(c.per_device_batch_size for c in loop.results) == [1, 8]
    assert len(loop.remeasure.contenders()) == 1  # its own trials: nothing to separate
    mine = next(iter(loop.results))
    theirs, samples = {}, {}
    for number, (batch, cost) in enumerate([(2, 5.0), (4, 5.15)], start=7):
        config = mine.model_copy(update={"per_device_batch_size": batch})
        sample = _sample(cost, ci=0.02)
        theirs[config] = Outcome(number=number, cost=cost, spread=0.02, sample=sample)
        samples[config] = [sample]
    theirs[mine] = Outcome(number=99, cost=1.0, spread=0.02)  # a config it knows: its own kept
    assert loop.remeasure.take_in(theirs, samples) == [7, 8]
    assert loop.results[mine].number != 99
    loop.settle()
    final = [(b, k) for b, k in script.calls if k == "final"]
    assert final == [(2, "final"), (4, "final")], script.calls
    assert any(n.startswith("measuring #7, #8 again (round 1 of 2)") for n in notes.notes)
    assert script.estimates[7].n == 2 and script.estimates[8].n == 2
