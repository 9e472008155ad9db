"""Paired comparison of saved bayes replays (bench/RESULTS.md, Search Run 10): the unweighted
search against each form of the time weighing, seed by seed.

    .venv/bin/python bench/replay/paired.py DIR TABLE SPACE [FORMS]

reads DIR/TABLE.unweighted.jsonl and DIR/TABLE.<form>.jsonl (``search_replay.py --save``) for
each form in tiebreak, cooling (or FORMS, comma-separated), and prints one row per form and
metric: medians of trials and measurement-seconds to 5% with bootstrap 95% intervals, seeds
worse / better, the median paired difference, the sum ratio of seconds, and the pre-set rule
(Run 10's: the form's median at most 1 above; with FORMS, Run 12's per row: that, and the sum
ratio at most 1.05).
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent), str(HERE.parent.parent)]
import search_replay as sr  # noqa: E402

from sweeper.space import load_space  # noqa: E402

FORMS = ("tiebreak", "cooling")


def _boot(values: list[float], rng: np.random.Generator) -> tuple[float, float, float]:
    xs = np.array(values, float)
    medians = np.median(rng.choice(xs, size=(2000, len(xs))), axis=1)
    return (
        float(np.median(xs)),
        float(np.percentile(medians, 2.5)),
        float(np.percentile(medians, 97.5)),
    )


def _to_5(
    replays: dict[int, sr.Replay], seeds: list[int], best: float
) -> tuple[list[float], list[float]]:
    trials = [sr.trials_until(replays[s].values, 0.95 * best) for s in seeds]
    seconds = [
        replays[s].seconds_at[int(n) - 1] if math.isfinite(n) else math.inf
        for s, n in zip(seeds, trials, strict=True)
    ]
    return trials, seconds


def main(directory: Path, table: str, space: str, forms: tuple[str, ...] = FORMS) -> None:
    rows = sr.read_table(HERE / f"{table}.jsonl", load_space(HERE / f"{space}.yaml"))
    name = f"{table}.jsonl"
    base = sr.load_replays([directory / f"{table}.unweighted.jsonl"], name)
    for metric in ("samples_per_s", "tokens_per_s"):
        best = sr.eligible_best(rows, metric)
        unweighted = base.get(("bayes", metric), {})
        for form in forms:
            path = directory / f"{table}.{form}.jsonl"
            if not sr.saved_path(path).exists():
                continue
            weighted = sr.load_replays([path], name).get(("bayes", metric), {})
            seeds = sorted(set(unweighted) & set(weighted))
            if not seeds:
                continue
            rng = np.random.default_rng(0)
            tu, su = _to_5(unweighted, seeds, best)
            tw, sw = _to_5(weighted, seeds, best)
            mu, mw, smu, smw = (_boot(x, rng) for x in (tu, tw, su, sw))
            worse = sum(w > u for w, u in zip(tw, tu, strict=True))
            better = sum(w < u for w, u in zip(tw, tu, strict=True))
            diff = _boot([w - u for w, u in zip(tw, tu, strict=True)], rng)
            finite = all(map(math.isfinite, su + sw))
            total = sum(sw) / sum(su) if finite else float("nan")
            passes = mw[0] <= mu[0] + 1 and (forms == FORMS or total <= 1.05)
            rule = "passes" if passes else "**fails**"
            print(
                f"| {table} ({len(seeds)}) | {metric} | {mu[0]:g} [{mu[1]:g}, {mu[2]:g}] / "
                f"{smu[0]:,.0f} [{smu[1]:,.0f}, {smu[2]:,.0f}] | {form}: {mw[0]:g} [{mw[1]:g}, "
                f"{mw[2]:g}] / {smw[0]:,.0f} [{smw[1]:,.0f}, {smw[2]:,.0f}] | "
                f"{smw[0] / smu[0]:.2f} | {worse} / {better} | {diff[0]:g} [{diff[1]:g}, "
                f"{diff[2]:g}] | {total:.2f} | {rule} |"
            )


if __name__ == "__main__":
    if len(sys.argv) not in (4, 5):
        sys.exit("usage: paired.py DIR TABLE SPACE [FORMS] (e.g. run10 noisy interactions)")
    forms = tuple(sys.argv[4].split(",")) if len(sys.argv) == 5 else FORMS
    main(Path(sys.argv[1]), sys.argv[2], sys.argv[3], forms)
