"""End to end through the real CLI: sweep, store, read back by API, `best`, `serve`, Ctrl-C."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import optuna
import psutil
import pytest
from fastapi.testclient import TestClient

from api.app import create_app
from sweeper.errors import StorageError, StudyNotFoundError
from sweeper.recommend import best as best_of
from sweeper.store import Store
from tests.helpers import (
    REPO,
    STUDY_FIELDS,
    TINY_SPACE,
    UNSHARE,
    assert_cheapest_or_tied,
    can_unshare,
    run_sweeper,
    tiny_space_without_baseline,
)


def _sweeper(*args: str, env: dict[str, str], timeout: float = 300) -> subprocess.CompletedProcess:
    return run_sweeper(*args, env=env, timeout=timeout)


@pytest.fixture
def env(cache_dir: Path) -> dict[str, str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("SWEEPER_")}
    # PYTHONFAULTHANDLER: a hung sweeper killed with SIGABRT prints where it hung
    return {
        **clean,
        "SWEEPER_CACHE_DIR": str(cache_dir),
        "COLUMNS": "200",
        "PYTHONFAULTHANDLER": "1",
    }


def test_invalid_space_exits_2_and_writes_nothing(tmp_path: Path, env: dict[str, str]) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(TINY_SPACE.read_text().replace("[sdpa, eager]", "[]"))
    db = tmp_path / "never.db"
    result = _sweeper("launch", "--space", str(bad), "--storage", f"sqlite:///{db}", env=env)
    assert result.returncode == 2
    assert (
        f"{bad}:27: search.attn_implementation: List should have at least 1 item" in result.stderr
    )
    assert not db.exists()


def test_a_space_file_that_is_not_utf8_exits_2_with_where_and_the_fix(
    tmp_path: Path, env: dict[str, str]
) -> None:
    latin1 = tmp_path / "latin1.yaml"
    latin1.write_bytes(TINY_SPACE.read_bytes().replace(b"study: tiny", b"study: tiny # caf\xe9"))
    db = tmp_path / "never.db"
    result = _sweeper("launch", "--space", str(latin1), "--storage", f"sqlite:///{db}", env=env)
    assert result.returncode == 2, result.stderr
    assert f"{latin1}:" in result.stderr and "not UTF-8 text (byte 0xe9)" in result.stderr
    assert "iconv" in result.stderr and "Traceback" not in result.stderr
    assert not db.exists()


def test_worker_on_a_database_without_the_study_says_so_without_sql(
    tmp_path: Path, postgres_url: str, env: dict[str, str]
) -> None:
    """Issue 31: ``sweeper worker`` on an empty database printed raw SQL, and on a missing
    SQLite path created an empty file."""
    missing = tmp_path / "nowhere" / "sweeper.db"
    result = _sweeper("worker", "--study", "x", "--storage", f"sqlite:///{missing}", env=env)
    assert result.returncode == 2, result.stderr
    assert f"no database at {missing}" in result.stderr and not missing.parent.exists()
    for command in (["worker", "--study", "x"], ["best", "--study", "x"]):
        result = _sweeper(*command, "--storage", postgres_url, env=env)
        assert result.returncode != 0
        said = " ".join(result.stderr.split())
        assert "holds no sweeper study (it has no sweeper tables)" in said or (
            "no study named 'x'" in said
        ), said
        assert "[SQL:" not in said and "SELECT" not in said and "Traceback" not in said, said


def test_an_endless_space_file_is_refused_unread(tmp_path: Path, env: dict[str, str]) -> None:
    """``--space /dev/zero`` once read without bound; a space file is a page of YAML."""
    db = tmp_path / "never.db"
    result = _sweeper(
        "launch", "--space", "/dev/zero", "--storage", f"sqlite:///{db}", env=env, timeout=60
    )
    assert result.returncode == 2, result.stderr
    assert "/dev/zero: larger than 1024 KiB, so not a space file" in result.stderr
    assert "Traceback" not in result.stderr and not db.exists()


def test_bad_data_names_its_lines_at_once_and_writes_nothing(
    tmp_path: Path, env: dict[str, str]
) -> None:
    """Bad records are said by launch (and doctor) before anything runs, every one of them up
    to five, exit 2: the prepare step (a child, tests/trial/test_user_data.py) stopped at the
    first, half a minute in, exit 1."""
    data = tmp_path / "chats.jsonl"
    chat = '{"messages": [{"role": "%s", "content": "hi"}, {"role": "assistant", "content": "yo"}]}'
    data.write_text(f'{chat % "user"}\n\n{{"messages": [\n{chat % "usr"}\n{chat % "user"}\n')
    space = tmp_path / "space.yaml"
    text = TINY_SPACE.read_text()
    text = re.sub(r"    generate:\n      samples: 400\n      median_chars: 300\n", "", text)
    field = f"  dataset:\n    path: {data}\n    messages_field: messages\n"
    space.write_text(text.replace("  dataset:\n", field))
    db = tmp_path / "sweeper.db"
    result = _sweeper("launch", "--space", str(space), "--storage", f"sqlite:///{db}", env=env)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    said = " ".join(result.stderr.split())
    assert "workload.dataset.path: the prepare step would refuse 2 records" in said, said
    wanted = "not a JSON object (Expecting value at the end of the line (a bracket or brace left"
    assert f"{data}:3: {wanted} open?))" in said, result.stderr
    assert f"{data}:4: message 1 has role 'usr'; did you mean 'user'?" in said
    # the file's line, not json's "line 1 column ..."
    assert "line 1 column" not in said, result.stderr
    assert not db.exists()  # nothing written: no study row to delete by hand
    doctor = _sweeper("doctor", "--space", str(space), env=env)
    assert doctor.returncode == 2 and f"{data}:4: message 1 has role 'usr'" in doctor.stderr
    # line 100 (and 1234): said as ":100:", not rich's emoji code for it (a walk read
    # "chats.jsonl💯 'messages' is missing")
    good = chat % "user"
    data.write_text("\n".join([good] * 99 + ['{"text": "no messages"}'] + [good] * 1133
                               + ['{"text": "none"}']) + "\n")  # fmt: skip
    result = _sweeper("launch", "--space", str(space), "--storage", f"sqlite:///{db}", env=env)
    assert result.returncode == 2, result.stderr
    said = " ".join(result.stderr.split())
    assert f"{data}:100: " in said and f"{data}:1234: " in said, result.stderr
    assert "\U0001f4af" not in result.stderr and not db.exists()


def test_a_missing_data_file_or_model_directory_is_said_with_its_line_at_once(
    tmp_path: Path, env: dict[str, str]
) -> None:
    """A walk's misspelt model directory and data file: launch showed 15-18 s of "preparing",
    then the prepare step's message without the space's line, exit 1 (which the Kubernetes
    recipe retries). Now exit 2 with file:line, at once, nothing written, as bad records are."""
    data = tmp_path / "chats.jsonl"
    data.write_text('{"messages": [{"role": "user", "content": "hi"}]}\n')
    generated = "    generate:\n      samples: 400\n      median_chars: 300\n"
    text = TINY_SPACE.read_text().replace(generated, f"    path: {data}\n")
    db = tmp_path / "sweeper.db"
    cases = (
        (f"path: {data}", f"path: {tmp_path / 'chat.jsonl'}", 14,
         f"workload.dataset.path: no such file or directory {tmp_path / 'chat.jsonl'}"),
        ("    arch: llama\n    size: tiny\n", f"    id: {tmp_path / 'modle'}\n", 9,
         f"workload.model.id: {tmp_path / 'modle'} is not a directory on this machine"),
        ("    vocab_size: 512\n", "    id: ./modle\n", 12,
         "workload.tokenizer.id: ./modle is not a directory on this machine"),
    )  # fmt: skip
    for replaced, written, line, said in cases:
        space = tmp_path / "space.yaml"
        assert replaced in text
        space.write_text(text.replace(replaced, written))
        for command in (("launch", "--storage", f"sqlite:///{db}"), ("doctor",)):
            result = _sweeper(*command, "--space", str(space), env=env, timeout=60)
            assert result.returncode == 2, (command, result.stderr)
            told = " ".join(result.stderr.split())
            assert f"{space}:{line}: {said}" in told and "Traceback" not in told, told
            assert "preparing" not in told and not db.exists()


def test_a_second_launch_beside_a_live_worker_refuses_without_join(
    tmp_path: Path, env: dict[str, str]
) -> None:
    from sweeper.joining import same_place_worker

    url = f"sqlite:///{tmp_path / 'sweeper.db'}"
    store = Store(url)
    store.migrate()
    store.upsert_study("tiny", **(STUDY_FIELDS | {"space_yaml": TINY_SPACE.read_text()}))
    env = {k: v for k, v in env.items() if k != "CUDA_VISIBLE_DEVICES"}
    # a worker killed a moment ago (kill -9): its heartbeat is fresh, its process gone
    gone = subprocess.Popen(["true"])
    gone.wait()
    store.register_worker("tiny", "w-0", socket.gethostname(), gone.pid, None)
    try:
        result = _sweeper("launch", "--space", str(TINY_SPACE), "--storage", url, env=env)
        assert result.returncode == 2 and "Traceback" not in result.stderr
        said = " ".join(result.stderr.split())
        assert f"(pid {gone.pid}, last heartbeat" in said
        # not "kill PID" of a process that is not there: when to launch again instead
        assert f"but no process {gone.pid} runs here: if it was killed" in said, said
        assert "in about" in said and f"kill {gone.pid}" not in said and "--join" in said
        store.end_worker("w-0")
        store.register_worker("tiny", "w-1", socket.gethostname(), os.getpid(), None)
        result = _sweeper("launch", "--space", str(TINY_SPACE), "--storage", url, env=env)
        assert result.returncode == 2 and "Traceback" not in result.stderr
        said = " ".join(result.stderr.split())
        assert "already has a live worker on this host using every visible device" in said
        assert f"(pid {os.getpid()}" in said and f"kill {os.getpid()}:" in said
        assert "--join" in said
        assert store.list_trials("tiny") == []  # it ran nothing
        # another host's worker, or another GPU's, shares nothing with this launch
        store.register_worker("tiny", "w-2", "elsewhere", 1, None)
        store.end_worker("w-1")
        assert same_place_worker(url, "tiny") is None
        store.register_worker("tiny", "w-3", socket.gethostname(), 7, "1")
        assert same_place_worker(url, "tiny") is None  # CUDA_VISIBLE_DEVICES unset here
    finally:
        store.dispose()


def test_unreachable_storage_exits_1(env: dict[str, str]) -> None:
    result = _sweeper(
        "launch",
        "--space",
        str(TINY_SPACE),
        "--storage",
        "postgresql+psycopg://postgres@127.0.0.1:1/none",
        env=env,
    )
    assert result.returncode == 1
    assert "cannot reach" in result.stderr and "127.0.0.1:1" in result.stderr


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.torch
def test_sweep_stores_trials_and_api_reads_them(
    storage_url: str, env: dict[str, str], tmp_path: Path
) -> None:
    # SQLite through --storage, Postgres through the environment variable
    if storage_url.startswith("sqlite"):
        args = ("--storage", storage_url)
    else:
        args = ()
        env = {**env, "SWEEPER_STORAGE": storage_url}
    result = _sweeper("launch", "--space", str(TINY_SPACE), "--n-trials", "3", *args, env=env)
    assert result.returncode == 0, result.stderr + result.stdout
    assert "tiny: cheapest per run" in result.stdout
    assert "recommended for tiny" in result.stdout

    # our typed table
    store = Store(storage_url)
    trials = store.list_trials("tiny")
    store.dispose()
    assert len(trials) == 3 and all(t.state == "complete" for t in trials)
    # the space's baseline ran first, and the recommendation is compared with it
    baseline = trials[0].config
    assert (baseline["per_device_batch_size"], baseline["attn_implementation"]) == (2, "eager")
    for t in trials:
        assert t.samples_per_s and t.samples_per_s > 0 and t.it_per_s and t.projection
        # the planned work at the measured rate, plus start-up and checkpoint saves once each
        part = t.projection
        train_hours = 10_000 * 1 / t.samples_per_s / 3600
        assert part["train_hours"] == pytest.approx(train_hours)
        assert part["startup_s"] > 0
        steps = 10_000 / t.samples_per_s * t.it_per_s
        assert part["optimizer_steps"] == pytest.approx(steps)
        assert part["checkpoint_saves"] == int(steps // 500) and part["checkpoint_saves"] >= 2
        assert part["checkpoint_s"] > 0
        hours = train_hours + (part["startup_s"] + part["checkpoint_s"]) / 3600
        assert t.hours_per_run == pytest.approx(hours)
        assert t.cost_per_run_usd == pytest.approx(hours * 0.10)
    store = Store(storage_url)
    chosen = assert_cheapest_or_tied(best_of(store, "tiny"), trials)
    store.dispose()

    # Optuna's tables, same database: ordinary trials with values and user attributes
    optuna_storage = optuna.storages.RDBStorage(storage_url)
    study = optuna.load_study(study_name="tiny", storage=optuna_storage)
    done = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    optuna_storage.engine.dispose()
    assert len(done) == 3
    assert {round(t.values[0], 9) for t in done} == {round(t.cost_per_run_usd, 9) for t in trials}
    assert all("samples_per_s" in t.user_attrs for t in done)

    # the REST API
    with TestClient(create_app(storage_url)) as client:
        studies = client.get("/api/studies").json()
        assert [s["name"] for s in studies] == ["tiny"]
        assert studies[0]["trials"]["complete"] == 3 and studies[0]["trials"]["failed"] == 0
        listed = client.get("/api/studies/tiny/trials").json()
        assert [t["number"] for t in listed] == [t.number for t in trials]
        api_best = client.get("/api/studies/tiny/best").json()
        assert api_best["trial_number"] == chosen.number
        assert api_best["cost_per_run_usd"] == pytest.approx(chosen.cost_per_run_usd)
        assert api_best["baseline_trial_number"] == 0
        assert api_best["usd_saved_per_run"] == pytest.approx(
            trials[0].cost_per_run_usd - chosen.cost_per_run_usd
        )
        repriced = client.get("/api/studies/tiny/best", params={"usd_per_hour": 0.2}).json()
        assert repriced["cost_per_run_usd"] == pytest.approx(2 * chosen.cost_per_run_usd)
        impossible = client.get("/api/studies/tiny/best", params={"max_hours": 1e-9})
        assert impossible.status_code == 409 and "fastest takes" in impossible.json()["detail"]

    # `sweeper best --json` prints the same recommendation
    best = _sweeper("best", "--study", "tiny", "--json", *args, env=env)
    assert best.returncode == 0, best.stderr
    assert json.loads(best.stdout)["trial_number"] == chosen.number

    # and a real server answers the same
    port = _free_port()
    log = tmp_path / "serve.log"
    with log.open("wb") as log_file:
        server = subprocess.Popen(
            [sys.executable, "-m", "sweeper.cli", "serve", *args, "--port", str(port)],
            env=env,
            cwd=REPO,
            stdout=log_file,
            stderr=subprocess.STDOUT,
        )
    try:
        # the waits grow with the load: at load 8 on 2 cores the page's first render (its
        # templates and figures built cold) took over 5 s in a fresh clone's CI
        loaded = max(1.0, os.getloadavg()[0] / (os.cpu_count() or 1))
        deadline = time.monotonic() + 30 * loaded
        while True:
            try:
                response = httpx.get(f"http://127.0.0.1:{port}/api/studies/tiny/best", timeout=2)
                break
            except httpx.TransportError:
                assert server.poll() is None, log.read_text()
                assert time.monotonic() < deadline, f"server did not come up in {30 * loaded:.0f} s"
                time.sleep(0.2)
        assert response.status_code == 200
        assert response.json()["trial_number"] == chosen.number
        page = httpx.get(f"http://127.0.0.1:{port}/studies/tiny", timeout=30 * loaded)
        assert page.status_code == 200 and "/static/plotly.min.js" in page.text
    finally:
        server.terminate()
        server.wait(timeout=10)


def test_best_for_unknown_study_exits_1(sqlite_url: str, env: dict[str, str]) -> None:
    store = Store(sqlite_url)  # a database that exists, without that study
    store.migrate()
    store.dispose()
    result = _sweeper("best", "--study", "nope", "--storage", sqlite_url, env=env)
    assert result.returncode == 1
    assert "no study named 'nope'" in result.stderr
    # no database at all: exit 2, and none is created (test_reading_commands_name_the_storage)


def test_study_list_names_every_study_of_the_storage(storage_url: str, env: dict[str, str]) -> None:
    """`sweeper study list`: which studies a storage holds, without a browser or REST."""
    store = Store(storage_url)
    store.migrate()
    try:
        empty = _sweeper("study", "list", "--storage", storage_url, env=env)
        assert empty.returncode == 0, empty.stderr
        assert "no studies in" in empty.stdout and "sweeper launch --space FILE" in empty.stdout
        _priced_study(store, "on-h100", "H100 SXM 80GB", 2.5, [(512, 0.8), (1024, 1.2)])
        store.start_trial("on-h100", 2, {"per_device_batch_size": 16})  # running
        store.register_worker("on-h100", "w", socket.gethostname(), os.getpid())
        store.set_remeasuring("w", 0)
        # a sweep that ran to its end with every trial failed: "finished" alone reads as an
        # answer (a walk read it so); the row says there is none
        _priced_study(store, "all-failed", "H100 SXM 80GB", 2.5, [])
        for number in range(2):
            store.start_trial("all-failed", number, {"max_seq_length": 512})
            store.finish_trial("all-failed", number, "failed", failure_kind="oom")
    finally:
        store.dispose()
    listed = _sweeper("study", "list", "--storage", storage_url, env=env)
    assert listed.returncode == 0, listed.stderr
    (line,) = [row for row in listed.stdout.splitlines() if "on-h100" in row]
    cells = [cell.strip() for cell in re.split(r"[│|]", line) if cell.strip()]
    assert cells[:9] == [
        "on-h100", "finished", "H100 SXM 80GB", "2.50", "2", "0", "1 +1 re-measure", "2", "2.00"
    ], cells  # fmt: skip
    (line,) = [row for row in listed.stdout.splitlines() if "all-failed" in row]
    cells = [cell.strip() for cell in re.split(r"[│|]", line) if cell.strip()]
    assert cells[1:3] == ["finished · no trial completed", "H100 SXM 80GB"], cells
    assert cells[4:6] == ["0", "2"], cells
    as_json = _sweeper("study", "list", "--storage", storage_url, "--json", env=env)
    rows = {row["name"]: row for row in json.loads(as_json.stdout)}
    assert rows["all-failed"]["none_completed"] is True
    row = rows["on-h100"]
    assert row["none_completed"] is False
    assert row["trials"] == {"running": 1, "complete": 2, "failed": 0, "pruned": 0}
    assert row["remeasuring"] == [0] and row["best_cost_per_run_usd"] == pytest.approx(2.0)
    assert row["updated_at"].endswith("+00:00")


def _trial_processes(parent: int) -> list[psutil.Process]:
    """Live children of ``parent`` running ``sweeper.trial`` (the fork server, or a spawned
    prepare/trial child); zombies are gone."""
    found = []
    for child in psutil.Process(parent).children():
        try:
            if child.status() != psutil.STATUS_ZOMBIE and "sweeper.trial" in " ".join(
                child.cmdline()
            ):
                found.append(child)
        except psutil.NoSuchProcess:
            continue
    return found


def _slow_space(tmp_path: Path, workers: int = 0, seconds: int = 600) -> Path:
    """The tiny space with a window that runs for ``seconds`` (10 minutes by default)."""
    slow = tmp_path / "slow.yaml"
    slow.write_text(
        tiny_space_without_baseline()
        .replace("  num_workers: [0]", f"  num_workers: [{workers}]")
        .replace("    max_steps: 3", f"    max_steps: 100000\n    max_seconds: {seconds}")
        .replace("    min_seconds: 0", "    min_seconds: 0\n    target_ci: 0.000001")
    )
    return slow


def _launch(
    space: Path,
    storage: str,
    env: dict[str, str],
    *extra: str,
    background: bool = False,
    pid_1: bool = False,
) -> subprocess.Popen[str]:
    """``sweeper launch`` of ``space`` as a child process with pipes, not waited for; with
    ``background``, started as a shell starts a background job (SIGINT ignored); with
    ``pid_1``, as the first process of a new PID namespace, as in a container (a signal
    without a handler is ignored there)."""
    return subprocess.Popen(
        (UNSHARE if pid_1 else [])
        + [sys.executable, "-m", "sweeper.cli", "launch", "--space", str(space)]
        + ["--storage", storage, *extra],
        env=env,
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=(lambda: signal.signal(signal.SIGINT, signal.SIG_IGN)) if background else None,
    )


def _wait_for_a_running_trial(
    process: subprocess.Popen[str], store: Store, timeout_s: float = 120, parent: int = 0
) -> list[psutil.Process]:
    """Wait until study "tiny" has a trial (not the prepare step) training; its processes
    (children of ``parent``, by default of ``process``)."""
    deadline = time.monotonic() + timeout_s
    while True:
        trials = _trial_processes(parent or process.pid)
        try:
            running = store.list_trials("tiny", states=["running"]) if trials else []
        except (StudyNotFoundError, StorageError):  # the sweep has not created it yet
            running = []
        if running:
            return trials
        assert process.poll() is None, process.communicate()
        assert time.monotonic() < deadline, f"no trial started in {timeout_s:g} s"
        time.sleep(0.3)


def _communicate_or_dump_stacks(process: subprocess.Popen[str], timeout: float) -> str:
    """The process's stderr once it exits; if it hangs, fail with the Python stack it hangs in
    (PYTHONFAULTHANDLER makes SIGABRT print every thread's stack)."""
    try:
        return process.communicate(timeout=timeout)[1]
    except subprocess.TimeoutExpired:
        process.send_signal(signal.SIGABRT)
        _, stderr = process.communicate(timeout=30)
        pytest.fail(f"no exit {timeout:g} s after SIGINT; stacks at SIGABRT:\n{stderr[-6000:]}")


@pytest.mark.torch
@pytest.mark.parametrize(
    ("sent", "how", "code", "said"),
    [
        (signal.SIGINT, "terminal", 130, "interrupted"),
        (signal.SIGINT, "background", 130, "interrupted"),
        (signal.SIGTERM, "terminal", 143, "terminated (SIGTERM)"),
        (signal.SIGTERM, "pid-1", 143, "terminated (SIGTERM)"),
    ],
    ids=["SIGINT", "SIGINT-to-a-background-job", "SIGTERM", "SIGTERM-to-PID-1-of-a-container"],
)
def test_ctrl_c_marks_the_running_trial_and_leaves_no_orphan(
    tmp_path: Path,
    sqlite_url: str,
    env: dict[str, str],
    sent: int,
    how: str,
    code: int,
    said: str,
) -> None:
    if how == "pid-1" and not can_unshare():
        pytest.skip("needs `unshare --pid` (root or user namespaces) to start a PID namespace")
    process = _launch(
        _slow_space(tmp_path),
        sqlite_url,
        env,
        background=how == "background",
        pid_1=how == "pid-1",
    )
    store = Store(sqlite_url)
    try:
        sweeper = process.pid
        if how == "pid-1":  # unshare's child is the namespace's PID 1
            deadline = time.monotonic() + 60
            while not psutil.Process(process.pid).children() and time.monotonic() < deadline:
                time.sleep(0.1)
            (first,) = psutil.Process(process.pid).children()
            sweeper = first.pid
            namespace = os.readlink(f"/proc/{sweeper}/ns/pid")
            assert namespace != os.readlink("/proc/self/ns/pid")
        trials = _wait_for_a_running_trial(process, store, parent=sweeper)
        time.sleep(2)
        os.kill(sweeper, sent)
        stderr = _communicate_or_dump_stacks(process, timeout=30)
        assert process.returncode == code, stderr
        assert said in stderr
        # which trial it marked (a walk's Ctrl-C in prepare was told "the running one is marked")
        assert "the running one (#0) is marked interrupted" in " ".join(stderr.split()), stderr
        (trial,) = store.list_trials("tiny")
        assert (trial.state, trial.failure_kind) == ("failed", "interrupted")
        assert store.get_study("tiny").state == "interrupted"
        _, alive = psutil.wait_procs(trials, timeout=10)
        assert [p for p in alive if p.status() != psutil.STATUS_ZOMBIE] == []
    finally:
        store.dispose()
        if process.poll() is None:
            process.kill()
        process.communicate()


@pytest.mark.torch
def test_killing_the_sweeper_leaves_no_orphan(
    tmp_path: Path, sqlite_url: str, env: dict[str, str]
) -> None:
    """SIGKILL gives the parent no chance to clean up: the kernel's parent-death signal must."""
    launch = [
        sys.executable,
        "-m",
        "sweeper.cli",
        "launch",
        "--space",
        str(_slow_space(tmp_path, 2)),
    ]
    sweeper = subprocess.Popen(
        [*launch, "--storage", sqlite_url],
        env=env,
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 120
        family: list[psutil.Process] = []
        while not family:  # wait for the fork server, a trial and its two DataLoader workers
            for server in _trial_processes(sweeper.pid):
                try:
                    descendants = server.children(recursive=True)
                except psutil.NoSuchProcess:
                    continue
                if len(descendants) >= 3:
                    family = [server, *descendants]
            assert sweeper.poll() is None
            assert time.monotonic() < deadline, "no trial with workers appeared in 120 s"
            time.sleep(0.2)
        sweeper.kill()
        sweeper.wait()
        _, alive = psutil.wait_procs(family, timeout=10)
        alive = [p for p in alive if p.status() != psutil.STATUS_ZOMBIE]
        assert alive == [], [p.pid for p in alive]
    finally:
        if sweeper.poll() is None:
            sweeper.kill()
            sweeper.wait()


def _priced_study(store: Store, name: str, hardware: str, price: float, runs: list) -> None:
    store.upsert_study(
        name,
        state="finished",
        hardware_name=hardware,
        usd_per_hour=price,
        device="cpu",
        samples=100,
        epochs=1.0,
        n_trials_planned=2,
        space_yaml="",
        space_path=None,
        workload_hash="same-job",
        dataset_stats={"token_percentiles": list(range(0, 1010, 10)), "tokens_max": 1000},
    )
    for number, (seq, hours) in enumerate(runs):
        store.start_trial(name, number, {"max_seq_length": seq})
        store.finish_trial(
            name,
            number,
            "complete",
            samples_per_s=10.0,
            hours_per_run=hours,
            cost_per_run_usd=hours * price,
        )


def test_reading_commands_name_the_storage_and_create_nothing(
    tmp_path: Path, sqlite_url: str, env: dict[str, str]
) -> None:
    """Issue 18: `best --storage sweeper.db` printed a 45-line traceback about '<unparseable
    URL>'; `best --study X` from the wrong directory said only "no study named 'X' in this
    storage" and left an empty sweeper.db behind. A path to an SQLite file is accepted, a
    missing database is named with where it was looked for, and a study not found is named
    with the storage, the studies it holds and the nearest name."""
    store = Store(sqlite_url)
    store.migrate()
    _priced_study(store, "h100-llama-1b", "H100 SXM 80GB", 2.5, [(2048, 8.0)])
    _priced_study(store, "a100", "A100 80GB", 1.2, [(2048, 15.0)])
    store.dispose()
    database = sqlite_url.removeprefix("sqlite:///")

    by_path = run_sweeper("best", "--study", "a100", "--storage", database, env=env, cwd=tmp_path)
    assert by_path.returncode == 0, by_path.stderr

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    for args in (["best"], ["export"], ["study", "export"]):
        for storage in ([], ["--storage", "sweeper.db"]):
            result = run_sweeper(*args, "--study", "a100", *storage, env=env, cwd=elsewhere)
            said = " ".join(result.stderr.split())
            assert result.returncode == 2 and "Traceback" not in result.stderr, said
            assert f"no database at {elsewhere / 'sweeper.db'}" in said, said
    assert list(elsewhere.iterdir()) == []  # reading created no database

    for args in (["best"], ["export"], ["study", "export"]):
        near = run_sweeper(*args, "--study", "h100-llama", "--storage", sqlite_url, env=env)
        said = " ".join(near.stderr.split())
        assert near.returncode == 1 and "Traceback" not in near.stderr, said
        assert f"no study named 'h100-llama' in {sqlite_url}" in said, said
        assert (
            "its studies: a100, h100-llama-1b" in said and "did you mean 'h100-llama-1b'?" in said
        )


def test_best_guards_truncation_and_compares_hardware(sqlite_url: str, env: dict[str, str]) -> None:
    """`sweeper best` leaves a truncating config out and says so; --allow-truncation takes it
    with a warning; --across-hardware prices the same job on every machine it was swept on."""
    store = Store(sqlite_url)
    store.migrate()
    _priced_study(store, "h100", "H100 SXM 80GB", 2.5, [(128, 4.0), (2048, 8.0)])
    _priced_study(store, "a100", "A100 80GB", 1.2, [(2048, 15.0)])  # $18 vs the H100's $20
    _priced_study(store, "short", "H100 SXM 80GB", 2.5, [(128, 4.0)])
    store.dispose()
    args = ("--storage", sqlite_url)

    # every trial truncates: the one fix, and the best truncating config with its cut
    none = _sweeper("best", "--study", "short", *args, env=env)
    assert none.returncode != 0 and "Traceback" not in none.stderr
    said = " ".join(none.stderr.split())
    assert "To get an answer, list a max_seq_length of at least 1001 tokens" in said, said
    assert "Until then the cheapest config, trial #0" in said and "--allow-truncation" in said

    guarded = _sweeper("best", "--study", "h100", *args, env=env)
    assert guarded.returncode == 0, guarded.stderr
    assert "max_seq_length: 2048" in guarded.stdout
    assert "left out: trial #0 (bs" in guarded.stdout and "truncates" in guarded.stdout

    allowed = _sweeper("best", "--study", "h100", "--allow-truncation", "--json", *args, env=env)
    chosen = json.loads(allowed.stdout)
    assert chosen["config"]["max_seq_length"] == 128
    assert chosen["truncated_samples_share"] == pytest.approx(88 / 101)
    assert any("allowed by request" in w for w in chosen["warnings"])

    across = _sweeper("best", "--study", "h100", "--across-hardware", "--json", *args, env=env)
    assert across.returncode == 0, across.stderr
    result = json.loads(across.stdout)
    assert result["cheapest"]["study"] == "a100"
    assert result["cheapest"]["cost_per_run_usd"] == pytest.approx(18.0)
    front = [(p["study"], p["hours_per_run"]) for p in result["pareto"]]
    assert front == [("h100", 8.0), ("a100", 15.0)]
    table = _sweeper("best", "--study", "a100", "--across-hardware", *args, env=env)
    assert "cheapest across 2 machine(s): A100 80GB" in table.stdout
    assert "Pareto front" in table.stdout

    mixed = _sweeper(
        "best", "--study", "h100", "--across-hardware", "--usd-per-hour", "2", *args, env=env
    )
    assert mixed.returncode == 2 and "--usd-per-hour re-prices one study" in mixed.stderr

    # the study page's recommendation card names what it left out, too
    with TestClient(create_app(sqlite_url)) as client:
        page = client.get("/studies/h100").text
    assert re.search(
        r"Left out: trial #0 \(bs\S+ seq128\) costs \$10\.00 but truncates [\d.]+% of the tokens",
        page,
    )


@pytest.mark.torch
def test_a_stop_request_ends_the_sweep_after_its_running_trial(
    tmp_path: Path, sqlite_url: str, env: dict[str, str]
) -> None:
    """What POST /api/studies/{name}/stop does (Store.request_stop), seen by a real sweep.
    Trials of 6 s: a 3-step trial could end, and the next start, between the wait and the
    request (seen once with a torch thread per test process)."""
    process = _launch(_slow_space(tmp_path, seconds=6), sqlite_url, env, "--n-trials", "3")
    store = Store(sqlite_url)
    try:
        _wait_for_a_running_trial(process, store)
        assert store.request_stop("tiny")
        stdout, stderr = process.communicate(timeout=120)
        assert process.returncode == 0, stderr
        assert "stop requested" in stdout + stderr
        assert store.get_study("tiny").state == "stopped"
        (trial,) = store.list_trials("tiny")
        assert trial.state == "complete"  # the running trial finished and was recorded
    finally:
        store.dispose()
        if process.poll() is None:
            process.kill()
            process.communicate()


def test_help_reads_as_a_newcomer_needs_it(env: dict[str, str]) -> None:
    """Issue 18: flags showed a `<bool>` placeholder that suggests `--json true`, there was no
    -h or --version, --max-hours did not say its unit, and launch --help did not say that each
    launch adds --n-trials more trials."""
    from sweeper import __version__

    for flag in ("--version", "-V"):
        version = _sweeper(flag, env=env)
        assert version.returncode == 0 and version.stdout.strip() == f"sweeper {__version__}"
    wide = {**env, "COLUMNS": "200"}
    helps: dict[str, str] = {}  # each command's -h, read below (not run a second time)
    for command in (["best"], ["export"], ["launch"], ["worker"], ["doctor"], ["study", "export"]):
        short, long = _sweeper(*command, "-h", env=wide), _sweeper(*command, "--help", env=wide)
        assert short.returncode == long.returncode == 0, short.stderr
        assert short.stdout == long.stdout and "<bool>" not in short.stdout, short.stdout
        helps[" ".join(command)] = short.stdout
    best_help = " ".join(helps["best"].split())
    assert "the run must finish within this many hours" in best_help
    assert "<float range>" in best_help  # options that take a value keep their label
    launch_help = " ".join(helps["launch"].split())
    assert "launching a study again resumes it and adds this many more" in launch_help


@pytest.mark.torch
def test_a_second_demo_launch_serves_what_is_there(
    sqlite_url: str, env: dict[str, str], tmp_path: Path
) -> None:
    """Issue 18: running scripts/demo.sh again swept 8 more trials and the home page said
    "Complete 16, Planned 8". `launch --fill` runs only what the study lacks and says so; a
    plain second launch adds its trials and the plan says the total."""
    args = ("--space", str(TINY_SPACE), "--storage", sqlite_url)
    piped = {k: v for k, v in env.items() if k != "COLUMNS"}  # as in CI or `> log.txt`
    first = _sweeper("launch", *args, "--n-trials", "2", "--fill", env=piped)
    assert first.returncode == 0, first.stderr
    # issue 18: piped output wrapped at 80 columns mid-sentence, cut the leaderboard's config
    # to "compile...", and gave no ETA
    lines = first.stdout.splitlines()
    assert any(line.startswith("2 trials (") and "; stopped: " in line for line in lines)
    assert any(line.startswith("✓ #0 ") and line.endswith(" left]") for line in lines), lines
    assert any("[2/2]" in line for line in lines)
    assert any("│ bs2×ga2 seq64 w0 eager compile=none " in line for line in lines), lines
    again = _sweeper("launch", *args, "--n-trials", "2", "--fill", env=env)
    said = " ".join(again.stdout.split())
    assert again.returncode == 0, again.stderr
    assert "already has 2 of its 2 trials: nothing to run (--fill)" in said, said
    assert "tiny: cheapest per run" in said  # what is there is shown
    topped = _sweeper("launch", *args, "--n-trials", "3", "--fill", env=env)
    assert topped.returncode == 0, topped.stderr
    assert "has 2 of its 3 trials: running the 1 missing" in " ".join(topped.stdout.split())
    more = _sweeper("launch", *args, "--n-trials", "1", env=env)
    assert more.returncode == 0, more.stderr
    store = Store(sqlite_url)
    try:
        assert len(store.list_trials("tiny")) == 4
        assert store.get_study("tiny").n_trials_planned == 4  # 3, then one more
    finally:
        store.dispose()


def test_a_taken_port_is_found_before_anything_runs(env: dict[str, str]) -> None:
    """Issue 18: `serve` printed its URL, then "address already in use" (exit 3) with no hint,
    after the demo's sweep. `serve --check` (which demo.sh runs first) and `serve` itself say
    so at once and name a free port."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        for args in (["--check"], []):
            result = _sweeper("serve", "--port", str(port), *args, env=env, timeout=60)
            said = " ".join(result.stderr.split())
            assert result.returncode == 3 and "Traceback" not in result.stderr, said
            assert f"cannot serve on 127.0.0.1:{port}" in said and "use --port" in said, said
            free = int(said.rsplit("use --port ", 1)[1].split(",")[0])
            with socket.socket() as probe:
                probe.bind(("127.0.0.1", free))  # the port it names is free
    demo = (REPO / "scripts" / "demo.sh").read_text()  # checked before the sweep, not after
    assert demo.index('serve --port "$port" --check') < demo.index("launch --space")


def test_an_interrupted_sweep_says_whether_a_trial_was_running() -> None:
    """A walk's Ctrl-C during the data's preparation was told "the running one is marked"."""
    from sweeper.console import RichObserver
    from tests.helpers import tiny_config

    observer = RichObserver("tiny", 3)
    assert observer.interrupted_words().startswith("no trial was running (nothing is lost)")
    observer.trial_started(4, tiny_config())
    assert observer.interrupted_words() == (
        "finished trials are kept, the running one (#4) is marked interrupted"
    )
    # a re-walk's Ctrl-C during a re-measure was told "no trial was running"
    observer.running = None
    observer.remeasuring(1)
    assert observer.interrupted_words().startswith(
        "finished trials are kept; #1's config was being measured again, and that measurement "
        "is dropped"
    )
    # a trial the budget cut ends the sweep: its line gives no time left (a walk read "about
    # 2 min left" right after "the budget ran out"); a finished one estimates it
    from sweeper.store.models import TrialRow

    observer.first_trial_at = time.monotonic() - 30
    lines = []
    for number, kind in ((0, "oom"), (1, "interrupted")):
        row = TrialRow(number=number, state="failed", failure_kind=kind, own_values=None,
                       config=tiny_config().model_dump(), failure_message="cut")  # fmt: skip
        with observer.progress.console.capture() as captured:
            observer.trial_done(row)
        lines.append(" ".join(captured.get().split()))
    assert lines[0].endswith("left]") and lines[1].endswith("cut [2/3]"), lines


def test_an_interrupted_sweep_says_how_to_go_on(tmp_path: Path) -> None:
    """A re-walk's Ctrl-C during preflight was told to resume a study that was never made."""
    from sweeper.cli_sweep import _resume_words
    from sweeper.store import Store
    from tests.helpers import STUDY_FIELDS

    url = f"sqlite:///{tmp_path / 'sweep.db'}"
    assert _resume_words(url, "s", "mine.yaml") == (
        "no study was made yet: `sweeper launch --space mine.yaml` starts it again"
    )
    assert not (tmp_path / "sweep.db").exists()  # no empty database made to ask
    store = Store(url)
    store.migrate()
    assert _resume_words(url, "s", "mine.yaml").startswith("no study was made yet")
    store.upsert_study("s", **STUDY_FIELDS)
    store.dispose()
    assert _resume_words(url, "s", "mine.yaml") == "`sweeper launch --study s` resumes it"


def test_the_sweeps_last_line_keeps_the_code_its_stop_reason_quotes() -> None:
    """A re-walk read "pass it as Trainer(..., callbacks=)": rich took the brackets."""
    from sweeper.console import console, print_sweep_summary
    from sweeper.sweep.run import SweepReport

    reason = "pass it as Trainer(..., callbacks=[sweeper.callback()])"
    report = SweepReport(study="s", storage_url="", trials_run=3, completed=0, failed=3,
                         wall_s=32.0, stop_reason=reason)  # fmt: skip
    with console.capture() as captured:
        print_sweep_summary(report)
    assert f"stopped: {reason}" in " ".join(captured.get().split())
    # a proposal of a measured config runs nothing, and its trial number has no row: said
    # (a walk saw #2 then #4 and no word why)
    repeated = SweepReport(study="s", storage_url="", trials_run=4, completed=4, failed=0,
                           wall_s=60.0, repeats=1)  # fmt: skip
    with console.capture() as captured:
        print_sweep_summary(repeated)
    said = " ".join(captured.get().split())
    assert "1 proposal of a config measured already, told its result and not run" in said, said
