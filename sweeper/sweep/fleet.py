"""N worker processes of one study on one machine (``launch --workers``, ``worker --devices``):
which GPUs they share, how many trials each runs, and a supervisor that starts them, passes
SIGINT and SIGTERM on, and says which failed. ``--fill`` asks how many trials a study lacks.

The workers of a machine share its GPUs as one pool (``sweeper.sweep.devicepool``): each trial
holds as many as its ``devices`` knob says, and sees only those (CUDA_VISIBLE_DEVICES), so
trials of different sizes run side by side and never two on one GPU.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from sweeper.errors import SweeperError, Terminated
from sweeper.settings import absent_sqlite_file
from sweeper.sweep.devicepool import DevicePool, workers_for


class FleetError(SweeperError):
    """The workers could not be started, or one of them failed; ``code`` is the exit code
    the command ends with (2: a wrong option, 130/143: interrupted/terminated)."""

    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.code = code


def parse_devices(text: str) -> list[str]:
    """``--devices 0,1`` (GPU indexes or UUIDs, as CUDA_VISIBLE_DEVICES takes them).

    >>> parse_devices("0, 1")
    ['0', '1']
    >>> parse_devices("0,gpu1")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    sweeper.sweep.fleet.FleetError: --devices '0,gpu1': 'gpu1' is not a GPU index (0, 1, ...) ...
    """
    devices = [d.strip() for d in text.split(",")]
    fix = "give distinct GPUs separated by commas, e.g. --devices 0,1"
    if not all(devices) or len(set(devices)) != len(devices):
        raise FleetError(f"--devices {text!r}: {fix}", code=2)
    for device in devices:
        if not (device.isdigit() or device.startswith(("GPU-", "MIG-"))):
            raise FleetError(
                f"--devices {text!r}: {device!r} is not a GPU index (0, 1, ...) or UUID "
                f"(GPU-..., MIG-...); {fix}",
                code=2,
            )
    return devices


def visible_gpus() -> list[str]:
    """The GPUs a worker may take: CUDA_VISIBLE_DEVICES if set, else what nvidia-smi lists."""
    import shutil

    listed = os.environ.get("CUDA_VISIBLE_DEVICES")
    if listed is not None:
        return [d.strip() for d in listed.split(",") if d.strip()]
    if shutil.which("nvidia-smi") is None:
        return []
    try:
        out = subprocess.run(
            ["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return [str(i) for i, line in enumerate(out.splitlines()) if line.startswith("GPU ")]


@dataclass(frozen=True)
class FillPlan:
    """``launch --fill``: of ``planned`` trials, the study has ``done``."""

    done: int
    planned: int

    @property
    def missing(self) -> int:
        return max(0, self.planned - self.done)


def fill_plan(url: str, study: str, planned: int) -> FillPlan:
    """How many of ``planned`` trials the study has. An SQLite file that does not exist holds
    no trial (and is not created here). Raises FleetError (code 2) for a storage URL that
    cannot be used, SweeperError for a database that cannot be read."""
    from sweeper.store import Store
    from sweeper.sweep.run import trials_done

    if absent_sqlite_file(url) is not None:
        return FillPlan(0, planned)
    try:
        store = Store(url)
    except SweeperError as e:
        raise FleetError(str(e), code=2) from None
    try:
        store.migrate()
        return FillPlan(trials_done(store, study), planned)
    finally:
        store.dispose()


def check_pool(devices: list[str], sizes: list[int], count: int | None) -> int:
    """How many workers share the GPUs ``devices`` when the space's trials take ``sizes``
    devices: ``count`` if given (``launch --workers``), else as many as trials of the smallest
    size fit side by side (``worker --devices``). Raises FleetError (code 2) when a listed
    size cannot fit in the pool, or ``count`` workers could never all run at once."""
    largest, smallest = max(sizes, default=1), min(sizes, default=1)
    if largest > len(devices):
        raise FleetError(
            f"search.devices lists {largest}, but the workers share {len(devices)} GPU(s) "
            f"({','.join(devices)}): give more (--devices, CUDA_VISIBLE_DEVICES) or leave "
            f"{largest} out of search.devices",
            2,
        )
    most = workers_for(len(devices), sizes)
    if count is not None and count > most:
        raise FleetError(
            f"--workers {count}: {len(devices)} GPU(s) ({','.join(devices)}) hold {most} "
            f"trial(s) of {smallest} device(s) at a time (search.devices lists "
            f"{sorted(set(sizes))}); use --workers {most} or fewer",
            2,
        )
    return most if count is None else count


def budget_use(url: str, study: str, pids: list[int]) -> list[str]:
    """What each of the workers (``pids``, of this host) used of the study's device time, one
    line each, with their share of the space's device-time budget (``budget.max_usd``,
    ``budget.max_device_hours``) where it has one; nothing when the store cannot say."""
    import socket

    from sweeper.space import stored_space
    from sweeper.store import Store
    from sweeper.sweep.stopping import device_hours_limit

    try:
        store = Store(url)
        try:
            row = store.get_study(study)
            listed = store.list_workers(study)
        finally:
            store.dispose()
        space = stored_space(row.space_yaml, study, row.space_path or f"study {study}")
    except SweeperError:
        return []
    workers, trials = [w for w, _ in listed], {w.id: n for w, n in listed}
    hours = device_hours_limit(space.budget, space.hardware.usd_per_hour)
    limit = None if hours is None else 3600 * hours
    host, lines, total = socket.gethostname(), [], 0.0
    for index, pid in enumerate(pids):
        # the latest row of that process (a PID can come back in an older run)
        rows = [w for w in workers if w.pid == pid and w.host == host]
        if not rows:
            continue
        worker = max(rows, key=lambda w: w.started_at)
        used = worker.device_seconds or 0.0
        total += used
        share = "" if limit is None else f", {used / limit:.0%} of the study's budget"
        lines.append(
            f"worker {index}: {trials.get(worker.id, 0)} trial(s), {used:,.0f} "
            f"device-seconds{share}"
        )
    if lines:
        said = "" if limit is None else f" of the budget's {limit:,.0f} ({total / limit:.0%})"
        lines.append(f"the {len(lines)} workers used {total:,.0f} device-seconds{said}")
    return lines


def trial_shares(n_trials: int, count: int) -> list[int]:
    """Each worker's trials: ``n_trials`` in all (not ``count`` × the rounded-up share), no
    worker without one.

    >>> trial_shares(5, 2), trial_shares(2, 3)
    ([3, 2], [1, 1])
    """
    shares = [n_trials // count + (index < n_trials % count) for index in range(count)]
    return [share for share in shares if share > 0]


def run_workers(
    command: list[str],
    name: str,
    url: str,
    devices: list[str],
    count: int,
    n_trials: int,
    max_minutes: float | None,
    *,
    logs: Path,
    say: Callable[[str], None],
    sizes: list[int] | None = None,
) -> None:
    """``count`` worker processes running ``sweeper COMMAND`` on one study, each with its
    share of the trials; when ``devices`` are given they share them as one pool (each trial
    holds the devices it trains on: ``sizes`` are the space's device counts). Their output goes
    to log files under ``logs``. SIGINT and SIGTERM are passed on to every worker (each marks
    its running trial); ``say`` hears which worker runs where."""
    pool = None
    if devices:
        check_pool(devices, sizes or [1], count)
        pool = DevicePool(devices)
    logs.mkdir(parents=True, exist_ok=True)
    shares = trial_shares(n_trials, count)
    if len(shares) < count:
        say(f"{n_trials} trial(s) for {count} workers: starting {len(shares)}, one trial each")
    processes = []
    for index, share in enumerate(shares):
        env = dict(os.environ, SWEEPER_FLEET_TRIALS=str(n_trials))  # the study plans them all
        if pool is not None:
            env.update(pool.env())
        log = logs / f"{name}-{index}.log"
        argv = [sys.executable, "-m", "sweeper.cli", *command]
        argv += ["--storage", url, "--n-trials", str(share)]
        if max_minutes is not None:
            argv += ["--max-minutes", str(max_minutes)]
        with log.open("w") as out:
            processes.append(
                (log, subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT))
            )
        say(f"worker {index}: {share} trials, log {log}")
    if pool is not None:
        say(
            f"the workers share GPU(s) {','.join(devices)}: each trial holds the devices it "
            f"trains on (search.devices {sorted(set(sizes or [1]))}) and sees only those "
            f"(CUDA_VISIBLE_DEVICES); locks in {pool.directory}"
        )
    failed = []
    try:
        for index, (log, process) in enumerate(processes):
            if process.wait() != 0:
                failed.append((index, log, process.returncode))
        for line in budget_use(url, name, [p.pid for _, p in processes]):
            say(line)
    except KeyboardInterrupt as stop:
        terminated = isinstance(stop, Terminated)
        # pass it on once; a second signal must not cut the wait for the workers short
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        for _, process in processes:
            process.send_signal(signal.SIGTERM if terminated else signal.SIGINT)
        for _, process in processes:
            process.wait()
        said = "terminated (SIGTERM)" if terminated else "interrupted"
        code = 143 if terminated else 130
        raise FleetError(f"{said}; each worker marked its running trial", code) from None
    if failed:
        _reap_killed(url, name, [processes[i][1].pid for i, _, code in failed if code < 0], say)
        _failed(failed, len(processes), name)


def _reap_killed(url: str, name: str, pids: list[int], say: Callable[[str], None]) -> None:
    """The trials of the workers killed by a signal (``pids``) lost now, not once their
    heartbeats have aged, as a reaper would have them (``sweeper.sweep.worker.reap_killed``)."""
    if not pids:
        return
    from sweeper.sweep.worker import reap_killed

    try:
        reap_killed(url, name, pids)
    except Exception as e:  # noqa: BLE001 - the database is away: the next launch reaps it
        say(f"the killed worker's trial is not marked lost yet: {e}")


def _failed(failed: list[tuple[int, Path, int]], workers: int, name: str) -> None:
    """Raise FleetError for the workers that ended non-zero (index, log, exit status)."""
    if len(failed) == workers and all(code == 2 for _, _, code in failed):
        # each refused the space or its arguments before any trial (a changed search list,
        # a bad flag): the same words as a single launch's, and its exit status (a walk read
        # "worker 0 exited 2 (see ...log)", exit 1, the reason only in the logs)
        refusals = {refusal(log) for _, log, _ in failed}
        if None not in refusals and len(refusals) == 1:
            raise FleetError(str(refusals.pop()), code=2)
        raise FleetError(
            "; ".join(
                f"worker {i}: {refusal(log) or ended(code)} (see {log})" for i, log, code in failed
            ),
            code=2,
        )
    said = "; ".join(f"worker {i} {ended(code)} (see {log})" for i, log, code in failed)
    if any(code < 0 for _, _, code in failed):
        # killed mid-trial (kill -9, the OOM killer): no handler marked its trial
        said += (
            f". A trial a killed worker was running is marked lost (failure kind lost) "
            f"and its config queued again: `sweeper launch --study {name} --fill` (with this "
            "--storage) runs it and any other trial the study lacks"
        )
    raise FleetError(said, code=1)


def refusal(log: Path) -> str | None:
    """What a worker that exited 2 said, from its log: its last ``error:`` line and the lines
    after it (the terminal width folds a long one), as one line without the prefix."""
    try:
        lines = log.read_text(errors="replace").splitlines()
    except OSError:
        return None
    starts = [i for i, line in enumerate(lines) if line.startswith("error: ")]
    if not starts:
        return None
    return " ".join(" ".join(lines[starts[-1] :]).removeprefix("error: ").split())


def ended(returncode: int) -> str:
    """How a worker's exit status reads (a negative one is the signal that killed it).

    >>> ended(2), ended(-9), ended(-200)
    ('exited 2', 'was killed by SIGKILL', 'was killed by signal 200')
    """
    if returncode >= 0:
        return f"exited {returncode}"
    try:
        return f"was killed by {signal.Signals(-returncode).name}"
    except ValueError:
        return f"was killed by signal {-returncode}"
