"""Where a trial's time goes, today's trial against the lean one, side by side (issue 32).

    python bench/trial_overhead.py [--space bench/spaces/trial-overhead.yaml]
        [--today bc9ec57] [--rounds 2]

Both sides run the space's named configs (baseline, then ``also_try``) the way a sweep runs
them: one prepare, one fork server with the data and model code loaded, then one child per
trial. "today" is the trial code at ``--today`` (the commit before issue 32, extracted with
``git archive`` into a temporary directory and put first on PYTHONPATH); "lean" is this
checkout. Each round is a new sweep (fresh cache directory) on each side, and the rounds
alternate which side goes first so that a machine that gets busier in the middle hurts both.

Per trial it prints the wall time the sweep pays (spawn to exit, as the launcher sees it),
the timed window, the share outside the window and each phase: start-up (imports + data
+ tokenizer, most inherited from the fork server), model build, burn-in, the checkpoint phase
and where its figure came from (measured or reused), the rest (result, teardown). Then, per
side, the median share outside the window and trials per hour of trial time.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent

# Run in each side's interpreter with its tree first on PYTHONPATH: only names both trees have.
_DRIVER = r"""
import json, sys, time
from sweeper.launcher import ForkServer, run_child
from sweeper.space import load_space
from sweeper.trial.protocol import ChildRequest, PreparedData

space = load_space(sys.argv[1])
cache = sys.argv[2]
started = time.perf_counter()
prep = run_child(ChildRequest.for_space("prepare", space, cache), timeout_s=1800)
if prep.result.status != "ok":
    sys.exit("prepare failed: " + str(prep.result.failure_message))
prepared = PreparedData.model_validate(prep.result.payload)
print(json.dumps({"event": "prepared", "wall_s": prep.wall_s}), flush=True)
with ForkServer(cache) as server:
    t = time.perf_counter()
    server.preload(ChildRequest.for_space("probe", space, cache, prepared=prepared))
    print(json.dumps({"event": "preloaded", "wall_s": time.perf_counter() - t}), flush=True)
    for label, known in space.named_known_configs():
        config = known.as_config(space.search)
        request = ChildRequest.for_space(
            "trial", space, cache, prepared=prepared, config=config, settings=space.trial
        )
        run = run_child(request, timeout_s=space.trial.timeout_s, server=server)
        print(json.dumps({
            "event": "trial", "label": known.label or label, "wall_s": run.wall_s,
            "status": run.result.status, "failure": run.result.failure_message,
            "payload": run.result.payload,
        }), flush=True)
