"""Can one short trial be trusted? Fidelity, overhead and repeatability, measured in one run.

    .venv/bin/python bench/trial_quality.py [--space spaces/cpu-demo.yaml] > /tmp/quality.md

- fidelity: for 3 configs, the trial's samples/s against a run of the same config whose timed
  window is 10x as many steps (goal: within 3%). Trials and long runs alternate, so a drift of
  the machine hits both.
- overhead: the share of each trial's wall time outside its timed window (fork, build, burn-in,
  exit); goal <= 20% for configs without torch.compile.
- repeatability: one config measured 5 times; the CV of samples/s, next to the trials' own
  95% interval.

Trials run exactly as a sweep runs them: prepared once, forked from a preloaded fork server.
Prints markdown for bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

from sweeper.errors import SweeperError
from sweeper.knobs import describe
from sweeper.launcher import ChildRun, ForkServer, run_child
from sweeper.measurement import Measurement, parse_measurement
from sweeper.settings import Settings
from sweeper.space import Space, TrialConfig, load_space
from sweeper.trial.protocol import ChildRequest, PreparedData


def trial_request(
    space: Space, prepared: PreparedData, cache_dir: Path, config: TrialConfig, **measure: float
) -> ChildRequest:
    settings = space.trial.model_copy(
        update={"measure": space.trial.measure.model_copy(update=measure)}
    )
    return ChildRequest(
        kind="trial",
        workload=space.workload,
        device=space.hardware.device,
        cache_dir=str(cache_dir),
        prepared=prepared,
        config=config,
        settings=settings,
    )


def ok_payload(run: ChildRun) -> dict:
    if run.result.status != "ok" or run.result.payload is None:
        sys.exit(f"trial failed: {run.result.failure_kind}: {run.result.failure_message}")
    return run.result.payload


def measured_of(run: ChildRun) -> Measurement:
    return parse_measurement(ok_payload(run))


def _describe(c: TrialConfig) -> str:
    return describe(c.model_dump())


def _pick_configs(space: Space) -> list[TrialConfig]:
    """Three configs spread over the grid: small, middle and large batch, compile off."""
    grid = [
        c
        for c in space.search.grid()
        if c.compile_mode == "none" and c.attn_implementation in ("sdpa", "eager")
    ]
    grid.sort(key=lambda c: (c.per_device_batch_size * c.max_seq_length, c.num_workers))
    return [grid[0], grid[len(grid) // 2], grid[-1]]


def _chosen_configs(space: Space, names: str, storage: str | None, study: str) -> list[TrialConfig]:
    """Configs by name: ``spread`` (three over the grid), ``baseline``, ``also_try`` (all of
    them) or ``also_try[N]``, and ``best`` (the recommendation of ``study`` in ``storage``)."""
    chosen: list[TrialConfig] = []
    for name in (n.strip() for n in names.split(",") if n.strip()):
        if name == "spread":
            chosen += _pick_configs(space)
        elif name == "baseline":
            if space.baseline is None:
                sys.exit("--configs baseline: the space has no baseline")
            chosen.append(space.baseline.as_config(space.search))
        elif name == "also_try":
            chosen += [c.as_config(space.search) for c in space.also_try]
        elif name.startswith("also_try[") and name.endswith("]"):
            index = int(name[len("also_try[") : -1])
            if index >= len(space.also_try):
                sys.exit(f"--configs {name}: the space has {len(space.also_try)} also_try configs")
            chosen.append(space.also_try[index].as_config(space.search))
        elif name == "best":
            if storage is None:
                sys.exit("--configs best needs --storage (the study's database)")
            from sweeper.recommend import best
            from sweeper.store import Store

            store = Store(storage)
            try:
                chosen.append(TrialConfig.model_validate(best(store, study).config))
            except SweeperError as e:  # no recommendation (yet): measure the other configs
                print(f"--configs best: skipped, {e}", file=sys.stderr)
            finally:
                store.dispose()
        else:
            sys.exit(f"--configs: unknown {name!r}; use spread, baseline, also_try[N] or best")
    return list(dict.fromkeys(chosen))  # a config named twice is measured once


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--space", default="spaces/cpu-demo.yaml")
    parser.add_argument("--repeats", type=int, default=5, help="0: no repeatability part")
    parser.add_argument("--long-factor", type=int, default=10)
    parser.add_argument(
        "--configs",
        default="spread",
        help="comma list: spread, baseline, also_try, also_try[N], best (default: spread)",
    )
    parser.add_argument("--storage", help="the study's database, for --configs best")
    parser.add_argument("--study", help="the study, for --configs best (default: the space's)")
    args = parser.parse_args()
    space = load_space(args.space)
    configs = _chosen_configs(space, args.configs, args.storage, args.study or space.study)
    if not configs:
        sys.exit(f"--configs {args.configs}: nothing to measure")
    cache_dir = Settings().cache_dir
    started = time.perf_counter()
    run = run_child(
        ChildRequest(
            kind="prepare",
            workload=space.workload,
            device=space.hardware.device,
            cache_dir=str(cache_dir),
        ),
        timeout_s=900,
    )
    prepared = PreparedData.model_validate(ok_payload(run))
    trials: list[tuple[TrialConfig, Measurement, float]] = []  # config, measurement, wall_s
    fidelity_rows = []
    repeat_rows = []
    with ForkServer(str(cache_dir)) as server:
        server.preload(trial_request(space, prepared, cache_dir, configs[0]))
        for config in configs:
            trial_run = run_child(
                trial_request(space, prepared, cache_dir, config),
                timeout_s=space.trial.timeout_s,
                server=server,
            )
            trial = measured_of(trial_run)
            trials.append((config, trial, trial_run.wall_s))
            steps = trial.measured_steps * args.long_factor
            long = measured_of(
                run_child(
                    trial_request(
                        space,
                        prepared,
                        cache_dir,
                        config,
                        min_steps=steps,
                        max_steps=steps,
                        min_seconds=0,
                        max_seconds=10 * 3600,
                        target_ci=1e-9,
                    ),
                    timeout_s=space.trial.timeout_s * args.long_factor * 2,
                    server=server,
                )
            )
            fidelity_rows.append((config, trial, long))
        for _ in range(args.repeats):
            repeat_run = run_child(
                trial_request(space, prepared, cache_dir, configs[0]),
                timeout_s=space.trial.timeout_s,
                server=server,
            )
            measurement = measured_of(repeat_run)
            repeat_rows.append(measurement)
            trials.append((configs[0], measurement, repeat_run.wall_s))

    env = trials[0][1].env
    device = env.device_name
    print(f"## Trial quality on {device} ({space.hardware.name}), {datetime.now(UTC):%Y-%m-%d}\n")
    print(
        f"Command: `python {' '.join(sys.argv)}` "
        f"(torch {env.torch}, Python {platform.python_version()}, "
        f"{env.cpu_threads} torch threads); whole run "
        f"{time.perf_counter() - started:.0f} s.\n"
    )
    print(f"### Fidelity: trial vs a run {args.long_factor}x longer (goal: within 3%)\n")
    print(
        "| config | trial samples/s (±95%) | trial steps | long samples/s | long steps "
        "| trial / long |"
    )
    print("|---|---:|---:|---:|---:|---:|")
    for config, trial, long in fidelity_rows:
        ratio = trial.samples_per_s / long.samples_per_s
        print(
            f"| {_describe(config)} | {trial.samples_per_s:.1f} "
            f"(±{trial.throughput_ci95_rel:.1%}) | {trial.measured_steps} "
            f"| {long.samples_per_s:.1f} | {long.measured_steps} | {ratio:.3f} |"
        )
    print(
        "\n### Overhead: share of a trial's wall time outside the timed window "
        "(goal: <= 20%, no compile)\n"
    )
    print("| config | wall s | window s | burn-in s | build s | overhead |")
    print("|---|---:|---:|---:|---:|---:|")
    shares = []
    for config, m, wall_s in trials:
        share = 1 - m.window_s / wall_s
        shares.append(share)
        phases = m.phases_s
        built = ("imports", "tokenizer", "data", "model", "optimizer")
        build = sum(getattr(phases, k) or 0.0 for k in built)
        print(
            f"| {_describe(config)} | {wall_s:.2f} | {m.window_s:.2f} "
            f"| {phases.warmup or 0.0:.2f} | {build:.2f} | {share:.0%} |"
        )
    print(
        f"\nOverhead over {len(shares)} trials: mean {statistics.fmean(shares):.0%}, "
        f"max {max(shares):.0%}.\n"
    )
    if not repeat_rows:
        return
    print(f"### Repeatability: {_describe(configs[0])}, {args.repeats} trials\n")
    values = [m.samples_per_s for m in repeat_rows]
    cis = [m.throughput_ci95_rel for m in repeat_rows]
    print("samples/s: " + ", ".join(f"{v:.1f}" for v in values))
    mean = statistics.fmean(values)
    print(
        f"\nmean {mean:.1f}, CV {statistics.stdev(values) / mean:.1%}"
        f" (the trials' own 95% intervals: ±{min(cis):.1%} to ±{max(cis):.1%})"
    )


if __name__ == "__main__":
    main()
