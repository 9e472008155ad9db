"""The recommendation: $/run decides (never it/s), constraints filter, prices re-price,
and every answer is compared with the user's baseline."""

from __future__ import annotations

import os
import re

import pytest

from sweeper.caveats import knob_caveats
from sweeper.console import console, print_recommendation
from sweeper.cost import money
from sweeper.errors import NoResultError, SpaceError, TruncatesOnlyError
from sweeper.recommend import Constraints, best
from sweeper.recommendation import Recommendation
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


def test_headline_throughput_and_what_trains(store: Store) -> None:
    r = best(store, "seed")
    # the trials above stored no measurement: no parameter counts are made up
    assert (r.n_params, r.trainable_params, r.trainable_text()) == (None, None, None)
    assert r.throughput_text() == "24.0 samples/s" and r.headline == "samples"
    assert r.baseline_throughput_text() == "20.0 → 24.0 samples/s"
    tokens = r.model_copy(
        update={
            "headline": "tokens",
            "tokens_per_s": 40_310.0,
            "baseline_tokens_per_s": 22_089.0,
            "n_params": 3_821_079_552,
            "trainable_params": 1_572_864,
        }
    )
    assert tokens.throughput_text() == "40,310 tokens/s (24.0 samples/s)"
    assert tokens.baseline_throughput_text() == "22,089 → 40,310 tokens/s"
    assert tokens.trainable_text() == "trains 1.57M of 3.82B parameters (0.04%)"
    full = tokens.model_copy(update={"trainable_params": 3_821_079_552})
    assert full.trainable_text() == "trains all 3.82B parameters"


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
    with pytest.raises(
        SpaceError,
        match=r":45: baseline.per_device_batch_size: per_device_batch_size = 3 is not among",
    ):
        parse_space(text, source="tiny.yaml")


# ------------------------------------------------------------------ training-semantics guards

# token lengths of a dataset whose longest sample is 1480 tokens (+ EOS: 1481), p99 999
STATS = {"token_percentiles": [10 * q for q in range(100)] + [1480], "tokens_max": 1480}


def _space_yaml(**workload: object) -> str:
    """The tiny space's text with extra workload keys (coverage, learning rate)."""
    lines = "".join(f"  {key}: {value}\n" for key, value in workload.items())
    text = re.sub(r"  coverage_percentile: .*\n", "", TINY_SPACE.read_text())
    return text.replace("  samples: 10000\n", f"  samples: 10000\n{lines}")


def _finish(store: Store, study: str, number: int, config: dict, hours: float, **extra) -> None:
    store.start_trial(study, number, config)
    store.finish_trial(
        study,
        number,
        "complete",
        samples_per_s=SAMPLES / hours / 3600,
        hours_per_run=hours,
        cost_per_run_usd=hours * 2.5,
        **extra,
    )


def _seq(batch: int, accumulation: int, seq: int, packing: bool = False) -> dict:
    return tiny_config(
        per_device_batch_size=batch,
        gradient_accumulation_steps=accumulation,
        max_seq_length=seq,
        packing=packing,
    ).model_dump()


@pytest.fixture
def guarded(sqlite_url: str) -> Store:
    store = Store(sqlite_url)
    store.migrate()
    store.upsert_study(
        "guard",
        **(
            STUDY_FIELDS
            | {
                "baseline": _seq(2, 8, 2048),
                "dataset_stats": STATS,
                "space_yaml": _space_yaml(learning_rate=0.0002),
            }
        ),
    )
    _finish(store, "guard", 0, _seq(2, 8, 2048), 38.0)  # the baseline: pads to 2048
    _finish(store, "guard", 1, _seq(4, 2, 1024), 12.0)  # the cheapest, but cuts long samples
    _finish(store, "guard", 2, _seq(4, 2, 1536), 16.0)  # holds every sample
    _finish(store, "guard", 3, _seq(4, 2, 512, packing=True), 14.0)  # packed: cuts nothing
    yield store
    store.dispose()


def test_a_truncating_config_is_never_recommended_silently(guarded: Store) -> None:
    r = best(guarded, "guard")
    assert r.trial_number == 3 and r.truncated_tokens_share == 0.0  # packed
    assert r.coverage_length == 1481
    assert len(r.excluded) == 1 and r.excluded[0].startswith("trial #1 (bs4×ga2 seq1024)")
    assert "truncates" in r.excluded[0] and "needs 1481 tokens" in r.excluded[0]
    allowed = best(guarded, "guard", Constraints(allow_truncation=True))
    assert allowed.trial_number == 1 and allowed.excluded == ()
    assert allowed.truncated_tokens_share and allowed.truncated_tokens_share > 0
    assert any("truncates" in w and "allowed by request" in w for w in allowed.warnings)


