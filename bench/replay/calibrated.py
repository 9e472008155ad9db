"""The time weighing's rule with its error rates computed (bench/RESULTS.md, Search Run 19;
Run 18 found the earlier rule failed a form that changes nothing 97% of the time).

    .venv/bin/python bench/replay/calibrated.py null DIR [--seeds N] [--draws N] [--tied FORM]
    .venv/bin/python bench/replay/calibrated.py judge DIR FORM [--default DIR2]

The rule (fixed in bench/replay/run19/RULE.md before Run 19's replays): a form of the time
weighing becomes the default only if, on the six tables with compile modes and both metrics
(12 rows), paired seed by seed with the default's saved replays,

- **it does not lose trials**: on no row does the one-sided exact sign test (seeds where the
  form needed more trials to 5% against seeds where it needed fewer, ties left out) say it
  needs more at p < ``ALPHA`` (0.005);
- **it saves seconds**: the geometric mean over the rows of its summed measurement-seconds
  to 5% ÷ the default's has a 95% interval (paired bootstrap: the seeds of each row resampled)
  wholly below 1.

``null`` estimates how often this rule fails, and how often it passes, a form that changes
nothing (the default against itself reseeded, drawn with replacement from the default's saved
replays as ``null_rule.py`` does; ``--tied FORM`` keeps the share of seeds whose replay under
FORM was the default's pick for pick). ``judge`` applies it to FORM's saved replays
(DIR/TABLE.FORM.jsonl) against the default's (DIR/TABLE.unweighted.jsonl, or --default DIR2).
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent), str(HERE.parent.parent), str(HERE)]
import null_rule  # noqa: E402
import search_replay as sr  # noqa: E402

from sweeper.space import load_space  # noqa: E402

ALPHA = 0.005  # per row, one-sided: about 5% over the 12 rows for a form that changes nothing
BOOT = 2000


def sign_p(worse: int, better: int) -> float:
    """One-sided exact sign test: P(at least ``worse`` of worse + better seeds worse) when
    worse and better are equally likely."""
    n = worse + better
    if n == 0:
        return 1.0
    return sum(math.comb(n, i) for i in range(worse, n + 1)) / 2**n


def _to_5(directory: Path, table: str, metric: str, form: str) -> dict[int, tuple[float, float]]:
    rows = sr.read_table(
        HERE / f"{table}.jsonl", load_space(HERE / f"{null_rule.TABLES[table]}.yaml")
    )
    target = 0.95 * sr.eligible_best(rows, metric)
    saved = sr.load_replays([directory / f"{table}.{form}.jsonl"], f"{table}.jsonl")
    out = {}
    for seed, replay in saved.get(("bayes", metric), {}).items():
        n = sr.trials_until(replay.values, target)
        out[seed] = (n, replay.seconds_at[int(n) - 1] if math.isfinite(n) else math.inf)
    return out


def verdict(
    pairs: list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]], rng: np.random.Generator
) -> tuple[list[tuple[int, int, float, float]], tuple[float, float, float], bool, bool]:
    """Per row (form trials, default trials, form seconds, default seconds, paired by seed):
    (worse, better, p, sum ratio); the geometric mean of the sum ratios with its 95% interval;
    whether the trials part fails and whether the seconds part passes."""
    rows = []
    logs = np.zeros((BOOT, len(pairs)))
    for j, (tf, td, sf, sd) in enumerate(pairs):
        worse, better = int((tf > td).sum()), int((tf < td).sum())
        rows.append((worse, better, sign_p(worse, better), float(sf.sum() / sd.sum())))
        idx = rng.integers(0, len(tf), size=(BOOT, len(tf)))
        logs[:, j] = np.log(sf[idx].sum(axis=1) / sd[idx].sum(axis=1))
    geo = float(np.exp(np.mean([math.log(r[3]) for r in rows])))
    lo, hi = np.exp(np.percentile(logs.mean(axis=1), [2.5, 97.5]))
    loses = any(p < ALPHA for _, _, p, _ in rows)
    return rows, (geo, float(lo), float(hi)), loses, bool(hi < 1)


def judge(directory: Path, form: str, default_dir: Path | None = None) -> bool:
    """Print FORM's table and verdict; True if it passes the rule."""
    rng = np.random.default_rng(0)
    pairs, names = [], []
    for table in null_rule.TABLES:
        if not sr.saved_path(directory / f"{table}.{form}.jsonl").exists():
            print(f"({table}: no replays of {form})")
            continue
        for metric in null_rule.METRICS:
            f = _to_5(directory, table, metric, form)
            d = _to_5(default_dir or directory, table, metric, "unweighted")
            seeds = sorted(set(f) & set(d))
            if not seeds:
                continue
            bad = [s for s in seeds if not (math.isfinite(f[s][1]) and math.isfinite(d[s][1]))]
            if bad:
                raise SystemExit(f"{table} {metric}: seeds {bad} never within 5%; not handled")
            pairs.append(tuple(np.array([x[s][k] for s in seeds]) for x, k in
                               ((f, 0), (d, 0), (f, 1), (d, 1))))  # fmt: skip
            names.append((table, metric, len(seeds)))
    rows, (geo, lo, hi), loses, saves = verdict(pairs, rng)  # type: ignore[arg-type]
    print("| table (paired seeds) | metric | form's trials to 5%: median / default's | seeds "
          "worse / better | one-sided sign test p | summed seconds ratio |")  # fmt: skip
    print("|---|---|---|---|---:|---:|")
    for (table, metric, n), (worse, better, p, ratio), (tf, td, _, _) in zip(
        names, rows, pairs, strict=True
    ):
        flag = " **loses**" if p < ALPHA else ""
        print(
            f"| {table} ({n}) | {metric} | {np.median(tf):g} / {np.median(td):g} | "
            f"{worse} / {better} | {p:.2g}{flag} | {ratio:.3f} |"
        )
    print(
        f"\nseconds, geometric mean of the {len(rows)} rows' ratios: {geo:.3f} [{lo:.3f}, {hi:.3f}]"
        f"\ntrials part: {'fails (a row at' if loses else 'passes (no row at'} p < {ALPHA}); "
        f"seconds part: {'passes (the interval is' if saves else 'fails (the interval is not'} "
        "wholly below 1)"
        f"\nrule: {'PASSES' if saves and not loses else 'fails'}"
    )
    return saves and not loses