"""


def _today_tree(commit: str, into: Path) -> Path:
    """The package as it was at ``commit``, extracted (no checkout is touched)."""
    archive = subprocess.run(
        ["git", "-C", str(REPO), "archive", "--format=tar", commit, "sweeper"],
        check=True,
        capture_output=True,
    ).stdout
    tree = into / f"sweeper-{commit}"
    tree.mkdir()
    archive_path = into / "today.tar"
    archive_path.write_bytes(archive)
    with tarfile.open(archive_path) as tar:
        tar.extractall(tree, filter="data")
    return tree


def _run_side(tree: Path, space: Path, cache: Path) -> list[dict[str, Any]]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SWEEPER_")}
    env["PYTHONPATH"] = os.pathsep.join([str(tree), *filter(None, [env.get("PYTHONPATH")])])
    env["PYTHONUNBUFFERED"] = "1"
    completed = subprocess.run(
        [sys.executable, "-c", _DRIVER, str(space), str(cache)],
        capture_output=True,
        text=True,
        env=env,
        cwd=tree,  # so that `sweeper` resolves to this side's tree, not an installed copy
        timeout=7200,
    )
    if completed.returncode != 0:
        raise SystemExit(f"{tree}: the driver failed:\n{completed.stderr[-4000:]}")
    return [json.loads(line) for line in completed.stdout.splitlines() if line.startswith("{")]


def _row(side: str, round_: int, event: dict[str, Any]) -> dict[str, Any]:
    payload = event["payload"] or {}
    phases = payload.get("phases_s") or {}
    wall = event["wall_s"]
    window = payload.get("window_s") or 0.0
    startup = payload.get("startup_s")
    model = phases.get("model")
    burn_in = phases.get("warmup")
    checkpoint = phases.get("checkpoint")
    named = sum(v or 0.0 for v in (startup, burn_in, checkpoint)) + window
    return {
        "side": side,
        "round": round_,
        "label": event["label"],
        "status": event["status"],
        "failure": event["failure"],
        "wall_s": wall,
        "window_s": window,
        "outside": 1 - window / wall if wall else float("nan"),
        "startup_s": startup,
        "model_s": model,
        "burn_in_s": burn_in,
        # today's payload has no checkpoint phase: its save sits between window and result
        "checkpoint_s": checkpoint if checkpoint is not None else payload.get("checkpoint_save_s"),
        "checkpoint_source": payload.get("checkpoint_source", "measured")
        if payload.get("checkpoint_save_s") is not None
        else "—",
        "rest_s": wall - named if checkpoint is not None else None,
        "samples_per_s": payload.get("samples_per_s"),
    }


def _fmt(value: Any, spec: str = ".1f") -> str:
    return "—" if value is None else format(value, spec)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--space", type=Path, default=REPO / "bench/spaces/trial-overhead.yaml")
    parser.add_argument("--today", default="bc9ec57", help="the commit of today's trial")
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()

    load_start = os.getloadavg()[0]
    rows: list[dict[str, Any]] = []
    once: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="trial-overhead-") as tmp:
        tmp_path = Path(tmp)
        sides = {"today": _today_tree(args.today, tmp_path), "lean": REPO}
        started = time.perf_counter()
        for round_ in range(1, args.rounds + 1):
            order = ["today", "lean"] if round_ % 2 else ["lean", "today"]
            for side in order:
                cache = tmp_path / f"cache-{side}-{round_}"
                events = _run_side(sides[side], args.space.resolve(), cache)
                for event in events:
                    if event["event"] == "trial":
                        rows.append(_row(side, round_, event))
                    else:
                        once.setdefault(f"{side} {event['event']}", []).append(event["wall_s"])
                print(f"round {round_} {side}: done", file=sys.stderr, flush=True)
        total_s = time.perf_counter() - started
    load_end = os.getloadavg()[0]

    print(f"# Trial overhead: today ({args.today}) against lean (this checkout)\n")
    print(
        f"Space {args.space.relative_to(REPO) if args.space.is_relative_to(REPO) else args.space}"
        f", {args.rounds} rounds, {total_s / 60:.1f} min in all, load average "
        f"{load_start:.1f} at the start and {load_end:.1f} at the end on {os.cpu_count()} "
        "cores (contention slows both sides alike: they alternate). Seconds per trial.\n"
    )
    print(
        "| side | round | config | wall | window | outside | start-up | model | burn-in "
        "| checkpoint | checkpoint figure | rest | samples/s |"
    )
    print("|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|")
    for row in sorted(rows, key=lambda r: (r["label"], r["round"], r["side"])):
        if row["status"] != "ok":
            print(
                f"| {row['side']} | {row['round']} | {row['label']} | {row['wall_s']:.1f} "
                f"| failed: {row['failure']} |||||||||"
            )
            continue
        print(
            f"| {row['side']} | {row['round']} | {row['label']} | {row['wall_s']:.1f} "
            f"| {row['window_s']:.1f} | {row['outside']:.0%} | {_fmt(row['startup_s'])} "
            f"| {_fmt(row['model_s'])} | {_fmt(row['burn_in_s'])} | {_fmt(row['checkpoint_s'])} "
            f"| {row['checkpoint_source']} | {_fmt(row['rest_s'])} "
            f"| {_fmt(row['samples_per_s'], '.2f')} |"
        )
    print()
    summary: dict[str, dict[str, float]] = {}
    for side in ("today", "lean"):
        ok = [r for r in rows if r["side"] == side and r["status"] == "ok"]
        if not ok:
            continue
        walls = [r["wall_s"] for r in ok]
        shares = [r["outside"] for r in ok]
        summary[side] = {
            "median": statistics.median(shares),
            "max": max(shares),
            "per_hour": 3600 * len(walls) / sum(walls),
        }
        print(
            f"- {side}: outside the window median {statistics.median(shares):.0%} "
            f"(min {min(shares):.0%}, max {max(shares):.0%}) over {len(ok)} trials; "
            f"{summary[side]['per_hour']:.0f} trials per hour of trial time "
            f"(mean wall {statistics.mean(walls):.1f} s)"
        )
    for name, values in sorted(once.items()):
        print(f"- once per sweep, {name}: " + ", ".join(f"{v:.1f} s" for v in values))
    if "today" in summary and "lean" in summary:
        ratio = summary["lean"]["per_hour"] / summary["today"]["per_hour"]
        print(
            f"\nlean ÷ today, trials per hour: {ratio:.2f}×; lean's worst trial spends "
            f"{summary['lean']['max']:.0%} outside the window (goal on the CPU: ≤ 20% for "
            "every config)."
        )


if __name__ == "__main__":
    main()