def test_trls_bfd_packing_cuts_long_samples_so_it_is_guarded_too(guarded: Store) -> None:
    """TRL's default packing (bfd, best-fit decreasing) drops what overflows max_length;
    wrapped and bfd_split continue a long sample in another row. A packed bfd config below the
    coverage length is guarded like an unpacked one, and so is an sft config stored before the
    packing_strategy knob (it packed with TRL's default)."""
    guarded.upsert_study("guard", space_yaml=_space_yaml(learning_rate=0.0002, engine="sft"))
    packed = _seq(4, 2, 512, packing=True)
    assert packed["packing_strategy"] == "wrapped"
    _finish(guarded, "guard", 4, packed | {"packing_strategy": "bfd"}, 13.0)
    _finish(guarded, "guard", 5, {k: v for k, v in packed.items() if k != "packing_strategy"}, 13.5)
    _finish(guarded, "guard", 6, packed | {"packing_strategy": "bfd_split"}, 14.5)
    r = best(guarded, "guard")
    assert r.trial_number == 3 and r.truncated_tokens_share == 0.0  # wrapped cuts nothing
    cut = [e for e in r.excluded if "truncates" in e]
    assert [e.split(" ")[1] for e in cut] == ["#1", "#4", "#5"], r.excluded
    guarded.finish_trial("guard", 3, "failed", failure_kind="oom")
    assert best(guarded, "guard").trial_number == 6  # bfd_split cuts nothing either


def test_coverage_percentile_from_the_space(guarded: Store) -> None:
    # 99%: 1024 holds p99 (990 + EOS), so it is no longer truncating in the guard's sense
    guarded.upsert_study("guard", space_yaml=_space_yaml(coverage_percentile=99))
    r = best(guarded, "guard")
    assert r.trial_number == 1 and r.coverage_length == 991 and r.excluded == ()
    assert r.truncated_tokens_share and r.truncated_tokens_share > 0  # still reported


def test_only_truncating_configs_is_an_error_that_says_what_to_do(guarded: Store) -> None:
    trials = guarded.list_trials("guard")
    for t in trials:
        if t.number != 1:
            guarded.finish_trial("guard", t.number, "failed", failure_kind="oom")
    with pytest.raises(TruncatesOnlyError) as info:
        best(guarded, "guard")
    # the space lists 64 only: the one change is a length that holds every sample
    assert info.value.fix.startswith("add 1536 to search.max_seq_length (it lists [64])")
    message = str(info.value)
    assert "To get an answer, add 1536" in message
    assert "Until then the cheapest config, trial #1 (bs4×ga2 seq1024), costs $30.00/run" in message
    assert "--allow-truncation" in message and "packing: [false, true]" not in message
    fallback = info.value.fallback
    assert fallback.trial_number == 1 and fallback.truncated_tokens_share > 0
    assert f"cuts {fallback.truncated_tokens_share:.1%} of the tokens" in message


def test_the_fix_for_truncation_is_never_what_the_space_has(guarded: Store) -> None:
    text = _space_yaml().replace("max_seq_length: [64]", "max_seq_length: [64, 1536]")
    text = text.replace("  max_seq_length: 64\n", "  max_seq_length: 1536\n")
    guarded.upsert_study("guard", space_yaml=text)
    for number in (0, 2, 3):
        guarded.finish_trial("guard", number, "failed", failure_kind="oom")
    with pytest.raises(TruncatesOnlyError) as info:
        best(guarded, "guard")
    assert info.value.fix.startswith("measure a config at max_seq_length 1536, which the space")
    # auto lists a length that holds every sample: never "add a length"
    auto = _space_yaml().replace("max_seq_length: [64]", "max_seq_length: auto")
    guarded.upsert_study("guard", space_yaml=auto)
    with pytest.raises(TruncatesOnlyError) as info:
        best(guarded, "guard")
    assert info.value.fix.startswith("measure a config at max_seq_length 1536"), info.value.fix


def test_effective_batch_change_comes_with_learning_rate_advice(guarded: Store) -> None:
    r = best(guarded, "guard")
    assert (r.baseline_effective_batch, r.effective_batch) == (16, 8)
    assert r.learning_rate == 0.0002
    assert r.suggested_learning_rate == pytest.approx(0.0002 * (8 / 16) ** 0.5)
    advice = [w for w in r.warnings if "effective batch changes from 16 to 8" in w]
    assert len(advice) == 1 and "0.000141" in advice[0] and "linear rule gives 0.0001" in advice[0]


def test_the_advice_scales_the_learning_rate_the_program_ran(guarded: Store) -> None:
    """A script's run has its own learning rate (a walk's `--lr 3e-4` into OneCycleLR), which
    its trial reads from what ran (ProgramRun.learning_rate): the advice scales that one, not
    the space's, and says so (it said "from 0.0001 to 0.000283" to a run at 3e-4)."""
    guarded.finish_trial(
        "guard", 3, "complete", measurement={"program_run": {"learning_rate": 3e-4}}
    )
    r = best(guarded, "guard")
    assert r.trial_number == 3 and r.learning_rate == 3e-4
    assert r.suggested_learning_rate == pytest.approx(3e-4 * (8 / 16) ** 0.5)
    (advice,) = [w for w in r.warnings if "effective batch changes from 16 to 8" in w]
    assert "from 0.0003 (your program's, as it ran) to 0.000212" in advice, advice


