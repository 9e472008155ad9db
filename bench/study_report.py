"""A recorded study as a markdown report for bench/RESULTS.md: every trial's figures, the
recommendation side by side with the space's named configs, and what doctor found.

    python bench/study_report.py studies/h100-llama-1b.json [--doctor doctor.json]
        [--fidelity fidelity.md] > summary.md

The study file is imported into a throwaway SQLite database and the recommendation comes from
``sweeper.recommend.best`` there, so the report says what ``sweeper best`` says. Every figure
is a measurement of the file's trials (hours and $ per run are their projections).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
from pathlib import Path
from typing import Any

from sweeper.errors import SweeperError
from sweeper.knobs import describe
from sweeper.measurement import parse_measurement
from sweeper.recommend import best
from sweeper.recommendation import Recommendation
from sweeper.space import TrialConfig, parse_space
from sweeper.store import Store
from sweeper.studyfile import (
    StudyDocument,
    import_study,
    model_shape,
    read_study_file,
    real_token_mfu,
)


def _describe(config: dict[str, Any]) -> str:
    return describe(config)


def _num(value: float | None, spec: str, scale: float = 1.0, suffix: str = "") -> str:
    if value is None or math.isnan(value):
        return "—"
    return format(value * scale, spec) + suffix


def _gib(value: float | None) -> str:
    return _num(value, ",.1f", 1 / 1024**3, " GiB")


def _named_configs(document: StudyDocument) -> list[tuple[str, dict[str, Any]]]:
    space = parse_space(document.study["space_yaml"], "the study's space")
    return [
        (known.label or where, known.as_config(space.search).model_dump())
        for where, known in space.named_known_configs()
    ]


def _why_not_run(study: dict[str, Any], config: dict[str, Any]) -> str:
    """': preflight dropped attn_implementation flash_attention_2 (the package ... is not
    installed)' when a value of the config could not run on the machine; else ''."""
    dropped = (study.get("preflight") or {}).get("dropped") or {}
    reasons = [
        f"{knob} {config[knob]} ({why.rsplit(': ', 1)[-1].rstrip('.')})"
        for knob, values in dropped.items()
        for value, why in values.items()
        if knob in config and str(config[knob]) == value
    ]
    return f": preflight dropped {'; '.join(reasons)}" if reasons else ""


def _trial_of(trials: list[dict[str, Any]], config: dict[str, Any]) -> dict[str, Any] | None:
    wanted = TrialConfig.model_validate(config)
    for trial in trials:
        if TrialConfig.model_validate(trial["config"]) == wanted:
            return trial
    return None


