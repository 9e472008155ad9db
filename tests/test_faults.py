"""Faults an operator meets, with real processes and a real Postgres: the server going away
under a running sweep."""

from __future__ import annotations

import contextlib
import itertools
import json
import multiprocessing
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import optuna
import psutil
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import text

from api.app import create_app
from sweeper.errors import StorageError, StudyNotFoundError
from sweeper.search import CONSTRAINT, WORKER_ATTR
from sweeper.space import Space
from sweeper.store import Store
from tests.helpers import (
    REPO,
    STUDY_FIELDS,
    TINY_SPACE,
    FaultTally,
    tally_study,
    tiny_space_without_baseline,
)
from tests.proxy import FaultProxy
from tests.spawned import start_worker
from tests.test_cli import (  # noqa: F401 (env is a fixture)
    _launch,
    _slow_space,
    _wait_for_a_running_trial,
    env,
)

TOKEN = "a-test-token-of-16+-chars"
AUTH = {"Authorization": f"Bearer {TOKEN}"}

PG_CTL = ["pg_ctlcluster", "--skip-systemctl-redirect", "15", "main"]


def _postgres(action: str) -> None:
    done = subprocess.run([*PG_CTL, action], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"pg_ctlcluster {action}: {done.stderr}"


@pytest.mark.torch
@pytest.mark.postgres
@pytest.mark.exclusive  # every other Postgres test would fail while the server is down
def test_a_postgres_outage_mid_sweep_loses_no_trial(
    postgres_url: str,
    env: dict[str, str],  # noqa: F811
    fault_report: Callable[[FaultTally], FaultTally],
    capsys: pytest.CaptureFixture[str],
) -> None:
    process = _launch(TINY_SPACE, postgres_url, env, "--n-trials", "3")
    store = Store(postgres_url, retry_s=120)
    try:
        _wait_for_a_running_trial(process, store)
        store.dispose()
        # down for longer than the trial has left: it ends while the server is away, and
        # its measurement must be written once the server is back
        with capsys.disabled():  # said on the terminal: everyone on this machine loses it
            print(f"\n{__name__}: STOPPING this machine's Postgres for 12 s (outage test)")
        _postgres("stop")
        time.sleep(12)
        _postgres("start")
        with capsys.disabled():
            print(f"{__name__}: Postgres started again")
        stdout, stderr = process.communicate(timeout=600)
        assert process.returncode == 0, stderr[-4000:]
        assert "Traceback" not in stderr + stdout
        trials = store.list_trials("tiny")
        assert [t.state for t in trials] == ["complete"] * 3, [
            (t.number, t.state, t.failure_message) for t in trials
        ]
        assert store.get_study("tiny").state == "finished"
        tally = fault_report(tally_study(postgres_url, "tiny", "Postgres down 12 s mid-trial", 3))
        assert (tally.complete, tally.duplicates, tally.stuck) == (3, 0, 0), tally
    finally:
        subprocess.run([*PG_CTL, "start"], capture_output=True, timeout=120)  # if a step failed
        store.dispose()
        if process.poll() is None:
            process.kill()
            process.communicate()


def _timed_space(tmp_path: Path, seconds: int) -> Path:
    """The tiny space whose trials measure for ``seconds`` (a fault starts inside one), with
    a timeout a loaded machine never reaches."""
    timed = tmp_path / "timed.yaml"
    timed.write_text(
        tiny_space_without_baseline()
        .replace("    max_steps: 3", f"    max_steps: 100000\n    max_seconds: {seconds}")
        .replace("    min_seconds: 0", "    min_seconds: 0\n    target_ci: 0.000001")
        .replace("  timeout_s: 120", "  timeout_s: 900")
    )
    return timed


def _kill_if_running(*processes: subprocess.Popen[str] | None) -> None:
    for process in processes:
        if process is not None and process.poll() is None:
            process.kill()
            process.communicate()


@pytest.mark.torch
def test_an_outage_past_the_retry_window_ends_in_one_line_and_keeps_the_measurement(
    tmp_path: Path,
    postgres_url: str,
    env: dict[str, str],  # noqa: F811
    fault_report: Callable[[FaultTally], FaultTally],
) -> None:
    """The database refuses for longer than the sweep waits (a 4 s window here, 120 s by
    default), through a real TCP proxy (tests/proxy.py). The trial in flight finishes while
    the database refuses: the sweep keeps its measurement on disk (sweeper.sweep.spool) and
    stops with one paragraph (no traceback) that says how to resume; the resumed sweep writes
    the kept measurement and runs one new trial; nothing stays RUNNING. It once ended in a
    190-line traceback, the measurement lost, its trial RUNNING for good and its worker marked
    done, so no reaper touched it."""
    timed = _timed_space(tmp_path, 10)  # trials of about 10 s: the outage starts inside one
    short = env | {
        "SWEEPER_DATABASE_RETRY_S": "4",
        "SWEEPER_DB_STATEMENT_BOUND_S": "3",
        "SWEEPER_HEARTBEAT_S": "0.5",
        "SWEEPER_WORKER_GRACE_S": "2",
    }
    store = Store(postgres_url)
    with FaultProxy() as proxy:
        through = proxy.url_for(postgres_url)
        process = _launch(timed, through, short, "--n-trials", "2")
        try:
            _wait_for_a_running_trial(process, store)
            (running,) = store.list_trials("tiny", states=["running"])
            proxy.mode = "refuse"  # until the sweep has given up
            stdout, stderr = process.communicate(timeout=300)
            proxy.mode = "forward"
            assert process.returncode == 1, stderr[-4000:]
            assert "Traceback" not in stdout + stderr, stderr[-4000:]
            said = " ".join(stderr.split())
            assert (
                "did not answer for 4 s (SWEEPER_DATABASE_RETRY_S), so this sweep stopped" in said
            )
            assert f"trial #{running.number} had finished: its measurement is kept in" in said
            assert "sweeper worker --study tiny" in said, said
            # RUNNING until the study resumes (the database never took the result)
            assert store.get_trial("tiny", running.number).state == "running"
            kept = [p for p in Path(short["SWEEPER_CACHE_DIR"]).rglob("spool/tiny/*.json")]
            assert [p.name for p in kept] == [f"{running.number}.json"]
            again = _launch(timed, through, short, "--n-trials", "1")
            stdout, stderr = again.communicate(timeout=600)
            assert again.returncode == 0, stderr[-4000:]
            assert f"#{running.number}: wrote the measurement kept" in " ".join(stdout.split())
        finally:
            _kill_if_running(process, locals().get("again"))
    trials = {t.number: t for t in store.list_trials("tiny", include_measurement=True)}
    store.dispose()
    assert not kept[0].exists()  # written, then dropped
    written = trials[running.number]
    assert (written.state, written.config) == ("complete", running.config)
    assert written.cost_per_run_usd and written.measurement and written.measurement["window_s"] > 5
    assert [t.state for t in trials.values()] == ["complete", "complete"]
    storage = optuna.storages.RDBStorage(postgres_url)
    try:
        told = optuna.load_study(study_name="tiny", storage=storage).trials[running.number]
    finally:
        storage.engine.dispose()
    assert told.state == optuna.trial.TrialState.COMPLETE
    assert told.value == pytest.approx(written.cost_per_run_usd)
    tally = fault_report(
        tally_study(postgres_url, "tiny", "Postgres refused past the 4 s window, then resumed", 2)
    )
    assert (tally.complete, tally.lost, tally.duplicates, tally.stuck) == (2, 0, 0, 0), tally


@pytest.mark.torch
def test_a_database_that_stops_answering_mid_sweep_is_waited_out_not_hung_on(
    tmp_path: Path,
    postgres_url: str,
    env: dict[str, str],  # noqa: F811
    fault_report: Callable[[FaultTally], FaultTally],
) -> None:
    """The database keeps its sockets open and answers nothing for 15 s (a black hole,
    through tests/proxy.py), mid-trial: every call is bounded (3 s here, 60 s by default), so
    the sweep and its heartbeat fail over to new connections once it answers, and the sweep
    finishes with every trial. It once hung in poll() for more than 4 minutes after the
    database was back."""
    timed = _timed_space(tmp_path, 8)
    bounded = env | {"SWEEPER_DB_STATEMENT_BOUND_S": "3", "SWEEPER_HEARTBEAT_S": "1"}
    store = Store(postgres_url)
    with FaultProxy() as proxy:
        process = _launch(timed, proxy.url_for(postgres_url), bounded, "--n-trials", "2")
        try:
            _wait_for_a_running_trial(process, store)
            proxy.mode = "blackhole"
            time.sleep(15)
            proxy.mode = "forward"
            stdout, stderr = process.communicate(timeout=600)
        finally:
            _kill_if_running(process)
    store.dispose()
    assert process.returncode == 0, stderr[-4000:]
    assert "Traceback" not in stdout + stderr
    tally = fault_report(
        tally_study(postgres_url, "tiny", "Postgres black-holed 15 s mid-trial (half-open)", 2)
    )
    assert (tally.lost, tally.interrupted, tally.duplicates, tally.stuck) == (0, 0, 0, 0), tally
    store = Store(postgres_url)
    trials = store.list_trials("tiny")
    store.dispose()
    # a sampled config may fail as data (the tiny space holds ones a CPU cannot run); none
    # failed for the database
    assert len(trials) == 2 and trials[0].state == "complete", trials
    for trial in trials:
        assert trial.state == "complete" or trial.failure_kind == "unsupported", (
            trial.failure_kind,
            trial.failure_message,
        )


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A real 16 MB tmpfs to put a SQLite study on (mounting needs root: skipped without).
    Not smaller: SQLite's WAL grows to ~4 MB (1,000 pages) between checkpoints, and on a
    4 MB disk it filled the disk itself under load, before the test did (CI at 4993329)."""
    disk = tmp_path / "small-disk"
    disk.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(disk)],
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {mounted.stderr.strip()}")
    try:
        yield disk
    finally:
        subprocess.run(["umount", "-l", str(disk)], capture_output=True, timeout=30)


@pytest.mark.torch
@pytest.mark.parametrize("ending", ["measured", "failed"])
def test_a_full_disk_under_sqlite_is_said_at_once_and_the_trials_record_is_kept(
    tmp_path: Path,
    small_disk: Path,
    env: dict[str, str],  # noqa: F811
    fault_report: Callable[[FaultTally], FaultTally],
    ending: str,
) -> None:
    """The disk under the SQLite file fills while a trial runs: the sweep says so at once
    (where, how much is free), keeps the trial's record, and a resume after space is freed
    writes it. It was once taken for a lost connection: 170 retry lines over 6 m 46 s, then
    one line, and the measurement lost. A trial that fails (here: its timeout) is data too:
    its failure is kept the same way."""
    timed = first = _timed_space(tmp_path, 6)
    if ending == "failed":  # measures for 10 minutes: its 20 s timeout ends it
        first = tmp_path / "timing-out.yaml"
        first.write_text(
            timed.read_text()
            .replace("max_seconds: 6", "max_seconds: 600")
            .replace("timeout_s: 900", "timeout_s: 20")
        )
    url = f"sqlite:///{small_disk / 'sweeper.db'}"
    env = env | {"SWEEPER_HEARTBEAT_S": "1"}  # the stopped worker misses 3 beats in 3 s
    process = _launch(first, url, env, "--n-trials", "2")
    store = Store(url)
    filler = small_disk / "filler"
    try:
        _wait_for_a_running_trial(process, store)
        (running,) = store.list_trials("tiny", states=["running"])
        store.dispose()
        # every free byte, as a full disk has none. Unbuffered: a buffered file keeps what
        # the full disk refused and raises ENOSPC again when it closes (CI, 2026-11-28)
        with filler.open("wb", buffering=0) as fill, contextlib.suppress(OSError):
            while True:
                fill.write(b"\0" * 65536)
        started = time.monotonic()
        stdout, stderr = process.communicate(timeout=300)
        said = " ".join(stderr.split())
        assert process.returncode == 1, stderr[-4000:]
        assert "Traceback" not in stdout + stderr and "retrying" not in stderr, stderr[-4000:]
        assert f"the disk under {small_disk.resolve() / 'sweeper.db'} is full (" in said, said
        assert "free at least 10 MB there" in said, said  # what it needs (its file is < 5 MB)
        # the disk fills while trial #0 runs; its record is the first write the sweep's main
        # thread makes after that (the heartbeat's refused writes are ridden out)
        kept_as = {
            "measured": f"trial #{running.number} had finished: its measurement is kept in",
            "failed": f"trial #{running.number} had failed (timeout): its record is kept in",
        }
        assert kept_as[ending] in said, said
        # at once: the trial's own window (6 s) or timeout (20 s) and teardown, no retry window
        assert time.monotonic() - started < 120
        filler.unlink()
        again = _launch(timed, url, env, "--n-trials", "1")  # 6 s trials
        stdout, stderr = again.communicate(timeout=600)
        assert again.returncode == 0, stderr[-4000:]
        what = "measurement" if ending == "measured" else "failure (timeout)"
        assert f"#{running.number}: wrote the {what} kept" in " ".join(stdout.split()), stdout
    finally:
        _kill_if_running(process, locals().get("again"))
        store.dispose()
    store = Store(url)
    written = store.get_trial("tiny", running.number)
    store.dispose()
    if ending == "measured":
        assert written.state == "complete" and written.cost_per_run_usd
    else:
        assert (written.state, written.failure_kind) == ("failed", "timeout"), written
        assert "no result after 20 s" in (written.failure_message or "")
    # Optuna agrees with our row: told its value, or its failure by the resume's reaper
    storage = optuna.storages.RDBStorage(url)
    try:
        frozen = optuna.load_study(study_name="tiny", storage=storage).trials[running.number]
    finally:
        storage.engine.dispose()
    assert (
        frozen.state
        == {
            "measured": optuna.trial.TrialState.COMPLETE,
            "failed": optuna.trial.TrialState.FAIL,
        }[ending]
    ), frozen
    tally = fault_report(
        tally_study(
            url, "tiny", f"disk full under SQLite mid-trial ({ending}), then freed and resumed", 2
        )
    )
    assert tally.stuck == 0 and tally.lost == 0, tally
    assert tally.complete >= (2 if ending == "measured" else 1), tally


@pytest.mark.parametrize("attempt", [1, 2])
@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_workers_starting_together_on_an_empty_database_do_not_race(
    request: pytest.FixtureRequest, backend: str, attempt: int
) -> None:
    if backend == "postgres":
        request.applymarker(pytest.mark.postgres)
    postgres_url = request.getfixturevalue(f"{backend}_url")  # (or SQLite's)
    context = multiprocessing.get_context("spawn")
    barrier, results = context.Barrier(6), context.Queue()
    workers = [
        context.Process(target=start_worker, args=(postgres_url, barrier, results))
        for _ in range(6)
    ]
    for worker in workers:
        worker.start()
    outcomes = [results.get(timeout=120) for _ in workers]
    for worker in workers:
        worker.join(timeout=60)
    assert outcomes == ["ok"] * 6, outcomes


@pytest.mark.torch
@pytest.mark.postgres
def test_a_killed_workers_trial_is_lost_then_retried_once_and_nothing_stays_running(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    postgres_url: str,
    env: dict[str, str],  # noqa: F811
    fault_report: Callable[[FaultTally], FaultTally],
) -> None:
    # a temp dir of its own: any sweep that starts sweeps the trial dirs of dead sweeps in its
    # temp dir, and a sweep of another test (under -n 2) once swept this one's before it looked
    own_tmp = tmp_path / "tmp"
    own_tmp.mkdir()
    beats = env | {
        "SWEEPER_HEARTBEAT_S": "0.5", "SWEEPER_WORKER_GRACE_S": "4", "TMPDIR": str(own_tmp),
    }  # fmt: skip
    process = _launch(_slow_space(tmp_path), postgres_url, beats)
    store = Store(postgres_url)
    try:
        children = _wait_for_a_running_trial(process, store)
        (running,) = store.list_trials("tiny", states=["running"])
        with TestClient(create_app(postgres_url, api_token=TOKEN)) as client:
            refused = client.delete("/api/studies/tiny", headers=AUTH)
            assert refused.status_code == 409 and "live worker" in refused.text
        process.kill()  # kill -9: no handler runs
        process.communicate()
        psutil.wait_procs(children, timeout=30)
        # what it could not remove: its trial's directory (request, log, the child's TMPDIR)
        # and its zygote's (the zygote's own temporary files)
        left = list(own_tmp.glob(f"sweeper-trial-{process.pid}-*"))
        assert sorted(p.name.split("-")[3] == "zygote" for p in left) == [False, True], left
        assert all((p / "tmp").is_dir() for p in left), left
        time.sleep(5)  # past the grace period
        monkeypatch.setenv("SWEEPER_WORKER_GRACE_S", beats["SWEEPER_WORKER_GRACE_S"])
        with TestClient(create_app(postgres_url, api_token=TOKEN)) as client:
            (silent,) = client.get("/api/studies/tiny/workers").json()
        assert (silent["state"], silent["trials"]) == ("silent", 1), silent
        # the next sweep of the study reaps the dead worker and runs the lost config again
        quick = tmp_path / "quick.yaml"  # the same space, with short trials
        quick.write_text(tiny_space_without_baseline())
        again = _launch(quick, postgres_url, beats, "--n-trials", "1")
        _, stderr = again.communicate(timeout=600)
        assert again.returncode == 0, stderr[-4000:]
        # swept by the next launch (their owner is gone), which left nothing of its own:
        # no trial or zygote directory, no pymp-*, no preload request
        assert list(own_tmp.iterdir()) == []
        trials = {t.number: t for t in store.list_trials("tiny")}
        lost = trials[running.number]
        assert (lost.state, lost.failure_kind) == ("failed", "lost")
        assert "stopped sending heartbeats" in (lost.failure_message or "")
        retried = [t for n, t in trials.items() if n != running.number]
        assert [t.config for t in retried] == [running.config]
        assert retried[0].state == "complete"
        assert store.get_study("tiny").state == "finished"
        storage = optuna.storages.RDBStorage(postgres_url)
        try:
            optuna_trials = optuna.load_study(study_name="tiny", storage=storage).trials
        finally:
            storage.engine.dispose()
        assert optuna_trials[running.number].state == optuna.trial.TrialState.FAIL
        tally = fault_report(
            tally_study(postgres_url, "tiny", "kill -9 of a worker mid-trial, then a sweep", 2)
        )
        assert (tally.lost, tally.complete, tally.duplicates, tally.stuck) == (1, 1, 0, 0), tally
        with TestClient(create_app(postgres_url, api_token=TOKEN)) as client:
            assert client.delete("/api/studies/tiny", headers=AUTH).status_code == 204
    finally:
        store.dispose()
        if process.poll() is None:
            process.kill()
            process.communicate()


@pytest.mark.torch
@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_three_workers_on_one_study_run_distinct_configs(
    request: pytest.FixtureRequest,
    backend: str,
    env: dict[str, str],  # noqa: F811
    fault_report: Callable[[FaultTally], FaultTally],
) -> None:
    """`launch --workers 3`: each worker its share, no config run twice, no lock errors."""
    if backend == "postgres":
        request.applymarker(pytest.mark.postgres)
    url = request.getfixturevalue(f"{backend}_url")
    done = subprocess.run(
        [sys.executable, "-m", "sweeper.cli", "launch", "--space", str(TINY_SPACE)]
        + ["--storage", url, "--workers", "3", "--n-trials", "6"],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=900,
    )
    logs = Path(env["SWEEPER_CACHE_DIR"]) / "workers"
    worker_logs = "\n".join(p.read_text()[-2000:] for p in sorted(logs.glob("tiny-*.log")))
    assert done.returncode == 0, done.stderr[-3000:] + worker_logs
    assert done.stdout.count("worker ") >= 3
    # on a CPU the workers' trials contend with one another: said before they start
    assert "note: 3 workers share this machine's CPU" in " ".join(done.stdout.split())
    store = Store(url)
    try:
        trials = store.list_trials("tiny")
        study = store.get_study("tiny")
        state = study.state
    finally:
        store.dispose()
    # the study plans the fleet's 6 trials, not one worker's share of 2 (issue 31)
    assert study.n_trials_planned == 6
    configs = [json.dumps(t.config, sort_keys=True) for t in trials]
    assert len(trials) == 6 and len(set(configs)) == 6, [(t.number, t.config) for t in trials]
    assert len({t.number for t in trials}) == 6
    assert [t.state for t in trials] == ["complete"] * 6, [t.failure_message for t in trials]
    assert len({t.worker_id for t in trials}) == 3  # every worker ran its share
    assert state == "finished"
    # the end re-measure is the run's, once: two workers leave it to the last one to finish
    left = [
        log.name
        for log in sorted(logs.glob("tiny-*.log"))
        if re.search(r"measures (the study's|its) best configs again", log.read_text())
    ]
    assert len(left) == 2, worker_logs
    for marker in ("locked", "Traceback", "UniqueViolation"):
        assert marker not in worker_logs + done.stderr
    tally = fault_report(tally_study(url, "tiny", f"3 workers x 2 trials on {backend}", 6))
    assert (tally.complete, tally.duplicates, tally.duplicate_numbers, tally.stuck) == (6, 0, 0, 0)


def _wait_for_two_running(store: Store, process: subprocess.Popen[str]) -> None:
    """Until both workers of `launch --workers 2` train a trial of study tiny. Each prepares,
    probes and starts one: 180 s idle; the second was not training yet at 180 s beside a CI
    run and three other jobs (load 5 on 2 cores), so the wait grows with the load, inside the
    trials' 600 s windows."""
    wait_s = min(540.0, 180.0 * max(1.0, os.getloadavg()[0] / (os.cpu_count() or 1)))
    deadline = time.monotonic() + wait_s
    while True:
        try:
            running = store.list_trials("tiny", states=["running"])
        except (StudyNotFoundError, StorageError):
            running = []
        if len(running) == 2:
            return
        assert process.poll() is None, process.communicate()
        assert time.monotonic() < deadline, f"{len(running)} trial(s) running after {wait_s:.0f} s"
        time.sleep(0.3)


@pytest.mark.torch
@pytest.mark.postgres
def test_sigterm_to_launch_with_workers_interrupts_every_worker_and_leaves_nothing_running(
    tmp_path: Path,
    postgres_url: str,
    env: dict[str, str],  # noqa: F811
    fault_report: Callable[[FaultTally], FaultTally],
) -> None:
    """`docker stop` of a container running `sweeper launch --workers 2`: the launcher passes
    SIGTERM on, each worker marks its running trial interrupted, and the study can be deleted
    at once (no live worker, nothing RUNNING)."""
    process = _launch(_slow_space(tmp_path), postgres_url, env, "--workers", "2")
    store = Store(postgres_url)
    try:
        _wait_for_two_running(store, process)
        family = psutil.Process(process.pid).children(recursive=True)
        process.send_signal(signal.SIGTERM)
        stdout, stderr = process.communicate(timeout=60)
        assert process.returncode == 143, stdout + stderr
        assert "terminated (SIGTERM)" in stderr
        _, alive = psutil.wait_procs(family, timeout=30)
        assert [p for p in alive if p.status() != psutil.STATUS_ZOMBIE] == []
        tally = fault_report(
            tally_study(postgres_url, "tiny", "SIGTERM to `launch --workers 2` mid-trials", 2)
        )
        assert (tally.interrupted, tally.lost, tally.stuck, tally.duplicates) == (2, 0, 0, 0)
        assert store.get_study("tiny").state == "interrupted"
        with TestClient(create_app(postgres_url, api_token=TOKEN)) as client:
            workers = client.get("/api/studies/tiny/workers").json()
            assert [w["state"] for w in workers] == ["done", "done"], workers
            assert client.delete("/api/studies/tiny", headers=AUTH).status_code == 204
    finally:
        store.dispose()
        if process.poll() is None:
            process.kill()
            process.communicate()


@pytest.mark.torch
@pytest.mark.postgres
def test_ctrl_c_in_a_terminal_to_launch_with_workers_releases_what_the_trials_held(
    tmp_path: Path,
    postgres_url: str,
    env: dict[str, str],  # noqa: F811
) -> None:
    """Ctrl-C in a terminal reaches the whole foreground process group: `launch --workers 2`
    and each worker, and the launcher passes it on, so each worker is interrupted twice. A
    user walk saw the second one cut a trial's recording: its claim kept (its retry refused
    as "claimed", the config never measured) and Optuna's trial left RUNNING. Each worker
    now finishes recording: nothing RUNNING in Optuna, no claim of an interrupted trial."""
    process = subprocess.Popen(
        [sys.executable, "-m", "sweeper.cli", "launch", "--space", str(_slow_space(tmp_path))]
        + ["--storage", postgres_url, "--workers", "2"],
        env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True,  # its own process group: the terminal's, not pytest's
    )  # fmt: skip
    store = Store(postgres_url)
    try:
        _wait_for_two_running(store, process)
        family = psutil.Process(process.pid).children(recursive=True)
        os.killpg(process.pid, signal.SIGINT)  # the terminal's Ctrl-C
        stdout, stderr = process.communicate(timeout=90)
        assert process.returncode == 130, stdout + stderr
        _, alive = psutil.wait_procs(family, timeout=30)
        assert [p for p in alive if p.status() != psutil.STATUS_ZOMBIE] == []
        trials = store.list_trials("tiny")
        assert [(t.state, t.failure_kind) for t in trials] == [("failed", "interrupted")] * 2
        storage = optuna.storages.RDBStorage(postgres_url)
        try:
            states = [t.state for t in optuna.load_study(study_name="tiny", storage=storage).trials]
        finally:
            storage.engine.dispose()
        assert optuna.trial.TrialState.RUNNING not in states, states
        with store.session() as s:
            claims = s.execute(text("SELECT trial_number FROM sweeper_claims")).scalars().all()
        assert not set(claims) & {t.number for t in trials}, claims
    finally:
        store.dispose()
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.communicate()


@pytest.mark.torch
@pytest.mark.postgres
def test_a_worker_of_launch_workers_killed_mid_trial_is_named_with_the_way_to_resume(
    tmp_path: Path,
    postgres_url: str,
    env: dict[str, str],  # noqa: F811
    fault_report: Callable[[FaultTally], FaultTally],
) -> None:
    """kill -9 of one worker of `launch --workers 2` (the OOM killer does the same): the
    launcher once ended with 'error: a worker exited -9 (see LOG)', saying neither what
    killed it nor what became of its trial. It names the signal and the command that runs
    the lost config again, and that command does: nothing lost, nothing run twice. The
    killed worker's trial is lost as the launch ends, not once its heartbeats have aged: a
    walk's other worker finished before the dead one missed three beats, and the study
    stayed "running" with the trial running (here the beats are too slow for any reaper)."""
    beats = env | {"SWEEPER_HEARTBEAT_S": "30", "SWEEPER_WORKER_GRACE_S": "600"}
    space = _slow_space(tmp_path, seconds=20)
    process = _launch(space, postgres_url, beats, "--workers", "2", "--n-trials", "2")
    store = Store(postgres_url)
    try:
        deadline = time.monotonic() + 180
        while True:  # both workers are training a trial
            try:
                running = store.list_trials("tiny", states=["running"])
            except (StudyNotFoundError, StorageError):
                running = []
            if len(running) == 2:
                break
            assert process.poll() is None, process.communicate()
            assert time.monotonic() < deadline, f"{len(running)} trial(s) running after 180 s"
            time.sleep(0.3)
        workers = psutil.Process(process.pid).children()  # the two `launch --join` processes
        assert len(workers) == 2, workers
        family = workers[0].children(recursive=True)
        workers[0].kill()
        stdout, stderr = process.communicate(timeout=600)
        said = " ".join(stderr.split())
        assert process.returncode == 1, stdout + stderr
        assert "Traceback" not in stdout + stderr
        assert "worker 0 was killed by SIGKILL (see " in said, said
        assert "`sweeper launch --study tiny --fill` (with this --storage)" in said, said
        _, alive = psutil.wait_procs(family, timeout=30)  # its zygote and trial went with it
        assert [p for p in alive if p.status() != psutil.STATUS_ZOMBIE] == []
        (lost,) = store.list_trials("tiny", failure_kinds=["lost"])  # as the launch ended
        assert store.list_trials("tiny", states=["running"]) == []
        assert store.get_study("tiny").state != "running", store.get_study("tiny").state
        fill = subprocess.run(
            [sys.executable, "-m", "sweeper.cli", "launch", "--study", "tiny", "--fill"]
            + ["--storage", postgres_url],
            env=beats, cwd=REPO, capture_output=True, text=True, timeout=600,
        )  # fmt: skip
        assert fill.returncode == 0, fill.stderr[-3000:]
        trials = store.list_trials("tiny")
        lost = [t for t in trials if t.failure_kind == "lost"]
        assert len(lost) == 1 and "stopped sending heartbeats" in (lost[0].failure_message or "")
        # the fill runs the lost config first (then what else the space's budget lacks)
        assert [t.config for t in trials if t.number == 2] == [lost[0].config]
        tally = fault_report(
            tally_study(
                postgres_url, "tiny", "kill -9 of 1 of `launch --workers 2`, --fill", len(trials)
            )
        )
        assert (tally.complete, tally.lost) == (len(trials) - 1, 1), tally
        assert (tally.duplicates, tally.duplicate_numbers, tally.stuck) == (0, 0, 0), tally
    finally:
        store.dispose()
        if process.poll() is None:
            process.kill()
            process.communicate()


@pytest.mark.torch
def test_a_worker_with_two_devices_runs_two_processes_sharing_them(
    sqlite_url: str,
    env: dict[str, str],  # noqa: F811
    tmp_path: Path,
) -> None:
    """`sweeper worker --devices 0,1` with 1-device trials: two processes sharing the two
    GPUs, each trial seeing only the one it holds (here, on a CPU, the variable is set and
    recorded; the trials run on the CPU). tests/test_device_pool.py: trials of 1 and 2."""
    env = dict(env, SWEEPER_DEVICE_LOCKS=str(tmp_path / "locks"))
    first = _launch(TINY_SPACE, sqlite_url, env, "--n-trials", "1")
    _, stderr = first.communicate(timeout=600)
    assert first.returncode == 0, stderr[-3000:]
    done = subprocess.run(
        [sys.executable, "-m", "sweeper.cli", "worker", "--study", "tiny"]
        + ["--storage", sqlite_url, "--devices", "0,1", "--n-trials", "2"],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "worker 1:" in done.stdout and "the workers share GPU(s) 0,1" in done.stdout
    with TestClient(create_app(sqlite_url)) as client:
        workers = client.get("/api/studies/tiny/workers").json()
        trials = client.get("/api/studies/tiny/trials").json()
    # the two started together: either may register first
    assert sorted((w["devices"] or "", w["state"], w["trials"]) for w in workers) == [
        ("", "done", 1),
        ("0,1", "done", 1),
        ("0,1", "done", 1),
    ], workers
    assert len({json.dumps(t["config"], sort_keys=True) for t in trials}) == 3
    assert [t["state"] for t in trials] == ["complete"] * 3


@pytest.mark.parametrize("devices", ["0,,1", "0,0", " "])
def test_worker_devices_must_be_distinct_gpus(sqlite_url: str, devices: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "sweeper.cli", "worker", "--study", "tiny"]
        + ["--storage", sqlite_url, "--devices", devices],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2, done.stderr
    assert "--devices" in done.stderr and "e.g. --devices 0,1" in done.stderr
    assert "Traceback" not in done.stderr


def test_trials_optuna_still_has_running_after_their_worker_died_are_told_from_our_rows(
    storage_url: str, tiny_space: Space
) -> None:
    """A worker that recorded its trial and then lost the database (past its retry window, or
    killed) never told Optuna: the trial stayed RUNNING there for good, the samplers counting
    it as in flight, though our row said complete. One that died between asking and starting
    left a RUNNING trial with no row and its config claimed. The next worker's reaper tells
    Optuna each of them from our row as the dead worker would have, fails the row-less one and
    frees its config, and leaves a live worker's trials alone. The state is built with the
    store's and Optuna's own calls (which write the worker died between cannot be timed with a
    real outage: the tell follows the record within milliseconds)."""
    from sweeper.store.optuna import create_or_load_study, optuna_storage
    from sweeper.sweep.executor import ChildExecutor
    from sweeper.sweep.worker import Worker

    study_name = tiny_space.study
    store = Store(storage_url)
    store.migrate()
    storage = optuna_storage(storage_url)
    try:
        store.upsert_study(study_name, **STUDY_FIELDS)
        study = create_or_load_study(study_name, storage, 0)
        # the grace period: long enough that the live worker's last beat stays within it
        # through a pass on a loaded machine (1 s once failed in CI at load 10: the second
        # pass found the live worker silent and told its trials)
        grace_s = 5.0
        store.register_worker(study_name, "dead", "elsewhere", 1)
        time.sleep(grace_s + 0.2)  # its heartbeat is now older than the grace period
        store.register_worker(study_name, "live", "elsewhere", 2)
        asked = [study.ask() for _ in range(5)]
        for trial, owner in zip(asked, ["dead", "dead", "dead", "live", "live"], strict=True):
            trial.set_user_attr(WORKER_ATTR, owner)
        configs = [c.model_dump() for c in itertools.islice(tiny_space.search.grid(), 5)]
        # 0: measured, then the database went away before the tell
        store.start_trial(study_name, 0, configs[0], "dead")
        store.finish_trial(study_name, 0, "complete", cost_per_run_usd=3.0)
        # 1: ran out of memory (a config that cannot run: infeasible, not failed)
        store.start_trial(study_name, 1, configs[1], "dead")
        store.finish_trial(study_name, 1, "failed", failure_kind="oom", failure_message="OOM")
        # 2: asked and claimed, never started
        assert store.claim(study_name, "config-2", 2, "dead") is None
        # 3 and 4: a live worker's, recorded or not yet; it tells them itself
        store.start_trial(study_name, 4, configs[4], "live")
        store.finish_trial(study_name, 4, "complete", cost_per_run_usd=2.0)

        reaper = Worker(store, storage, study, tiny_space, heartbeat_s=0.2, grace_s=grace_s)
        store.beat("live")
        reaper.reap()
        store.beat("live")
        assert reaper.settle_orphans() == []  # told once: a second pass finds nothing
        trials = optuna.load_study(study_name=study_name, storage=storage).trials
        states = [t.state.name for t in trials]
        assert states == ["COMPLETE", "COMPLETE", "FAIL", "RUNNING", "RUNNING"], states
        assert (trials[0].value, trials[0].constraints) == (3.0, {CONSTRAINT: 0.0})
        # the worst $/run so far, the constraint violated: as the loop tells an OOM
        assert (trials[1].value, trials[1].constraints) == (3.0, {CONSTRAINT: 1.0})
        assert trials[1].user_attrs["failure_kind"] == "oom"
        assert "between asking for it and running it" in trials[2].user_attrs["skipped"]
        assert store.claim(study_name, "config-2", 7, "another") is None  # free again
        # what a resumed sweep learns from them is what the dead worker would have told
        earlier = ChildExecutor(tiny_space, store, None, Path(), None).earlier()  # type: ignore[arg-type]
        assert {o.number: (o.cost, o.failure_kind) for o in earlier.values()} == {
            0: (3.0, None),
            1: (None, "oom"),
            4: (2.0, None),
        }
    finally:
        store.dispose()
        storage.engine.dispose()