def null(directory: Path, seeds: int, draws: int, tied_form: str | None) -> tuple[float, float]:
    """Print and return how often a form that changes nothing fails the trials part, and
    how often it passes the whole rule."""
    rng = np.random.default_rng(0)
    data = []
    for table in null_rule.TABLES:
        for metric in null_rule.METRICS:
            trials, seconds = null_rule._row(directory, table, metric)
            tied = null_rule._tied(directory, table, metric, tied_form) if tied_form else 0.0
            data.append((trials, seconds, tied))
    fails = passes = 0
    boot_rng = np.random.default_rng(1)
    for _ in range(draws):
        pairs = []
        for trials, seconds, tied in data:
            a = rng.integers(0, len(trials), size=seeds)
            b = np.where(rng.random(seeds) < tied, a, rng.integers(0, len(trials), size=seeds))
            pairs.append((trials[b], trials[a], seconds[b], seconds[a]))
        _, _, loses, saves = verdict(pairs, boot_rng)
        fails += loses
        passes += saves and not loses
    print(
        f"a form that changes nothing, {draws} draws of {seeds} seeds a side"
        f"{f', pairing as {tied_form}' if tied_form else ', unpaired'}:\n"
        f"  fails the trials part (a row at one-sided p < {ALPHA}): {fails / draws:.3f}\n"
        f"  passes the whole rule (seconds' interval below 1, no row losing): {passes / draws:.3f}"
    )
    return fails / draws, passes / draws


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    n = sub.add_parser("null")
    n.add_argument("directory", type=Path)
    n.add_argument("--seeds", type=int, default=200)
    n.add_argument("--draws", type=int, default=500)
    n.add_argument("--tied", metavar="FORM")
    j = sub.add_parser("judge")
    j.add_argument("directory", type=Path)
    j.add_argument("form")
    j.add_argument("--default", type=Path, help="the default's replays' folder (else DIR)")
    args = parser.parse_args()
    if args.command == "null":
        null(args.directory, args.seeds, args.draws, args.tied)
    else:
        judge(args.directory, args.form, args.default)


if __name__ == "__main__":
    main()
