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
from sweeper.errors import SpaceError, SweeperError, Terminated


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
    import os

    from sweeper.settings import Settings
    from sweeper.sweep.fleet import FleetError, run_workers

    if not devices:  # a user walk: 2 workers on 2 cores, every measurement contended, unsaid
        console.print(
            f"[yellow]note: {workers} workers share this machine's CPU ({os.cpu_count()} "
            "cores): their trials run side by side and slow each other down, so each "
            "measurement is flagged contended and the configs' $/run compare less well. One "
            "worker per machine measures a CPU job cleanly; several pay off with one GPU "
            "each.[/]",
            highlight=False,
        )

    try:
        run_workers(
            command, name, url, devices, workers, n_trials, max_minutes,
            logs=Settings().cache_dir / "workers",
            say=lambda line: console.print(line, highlight=False), sizes=sizes,
        )  # fmt: skip
    except FleetError as e:
        code = e.code
        if code == 1 and ran_without_completing(url, name):  # the workers' own exit 3
            code = NO_TRIAL_COMPLETED
        raise fail(str(e), code) from None


def ran_without_completing(url: str, study: str) -> bool:
    """Whether ``study`` has finished trials and none of them completed."""
    from sweeper.store import Store

    try:
        store = Store(url)
        try:
            states = [t.state for t in store.list_trials(study)]
        finally:
            store.dispose()
    except SweeperError:
        return False
    return bool(states) and "complete" not in states


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
        raise fail(f"terminated (SIGTERM); {observer.interrupted_words()}", 143) from None
    except KeyboardInterrupt:
        resume = _resume_words(url, parsed.study, space_path)
        raise fail(f"interrupted; {observer.interrupted_words()}; {resume}", 130) from None
    except PreflightError as e:
        raise fail(f"preflight: {e}", code=2) from None
    except SpaceError as e:  # a space the stored study cannot take (its lists changed)
        raise fail(str(e), code=2) from None
    except SweeperError as e:
        raise fail(str(e)) from None
    print_leaderboard(url, parsed.study)
    print_sweep_summary(report)
    print_best(url, parsed.study)
    said, code = outcome(url, report, space_path, settings.worker_grace_s)
    if code:
        raise fail(said, code)
    if said:
        console.print(f"[yellow]{escape(said)}[/]", highlight=False)


def _resume_words(url: str, study: str, space_path: str | None) -> str:
    """How to go on after an interrupt: resume the study where it exists, else launch the
    space again (a re-walk's Ctrl-C during preflight was told to resume a study never made)."""
    from sweeper.settings import absent_sqlite_file
    from sweeper.store import Store

    made: bool | None = False  # None: not known (the database out of reach)
    if absent_sqlite_file(url) is None:  # never an empty database made to ask
        try:
            store = Store(url)
            try:
                made = store.has_study(study)
            finally:
                store.dispose()
        except SweeperError:
            made = None
    if made:
        return f"`sweeper launch --study {study}` resumes it"
    again = f"`sweeper launch --space {space_path}`" if space_path else "`sweeper launch`"
    return f"{'' if made is None else 'no study was made yet: '}{again} starts it again"


# ``launch``/``worker``'s exit status when the study ends this run without a completed trial
# (each failed, or none could run), or the sweep stopped on a defect of the user's program (it
# ignores a knob): ``sweeper launch && sweeper best`` stops at the launch
NO_TRIAL_COMPLETED = 3


