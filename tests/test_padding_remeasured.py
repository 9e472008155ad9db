"""A config measured again keeps its padding share: the pooled estimate replaces a trial's
tokens/s, and its padded tokens/s follow (the padding is the batches', not the machine's).

Found walking a script sweep on a shared CPU: trial #3's first window padded 19% of what it
computed (192.9 tokens a row, 156.6 real), its fastest re-measure became the row's tokens/s
(407) beside the first window's padded tokens/s (226), and `best` said "padding 0% of
computed tokens"."""

from __future__ import annotations

import pytest

from sweeper.noise import Estimate, Sample
from sweeper.recommend import best
from sweeper.store import Store
from tests.helpers import STUDY_FIELDS, tiny_config


def _sample(kind: str, tokens_per_s: float) -> Sample:
    samples_per_s = tokens_per_s / 156.6
    hours = 300 * 2 / samples_per_s / 3600
    return Sample(
        kind=kind,  # type: ignore[arg-type]
        cost_per_run_usd=hours * 0.1,
        hours_per_run=hours,
        samples_per_s=samples_per_s,
        tokens_per_s=tokens_per_s,
        it_per_s=samples_per_s / 2,
        ci95_rel=0.4,
        contended=True,
    )


def test_a_remeasured_configs_padding_share_is_its_batches(sqlite_url: str) -> None:
    store = Store(sqlite_url)
    try:
        store.migrate()
        store.upsert_study("pad", **STUDY_FIELDS)
        store.start_trial("pad", 0, tiny_config().model_dump())
        first = _sample("trial", 183.8)
        store.finish_trial(
            "pad", 0, "complete", samples_per_s=first.samples_per_s,
            tokens_per_s=183.8, padded_tokens_per_s=226.4, it_per_s=first.it_per_s,
            hours_per_run=first.hours_per_run, cost_per_run_usd=first.cost_per_run_usd,
        )  # fmt: skip
        assert best(store, "pad").padding_share == pytest.approx(1 - 183.8 / 226.4)
        again = [first, _sample("rerun", 292.99), _sample("final", 407.4)]
        fastest = again[-1]  # contended throughout: the fastest measurement counts
        estimate = Estimate(
            cost_per_run_usd=fastest.cost_per_run_usd,
            hours_per_run=fastest.hours_per_run,
            samples_per_s=fastest.samples_per_s,
            tokens_per_s=407.4,
            it_per_s=fastest.it_per_s,
            ci95_rel=0.4,
            n=1,
            contended=True,
            dropped=2,
        )
        store.record_estimates("pad", {0: (estimate, again)})
        store.record_estimates("pad", {0: (estimate, again)})  # written again: the same
        (trial,) = store.list_trials("pad")
        assert trial.tokens_per_s == pytest.approx(407.4)
        assert best(store, "pad").padding_share == pytest.approx(1 - 183.8 / 226.4)
    finally:
        store.dispose()
