"""What each knob is worth at the recommendation (sweeper/verdict.py): the maths on a recorded
study and on constructed tables whose effects are known, and the CLI, REST and the study page
showing it on real stores."""

from __future__ import annotations

import html
import itertools
import json
import math
import os
import random
import subprocess
import sys
from types import SimpleNamespace
from typing import Any

import pytest
from fastapi.testclient import TestClient

from api.app import create_app
from sweeper.store import Store
from sweeper.studyfile import import_study, read_study_file
from sweeper.verdict import knob_effects, markdown_table, study_knob_effects
from tests.helpers import REPO

CPU_DEMO = REPO / "studies" / "cpu-demo.json"  # 8 trials recorded on this project's CPU demo


def _trial(
    number: int, config: dict[str, Any], cost: float, ci: float = 0.01, contended: bool = False
) -> Any:
    return SimpleNamespace(
        number=number, state="complete", config=config, cost_per_run_usd=cost,
        cost_ci95_rel=ci, contended=contended,
    )  # fmt: skip


def _recorded() -> tuple[list[Any], dict[int, Any]]:
    document = json.loads(CPU_DEMO.read_text())
    trials = [
        _trial(t["number"], t["config"], t["cost_per_run_usd"], t["cost_ci95_rel"])
        for t in document["trials"]
        if t["state"] == "complete"
    ]
    return trials, {t.number: t for t in trials}


def _differ_in_alone(a: dict[str, Any], b: dict[str, Any]) -> set[str]:
    return {k for k in a.keys() | b.keys() if a.get(k) != b.get(k)}


def test_on_the_recorded_cpu_demo_a_pair_at_the_winner_gives_the_two_trials_ratio() -> None:
    trials, by_number = _recorded()
    winner = by_number[4]  # the study's recommendation (sweeper best --study cpu-demo)
    effects = {(e.knob, json.dumps(e.value)): e for e in knob_effects(trials, winner).effects}
    # trial #1 is trial #4 with gradient accumulation 2: found here by reading the configs
    (other,) = [
        t
        for t in trials
        if _differ_in_alone(t.config, winner.config) == {"gradient_accumulation_steps"}
    ]
    e = effects[("gradient_accumulation_steps", "2")]
    assert e.basis == "at the winner" and e.trials == (other.number,)
    assert e.ratio == pytest.approx(other.cost_per_run_usd / winner.cost_per_run_usd)
    # the interval combines the two measurements' own 95% intervals
    half = math.hypot(math.log1p(other.cost_ci95_rel), math.log1p(winner.cost_ci95_rel))
    assert (e.low, e.high) == pytest.approx((e.ratio / math.exp(half), e.ratio * math.exp(half)))
    assert e.low > 1 and e.verdict == "leave it at 1" and e.words.endswith(e.verdict)
    # eager attention: one pair elsewhere in the space, found here by reading the configs
    ((a, b),) = [
        (a, b)
        for a, b in itertools.permutations(trials, 2)
        if _differ_in_alone(a.config, b.config) == {"attn_implementation"}
        and b.config["attn_implementation"] == "eager"
    ]
    eager = effects[("attn_implementation", '"eager"')]
    assert winner not in (a, b) and eager.basis == "elsewhere" and eager.pairs == 1
    assert eager.ratio == pytest.approx(b.cost_per_run_usd / a.cost_per_run_usd)
    assert eager.low > 1.4 and eager.verdict == "leave it at sdpa"


def test_a_knob_that_turns_others_off_is_still_paired_and_a_tiny_effect_does_not_matter() -> None:
    """num_workers 0 sets prefetch_factor and persistent_workers to None: the pair differs in
    three keys, all from one knob. A 0.5% difference within ±1% intervals is said not to matter,
    not to be a reason to switch."""
    base = {
        "per_device_batch_size": 8,
        "num_workers": 2,
        "prefetch_factor": 2,
        "persistent_workers": False,
    }
    winner = _trial(0, base, 10.0, ci=0.005)
    no_workers = {**base, "num_workers": 0, "prefetch_factor": None, "persistent_workers": None}
    trials = [
        winner,
        _trial(1, no_workers, 10.05, ci=0.005),
        _trial(2, {**base, "per_device_batch_size": 4}, 13.0),
    ]
    effects = {e.knob: e for e in knob_effects(trials, winner).effects}
    workers = effects["num_workers"]
    assert workers.basis == "at the winner" and workers.ratio == pytest.approx(1.005)
    assert workers.verdict.startswith("no difference that matters")
    assert effects["per_device_batch_size"].ratio == pytest.approx(1.3)
    # prefetch_factor and persistent_workers only followed num_workers: no effect of their own
    assert set(effects) == {"num_workers", "per_device_batch_size"}


def test_without_any_pair_a_main_effects_model_recovers_known_effects() -> None:
    """A constructed 2^(4-1) design (resolution IV: no two trials differ in one knob alone),
    $/run = exp(sum of known effects) with 1% noise: the model's ratios land on the truth,
    inside their intervals, and say where they come from."""
    rng = random.Random(7)
    knobs = {
        "per_device_batch_size": (8, 4, math.log(1.30)),  # winner's value, other, true effect
        "gradient_accumulation_steps": (1, 2, math.log(1.05)),
        "attn_implementation": ("sdpa", "eager", math.log(1.50)),
        "optim": ("adamw_torch_fused", "adamw_torch", math.log(1.00)),
    }
    names = list(knobs)
    trials = []
    for number, levels in enumerate(itertools.product((0, 1), repeat=3)):
        levels = (*levels, levels[0] ^ levels[1] ^ levels[2])  # D = ABC
        config = {n: knobs[n][lv] for n, lv in zip(names, levels, strict=True)}
        log_cost = sum(knobs[n][2] for n, lv in zip(names, levels, strict=True) if lv)
        trials.append(_trial(number, config, 10 * math.exp(log_cost + rng.gauss(0, 0.01))))
    for a, b in itertools.combinations(trials, 2):
        assert len(_differ_in_alone(a.config, b.config)) >= 2
    winner = next(t for t in trials if all(t.config[n] == knobs[n][0] for n in names))
    result = knob_effects(trials, winner)
    assert result.untold == ()
    for e in result.effects:
        truth = math.exp(knobs[e.knob][2])
        assert e.basis == "model" and "from a model" in e.words
        assert e.ratio == pytest.approx(truth, rel=0.03), e
        assert e.low <= truth <= e.high, e
    verdicts = {e.knob: e.verdict for e in result.effects}
    assert verdicts["attn_implementation"] == "leave it at sdpa"
    assert verdicts["optim"].startswith("no difference")