def test_same_effective_batch_needs_no_advice(store: Store) -> None:
    # the seed fixture: baseline 2×8 = 16; the winner 8×1 = 8 … so restrict to 16s
    _finish(store, "seed", 9, _config(4, 4), 1.0)
    r = best(store, "seed")
    assert r.trial_number == 9 and r.effective_batch == 16 and r.suggested_learning_rate is None
    assert not any("effective batch" in w for w in r.warnings)


def test_memory_headroom_constraint(guarded: Store) -> None:
    gib = 1 << 30
    guarded.finish_trial("guard", 3, "complete", peak_memory_bytes=78 * gib)
    guarded.finish_trial("guard", 2, "complete", peak_memory_bytes=60 * gib)
    for number in (0, 1, 2, 3):
        guarded.finish_trial("guard", number, "complete", device_memory_bytes=80 * gib)
    assert best(guarded, "guard").memory_headroom == pytest.approx(2 / 80)
    roomy = best(guarded, "guard", Constraints(min_memory_headroom=0.1))
    assert roomy.trial_number == 2 and roomy.memory_headroom == pytest.approx(0.25)
    assert roomy.constraints == "at least 10% memory headroom"


def test_sweep_cost_and_payback(guarded: Store) -> None:
    guarded.add_sweep_seconds("guard", 3 * 3600)  # three hours of the H100: $7.50
    r = best(guarded, "guard")
    assert r.sweep_hours == pytest.approx(3) and r.sweep_cost_usd == pytest.approx(7.5)
    assert r.usd_saved_per_run == pytest.approx((38 - 14) * 2.5)  # $60 a run
    assert r.payback_runs == 1
    guarded.add_sweep_seconds("guard", 30 * 3600)  # 33 h: $82.50, more than one run saves
    assert best(guarded, "guard").payback_runs == 2


def test_priced_as_one_machine_measured_on_another(guarded: Store) -> None:
    guarded.finish_trial("guard", 3, "complete", device_name="AMD EPYC 9B14")
    r = best(guarded, "guard")
    assert r.measured_on == "AMD EPYC 9B14"
    assert any("priced as H100 SXM 80GB but measured on AMD EPYC" in w for w in r.warnings)
    guarded.finish_trial("guard", 3, "complete", device_name="NVIDIA H100 80GB HBM3")
    assert not any("priced as" in w for w in best(guarded, "guard").warnings)


# ------------------------------------------------------------------ across hardware


def _machine(store: Store, study: str, name: str, price: float, hours: list[float]) -> None:
    store.upsert_study(
        study,
        **(
            STUDY_FIELDS
            | {"hardware_name": name, "usd_per_hour": price, "workload_hash": "job-000"}
        ),
    )
    for number, h in enumerate(hours):
        store.start_trial(study, number, _config(2 ** (number % 4), 1))
        store.finish_trial(
            study,
            number,
            "complete",
            samples_per_s=SAMPLES / h / 3600,
            hours_per_run=h,
            cost_per_run_usd=h * price,
        )


def test_cheapest_and_pareto_front_across_hardware(sqlite_url: str) -> None:
    from sweeper.compare import compare

    store = Store(sqlite_url)
    store.migrate()
    _machine(store, "h100", "H100 SXM 80GB", 2.50, [20.0, 16.0])  # $50, $40
    _machine(store, "a100", "A100 80GB", 1.20, [40.0, 30.0])  # $48, $36
    _machine(store, "4090", "RTX 4090", 0.40, [95.0, 150.0])  # $38, $60
    _machine(store, "other", "H100 SXM 80GB", 1.0, [1.0])  # another job: never compared
    store.upsert_study("other", workload_hash="job-001")
    result = compare(store, "h100")
    assert [r.study for r in result.per_study] == ["h100", "a100", "4090"]
    assert result.cheapest.study == "a100"
    assert result.cheapest.cost_per_run_usd == pytest.approx(36)
    front = [(p.study, p.hours_per_run, p.cost_per_run_usd) for p in result.pareto]
    assert front == [("h100", 16.0, 40.0), ("a100", 30.0, 36.0)]
    assert result.fastest.study == "h100"
    within = compare(store, "4090", Constraints(max_hours=20))
    assert within.cheapest.study == "h100" and set(within.unavailable) == {"a100", "4090"}
    store.dispose()


def _intervals(store: Store, spreads: dict[int, float], peaks: dict[int, int]) -> None:
    """Give trials $/run intervals and peak memory, as a sweep's estimates would."""
    from sweeper.noise import Estimate

    trials = {t.number: t for t in store.list_trials("seed")}
    estimates = {}
    for number, spread in spreads.items():
        t = trials[number]
        estimates[number] = (
            Estimate(
                t.cost_per_run_usd, t.hours_per_run, t.samples_per_s, None, t.it_per_s,
                spread, 1, False, 0,
            ),
            None,
        )  # fmt: skip
    store.record_estimates("seed", estimates)
    for number, peak in peaks.items():
        store.finish_trial("seed", number, "complete", peak_memory_bytes=peak)


