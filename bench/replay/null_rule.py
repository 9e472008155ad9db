"""How often the time weighing's rule (Search Runs 12, 16 and 17) fails a form that changes
nothing: the default against itself, reseeded (bench/RESULTS.md, Search Run 18).

    .venv/bin/python bench/replay/null_rule.py DIR [--draws N] [--seeds N] [--tied FORM]

reads the default's saved replays DIR/TABLE.unweighted.jsonl (``search_replay.py --save``) for
the six tables with compile modes, and draws two samples of ``--seeds`` seeds each, with
replacement, from each (table, metric)'s saved seeds: "the default" and "a form that is the
default under other seeds". Each draw judges the second against the first by the rule as
written (per row: the form's median trials to 5% at most 1 above the default's and its summed
measurement-seconds at most 1.05x; over the 12 rows: the sum lower on at least half) and
prints, per row and for all rows at once, how often such a no-change form passes.

The two samples are unpaired: a real form is compared on paired seeds, but a changed first
pick changes every later pick (Run 16). ``--tied FORM`` models the pairing: a seed whose replay
under FORM (DIR/TABLE.FORM.jsonl) was identical to the default's, as that fraction of a row's
seeds, is the same seed on both sides, the rest are drawn apart. The figure is an estimate of
the rule's false-failure rate, not a measurement of any form.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent), str(HERE.parent.parent)]
import search_replay as sr  # noqa: E402

from sweeper.space import load_space  # noqa: E402

# table -> its space's file (noisy's is interactions.yaml, as in Runs 16 and 17)
TABLES = {
    "held-out": "held-out",
    "noisy": "interactions",
    "interactions": "interactions",
    "oom-wall": "oom-wall",
    "held-out-lora": "held-out-lora",
    "qlora-24gb": "qlora-24gb",
}
METRICS = ("samples_per_s", "tokens_per_s")


def _tied(directory: Path, table: str, metric: str, form: str) -> float:
    """The share of seeds whose replay under ``form`` was the default's, pick for pick."""
    name = f"{table}.jsonl"
    default = sr.load_replays([directory / f"{table}.unweighted.jsonl"], name)[("bayes", metric)]
    other = sr.load_replays([directory / f"{table}.{form}.jsonl"], name)[("bayes", metric)]
    seeds = sorted(set(default) & set(other))
    return sum(default[s].values == other[s].values for s in seeds) / len(seeds)


def _sign_test(directory: Path, table: str, metric: str, form: str) -> tuple[int, int, float]:
    """FORM's real pairs: seeds where it needed more / fewer trials to 5% than the default,
    and the two-sided exact sign test's p (ties left out)."""
    rows = sr.read_table(HERE / f"{table}.jsonl", load_space(HERE / f"{TABLES[table]}.yaml"))
    target = 0.95 * sr.eligible_best(rows, metric)
    name = f"{table}.jsonl"
    default = sr.load_replays([directory / f"{table}.unweighted.jsonl"], name)[("bayes", metric)]
    other = sr.load_replays([directory / f"{table}.{form}.jsonl"], name)[("bayes", metric)]
    pairs = [
        (sr.trials_until(other[s].values, target), sr.trials_until(default[s].values, target))
        for s in sorted(set(default) & set(other))
    ]
    worse = sum(f > d for f, d in pairs)
    better = sum(f < d for f, d in pairs)
    n, k = worse + better, min(worse, better)
    p = min(1.0, 2 * sum(math.comb(n, i) for i in range(k + 1)) / 2**n) if n else 1.0
    return worse, better, p


def _row(directory: Path, table: str, metric: str) -> tuple[np.ndarray, np.ndarray]:
    """Trials and measurement-seconds to 5% of each saved seed of the default."""
    rows = sr.read_table(HERE / f"{table}.jsonl", load_space(HERE / f"{TABLES[table]}.yaml"))
    best = sr.eligible_best(rows, metric)
    saved = sr.load_replays([directory / f"{table}.unweighted.jsonl"], f"{table}.jsonl")
    replays = saved[("bayes", metric)]
    trials, seconds = [], []
    for seed in sorted(replays):
        n = sr.trials_until(replays[seed].values, 0.95 * best)
        if not math.isfinite(n):
            raise SystemExit(f"{table} {metric} seed {seed}: never within 5%; not handled here")
        trials.append(n)
        seconds.append(replays[seed].seconds_at[int(n) - 1])
    return np.array(trials), np.array(seconds)


def judge(
    directory: Path, seeds: int, draws: int, tied_form: str | None = None
) -> tuple[list[str], float, float]:
    """The table's lines, the share of draws where a no-change form passes every row's
    limits, and the share where it passes the whole rule."""
    rng = np.random.default_rng(0)
    rows = [(t, m) for t in TABLES for m in METRICS]
    per_row_ok = np.zeros((draws, len(rows)), bool)
    lower = np.zeros((draws, len(rows)), bool)
    lines = []
    for j, (table, metric) in enumerate(rows):
        trials, seconds = _row(directory, table, metric)
        n = len(trials)
        a = rng.integers(0, n, size=(draws, seeds))
        b = rng.integers(0, n, size=(draws, seeds))
        tied = _tied(directory, table, metric, tied_form) if tied_form else 0.0
        b = np.where(rng.random(size=a.shape) < tied, a, b)
        trials_ok = np.median(trials[b], axis=1) <= np.median(trials[a], axis=1) + 1
        ratio = seconds[b].sum(axis=1) / seconds[a].sum(axis=1)
        lower[:, j] = ratio < 1
        per_row_ok[:, j] = trials_ok & (ratio <= 1.05)
        lo, hi = np.percentile(ratio, [2.5, 97.5])
        sign = ""
        if tied_form:
            worse, better, p = _sign_test(directory, table, metric, tied_form)
            sign = f" {worse} / {better}, p {p:.2g} |"
        lines.append(
            f"| {table} ({n} saved) | {metric} | {tied:.2f} | {trials_ok.mean():.2f} | "
            f"{np.mean(ratio <= 1.05):.2f} | {per_row_ok[:, j].mean():.2f} | "
            f"[{lo:.2f}, {hi:.2f}] |{sign}"
        )
    every_row = per_row_ok.all(axis=1)
    passes = every_row & (lower.sum(axis=1) >= len(rows) / 2)
    return lines, float(every_row.mean()), float(passes.mean())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("directory", type=Path)
    parser.add_argument("--draws", type=int, default=2000)
    parser.add_argument("--seeds", type=int, default=200)
    parser.add_argument("--tied", metavar="FORM", help="model the pairing from FORM's replays")
    args = parser.parse_args()
    lines, every_row, passes = judge(args.directory, args.seeds, args.draws, args.tied)
    print("\n".join(lines))
    print(
        f"\nall {len(lines)} rows pass their limits: {every_row:.3f}; "
        f"and the sum lower on at least half: {passes:.3f} "
        f"({args.draws} draws of {args.seeds} seeds a side)"
    )


if __name__ == "__main__":
    main()