def test_too_few_trials_for_a_model_and_no_pair_is_said_not_guessed() -> None:
    trials = [
        _trial(0, {"per_device_batch_size": 8, "attn_implementation": "sdpa"}, 10.0),
        _trial(1, {"per_device_batch_size": 4, "attn_implementation": "eager"}, 15.0),
    ]
    result = knob_effects(trials, trials[0])
    assert result.effects == () and set(result.untold) == {"batch size 4", "attention eager"}


def test_the_cli_rest_and_study_page_show_what_each_knob_is_worth(
    storage_url: str, tmp_path: Any
) -> None:
    store = Store(storage_url)
    store.migrate()
    import_study(store, read_study_file(CPU_DEMO), name="demo")
    expected = study_knob_effects(store, "demo")
    store.dispose()
    assert expected.winner == 4 and len(expected.effects) == 3
    env = os.environ | {"SWEEPER_STORAGE": storage_url, "COLUMNS": "200"}
    run = [sys.executable, "-m", "sweeper.cli", "best", "--study", "demo"]
    shown = subprocess.run(run, capture_output=True, text=True, env=env, timeout=300)
    assert shown.returncode == 0, shown.stderr
    out = " ".join(shown.stdout.split())
    assert "what each knob is worth here (at trial #4)" in out
    for effect in expected.effects:
        assert " ".join(effect.words.split()) in out
    # what it cannot tell apart, and the one trial that would (a walk's 6 trials aliased two)
    assert expected.untold
    told = expected.untold_sentence("demo")
    assert told in out and "measure trial #4's config with that knob alone changed" in told
    assert "POST /api/studies/demo/trials" in told and "sweeper launch --study demo" in told
    as_json = subprocess.run(run + ["--json"], capture_output=True, text=True, env=env)
    assert json.loads(as_json.stdout)["knob_effects"] == expected.model_dump(mode="json")
    with TestClient(create_app(storage_url)) as client:
        answer = client.get("/api/studies/demo/knob-effects")
        assert answer.status_code == 200, answer.text
        assert answer.json() == expected.model_dump(mode="json")
        missing = client.get("/api/studies/nope/knob-effects")
        assert missing.status_code == 404
        page = client.get("/studies/demo")
        section = page.text.split('<section id="knob-effects">')[1].split("</section>")[0]
        assert section.count("<tr data-basis=") == 3
        assert "leave it at sdpa" in section
        assert f'id="knob-effects-untold">{told}</p>' in html.unescape(section)


def test_the_verdict_table_for_results_has_one_row_per_effect_largest_first(
    sqlite_url: str,
) -> None:
    store = Store(sqlite_url)
    store.migrate()
    import_study(store, read_study_file(CPU_DEMO), name="demo")
    effects = study_knob_effects(store, "demo")
    store.dispose()
    table, untold = markdown_table(effects).split("\n\n")
    rows = table.splitlines()[2:]
    assert len(rows) == len(effects.effects) == 3
    assert untold.endswith(", ".join(effects.untold))
    ratios = [float(row.split("|")[4].strip().rstrip("×")) for row in rows]
    assert [abs(math.log(r)) for r in ratios] == sorted(
        (abs(math.log(r)) for r in ratios), reverse=True
    )
    for effect in effects.effects:
        row = next(r for r in rows if f"| {effect.ratio:.2f}× |" in r)
        assert row.rstrip().endswith(f"| {effect.verdict} |")
        assert f"{effect.low:.2f}–{effect.high:.2f}" in row


def test_a_trial_measured_only_on_a_shared_machine_is_no_evidence_against_a_knob() -> None:
    """A walk was told "grad. accumulation 2 instead of 1: 6.50x $/run ... leave it at 1"
    from a trial measured only while the machine was shared (side by side, calm: 1.24x).
    Sharing only slows a run: such a trial is left out of the pairs and the model, and
    named; measured calm, it counts."""
    base = {"per_device_batch_size": 1, "gradient_accumulation_steps": 1, "num_workers": 1}
    winner = _trial(6, base, 10.0)
    slowed = _trial(3, base | {"gradient_accumulation_steps": 2}, 65.0, contended=True)
    other = _trial(2, base | {"num_workers": 0}, 12.0)
    effects = knob_effects([winner, slowed, other], winner)
    assert effects.shared == (3,)
    assert {e.knob for e in effects.effects} == {"num_workers"}
    assert not any("accumulation" in u for u in effects.untold)  # no longer varied: named
    assert "#3, measured only while the machine was shared" in markdown_table(effects)
    calm = _trial(3, slowed.config, 12.4)  # the same config measured on a quiet machine
    (ga,) = [
        e for e in knob_effects([winner, calm, other], winner).effects if e.knob.startswith("grad")
    ]
    assert ga.ratio == pytest.approx(1.24) and ga.basis == "at the winner"