def test_configs_within_the_noise_tie_and_the_least_memory_wins(store: Store) -> None:
    # trial 2 (24 samples/s) and trial 3 (23.2) are 3.4% apart: with ±3% each their ratio's
    # interval (±4.2%) holds 1, so they tie
    _intervals(store, {0: 0.03, 1: 0.03, 2: 0.03, 3: 0.03}, {2: 9_000_000_000, 3: 6_000_000_000})
    r = best(store, "seed")
    assert r.trial_number == 3 and r.ties == (2,)
    assert r.tie_note is not None and r.tie_note.startswith("ties within the noise with #2 (")
    assert "picked for the least peak memory (6.00 GB)" in r.tie_note
    assert r.cost_ci95_rel == pytest.approx(0.03)
    assert r.interval_text() == f"{money(r.cost_per_run_usd)} ±3.0%/run"


def test_intervals_that_overlap_but_differ_beyond_the_noise_do_not_tie(store: Store) -> None:
    """Seen on a contended CPU sweep: two configs 33% apart with ±20% each, whose intervals
    overlap, were taken as a tie and the dearer one recommended for its lower peak memory,
    while the knob table under it said the other value was 0.75x (95%: 0.56-0.98), cheaper.
    Here trial 2 and trial 3 (3.4% apart) with ±2% each: their intervals overlap (2% + 2%),
    their ratio's interval (±2.8%) does not hold 1: the cheaper one is the answer, as the
    knob table at it reads the pair."""
    _intervals(store, {0: 0.02, 1: 0.02, 2: 0.02, 3: 0.02}, {2: 9_000_000_000, 3: 6_000_000_000})
    r = best(store, "seed")
    assert r.trial_number == 2 and r.ties == () and r.tie_note is None


def test_when_the_baseline_ties_the_answer_is_to_keep_it(store: Store) -> None:
    """Seen on seed 003 on an H100: three configs tied within ±7.5%, the baseline among them,
    and the least-memory rule recommended one 7% slower than the baseline ("0.93x faster,
    $-0.99 saved"). Nothing beats the baseline beyond the noise: the answer is to keep it."""
    # the baseline (20 samples/s) and trials 2 (24) and 3 (23.2) tie within ±15% each (the
    # ratio of the baseline to trial 2, 1.2, inside its interval of ±22%)
    _intervals(store, {0: 0.15, 1: 0.01, 2: 0.15, 3: 0.15}, {0: 12_000_000_000, 3: 6_000_000_000})
    r = best(store, "seed")
    assert r.trial_number == r.baseline_trial_number == 0 and set(r.ties) == {2, 3}
    assert r.tie_note is not None and "picked for being the baseline" in r.tie_note
    assert r.speedup_vs_baseline == 1.0 and r.usd_saved_per_run == 0.0


def test_wide_ties_do_not_trade_a_much_dearer_figure_for_memory(store: Store) -> None:
    """A re-walk's N3: every trial contended, the wide intervals tied 5 configs, and the least
    peak memory among them won at 1.8x the cheapest's figure, on a CPU with 98% headroom.
    Memory buys at most 5% of the figure: #1 (36% dearer by its figure, least memory) is not
    taken; #3 (3.4% dearer, less memory than #2) is."""
    store.upsert_study("seed", **(STUDY_FIELDS | {"baseline": _config(16, 1)}))  # unmeasured
    peaks = {1: 2_000_000_000, 2: 9_000_000_000, 3: 6_000_000_000}
    _intervals(store, {0: 0.5, 1: 0.5, 2: 0.5, 3: 0.5}, peaks)
    r = best(store, "seed")
    assert r.baseline_trial_number is None
    assert r.trial_number == 3 and set(r.ties) == {0, 1, 2}, r.tie_note
    assert r.tie_note is not None and "picked for the least peak memory (6.00 GB) among those " \
        "within 5% of the cheapest's figure" in r.tie_note  # fmt: skip
    assert "#1 (1.36x) needs less memory but costs more by its figure" in r.tie_note
    # without a close one of less memory: the cheapest, and why the lighter one lost
    store.finish_trial("seed", 3, "complete", peak_memory_bytes=12_000_000_000)
    r = best(store, "seed")
    assert r.trial_number == 2 and set(r.ties) == {0, 1, 3}
    assert r.tie_note is not None
    assert "picked for the lowest $/run; #1 (1.36x) needs less memory" in r.tie_note


def _printed(recommendation: Recommendation) -> str:
    """What `sweeper best` prints of ``recommendation``, on one line."""
    width = console.width
    console.width = 200
    try:
        with console.capture() as captured:
            print_recommendation(recommendation)
    finally:
        console.width = width
    return " ".join(captured.get().split())


