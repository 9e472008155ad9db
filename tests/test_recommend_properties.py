"""Properties of the decision (hypothesis): whatever the trials, the answer is the cheapest
eligible completed trial — independent of order, blind to failed/pruned/running trials, safe
with NaN and inf, and deterministic on ties."""

from __future__ import annotations

import math
import random

from hypothesis import given, settings
from hypothesis import strategies as st

from sweeper.errors import NoResultError
from sweeper.recommend import Constraints, StudyFacts, choose
from sweeper.recommendation import Recommendation
from sweeper.store import TrialRow

# token lengths 10..400 (percentiles), so max_seq_length 128 truncates and 512 covers
STATS = {"token_percentiles": [10 + 4 * q - 1 for q in range(101)], "tokens_max": 399}
FACTS = StudyFacts(name="p", hardware_name="H100 SXM 80GB", usd_per_hour=2.5, dataset_stats=STATS)
CONFIGS = [
    {
        "per_device_batch_size": batch,
        "gradient_accumulation_steps": accumulation,
        "num_workers": 0,
        "prefetch_factor": None,
        "max_seq_length": seq,
        "compile_mode": "none",
        "attn_implementation": "sdpa",
        "packing": packing,
    }
    for batch, accumulation, seq, packing in [
        (2, 8, 512, False),
        (4, 2, 512, False),
        (8, 1, 512, False),
        (8, 1, 128, False),  # truncates
        (8, 1, 128, True),  # packed: nothing is cut
    ]
]
STATES = ["complete", "complete", "failed", "pruned", "running"]
odd_floats = st.one_of(
    st.floats(min_value=1e-3, max_value=1e6),
    st.sampled_from([math.nan, math.inf, -math.inf, 0.0, -1.0]),
)


@st.composite
def trials(draw: st.DrawFn, min_size: int = 0) -> list[TrialRow]:
    count = draw(st.integers(min_value=min_size, max_value=12))
    numbers = draw(st.lists(st.integers(0, 500), min_size=count, max_size=count, unique=True))
    rows = []
    for number in numbers:
        rows.append(
            TrialRow(
                number=number,
                state=draw(st.sampled_from(STATES)),
                config=draw(st.sampled_from(CONFIGS)),
                samples_per_s=draw(st.one_of(st.none(), odd_floats)),
                hours_per_run=draw(st.one_of(st.none(), odd_floats)),
                it_per_s=draw(st.one_of(st.none(), odd_floats)),
                peak_memory_bytes=draw(st.one_of(st.none(), st.integers(0, 80 << 30))),
                device_memory_bytes=draw(st.sampled_from([None, 0, 80 << 30])),
            )
        )
    return rows


def _outcome(facts: StudyFacts, rows: list[TrialRow], c: Constraints | None = None) -> object:
    try:
        return choose(facts, rows, c)
    except NoResultError as e:
        return ("no result", str(e))


def _usable(t: TrialRow) -> bool:
    def positive(x: float | None) -> bool:
        return x is not None and math.isfinite(x) and x > 0

    return t.state == "complete" and positive(t.samples_per_s) and positive(t.hours_per_run)


def _whole(t: TrialRow) -> bool:
    return t.config["packing"] or t.config["max_seq_length"] >= 400  # longest sample + EOS


@settings(max_examples=300, deadline=None)
@given(trials(), st.randoms(use_true_random=False))
def test_order_does_not_matter(rows: list[TrialRow], rng: random.Random) -> None:
    shuffled = list(rows)
    rng.shuffle(shuffled)
    assert _outcome(FACTS, rows) == _outcome(FACTS, shuffled)


@settings(max_examples=300, deadline=None)
@given(trials(), trials())
def test_failed_pruned_and_running_trials_are_ignored(
    rows: list[TrialRow], others: list[TrialRow]
) -> None:
    taken = {t.number for t in rows}
    noise = [t for t in others if t.state != "complete" and t.number not in taken]
    assert _outcome(FACTS, rows) == _outcome(FACTS, rows + noise)


def _memory(t: TrialRow) -> float:
    return math.inf if t.peak_memory_bytes is None else t.peak_memory_bytes


@settings(max_examples=500, deadline=None)
@given(trials(), st.booleans())
def test_the_answer_is_the_cheapest_eligible_trial(
    rows: list[TrialRow], allow_truncation: bool
) -> None:
    """NaN, inf, zero and negative numbers never crash it and are never picked. These trials
    carry no interval, so only an equal $/run ties: the least peak memory wins it, then the
    earliest trial (the rule of ``sweeper.recommend._pick``)."""
    eligible = [t for t in rows if _usable(t) and (allow_truncation or _whole(t))]
    outcome = _outcome(FACTS, rows, Constraints(allow_truncation=allow_truncation))
    if not eligible:
        assert isinstance(outcome, tuple) and outcome[0] == "no result"
        return
    assert isinstance(outcome, Recommendation)

    def cost(t: TrialRow) -> float:
        assert t.hours_per_run is not None
        return t.hours_per_run * FACTS.usd_per_hour

    cheapest = min(cost(t) for t in eligible)
    tied = [t for t in eligible if cost(t) == cheapest]
    expected = min(tied, key=lambda t: (_memory(t), t.number))
    assert outcome.trial_number == expected.number
    assert math.isfinite(outcome.cost_per_run_usd) and outcome.cost_per_run_usd > 0
    assert outcome.cost_per_run_usd == cheapest
    assert set(outcome.ties) == {t.number for t in tied} - {expected.number}
    # a cheaper config that truncates is never taken silently: it is named as left out
    # (cheaper: before the first whole config in $/run order, the trial number breaking ties)
    first = min(eligible, key=lambda t: (cost(t), t.number))
    cheaper_cut = [
        t
        for t in rows
        if _usable(t) and not _whole(t) and (cost(t), t.number) < (cost(first), first.number)
    ]
    if not allow_truncation:
        assert len(outcome.excluded) == len(cheaper_cut)


@settings(max_examples=200, deadline=None)
@given(trials(), st.integers(2, 20), st.randoms(use_true_random=False))
def test_ties_go_to_the_earliest_trial(
    rows: list[TrialRow], copies: int, rng: random.Random
) -> None:
    """Configs that cost exactly the same: the lowest trial number wins, in any order."""
    rows = [t for t in rows if not (_usable(t) and t.hours_per_run <= 1.0)]
    tied = [
        TrialRow(
            number=1000 + 7 * k,
            state="complete",
            config=CONFIGS[k % 3],
            samples_per_s=10.0,
            hours_per_run=1.0,
        )
        for k in range(copies)
    ]
    mixed = rows + tied
    rng.shuffle(mixed)
    assert choose(FACTS, mixed).trial_number == 1000