def outcome(url: str, report: Any, space_path: str | None, grace_s: float) -> tuple[str, int]:
    """What the sweep's last line says, and the exit status: ``NO_TRIAL_COMPLETED`` when the
    study holds no completed trial once this worker is done, unless the user stopped it (a
    stop request: asked for, not a failure) or other workers of the study are still running
    (theirs may complete: a cluster's workers end one by one, and a failed exit restarts
    one). A worker whose own trials all failed while the study has completed ones (other
    workers', earlier launches') exits 0 and says so. ("", 0): nothing to say."""
    import socket
    from collections import Counter

    from sweeper.joining import process_alive
    from sweeper.store import Store
    from sweeper.sweep.queue import PROGRAM, program_failures

    host = socket.gethostname()  # a worker of this host counts only while its process exists

    try:
        store = Store(url)
        try:
            trials = store.list_trials(report.study)
            others = [
                w
                for w in store.live_workers(report.study, grace_s)
                if w.id != report.worker_id and (w.host != host or process_alive(w.pid))
            ]
            # its failures in the user's program, read with what they recorded (below)
            own = [
                t
                for t in program_failures(store, report.study)
                if t.worker_id == report.worker_id and (t.measurement or {}).get(PROGRAM)
            ]
        finally:
            store.dispose()
    except SweeperError:
        return "", 0  # the database went away at the end: the lines above said what was run
    complete = sum(t.state == "complete" for t in trials)
    mine = [t for t in trials if t.worker_id == report.worker_id]
    kinds = Counter(t.failure_kind or "error" for t in mine if t.state in ("failed", "pruned"))
    failed = ", ".join(f"{kind} {n}" for kind, n in kinds.most_common())
    ran = (
        f"this sweep ran {report.trials_run} trial{'' if report.trials_run == 1 else 's'}"
        + (f", {sum(kinds.values())} failed ({failed})" if kinds else "")
        + (
            f", skipped {report.predicted_oom} as heavy as one that ran out of memory"
            if report.predicted_oom
            else ""
        )  # fmt: skip
    )
    if report.program_defect:  # the trials that completed stand, but the sweep did not end
        stand = (
            f" The {complete} completed trial{' makes' if complete == 1 else 's make'} the "
            "recommendation above, among the values your program ran."
            if complete
            else " No trial completed, so there is no recommendation."
        )
        return (
            f"the sweep stopped early on a defect of your program ({ran}): {report.stop_reason}."
            f"{stand} (exit {NO_TRIAL_COMPLETED}: the sweep did not search what the space lists)",
            NO_TRIAL_COMPLETED,
        )
    if complete:
        if report.trials_run and report.completed == 0:
            return (
                f"{ran}: none of them completed; the study's {complete} completed trial"
                f"{'' if complete == 1 else 's'} (other workers', earlier launches') make the "
                "recommendation above",
                0,
            )
        return "", 0
    if report.stopped:
        return f"stopped on request before any trial completed: {ran}", 0
    if others:
        return (
            f"no trial of study {report.study} has completed yet ({ran}); {len(others)} other "
            f"worker{'' if len(others) == 1 else 's'} of it still running: `sweeper best "
            f"--study {report.study}` once they end",
            0,
        )
    if kinds and set(kinds) == {"interrupted"}:  # cut by the time budget: nothing to fix
        return (
            f"no trial completed, so there is nothing to recommend: {ran}, cut by the sweep's "
            f"time budget ({report.stop_reason or 'spent'}), which says nothing about the "
            "configs. Give the sweep more time (launch --max-minutes N, or budget.max_minutes) "
            f"and launch again: the study resumes with what did not finish (exit "
            f"{NO_TRIAL_COMPLETED})",
            NO_TRIAL_COMPLETED,
        )
    why = f" ({report.stop_reason})" if report.stop_reason and not report.trials_run else ""
    check = f"`sweeper doctor --space {space_path}`" if space_path else "`sweeper doctor`"
    # a walk fixed its script as told and launched again: the failed config counted as
    # measured and nothing ran. A failure in the user's program runs again once it changes
    resumes = (
        "the study resumes, and runs again the configs that failed in your program once its "
        "command or files have changed"
        if own
        else "the study resumes"
    )
    return (
        f"no trial completed, so there is nothing to recommend: {ran}{why}. Each failure is "
        "named above with its message (and in the dashboard, `sweeper serve`); fix what they "
        f"say, or check the space against this machine with {check}, then launch again "
        f"({resumes}) (exit {NO_TRIAL_COMPLETED})",
        NO_TRIAL_COMPLETED,
    )


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