def report(
    document: StudyDocument, doctor: dict[str, Any] | None, fidelity: str | None, command: str
) -> str:
    trials = document.trials
    complete = [t for t in trials if t["state"] == "complete"]
    failed = [t for t in trials if t["state"] == "failed"]
    study = document.study
    shape = model_shape(study["space_yaml"])  # for the real-token MFU of older records
    env = parse_measurement(complete[0]["measurement"]).env if complete else None
    lines = [
        f"#### {study['name']} on {env.device_name if env else study['hardware_name']}, "
        f"recorded {str(study['updated_at'])[:10]}",
        "",
        f"Command: `{command}`. Priced as {study['hardware_name']} at "
        f"${study['usd_per_hour']:.2f}/h; the job: {study['samples']:,} samples × "
        f"{study['epochs']:g} epochs. Driver {(env and env.driver) or '—'}, CUDA "
        f"{(env and env.cuda) or '—'}, torch {env.torch if env else '—'}, transformers "
        f"{env.transformers if env else '—'}, Python {env.python if env else '—'}. "
        f"{len(complete)} trials complete, {len(failed)} failed; the sweep used "
        f"{study['sweep_seconds'] / 60:.1f} min of the machine.",
        "",
    ]
    with tempfile.TemporaryDirectory() as tmp:
        store = Store(f"sqlite:///{tmp}/report.db")
        try:
            store.migrate()
            import_study(store, document)
            recommendation: Recommendation | None = best(store, study["name"])
            why_none = None
        except SweeperError as e:
            recommendation, why_none = None, str(e)
        finally:
            store.dispose()

    lines += ["##### Named configs side by side", ""]
    header = "| config | trial | samples/s (±95%) | tokens/s | MFU | peak memory | h/run | $/run |"
    lines += [header, "|---|---|---:|---:|---:|---:|---:|---:|"]
    rows = [("**recommended**", recommendation.config)] if recommendation else []
    for label, config in rows + _named_configs(document):
        trial = _trial_of(trials, config)
        if trial is None:
            lines.append(f"| {label} | not run{_why_not_run(document.study, config)} | | | | | | |")
            continue
        if trial["state"] != "complete":
            lines.append(
                f"| {label} | #{trial['number']} {trial['state']}: {trial['failure_kind']} "
                f"| | | | | | |"
            )
            continue
        lines.append(_trial_row(label, trial, shape))
    if recommendation is None:
        lines.append(f"\nNo recommendation: {why_none}")
    else:
        lines += [
            "",
            f"Recommended: trial #{recommendation.trial_number}, "
            f"{_describe(recommendation.config)}.",
        ]
        if recommendation.keeps_baseline:
            lines[-1] += f" It is the baseline: {recommendation.KEEP_BASELINE}."
        elif recommendation.speedup_vs_baseline is not None:
            lines[-1] += (
                f" {recommendation.speedup_vs_baseline:.2f}× faster than the baseline, "
                f"${recommendation.usd_saved_per_run or 0:,.2f} saved per run."
            )
        lines += [f"Warning: {w}" for w in recommendation.warnings]

    lines += ["", "##### Every trial", ""]
    lines += [header, "|---|---|---:|---:|---:|---:|---:|---:|"]
    for trial in sorted(complete, key=lambda t: t["cost_per_run_usd"] or float("inf")):
        lines.append(_trial_row(_describe(trial["config"]), trial, shape))
    if any("counts padding" in line for line in lines):
        lines += [
            "",
            "MFU marked 'counts padding' was recorded before MFU counted real tokens only "
            "(issue 36): the recorded figure is kept; the real-token one beside it is derived "
            "from the trial's padding share (`sweeper.studyfile.real_token_mfu`).",
        ]
    for trial in failed:
        message = (trial["failure_message"] or "")[:160].replace("|", "/").replace("\n", " ")
        lines.append(
            f"| {_describe(trial['config'])} | #{trial['number']} {trial['failure_kind']}: "
            f"{message} | | | | | | |"
        )

    lines += ["", *overhead_lines(trials)]

    if doctor is not None:
        lines += ["", "##### sweeper doctor", ""]
        facts = doctor["facts"]
        devices = ", ".join(
            f"{d['name']} ({d['memory_free_bytes'] / 1024**3:.0f} of "
            f"{d['memory_bytes'] / 1024**3:.0f} GiB free)"
            for d in facts["devices"]
        )
        lines.append(
            f"Devices: {devices or 'none'}; exit status {doctor['exit_code']} for "
            f"{doctor['space'] or 'the machine alone'}."
        )
        lines.append("")
        for finding in doctor["findings"]:
            fix = f" Fix: {finding['fix']}" if finding.get("fix") else ""
            lines.append(f"- {finding['level']} ({finding['topic']}): {finding['text']}{fix}")
    if fidelity:
        lines += ["", "##### Fidelity: a trial against a run 10× longer", "", fidelity.strip()]
    return "\n".join(lines) + "\n"