def test_a_tie_pick_says_it_is_not_the_cheapest_measured_and_which_is(store: Store) -> None:
    """Seen on a user walk: `best` recommended #1 ($0.0026/run) over #0 ($0.0021/run) "for
    the least peak memory"; its first line must say that the answer is not the cheapest
    measured, which is, and that the two tie within the noise."""
    _intervals(store, {0: 0.03, 1: 0.03, 2: 0.03, 3: 0.03}, {2: 9_000_000_000, 3: 6_000_000_000})
    r = best(store, "seed")
    cheapest = store.get_trial("seed", 2)
    assert cheapest is not None and cheapest.cost_per_run_usd is not None
    assert r.trial_number == 3 and r.cheapest_trial_number == 2
    assert r.cheapest_cost_per_run_usd == pytest.approx(cheapest.cost_per_run_usd)
    assert r.cheapest_cost_per_run_usd < r.cost_per_run_usd
    printed = _printed(r)
    assert (
        f"trial #3, not the cheapest measured: #2 is, at {money(cheapest.cost_per_run_usd)}/run, "
        "but the two tie within the noise (4 completed trials)"
    ) in printed
    assert "picked for the least peak memory (6.00 GB)" in printed
    assert r.tie_note is not None and "/run, the cheapest measured, 9.00 GB peak)" in r.tie_note
    from sweeper.export import _header

    assert f"\n# it {r.tie_note}" in _header(r)  # the pasted config says it too
    # across hardware the same pick is "recommended", with the cheapest named, not "cheapest"
    # above a front whose one point is the cheaper #2 (a walk's CPU study read so)
    from sweeper.compare import compare
    from sweeper.console import print_comparison

    width = console.width
    console.width = 200
    try:
        with console.capture() as captured:
            print_comparison(compare(store, "seed"))
    finally:
        console.width = width
    header = " ".join(captured.get().split())
    assert "recommended across 1 machine(s):" in header and "trial #3" in header
    assert f"not the cheapest measured: #2 is, at {money(cheapest.cost_per_run_usd)}/run" in header
    # the cheapest, picked among ties for its memory: it is the cheapest, and says who ties
    _intervals(store, {}, {2: 5_000_000_000})
    r = best(store, "seed")
    assert r.trial_number == 2 and r.ties == (3,) and r.cheapest_trial_number is None
    assert "trial #2, the cheapest of 4 completed trials; #3 ties with it within the noise" in (
        _printed(r)
    )
    # no tie: as before
    _intervals(store, {0: 0.01, 1: 0.01, 2: 0.01, 3: 0.01}, {})
    r = best(store, "seed")
    assert r.ties == () and r.pick_text() == "the cheapest of 4 completed trials"
    assert r.cheapest_trial_number is None


def test_compare_names_the_tie_pick_recommended_not_cheapest(store: Store) -> None:
    """compare's `cheapest` was each study's recommendation, whose pick among ties may be
    dearer than a point of the front beside it (#3 over the cheaper #2): it is `recommended`
    now, with `cheapest` kept, the same, for REST clients, and marked deprecated."""
    import json

    from sweeper.compare import Comparison, compare

    _intervals(store, {0: 0.03, 1: 0.03, 2: 0.03, 3: 0.03}, {2: 9_000_000_000, 3: 6_000_000_000})
    comparison = compare(store, "seed")
    assert comparison.recommended is not None and comparison.recommended.trial_number == 3
    dearer = comparison.recommended.cost_per_run_usd
    assert min(p.cost_per_run_usd for p in comparison.pareto) < dearer  # the front's #2
    answer = json.loads(comparison.model_dump_json())
    assert answer["recommended"]["trial_number"] == 3
    assert answer["cheapest"] == answer["recommended"]  # the old name, for old clients
    schema = Comparison.model_json_schema(mode="serialization")["properties"]
    assert schema["cheapest"]["deprecated"] is True and "deprecated" not in schema["recommended"]
    assert "tie" in schema["recommended"]["description"]


