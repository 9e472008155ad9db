"""Does a trial know when the machine was shared? One config measured calm and loaded, in turn.

    .venv/bin/python bench/contention.py [--space spaces/cpu-demo.yaml] [--rounds 3]

Each round measures the space's baseline once on a quiet machine and once while
``stress-ng --cpu N`` (N: the machine's CPUs; Python busy loops where stress-ng is missing)
runs beside it. Trials run as a sweep runs them: prepared once, forked from a preloaded fork
server. Prints, for each trial, samples/s, the window's 95% interval, the CPUs other processes
used during the window (``sweeper/trial/contention.py``) and whether the trial was flagged;
then the loaded ÷ calm ratio of samples/s and how many of each kind were flagged. Goal: every
loaded trial flagged, no calm one. Prints markdown for bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from datetime import UTC, datetime

from trial_quality import measured_of, ok_payload, trial_request  # bench/ is the script's directory

from sweeper.launcher import ForkServer, run_child
from sweeper.measurement import Measurement
from sweeper.settings import Settings
from sweeper.space import load_space
from sweeper.trial.protocol import ChildRequest, PreparedData

_BUSY = "import time\nend = time.time() + 3600\nwhile time.time() < end: pass\n"


class _Load:
    """N CPU hogs that are not the trial's: stress-ng if installed, else Python loops."""

    def __init__(self, cpus: int) -> None:
        self.cpus = cpus
        self.procs: list[subprocess.Popen[bytes]] = []

    def __enter__(self) -> _Load:
        stress = shutil.which("stress-ng")
        if stress:
            self.procs = [
                subprocess.Popen(
                    [stress, "--cpu", str(self.cpus), "--quiet"], start_new_session=True
                )
            ]
        else:
            self.procs = [
                subprocess.Popen([sys.executable, "-c", _BUSY], start_new_session=True)
                for _ in range(self.cpus)
            ]
        time.sleep(1.0)  # the hogs are running before the trial starts
        return self

    def __exit__(self, *exc: object) -> None:
        for proc in self.procs:
            os.killpg(proc.pid, 15)
            proc.wait()
        time.sleep(1.0)  # and gone before the next calm trial


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--space", default="spaces/cpu-demo.yaml")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    space = load_space(args.space)
    if space.baseline is None:
        sys.exit(f"{args.space}: the space has no baseline to measure")
    config = space.baseline.as_config(space.search)
    cache_dir = Settings().cache_dir
    cpus = os.cpu_count() or 2
    load_before = os.getloadavg()[0]
    started = time.perf_counter()
    prepare = ChildRequest(
        kind="prepare", workload=space.workload, device=space.hardware.device,
        cache_dir=str(cache_dir),
    )  # fmt: skip
    prepared = PreparedData.model_validate(ok_payload(run_child(prepare, timeout_s=900)))
    rows: list[tuple[str, Measurement]] = []
    with ForkServer(str(cache_dir)) as server:
        request = trial_request(space, prepared, cache_dir, config)
        server.preload(request)
        for _ in range(args.rounds):
            calm = measured_of(run_child(request, timeout_s=space.trial.timeout_s, server=server))
            rows.append(("calm", calm))
            with _Load(cpus):
                loaded = measured_of(
                    run_child(request, timeout_s=space.trial.timeout_s, server=server)
                )
            rows.append(("loaded", loaded))

    env = rows[0][1].env
    tool = "stress-ng" if shutil.which("stress-ng") else "Python busy loops"
    day = f"{datetime.now(UTC):%Y-%m-%d}"
    print(f"## Contention on {env.device_name} ({space.hardware.name}), {day}\n")
    print(
        f"Command: `python {' '.join(sys.argv)}` (torch {env.torch}, Python "
        f"{platform.python_version()}, {env.cpu_threads} torch threads, {cpus} CPUs; load: "
        f"{tool} on {cpus} CPUs); 1-min load average before {load_before:.2f}; whole run "
        f"{time.perf_counter() - started:.0f} s. Config: the baseline of {args.space}.\n"
    )
    print("| round | machine | samples/s | window ±95% | others' CPUs | flagged | why |")
    print("|---:|---|---:|---:|---:|---|---|")
    for i, (kind, m) in enumerate(rows):
        others = "?" if m.host_others_cpu is None else f"{m.host_others_cpu:.2f}"
        print(
            f"| {i // 2 + 1} | {kind} | {m.samples_per_s:.1f} | {m.throughput_ci95_rel:.1%} "
            f"| {others} | {'yes' if m.contended else 'no'} | {m.contention or ''} |"
        )
    calm = [m for kind, m in rows if kind == "calm"]
    loaded = [m for kind, m in rows if kind == "loaded"]
    ratio = statistics.fmean(m.samples_per_s for m in loaded) / statistics.fmean(
        m.samples_per_s for m in calm
    )
    flagged_loaded = sum(m.contended for m in loaded)
    flagged_calm = sum(m.contended for m in calm)
    goal = flagged_loaded == len(loaded) and flagged_calm == 0
    print(
        f"\nLoaded ÷ calm samples/s: {ratio:.2f}. Flagged: {flagged_loaded} of {len(loaded)} "
        f"loaded trials, {flagged_calm} of {len(calm)} calm ones "
        f"({'meets' if goal else 'misses'} the goal: every loaded trial flagged, no calm one)."
    )
    if load_before > 0.5:
        print(
            f"\n**The machine was not quiet before the run** (load {load_before:.2f}): a calm "
            "trial may rightly be flagged."
        )


if __name__ == "__main__":
    main()
