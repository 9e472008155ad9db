"""A sweep's time budget (``--max-minutes``, ``budget.max_minutes``): preparation counts, and no
trial starts that the time left cannot hold."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

from sweeper.cli_sweep import NO_TRIAL_COMPLETED, outcome
from sweeper.space import Space, parse_space
from sweeper.store import Store
from sweeper.sweep.observer import SilentObserver
from sweeper.sweep.run import run_sweep
from tests.helpers import TINY_SPACE, tally_study


class _Notes(SilentObserver):
    def __init__(self) -> None:
        self.notes: list[str] = []

    def note(self, message: str) -> None:
        self.notes.append(message)


@pytest.mark.torch
def test_a_spent_budget_starts_no_trial(
    tiny_space: Space, sqlite_url: str, cache_dir: Path
) -> None:
    """0.6 s is gone before the first trial could start (the prepare child alone takes
    longer): the sweep ends cleanly with no trial, and says why."""
    observer = _Notes()
    report = run_sweep(
        tiny_space,
        storage_url=sqlite_url,
        cache_dir=cache_dir,
        space_text=TINY_SPACE.read_text(),
        n_trials=3,
        max_minutes=0.01,
        observer=observer,
    )
    assert report.trials_run == 0
    assert any("time budget is spent" in n for n in observer.notes), observer.notes
    assert report.stop_reason.startswith("the sweep's time budget is spent")
    store = Store(sqlite_url)
    assert store.get_study("tiny").state == "finished"
    assert store.list_trials("tiny") == []
    store.dispose()


def test_the_space_can_set_the_budget() -> None:
    space = parse_space(
        TINY_SPACE.read_text().replace("n_trials: 3", "n_trials: 3\n  max_minutes: 90")
    )
    assert space.budget.max_minutes == 90


@pytest.mark.torch
def test_a_trial_the_budget_cuts_is_interrupted_and_runs_again_at_the_next_launch(
    sqlite_url: str, cache_dir: Path
) -> None:
    """Seen on an H100: the budget killed the first trial 48 s in, and it was recorded as the
    config's timeout. The budget ended it, not the config: it is ``interrupted``, the sampler
    learns nothing from it, and the study's next launch runs that config first, once."""
    import yaml

    text = yaml.safe_load(TINY_SPACE.read_text())
    slow = copy.deepcopy(text)  # a window that would last 10 minutes
    slow["trial"]["measure"] = {
        "min_steps": 3,
        "max_steps": 10**6,
        "min_seconds": 600,
        "max_seconds": 600,
    }
    slow["trial"]["timeout_s"] = 900
    slow_text = yaml.safe_dump(slow)
    first = run_sweep(
        parse_space(slow_text),
        storage_url=sqlite_url,
        cache_dir=cache_dir,
        space_text=slow_text,
        n_trials=3,
        max_minutes=0.75,  # what preparing leaves (the trial's timeout is at least 30 s)
    )
    assert first.trials_run == 1, first.stop_reason
    store = Store(sqlite_url)
    try:
        (cut,) = store.list_trials("tiny")
        assert (cut.state, cut.failure_kind) == ("failed", "interrupted")
        assert "time budget ran out" in (cut.failure_message or "")
        assert "next launch runs it again" in (cut.failure_message or "")
    finally:
        store.dispose()
    # the last line: more time, not "fix what the failures say" (a walk read that advice for
    # a budget cut, with nothing to fix)
    said, code = outcome(sqlite_url, first, "tiny.yaml", 60.0)
    assert code == NO_TRIAL_COMPLETED and "cut by the sweep's time budget" in said, said
    assert "--max-minutes N" in said and "fix what" not in said and "doctor" not in said

    again = run_sweep(
        parse_space(TINY_SPACE.read_text()),
        storage_url=sqlite_url,
        cache_dir=cache_dir,
        space_text=TINY_SPACE.read_text(),
        n_trials=1,
    )
    assert again.completed == 1
    tally = tally_study(sqlite_url, "tiny", "budget cut, then a launch", requested=2)
    assert (tally.interrupted, tally.complete, tally.duplicates, tally.stuck) == (1, 1, 0, 0)
    store = Store(sqlite_url)
    try:
        retried = [t for t in store.list_trials("tiny") if t.state == "complete"]
        assert [t.config for t in retried] == [cut.config]  # the cut config, first
    finally:
        store.dispose()


@pytest.mark.torch
def test_a_space_smaller_than_n_trials_plans_what_it_holds(
    sqlite_url: str, cache_dir: Path
) -> None:
    """A space of 2 configs under n_trials 12 (init's default search is 3 batch sizes): the
    progress read "[1/12, about 21 min left]" and the page "of 12 planned" although the sweep
    could run 2. The plan is what the space holds, said once."""
    text = (
        TINY_SPACE.read_text()
        .replace("attn_implementation: [sdpa, eager]", "attn_implementation: [eager]")
        .replace("per_device_batch_size: [2, 4]", "per_device_batch_size: [2]")
    )
    planned: list[int] = []

    class Plans(_Notes):
        def planned(self, trials: int) -> None:
            planned.append(trials)

    observer = Plans()
    report = run_sweep(
        parse_space(text), storage_url=sqlite_url, cache_dir=cache_dir, space_text=text,
        n_trials=12, observer=observer,
    )  # fmt: skip
    assert report.completed == 2
    assert planned == [2]
    assert any("the space holds 2 configs not yet measured here: 2 trials, not 12" in n
               for n in observer.notes), observer.notes  # fmt: skip
    store = Store(sqlite_url)
    try:
        assert store.get_study("tiny").n_trials_planned == 2
    finally:
        store.dispose()
