"""A sweep's time budget (``--max-minutes``, ``budget.max_minutes``): preparation counts, and no
trial starts that the time left cannot hold."""

from __future__ import annotations

from pathlib import Path

import pytest

from sweeper.space import Space, parse_space
from sweeper.store import Store
from sweeper.study import SilentObserver, run_sweep
from tests.helpers import TINY_SPACE


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