def test_the_fastest_of_contended_runs_is_never_called_pooled(store: Store) -> None:
    """Seen on a user walk: trial #0, measured at 5.45, 6.10, 5.04 and 4.03 samples/s, all on
    a shared machine, read "$0.0015 ±23.0% ×4" (legend: "measured N times, pooled") and `best`
    "(4 measurements)": the fastest alone, with one window's interval. `best`, REST and the
    table now say what the figure is, and its interval holds the runs."""
    from sweeper.console import print_leaderboard
    from sweeper.noise import Sample, machine_noise, pool

    trial = store.get_trial("seed", 2)
    assert trial is not None and trial.cost_per_run_usd and trial.hours_per_run
    cost, hours = trial.cost_per_run_usd, trial.hours_per_run

    def contended(*rates: float, window: float) -> None:
        runs = [
            Sample(
                kind="trial" if i == 0 else "rerun",
                cost_per_run_usd=cost * 24 / rate,
                hours_per_run=hours * 24 / rate,
                samples_per_s=rate,
                tokens_per_s=None,
                it_per_s=rate / 8,
                ci95_rel=window,
                contended=True,
                contention="other processes used 1.9 of the 2 CPUs",
            )
            for i, rate in enumerate(rates)
        ]
        store.record_estimates("seed", {2: (pool(runs, machine_noise([runs])), runs)})

    # the walk's four runs, spread 49%: the fastest cannot be told from the baseline (20
    # samples/s) within that, so the answer keeps the baseline, and names the tie
    contended(21.8, 24.0, 20.2, 16.1, window=0.23)
    r = best(store, "seed")
    assert r.trial_number == r.baseline_trial_number == 0 and 2 in r.ties
    width = console.width
    console.width = 200
    try:
        with console.capture() as captured:
            print_leaderboard(store.url, "seed")
    finally:
        console.width = width
    table = " ".join(captured.get().split())
    assert "49.1% fastest of 4" in table and "pooled" not in table
    assert "fastest of N: measured N times, each on a shared machine; the row is the fastest's" in (
        table
    )
    # runs 9% apart, each window ±2%: the fastest stands, and says what it is
    contended(23.0, 24.0, 22.5, 22.0, window=0.02)
    r = best(store, "seed")
    assert r.trial_number == 2 and r.contended and r.measurements == 4
    assert r.samples_per_s == pytest.approx(24.0)  # the fastest's
    assert r.cost_ci95_rel == pytest.approx(24.0 / 22.0 - 1)  # not its window's ±2%
    assert r.measured_as == "fastest of 4 measurements, all on a shared machine"
    assert r.model_dump(mode="json")["measured_as"] == r.measured_as  # REST says it too
    assert r.interval_text() == (
        f"{money(r.cost_per_run_usd)} ±9.1%/run (fastest of 4 measurements, all on a shared "
        "machine)"
    )
    printed = _printed(r)
    assert "/run (fastest of 4 measurements, all on a shared machine)" in printed
    assert "(4 measurements)" not in printed
    from sweeper.export import _header

    assert f"\n# its $/run, with its 95% interval: {r.interval_text()}" in _header(r)


def test_configs_apart_beyond_the_noise_do_not_tie(store: Store) -> None:
    _intervals(store, {2: 0.01, 3: 0.01}, {2: 9_000_000_000, 3: 6_000_000_000})
    r = best(store, "seed")
    assert r.trial_number == 2 and r.ties == () and r.tie_note is None


def test_rest_and_the_study_page_offer_the_best_truncating_config(
    guarded: Store, sqlite_url: str
) -> None:
    from fastapi.testclient import TestClient

    from api.app import create_app

    for number in (0, 2, 3):
        guarded.finish_trial("guard", number, "failed", failure_kind="oom")
    with TestClient(create_app(sqlite_url)) as client:
        answer = client.get("/api/studies/guard/best")
        assert answer.status_code == 409
        body = answer.json()
        assert body["fix"].startswith("add 1536 to search.max_seq_length")
        assert body["fallback"]["trial_number"] == 1
        assert body["fallback"]["truncated_tokens_share"] > 0
        allowed = client.get("/api/studies/guard/best?allow_truncation=true")
        assert allowed.status_code == 200 and allowed.json()["trial_number"] == 1
        page = client.get("/studies/guard")
        text = " ".join(page.text.split())
        assert page.status_code == 200 and "No completed trial yet" not in text
        assert "To get an answer, add 1536 to search.max_seq_length" in text
        assert "trial #1 (bs4×ga2 seq1024" in text and "of the tokens" in text


def test_without_a_baseline_the_answer_never_claims_to_keep_it(store: Store) -> None:
    r = best(store, "seed")
    kept = r.model_copy(update={"baseline_trial_number": r.trial_number})
    assert kept.keeps_baseline
    assert not r.model_copy(update={"baseline_trial_number": None}).keeps_baseline


def test_caveats_skip_knobs_the_winner_leaves_inactive() -> None:
    """A packed winner against an unpacked baseline: packing and its strategy are warned of,
    padding_free (inactive once packed) is not; a knob the baseline left unset says so."""
    warned = knob_caveats(
        {"packing": False, "padding_free": False},
        {"packing": True, "packing_strategy": "wrapped"},
    )
    names = [line.split(" is ")[0] for line in warned]
    assert "packing" in names and "packing_strategy" in names
    assert "padding_free" not in names
    strategy = next(line for line in warned if line.startswith("packing_strategy"))
    assert strategy.startswith("packing_strategy is wrapped, not set in the baseline: ")
    assert not any("None" in line.split(":")[0] for line in warned)


