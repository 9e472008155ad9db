"""What ``sweeper launch`` and ``sweeper worker`` do once their arguments are read: run this
process's share of the sweep and print what it found, start K worker processes, and count
what ``--fill`` still has to run. Commands stay in ``sweeper.cli``."""

from __future__ import annotations

from typing import Any

from rich.markup import escape

from sweeper.cli_common import fail
from sweeper.console import (
    RichObserver,
    console,
    print_leaderboard,
    print_recommendation,
    print_sweep_summary,
)
from sweeper.errors import SweeperError, Terminated


def launch_workers(
    command: list[str],
    name: str,
    url: str,
    devices: list[str],
    workers: int,
    n_trials: int,
    max_minutes: float | None,
    sizes: list[int],
) -> None:
    """``sweeper.sweep.fleet.run_workers``, its worker logs in the cache directory."""
    from sweeper.settings import Settings
    from sweeper.sweep.fleet import FleetError, run_workers

    try:
        run_workers(
            command, name, url, devices, workers, n_trials, max_minutes,
            logs=Settings().cache_dir / "workers",
            say=lambda line: console.print(line, highlight=False), sizes=sizes,
        )  # fmt: skip
    except FleetError as e:
        raise fail(str(e), e.code) from None


def missing_trials(url: str, study: str, planned: int) -> int:
    """``launch --fill``: how many of ``planned`` trials the study still lacks, said aloud."""
    from sweeper.store import redact
    from sweeper.sweep.fleet import FleetError, fill_plan

    try:
        plan = fill_plan(url, study, planned)
    except FleetError as e:
        raise fail(str(e), e.code) from None
    except SweeperError as e:
        raise fail(str(e)) from None
    if plan.missing == 0:
        console.print(
            f"study {study} in {redact(url)} already has {plan.done} of its {planned} trials: "
            f"nothing to run (--fill); its results follow, and `sweeper best --study {study}` "
            "prints the recommendation",
            highlight=False,
        )
        return 0
    if plan.done:
        console.print(
            f"study {study} has {plan.done} of its {planned} trials: running the "
            f"{plan.missing} missing (--fill)",
            highlight=False,
        )
    return plan.missing


def sweep_and_report(
    parsed: Any,
    url: str,
    space_text: str,
    space_path: str | None,
    n_trials: int | None,
    max_minutes: float | None,
) -> None:
    """Run this process's share of the sweep (as one worker of the study) and print what it
    found."""
    from sweeper.preflight import PreflightError
    from sweeper.recommend import recommendable
    from sweeper.settings import Settings
    from sweeper.store import redact
    from sweeper.sweep.run import run_sweep

    settings = Settings()
    observer = RichObserver(parsed.study, n_trials or parsed.budget.n_trials)
    console.print(
        f"sweep [bold]{parsed.study}[/] on {parsed.hardware.name} "
        f"(${parsed.hardware.usd_per_hour:.2f}/h) → {redact(url)}",
        highlight=False,
    )
    try:
        with observer:
            report = run_sweep(
                parsed,
                storage_url=url,
                cache_dir=settings.cache_dir,
                space_text=space_text,
                space_path=space_path,
                n_trials=n_trials,
                max_minutes=max_minutes,
                observer=observer,
                eligible_for=recommendable,
                heartbeat_s=settings.heartbeat_s,
                worker_grace_s=settings.worker_grace_s,
                database_retry_s=settings.database_retry_s,
                fleet_trials=settings.fleet_trials,
            )
    except Terminated:
        raise fail(
            "terminated (SIGTERM); finished trials are kept, the running one is marked interrupted",
            143,
        ) from None
    except KeyboardInterrupt:
        raise fail(
            "interrupted; finished trials are kept, the running one is marked", 130
        ) from None
    except PreflightError as e:
        raise fail(f"preflight: {e}", code=2) from None
    except SweeperError as e:
        raise fail(str(e)) from None
    print_leaderboard(url, parsed.study)
    print_sweep_summary(report)
    print_best(url, parsed.study)


def print_best(url: str, study: str) -> None:
    """The recommendation after a sweep, or why there is none."""
    from sweeper.recommend import best
    from sweeper.store import Store

    try:
        store = Store(url)
    except SweeperError as e:
        raise fail(str(e)) from None
    try:
        print_recommendation(best(store, study))
    except SweeperError as e:
        console.print(f"\n[yellow]no recommendation:[/] {escape(str(e))}", highlight=False)
    finally:
        store.dispose()
