"""The plain loop against transformers' Trainer (and TRL's SFTTrainer) on the same configs; or
sweeper's Trainer engine against the user's own Trainer script (``engine: script``).

    .venv/bin/python bench/engines.py [--space spaces/cpu-demo.yaml] [--rounds 3] > /tmp/engines.md
    .venv/bin/python scripts/tiny_job.py --out my-job     # the job the script parity runs
    .venv/bin/python bench/engines.py --space bench/spaces/script-parity.yaml

A space whose engine is ``script`` compares ``trainer`` (sweeper's Trainer built from the same
model, data and knobs) with ``script`` (the space's command); ratios are to the first engine.

For each config, the engines run in interleaved rounds (loop, trainer, sft, loop, trainer, sft,
...): a drift of the machine hits every engine alike. Each trial is a real child forked from a
preloaded fork server, exactly as a sweep runs it. Printed per config and engine: samples/s as
the median of the rounds with its min–max spread, the ratio to the loop, and where the time goes
(data wait share, step-time CV); a ratio outside the rounds' spread is a difference beyond noise,
and the notes under the table say what in the engine makes it.

Prints markdown for bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from datetime import UTC, datetime

from sweeper.knobs import describe
from sweeper.launcher import ChildRun, ForkServer, run_child
from sweeper.measurement import Measurement, parse_measurement
from sweeper.preflight import run_preflight
from sweeper.settings import Settings
from sweeper.space import Space, TrialConfig, load_space
from sweeper.trial.protocol import ChildRequest, PreparedData

ENGINES = ("loop", "trainer", "sft")


def _ok(run: ChildRun) -> dict:
    if run.result.status != "ok" or run.result.payload is None:
        sys.exit(f"trial failed: {run.result.failure_kind}: {run.result.failure_message}")
    return run.result.payload


def _request(
    space: Space, engine: str, prepared: PreparedData, config: TrialConfig
) -> ChildRequest:
    script = space.workload.script if engine == "script" else None
    if engine == "script" and script is None:
        sys.exit("--engines script needs a space with workload.script (engine: script)")
    workload = space.workload.model_copy(update={"engine": engine, "script": script})
    return ChildRequest.for_space(
        "trial",
        space.model_copy(update={"workload": workload}),
        Settings().cache_dir,
        prepared=prepared,
        config=config,
        settings=space.trial,
        spawned_at=time.time(),
    )


def _configs(space: Space) -> list[TrialConfig]:
    """The baseline, and the first also_try (packed in the demo space), as named in the file."""
    return space.known_configs()[:2]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--space", default="spaces/cpu-demo.yaml")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--engines", default=None, help="default: loop,trainer,sft; "
                        "trainer,script for a space of engine: script")  # fmt: skip
    args = parser.parse_args()
    space = load_space(args.space)
    default = "trainer,script" if space.workload.engine == "script" else ",".join(ENGINES)
    engines = (args.engines or default).split(",")
    first_engine = engines[0]
    cache_dir = Settings().cache_dir
    started = time.perf_counter()
    load_before = os.getloadavg()[0]
    prepared = PreparedData.model_validate(
        _ok(run_child(ChildRequest.for_space("prepare", space, cache_dir), timeout_s=900))
    )
    results: dict[tuple[int, str], list[Measurement]] = {}
    changes: list[str] = []
    with ForkServer(str(cache_dir)) as server:
        server.preload(ChildRequest.for_space("probe", space, cache_dir, prepared=prepared))
        # the named configs as a sweep runs them on this machine: what preflight drops takes
        # its fallback (pinned memory on a CPU runs unpinned), said under the table
        report = run_preflight(space, prepared, cache_dir, server=server)
        configs = []
        for config in _configs(space):
            runnable, changed = report.nearest(config)
            configs.append(runnable)
            changes += changed
        for _round in range(args.rounds):
            for index, config in enumerate(configs):
                for engine in engines:
                    run = run_child(
                        _request(space, engine, prepared, config),
                        timeout_s=space.trial.timeout_s,
                        server=server,
                    )
                    results.setdefault((index, engine), []).append(parse_measurement(_ok(run)))
    load_after = os.getloadavg()[0]
    first = next(iter(results.values()))[0]
    print(
        f"### Engines on {first.env.device_name}, {datetime.now(UTC):%Y-%m-%d}\n\n"
        f"Command: `python bench/engines.py --space {args.space} --rounds {args.rounds}"
        f"{' --engines ' + args.engines if args.engines else ''}`. "
        f"torch {first.env.torch}, transformers {first.env.transformers}, Python "
        f"{platform.python_version()}; {args.rounds} interleaved rounds; "
        f"{time.perf_counter() - started:.0f} s; load average {load_before:.1f} before, "
        f"{load_after:.1f} after"
        + (
            " (**contended**: other work was running; ratios still compare engines "
            "measured side by side)"
            # before: other work on the machine (after counts the bench's own processes)
            if load_before > (os.cpu_count() or 1) / 2
            else ""
        )
        + ".\n"
    )
    print(
        f"| config | engine | samples/s median (min–max) | × {first_engine} | tokens/s | "
        "tokens per row | data wait | step CV | burn-in steps | start-up s | optimizer |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    for index, config in enumerate(configs):
        loop = statistics.median(m.samples_per_s for m in results[(index, first_engine)])
        for engine in engines:
            runs = results[(index, engine)]
            rates = [m.samples_per_s for m in runs]
            median = statistics.median(rates)
            print(
                f"| {describe(config.model_dump())} | {engine} | {median:.1f} "
                f"({min(rates):.1f}–{max(rates):.1f}) | {median / loop:.2f} | "
                f"{statistics.median(m.tokens_per_s for m in runs):,.0f} | "
                f"{statistics.median(m.mean_row_tokens or 0 for m in runs):,.0f} | "
                f"{statistics.median(m.data_wait_share for m in runs):.1%} | "
                f"{statistics.median(m.step_time_cv for m in runs):.2f} | "
                f"{statistics.median(m.warmup_steps for m in runs):.0f} | "
                f"{statistics.median(m.startup_s for m in runs):.1f} | {runs[0].optimizer} |"
            )
    print()
    beyond = []
    for index, config in enumerate(configs):
        loop_rates = [m.samples_per_s for m in results[(index, first_engine)]]
        for engine in engines[1:]:
            rates = [m.samples_per_s for m in results[(index, engine)]]
            if max(rates) < min(loop_rates) or min(rates) > max(loop_rates):
                beyond.append(
                    f"{engine} on {describe(config.model_dump())}: "
                    f"{statistics.median(rates) / statistics.median(loop_rates):.2f}× "
                    f"{first_engine}"
                )
    print(
        "Differences beyond the rounds' spread: "
        + ("; ".join(beyond) if beyond else "none")
        + ".\n"
    )
    if changes:
        print("Run as this machine can (preflight's fallbacks): " + "; ".join(changes) + ".\n")


if __name__ == "__main__":
    main()
