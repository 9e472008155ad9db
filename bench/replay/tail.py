"""The tail of saved bayes replays, paired seed by seed (bench/RESULTS.md, Search Runs 13-15):
the default search against one form, per table and metric.

    .venv/bin/python bench/replay/tail.py DIR FORM TABLES [SEEDS]

reads DIR/TABLE.unweighted.jsonl (the default) and DIR/TABLE.<FORM>.jsonl
(``search_replay.py --save``) for each of the comma-separated TABLES (files in bench/replay)
and prints one Markdown row per metric: trials to 5% as median / 90th percentile (numpy's
linear) / share of seeds at 40 or more (count, max), for both on their common seeds (the
first SEEDS of them), the form's seeds worse / better, and the rule of Runs 13-15 (median at
most 1 above the default's; the tail lower: both the share at 40+ and the 90th percentile).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent), str(HERE.parent.parent)]
import search_replay as sr  # noqa: E402

from sweeper.space import load_space  # noqa: E402


def _space(table: str) -> Path:
    if table in ("noisy", "interactions"):
        return HERE / "interactions.yaml"
    return HERE / ("cpu-grid.yaml" if table.startswith("cpu-grid") else f"{table}.yaml")


def _figures(trials: np.ndarray) -> str:
    at_40 = int(np.sum(trials >= 40))
    return (
        f"{np.median(trials):g} / {np.percentile(trials, 90):g} / "
        f"{100 * at_40 / len(trials):.0f}% ({at_40}, max {trials.max():g})"
    )


def main(argv: list[str]) -> None:
    if len(argv) not in (3, 4):
        sys.exit(__doc__)
    folder, form, tables = Path(argv[0]), argv[1], argv[2].split(",")
    most = int(argv[3]) if len(argv) == 4 else None
    for table in tables:
        files = [folder / f"{table}.unweighted.jsonl", folder / f"{table}.{form}.jsonl"]
        missing = [str(f) for f in files if not sr.saved_path(f).is_file()]
        if missing:
            sys.exit(f"no such file {', '.join(missing)}: save them with search_replay.py --save")
        rows = sr.read_table(HERE / f"{table}.jsonl", load_space(_space(table)))
        base, other = (sr.load_replays([f], f"{table}.jsonl") for f in files)
        for metric in ("samples_per_s", "tokens_per_s"):
            best = sr.eligible_best(rows, metric)
            by_base, by_form = base.get(("bayes", metric), {}), other.get(("bayes", metric), {})
            seeds = sorted(set(by_base) & set(by_form))[:most]
            if not seeds:
                continue
            t_base, t_form = (
                np.array([sr.trials_until(r[s].values, 0.95 * best) for s in seeds])
                for r in (by_base, by_form)
            )
            median_ok = np.median(t_form) <= np.median(t_base) + 1
            tail_lower = np.mean(t_form >= 40) < np.mean(t_base >= 40) and np.percentile(
                t_form, 90
            ) < np.percentile(t_base, 90)
            print(
                f"| {table} ({len(seeds)}) | {metric} | {_figures(t_base)} | {form}: "
                f"{_figures(t_form)} | {int(np.sum(t_form > t_base))} / "
                f"{int(np.sum(t_form < t_base))} | median {'ok' if median_ok else 'FAILS'}; "
                f"tail {'lower' if tail_lower else 'not lower'} |"
            )


if __name__ == "__main__":
    main(sys.argv[1:])
