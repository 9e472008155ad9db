"""How long the slowest real database calls take at 10,000 trials, against the statement bound.

    .venv/bin/python bench/db_bound.py [--trials 10000] [--repeats 5] [--cold]

``sweeper.store.bounds`` ends any wait on an open Postgres connection after
``STATEMENT_BOUND_S`` (60 s): past it the connection is taken for half-open and the call fails
as a lost connection. The bound has to sit above the slowest call a healthy database makes.
This fills a fresh Postgres database with one study of spaces/h100.yaml (the dashboard bench's
study: ``--trials`` configs, both stores) and times, each ``--repeats`` times, the calls a sweep,
a worker's reaper and the API make that read or write the whole study: the full trial list, the
recommendation's rows, the recommendation itself, the reaper, Optuna's read of every trial (what
a sampler does on each ask), a trial's start and finish, and the migration check. ``--cold``
drops the OS page cache before each round (needs root): the nearest this machine has to a slow
disk. Prints a markdown table: median and max per call, and the bound's margin over the slowest.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import optuna

sys.path.insert(0, str(Path(__file__).resolve().parent))

from dashboard_perf import (  # noqa: E402  (a bench of this folder)
    SPACE,
    analyze,
    drop_database,
    fill_optuna,
    fill_ours,
    make_trials,
    recreate_database,
)

from sweeper.recommend import best  # noqa: E402
from sweeper.space import load_space  # noqa: E402
from sweeper.store import Store  # noqa: E402
from sweeper.store.bounds import STATEMENT_BOUND_S, bounded_connection_class  # noqa: E402
from sweeper.store.optuna import optuna_storage  # noqa: E402

WAITS: list[float] = []  # each wait on a bounded connection: what the bound is compared with


def record_waits() -> None:
    """Time every wait of the bounded connections (one statement's round trip, its rows
    included): a call's longest wait is what meets the bound, not the call's own time."""
    connection_class = bounded_connection_class()
    wait = connection_class.wait

    def timed(self: object, gen: object, interval: float = 0.1, timeout: object = None) -> object:
        began = time.perf_counter()
        try:
            return wait(self, gen, interval, timeout)
        finally:
            WAITS.append(time.perf_counter() - began)

    connection_class.wait = timed


def drop_page_cache() -> bool:
    try:
        subprocess.run(["sync"], check=True)
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
    except OSError:
        return False
    return True


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=10_000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--cold", action="store_true", help="drop the OS page cache per round")
    parser.add_argument("--admin-url", default="postgresql://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--db", default="sweeper_bound_bench")
    args = parser.parse_args()
    record_waits()

    url = args.admin_url.rsplit("/", 1)[0] + f"/{args.db}"
    sqlalchemy_url = url.replace("postgresql://", "postgresql+psycopg://")
    space = load_space(SPACE)
    study = space.study
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    recreate_database(args.admin_url, args.db)
    try:
        started = time.perf_counter()
        trials = make_trials(space, args.trials, seed=0)
        fill_ours(sqlalchemy_url, space, trials)
        fill_optuna(sqlalchemy_url, space, trials)
        analyze(url)
        print(f"filled {args.trials} trials in {time.perf_counter() - started:.0f} s")

        store = Store(sqlalchemy_url)
        storage = optuna_storage(sqlalchemy_url)
        optuna_study = optuna.load_study(study_name=study, storage=storage)
        config = trials[0].config.model_dump()
        next_number = args.trials + 1_000  # past every filled trial

        def start_and_finish() -> None:
            nonlocal next_number
            next_number += 1
            store.start_trial(study, next_number, config, None)
            store.finish_trial(study, next_number, "failed", failure_kind="error")

        calls: dict[str, Callable[[], object]] = {
            "Store.list_trials (every trial, whole rows)": lambda: store.list_trials(study),
            "Store.trial_metrics (the recommendation's rows)": lambda: store.trial_metrics(study),
            "recommend.best (rows + decision)": lambda: best(store, study),
            "Store.reap (the reaper's pass)": lambda: store.reap(study, 60.0),
            "Store.trial_marks (the dashboard's marks)": lambda: store.trial_marks(study),
            "Optuna get_trials (a sampler's ask)": lambda: optuna_study.get_trials(deepcopy=False),
            "Store.start_trial + finish_trial": start_and_finish,
            "Store.migrate (at every start)": store.migrate,
        }
        times: dict[str, list[float]] = {name: [] for name in calls}
        longest: dict[str, float] = dict.fromkeys(calls, 0.0)
        cold = False
        for _ in range(args.repeats):
            if args.cold:
                cold = drop_page_cache()
            for name, call in calls.items():
                WAITS.clear()
                began = time.perf_counter()
                call()
                times[name].append(time.perf_counter() - began)
                longest[name] = max([longest[name], *WAITS])
        store.dispose()
        storage.engine.dispose()
    finally:
        drop_database(args.admin_url, args.db)

    print()
    print(
        f"{args.trials:,} trials, {args.repeats} rounds"
        + (", OS page cache dropped before each round" if cold else "")
        + f"; bound {STATEMENT_BOUND_S:g} s"
    )
    print()
    print("| call | median s | max s | its longest wait on the database s | bound ÷ that |")
    print("|---|---:|---:|---:|---:|")
    for name, values in times.items():
        print(
            f"| {name} | {statistics.median(values):.3f} | {max(values):.3f} | "
            f"{longest[name]:.3f} | {STATEMENT_BOUND_S / max(longest[name], 1e-6):,.0f}× |"
        )
    slowest = max(longest, key=lambda name: longest[name])
    print()
    print(
        f"the longest single wait: {longest[slowest]:.2f} s ({slowest}): the bound is "
        f"{STATEMENT_BOUND_S / longest[slowest]:,.0f}× that"
    )


if __name__ == "__main__":
    main()