def test_rivals_measured_only_on_a_shared_machine_are_warned_about_by_cli_and_rest(
    store: Store,
) -> None:
    """A walk's `best` picked bs1 (33.9 samples/s, calm) over bs8 x 2, measured only under
    load at 6.0 samples/s (45.6 calm), and said nothing on the CLI or REST (`"warnings": []`)
    while the page warned. Both say it now, naming the rivals."""
    from fastapi.testclient import TestClient

    from api.app import create_app
    from sweeper.noise import Sample, machine_noise, pool

    for number in (1, 3):  # slowed to a quarter by the load, every measurement
        trial = store.get_trial("seed", number)
        assert trial is not None and trial.cost_per_run_usd and trial.hours_per_run
        runs = [
            Sample(
                kind="trial",
                cost_per_run_usd=trial.cost_per_run_usd * 4,
                hours_per_run=trial.hours_per_run * 4,
                samples_per_s=(trial.samples_per_s or 1.0) / 4,
                tokens_per_s=None,
                it_per_s=(trial.it_per_s or 1.0) / 4,
                ci95_rel=0.05,
                contended=True,
                contention="other processes used 1.9 of the 2 CPUs",
            )
        ]
        store.record_estimates("seed", {number: (pool(runs, machine_noise([runs])), runs)})
    r = best(store, "seed")
    assert r.trial_number == 2 and not r.contended
    said = [w for w in r.warnings if "measured only while the machine was shared" in w]
    assert len(said) == 1 and "(#1, #3)" in said[0] and "cheaper than #2" in said[0]
    with TestClient(create_app(store.url)) as client:
        answer = client.get("/api/studies/seed/best")
    assert answer.status_code == 200
    assert said[0] in answer.json()["warnings"]
    assert "(#1, #3)" in _printed(r)


def test_a_baseline_alone_is_not_said_to_have_beaten_anything(store: Store) -> None:
    """A re-walk's N2: every other trial failed (as a mismatch), and the baseline's answer read
    "no config measured so far beats it beyond the noise: keep it", as if compared."""
    store.upsert_study("alone", **(STUDY_FIELDS | {"baseline": _config(2, 8)}))
    store.start_trial("alone", 0, _config(2, 8))
    store.finish_trial("alone", 0, "complete", it_per_s=1.25, samples_per_s=20.0,
                       hours_per_run=25.0, cost_per_run_usd=62.5)  # fmt: skip
    store.start_trial("alone", 1, _config(8, 1))
    store.finish_trial("alone", 1, "failed", failure_message="mismatch: asked 8, ran 2")
    r = best(store, "alone")
    assert r.keeps_baseline and r.completed_trials == 1
    assert r.keep_baseline_text.startswith("no other config completed, so nothing has been ")
    printed = _printed(r)
    assert "this is your baseline (trial #0): no other config completed" in printed
    assert "beats it beyond the noise" not in printed
    r = best(store, "seed")  # compared with three others: the words it always had
    assert r.keep_baseline_text == r.KEEP_BASELINE


def test_no_completed_trial_says_what_the_trials_are_and_what_to_do(store: Store) -> None:
    """A walk's Ctrl-C left a study whose `best` said only "has no completed trial yet"."""
    store.upsert_study("cut", **STUDY_FIELDS)
    with pytest.raises(NoResultError, match=r"has no completed trial yet: none has run"):
        best(store, "cut")
    store.start_trial("cut", 0, _config(2, 8))
    store.finish_trial("cut", 0, "failed", failure_kind="interrupted", failure_message="Ctrl-C")
    store.start_trial("cut", 1, _config(8, 1))
    store.finish_trial("cut", 1, "failed", failure_kind="oom", failure_message="out of memory")
    with pytest.raises(NoResultError) as caught:
        best(store, "cut")
    said = str(caught.value)
    assert said.startswith("study 'cut' has no completed trial yet (1 interrupted, 1 oom): ")
    assert "`sweeper launch --study cut` resumes it, running what did not finish" in said
    assert "each failure's message is on the study page" in said


def test_a_length_from_the_scripts_command_is_not_called_a_list_of_the_space() -> None:
    """A re-walk was told "add 2432 to search.max_seq_length (it lists [1536])" where search:
    listed none and the 1536 was the command's --max_seq_length."""
    from sweeper.recommend import StudyFacts, truncation_fix

    facts = StudyFacts(name="s", hardware_name="CPU", usd_per_hour=0.1, listed_lengths=(1536,),
                       length_words="--max_seq_length 1536")  # fmt: skip
    said = truncation_fix(facts, 2365)
    assert said.startswith("list search.max_seq_length: [2432] in the space, or auto"), said
    assert "your command's --max_seq_length 1536 is the one length run" in said
    assert "it lists" not in said


