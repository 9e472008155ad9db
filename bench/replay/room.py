"""How many of the default search's seconds a time weighing could save at most, and where the
best configs lie (bench/RESULTS.md, Search Run 19).

    .venv/bin/python bench/replay/room.py [DIR]

For each table with compile modes and both metrics, from the default's saved replays
(DIR/TABLE.unweighted.jsonl, Run 17's by default): the summed measurement-seconds to 5%, and
that sum had every trial before the one within 5% taken the cheapest running config's time
(the same number of trials: the most any reordering by cost can save without losing a
trial); and the compile modes of the configs within 5% of the best.
"""

from __future__ import annotations

import collections
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent), str(HERE.parent.parent), str(HERE)]
import null_rule  # noqa: E402
import search_replay as sr  # noqa: E402

from sweeper.space import load_space  # noqa: E402

METRIC_FIELD = {"samples_per_s": "samples_per_s", "tokens_per_s": "tokens_per_s"}


def main(directory: Path) -> None:
    print("| table | metric | configs within 5%, by compile mode | cheapest running trial | "
          "seconds to 5%, summed | at most saved (share kept) |")  # fmt: skip
    print("|---|---|---|---:|---:|---:|")
    for table, space in null_rule.TABLES.items():
        rows = sr.read_table(HERE / f"{table}.jsonl", load_space(HERE / f"{space}.yaml"))
        raw = [json.loads(line) for line in (HERE / f"{table}.jsonl").open()]
        ran = [r for r in raw if r["status"] == "ok"]
        cheapest = min(r["trial_s"] for r in ran)
        saved = sr.load_replays([directory / f"{table}.unweighted.jsonl"], f"{table}.jsonl")
        for metric in null_rule.METRICS:
            best = sr.eligible_best(rows, metric)
            top = max(r[metric] for r in ran)
            modes = collections.Counter(
                r.get("compile_mode", "none") for r in ran if r[metric] >= top / 1.05
            )
            total = floor = 0.0
            for replay in saved[("bayes", metric)].values():
                n = int(sr.trials_until(replay.values, 0.95 * best))
                at = replay.seconds_at
                total += at[n - 1]
                floor += (n - 1) * cheapest + at[n - 1] - (at[n - 2] if n > 1 else 0.0)
            print(
                f"| {table} | {metric} | {', '.join(f'{m} {k}' for m, k in modes.items())} | "
                f"{cheapest:g} s | {total:,.0f} | {1 - floor / total:.0%} ({floor / total:.2f}) |"
            )


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else HERE / "run17")
