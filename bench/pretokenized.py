"""Reading a batch tokenized on the fly against reading it pretokenized, side by side.

    python bench/pretokenized.py [--space tests/spaces/tiny.yaml] [--batch 16]
        [--max-seq-length 256] [--rounds 30]

One prepare per side (a real prepare child, as a sweep runs it), then in this process the
loader's own work for one batch: ``batch`` samples read from the training dataset and
collated, the way the DataLoader of a trial with ``num_workers: 0`` does it. The two sides
alternate inside each round, so a machine that gets busier hurts both alike. Prints the
median, p10 and p90 per side in milliseconds and the ratio of the medians; the load average
is printed beside them, since a loaded machine stretches both.

The test suite checks only what cannot vary (the pretokenized loader makes no tokenizer
call and yields the same ids); how much wait that saves is this figure, per machine.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from sweeper.knobs import TrialConfig  # noqa: E402
from sweeper.launcher import run_child  # noqa: E402
from sweeper.space import load_space  # noqa: E402
from sweeper.trial.protocol import ChildRequest, PreparedData  # noqa: E402
from sweeper.trial.workload import (  # noqa: E402
    build_training_dataset,
    load_tokenizer,
    make_collator,
)


def _prepare(workload: object, cache: str) -> PreparedData:
    run = run_child(
        ChildRequest(kind="prepare", workload=workload, device="cpu", cache_dir=cache),
        timeout_s=600,
    )
    if run.result.status != "ok":
        sys.exit(f"prepare failed: {run.result.failure_message}")
    return PreparedData.model_validate(run.result.payload)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--space", default=str(REPO / "tests/spaces/tiny.yaml"))
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--max-seq-length", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=30)
    args = parser.parse_args()

    space = load_space(args.space)
    sides = {}
    with tempfile.TemporaryDirectory() as cache:
        for name, tokenize in (("on the fly", "on_the_fly"), ("pretokenized", "pretokenized")):
            workload = space.workload.model_copy(update={"tokenize": tokenize})
            prepared = _prepare(workload, cache)
            config = TrialConfig.model_validate(
                {
                    "per_device_batch_size": args.batch,
                    "gradient_accumulation_steps": 1,
                    "num_workers": 0,
                    "max_seq_length": args.max_seq_length,
                    "compile_mode": "none",
                    "attn_implementation": "sdpa",
                }
            )
            tokenizer = load_tokenizer(prepared)
            dataset = build_training_dataset(workload, prepared, config, tokenizer, Path(cache))
            collate = make_collator(workload, config, tokenizer)
            sides[name] = (dataset, collate)
        times: dict[str, list[float]] = {name: [] for name in sides}
        size = min(len(dataset) for dataset, _ in sides.values())
        for round_ in range(args.rounds):
            order = list(sides) if round_ % 2 == 0 else list(reversed(sides))
            start = (round_ * args.batch) % max(1, size - args.batch)
            for name in order:
                dataset, collate = sides[name]
                t = time.perf_counter()
                collate([dataset[i] for i in range(start, start + args.batch)])
                times[name].append(time.perf_counter() - t)
    print(
        f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs; "
        f"batch {args.batch}, max_seq_length {args.max_seq_length}, {args.rounds} rounds"
    )
    medians = {}
    for name, values in times.items():
        values.sort()
        ms = [v * 1000 for v in values]
        medians[name] = statistics.median(ms)
        p10, p90 = ms[int(0.1 * (len(ms) - 1))], ms[int(0.9 * (len(ms) - 1))]
        print(f"  {name:13s} median {medians[name]:7.2f} ms  p10 {p10:7.2f}  p90 {p90:7.2f}")
    print(f"  on the fly / pretokenized: {medians['on the fly'] / medians['pretokenized']:.2f}x")


if __name__ == "__main__":
    main()