def test_best_says_which_configs_and_values_no_trial_measured(sqlite_url: str) -> None:
    """A walk's `best` named its winner without a word for the configs whose trials all ran
    out of memory and the value no completed trial ran: read as ruled out on merit. It says
    them in one line (the CLI, --json and REST: `unmeasured`), and nothing when all ran."""
    import json
    import subprocess
    import sys

    from tests.helpers import REPO

    store = Store(sqlite_url)
    store.migrate()
    fields = STUDY_FIELDS | {"space_yaml": TINY_SPACE.read_text()}
    store.upsert_study("tiny", **fields)
    ran = [  # (number, config, state, failure kind)
        (0, tiny_config(per_device_batch_size=2, attn_implementation="eager"), "complete", None),
        (1, tiny_config(), "complete", None),
        (2, tiny_config(gradient_accumulation_steps=1), "failed", "oom"),
        (3, tiny_config(gradient_accumulation_steps=1), "failed", "error"),  # again: one config
        (4, tiny_config(per_device_batch_size=2, gradient_accumulation_steps=1), "pruned", "oom"),
        (5, tiny_config(attn_implementation="eager"), "running", None),  # not done: not said
    ]
    for number, config, state, kind in ran:
        store.start_trial("tiny", number, config.model_dump())
        if state == "complete":
            store.finish_trial(
                "tiny", number, "complete", samples_per_s=10.0 + number, it_per_s=1.0,
                hours_per_run=10.0 - number, cost_per_run_usd=25.0 - number,
            )  # fmt: skip
        elif state != "running":
            store.finish_trial("tiny", number, state, failure_kind=kind)
    r = best(store, "tiny")
    assert r.trial_number == 1
    assert r.unmeasured is not None
    assert r.unmeasured.configs == 2 and r.unmeasured.ended == {"error": 1, "oom predicted": 1}
    # accumulation 1 is listed and never completed; prefetch_factor applied to nothing
    assert r.unmeasured.values == {"gradient_accumulation_steps": [1]}
    assert r.unmeasured.untried == {}  # each was asked for and failed: read the failures
    assert "(the study page has each failure's message)" in " ".join(_printed(r).split())
    line = (
        "not measured, so not ruled out on merit: 2 configs the sweep tried whose trials all "
        "ended without a measurement (1 error, 1 oom predicted), and listed values no "
        "completed trial ran: gradient_accumulation_steps 1"
    )
    assert line in _printed(r)
    env = {**os.environ, "COLUMNS": "400"}
    cli = [sys.executable, "-m", "sweeper.cli", "best", "--study", "tiny", "--storage", sqlite_url]
    said = subprocess.run(cli, cwd=REPO, capture_output=True, text=True, timeout=120, env=env)
    assert said.returncode == 0, said.stderr
    assert sum(line in " ".join(out.split()) for out in said.stdout.splitlines()) == 1
    as_json = subprocess.run(
        [*cli, "--json"], cwd=REPO, capture_output=True, text=True, timeout=120, env=env
    )
    answer = json.loads(as_json.stdout)["unmeasured"]
    assert answer["values"] == {"gradient_accumulation_steps": [1]} and answer["configs"] == 2
    from fastapi.testclient import TestClient

    from api.app import create_app

    with TestClient(create_app(sqlite_url)) as client:  # the study page says it too
        page = " ".join(client.get("/studies/tiny").text.split())
        rest = client.get("/api/studies/tiny/best").json()
    assert "Not measured, so not ruled out on merit: 2 configs the sweep tried" in page
    assert rest["unmeasured"] == answer
    # once the value completes (a later trial of the failed config), there is nothing to say
    store.start_trial("tiny", 6, tiny_config(gradient_accumulation_steps=1).model_dump())
    store.finish_trial(
        "tiny", 6, "complete", samples_per_s=9.0, it_per_s=1.0, hours_per_run=12.0,
        cost_per_run_usd=30.0,
    )  # fmt: skip
    store.start_trial("tiny", 7, tiny_config(per_device_batch_size=2,
                      gradient_accumulation_steps=1).model_dump())  # fmt: skip
    store.finish_trial(
        "tiny", 7, "complete", samples_per_s=9.0, it_per_s=1.0, hours_per_run=12.0,
        cost_per_run_usd=30.0,
    )  # fmt: skip
    r = best(store, "tiny")
    assert r.unmeasured is None and "not ruled out on merit" not in _printed(r)
    store.dispose()


def test_values_no_trial_asked_for_are_said_as_such_not_as_failures(sqlite_url: str) -> None:
    """A walk's sweep stopped at its --max-minutes after one batch size; `best` said the other
    two "(the study page has each failure's message; launch said what it dropped ...)",
    though none failed and preflight dropped nothing."""
    store = Store(sqlite_url)
    store.migrate()
    store.upsert_study("tiny", **(STUDY_FIELDS | {"space_yaml": TINY_SPACE.read_text()}))
    for number, (accumulation, attention) in enumerate(((1, "sdpa"), (2, "eager"))):
        config = tiny_config(  # batch 2 only; the space lists 2 and 4
            per_device_batch_size=2,
            gradient_accumulation_steps=accumulation,
            attn_implementation=attention,
        )
        store.start_trial("tiny", number, config.model_dump())
        store.finish_trial(
            "tiny", number, "complete", samples_per_s=10.0 + number, it_per_s=1.0,
            hours_per_run=10.0 - number, cost_per_run_usd=25.0 - number,
        )  # fmt: skip
    r = best(store, "tiny")
    store.dispose()
    assert r.unmeasured is not None and r.unmeasured.configs == 0
    assert r.unmeasured.values == r.unmeasured.untried == {"per_device_batch_size": [4]}
    said = " ".join(_printed(r).split())
    assert (
        "listed values no completed trial ran: per_device_batch_size 4 (no trial asked for "
        "per_device_batch_size 4: the sweep ended first, or launch dropped it on this machine "
        "and said why; launch the study again to measure what this machine can run)"
    ) in said, said
    assert "failure" not in said.split("not ruled out on merit")[1].split(")")[0]