def overhead_lines(trials: list[dict[str, Any]]) -> list[str]:
    """Where each trial's wall time went: the timed window, and what a GPU minute bought
    outside it (issue 32), with the checkpoint and compile figures' sources."""
    # a failed trial keeps its log tail as its measurement: only the completed ones were timed
    timed = [
        t
        for t in trials
        if t.get("state") == "complete" and t.get("wall_s") and t.get("measurement")
    ]
    if not timed:
        return []
    lines = [
        "##### Where each trial's time went",
        "",
        "| trial | wall s | window s | outside | start-up s | model s | burn-in s "
        "| checkpoint s | checkpoint figure | compile |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---|---|",
    ]
    shares = []
    for trial in sorted(timed, key=lambda t: t["number"]):
        m = parse_measurement(trial["measurement"])
        phases = m.phases_s
        outside = 1 - m.window_s / trial["wall_s"]
        shares.append(outside)
        startup = m.startup_own_s if m.startup_own_s is not None else m.startup_s
        if m.compile_cache == "warm":
            compile_text = f"warm {m.compile_measured_s:.0f} s (cold {m.compile_s:.0f} s priced)"
        elif m.compile_cache == "cold":
            compile_text = f"cold {m.compile_s:.0f} s"
        else:
            compile_text = "—" if m.compile_s == 0 else f"{m.compile_s:.0f} s"
        lines.append(
            f"| #{trial['number']} | {trial['wall_s']:.1f} | {m.window_s:.1f} | {outside:.0%} "
            f"| {_num(startup, '.1f')} | {_num(phases.model, '.1f')} "
            f"| {_num(phases.warmup, '.1f')} | {_num(phases.checkpoint, '.1f')} "
            f"| {m.checkpoint_source or '—'} | {compile_text} |"
        )
    ordered = sorted(shares)
    median = (
        ordered[len(ordered) // 2]
        if len(ordered) % 2
        else sum(ordered[len(ordered) // 2 - 1 : len(ordered) // 2 + 1]) / 2
    )
    walls = [t["wall_s"] for t in timed]
    lines += [
        "",
        f"Outside the timed window: median {median:.0%} (min {ordered[0]:.0%}, max "
        f"{ordered[-1]:.0%}) of {len(timed)} measured trials; trials per hour of trial time "
        f"{3600 * len(walls) / sum(walls):.0f} (mean wall {sum(walls) / len(walls):.1f} s).",
    ]
    return lines


def _mfu_cell(trial: dict[str, Any], shape: tuple[int, int] | None) -> str:
    accounting = real_token_mfu(trial["measurement"], shape)
    if accounting is None or not accounting.counts_padding:
        return _num(trial["mfu"], ".1%")
    return f"{trial['mfu']:.1%} (counts padding; real tokens {accounting.figure}, derived)"


def _trial_row(label: str, trial: dict[str, Any], shape: tuple[int, int] | None) -> str:
    measurement = parse_measurement(trial["measurement"])
    return (
        f"| {label} | #{trial['number']} | {_num(trial['samples_per_s'], ',.1f')} "
        f"(±{_num(measurement.throughput_ci95_rel, '.1%')}) "
        f"| {_num(trial['tokens_per_s'], ',.0f')} "
        f"| {_mfu_cell(trial, shape)} | {_gib(trial['peak_memory_bytes'])} "
        f"| {_num(trial['hours_per_run'], ',.2f')} | {_num(trial['cost_per_run_usd'], ',.2f')} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("study_file", type=Path)
    parser.add_argument("--doctor", type=Path, help="the JSON of `sweeper doctor --json`")
    parser.add_argument("--fidelity", type=Path, help="bench/trial_quality.py's markdown")
    args = parser.parse_args()
    try:
        document = read_study_file(args.study_file)
    except SweeperError as e:
        sys.exit(f"error: {e}")
    doctor = json.loads(args.doctor.read_text()) if args.doctor else None
    fidelity = args.fidelity.read_text() if args.fidelity else None
    sys.stdout.write(report(document, doctor, fidelity, "python " + " ".join(sys.argv)))


if __name__ == "__main__":
    main()
