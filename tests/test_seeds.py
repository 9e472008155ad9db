"""The seeds' jobs as spaces (spaces/seed-000.yaml, spaces/seed-001.yaml), run on this CPU with
their small stand-in model: each runs its "before" and the notes' "after" config first, and the
decision says what the notes could not."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from sweeper.recommend import best
from sweeper.space import Space, load_space
from sweeper.store import Store, TrialRow
from sweeper.study import run_sweep
from tests.helpers import REPO

pytestmark = pytest.mark.torch  # each test runs a real sweep


def _quick(space: Space) -> Space:
    """The same space with trials cut to a few steps and no preflight: the job is unchanged."""
    trial = space.trial.model_copy(
        update={
            "preflight": False,
            "warmup": space.trial.warmup.model_copy(update={"min_steps": 1, "max_steps": 3}),
            "measure": space.trial.measure.model_copy(
                update={"min_steps": 3, "max_steps": 3, "min_seconds": 0, "warmup_multiple": 0}
            ),
        }
    )
    return space.model_copy(update={"trial": trial})


def _run_known_configs(path: Path, url: str, cache_dir: Path) -> tuple[Space, list[TrialRow]]:
    space = load_space(path)
    known = space.known_configs()
    report = run_sweep(
        _quick(space),
        storage_url=url,
        cache_dir=cache_dir,
        space_text=path.read_text(),
        space_path=str(path),
        n_trials=len(known),
    )
    assert report.completed == len(known), report
    store = Store(url)
    trials = store.list_trials(space.study, include_measurement=True)
    store.dispose()
    # the baseline first, then the notes' own config, exactly as written in the space
    assert [t.config for t in trials] == [c.model_dump() for c in known]
    return space, trials


def test_seed_000(sqlite_url: str, cache_dir: Path) -> None:
    path = REPO / "spaces" / "seed-000.yaml"
    space, (before, after) = _run_known_configs(path, sqlite_url, cache_dir)
    job = space.workload
    assert (job.samples, job.epochs, space.hardware.usd_per_hour) == (600_000, 3, 2.5)
    assert job.checkpoint.save_steps == 1000
    assert (before.config["per_device_batch_size"], before.config["num_workers"]) == (2, 8)
    # the notes' checkpoint arithmetic, with a save measured here: 1.8M samples at effective
    # batch 16 is 112,500 steps, 112 saves; the "faster" batch 8 doubles the steps and saves
    for trial, batch in ((before, 16), (after, 8)):
        part = trial.projection
        assert part["optimizer_steps"] == pytest.approx(1_800_000 / batch)
        assert part["checkpoint_saves"] == pytest.approx(1_800_000 / batch / 1000, abs=1)
        assert part["checkpoint_s"] == pytest.approx(
            part["checkpoint_saves"] * trial.measurement["checkpoint_save_s"]
        )
        assert trial.measurement["checkpoint_bytes"] > 0
    store = Store(sqlite_url)
    r = best(store, "seed-000")
    store.dispose()
    assert r.baseline_trial_number == before.number
    assert r.trial_number in (before.number, after.number)
    # priced as the H100, measured on this CPU: the answer says so instead of passing it off
    assert any(w.startswith("priced as H100 80GB (Vast.ai) but measured on") for w in r.warnings)
    if r.trial_number == after.number:  # effective batch 16 → 8: LR advice comes with it
        assert r.suggested_learning_rate == pytest.approx(1e-4 * math.sqrt(0.5))
    assert r.sweep_cost_usd and r.sweep_cost_usd > 0


def test_seed_001(sqlite_url: str, cache_dir: Path) -> None:
    path = REPO / "spaces" / "seed-001.yaml"
    space, (before, after) = _run_known_configs(path, sqlite_url, cache_dir)
    assert (before.config["max_seq_length"], after.config["max_seq_length"]) == (2048, 1536)
    # the trap: halving accumulation doubles it/s by itself; samples/s is what a run needs
    it_ratio = after.it_per_s / before.it_per_s
    samples_ratio = after.samples_per_s / before.samples_per_s
    assert it_ratio == pytest.approx(2 * samples_ratio, rel=1e-9)
    # right-sizing: 1536 holds the longest sample (so neither truncates) and pads less
    store = Store(sqlite_url)
    stats = store.get_study("seed-001").dataset_stats
    r = best(store, "seed-001")
    store.dispose()
    assert stats["tokens_max"] + 1 <= 1536 < 2048
    assert r.coverage_length == stats["tokens_max"] + 1 and r.excluded == ()
    padding = {t.number: t.measurement["padding_share"] for t in (before, after)}
    assert padding[before.number] > padding[after.number] > 0.3
    # save_steps 100 for both: the "after" run takes twice the steps, so twice the saves
    saves = after.projection["checkpoint_saves"] / before.projection["checkpoint_saves"]
    assert saves == pytest.approx(2, rel=0.05)
    # the decision is by $/run, and it is compared with "before"
    assert r.baseline_trial_number == before.number
    cheaper = min((before, after), key=lambda t: (t.cost_per_run_usd, t.number))
    assert r.trial_number == cheaper.number
    assert r.speedup_vs_baseline == pytest.approx(before.hours_per_run / cheaper.hours_per_run)
