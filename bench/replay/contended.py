"""cpu-grid-contended's saved replays read against the same grid measured calm
(cpu-grid.jsonl, the truth; bench/RESULTS.md, Search Run 10).

    .venv/bin/python bench/replay/contended.py SAVED.jsonl ...

SAVED: ``search_replay.py --table bench/replay/cpu-grid-contended.jsonl --save``. Each contended
value belongs to one config, so each replay's values map back to the configs it ran. Per
sampler and metric: trials to 5% of the table's best, trials until a config truly within 5%
(calm) ran, the calm regret of the table's pick after 20 and 40 trials and the table's regret
after 20, both in units of the grid's 4.5% run-to-run spread; medians [bootstrap 95% CI].
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
KNOBS = ("per_device_batch_size", "gradient_accumulation_steps", "num_workers",
         "max_seq_length", "packing", "attn_implementation")  # fmt: skip
SPREAD = 0.045  # the grid's run-to-run spread, measured (bench/RESULTS.md, repeatability)


def _read(name: str) -> dict[tuple, dict]:
    rows = [json.loads(line) for line in (HERE / name).read_text().splitlines() if line.strip()]
    return {tuple(r[k] for k in KNOBS): r for r in rows}


def _boot(values: list[float], rng: np.random.Generator) -> str:
    xs = np.array(values, float)
    medians = np.median(rng.choice(xs, size=(2000, len(xs))), axis=1)
    low, high = np.percentile(medians, [2.5, 97.5])
    return f"{np.median(xs):.3g} [{low:.3g}, {high:.3g}]"


def main(paths: list[Path]) -> None:
    calm, contended = _read("cpu-grid.jsonl"), _read("cpu-grid-contended.jsonl")
    records = [json.loads(line) for p in paths for line in p.open() if line.strip()]
    rng = np.random.default_rng(0)
    for metric in ("samples_per_s", "tokens_per_s"):
        config_of = {contended[k][metric]: k for k in contended}
        best = max(r[metric] for r in contended.values())
        truth = max(r[metric] for r in calm.values())
        print(f"\n{metric}: contended best {best:,.1f}, calm best {truth:,.1f}\n")
        print(
            "| sampler | seeds | to 5% of the table's best | to 5% of the calm best (a config "
            "truly within 5% run) | calm regret of the table's pick @20, in 4.5% units | @40 "
            "| table regret @20, in 4.5% units |\n|---|---:|---|---|---|---|---|"
        )
        for sampler in ("bayes", "random", "tpe"):
            runs = [r for r in records if r["sampler"] == sampler and r["metric"] == metric]
            if not runs:
                continue
            cells: list[list[float]] = [[], [], [], [], []]
            for r in runs:
                ran = [config_of[v] for v in r["values"]]
                cells[0].append(next(
                    (i for i, k in enumerate(ran, 1) if contended[k][metric] >= 0.95 * best),
                    math.inf,
                ))  # fmt: skip
                cells[1].append(next(
                    (i for i, k in enumerate(ran, 1) if calm[k][metric] >= 0.95 * truth),
                    math.inf,
                ))  # fmt: skip
                for column, n in ((2, 20), (3, 40)):
                    pick = max(ran[:n], key=lambda k: contended[k][metric])
                    cells[column].append((1 - calm[pick][metric] / truth) / SPREAD)
                pick = max(ran[:20], key=lambda k: contended[k][metric])
                cells[4].append((1 - contended[pick][metric] / best) / SPREAD)
            row = " | ".join(_boot(c, rng) for c in cells)
            print(f"| {sampler} | {len(runs)} | {row} |")


if __name__ == "__main__":
    main([Path(p) for p in sys.argv[1:]])
