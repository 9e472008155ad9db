"""The recommendation: $/run decides (never it/s), constraints filter, prices re-price,
and every answer is compared with the user's baseline."""

from __future__ import annotations

import pytest

from sweeper.errors import NoResultError, SpaceError
from sweeper.recommend import Constraints, best
from sweeper.space import parse_space
from sweeper.store import Store
from tests.helpers import STUDY_FIELDS, TINY_SPACE, tiny_config

SAMPLES = 600_000 * 3  # seed 000's job


def _config(batch: int, accumulation: int) -> dict:
    return tiny_config(
        per_device_batch_size=batch, gradient_accumulation_steps=accumulation
    ).model_dump()


@pytest.fixture
def store(sqlite_url: str) -> Store:
    store = Store(sqlite_url)
    store.migrate()
    # seed 001: "before" is batch 2 × accumulation 8 at 1.25 it/s (20 samples/s)
    store.upsert_study("seed", **(STUDY_FIELDS | {"baseline": _config(2, 8)}))
    trials = [
        (0, _config(2, 8), 1.25),  # the baseline
        (1, _config(2, 4), 2.2),  # more it/s, but 17.6 samples/s: slower per sample
        (2, _config(8, 1), 3.0),  # 24 samples/s: the cheapest
        (3, _config(4, 2), 2.9),  # 23.2 samples/s
    ]
    for number, config, it_per_s in trials:
        samples_per_s = (
            it_per_s * config["per_device_batch_size"] * config["gradient_accumulation_steps"]
        )
        hours = SAMPLES / samples_per_s / 3600
        store.start_trial("seed", number, config)
        store.finish_trial(
            "seed",
            number,
            "complete",
            it_per_s=it_per_s,
            samples_per_s=samples_per_s,
            hours_per_run=hours,
            cost_per_run_usd=hours * 2.5,
        )
    yield store
    store.dispose()


def test_it_per_s_never_decides(store: Store) -> None:
    recommendation = best(store, "seed")
    assert recommendation.trial_number == 2
    # trial 1 beats the baseline on it/s and still costs more per run than it
    trials = {t.number: t for t in store.list_trials("seed")}
    assert trials[1].it_per_s > trials[0].it_per_s
    assert trials[1].cost_per_run_usd > trials[0].cost_per_run_usd


def test_compared_with_the_baseline(store: Store) -> None:
    r = best(store, "seed")
    assert r.baseline_trial_number == 0
    assert r.baseline_hours_per_run == pytest.approx(SAMPLES / 20 / 3600)  # 25 h
    assert r.speedup_vs_baseline == pytest.approx(24 / 20)
    assert r.usd_saved_per_run == pytest.approx((SAMPLES / 20 - SAMPLES / 24) / 3600 * 2.5)


def test_repricing_moves_dollars_not_hours(store: Store) -> None:
    at_list = best(store, "seed")
    cheaper = best(store, "seed", Constraints(usd_per_hour=1.25))
    assert cheaper.trial_number == at_list.trial_number
    assert cheaper.hours_per_run == pytest.approx(at_list.hours_per_run)
    assert cheaper.cost_per_run_usd == pytest.approx(at_list.cost_per_run_usd / 2)
    assert cheaper.usd_per_hour == 1.25


def test_constraints_filter_and_explain(store: Store) -> None:
    within = best(store, "seed", Constraints(max_hours=22))  # 24 samples/s → 20.8 h
    assert within.trial_number == 2 and within.constraints == "within 22 h"
    with pytest.raises(NoResultError, match=r"meets within 10 h .* the fastest takes 20.8 h"):
        best(store, "seed", Constraints(max_hours=10))
    with pytest.raises(NoResultError, match=r"the cheapest costs \$52.08"):
        best(store, "seed", Constraints(max_cost_usd=50))


def test_baseline_must_be_in_the_search_space() -> None:
    text = TINY_SPACE.read_text().replace(
        "  per_device_batch_size: 2\n  gradient_accumulation_steps: 2\n  num_workers: 0",
        "  per_device_batch_size: 3\n  gradient_accumulation_steps: 2\n  num_workers: 0",
    )
    with pytest.raises(SpaceError, match=r"baseline.per_device_batch_size = 3 is not among"):
        parse_space(text, source="tiny.yaml")
