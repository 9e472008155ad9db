"""The launcher never hangs: a timeout kills the whole process group, deaths are classified."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil

from sweeper.errors import TrialError
from sweeper.launcher import ForkServer, read_result, run_child, sweep_stale_trial_dirs
from sweeper.space import Space
from sweeper.trial.failures import classify, raised_at
from sweeper.trial.protocol import PreparedData
from tests.helpers import REPO, UNSHARE, can_unshare, tiny_config, trial_request


def _live_group_members(pgid: int, wait_s: float = 5.0) -> list[int]:
    """Processes of the group still alive; zombies (dead, awaiting their reaper) don't count."""
    deadline = time.monotonic() + wait_s
    while True:
        members = []
        for proc in psutil.process_iter(["pid", "status"]):
            try:
                if os.getpgid(proc.pid) == pgid and proc.info["status"] != psutil.STATUS_ZOMBIE:
                    members.append(proc.pid)
            except (ProcessLookupError, psutil.NoSuchProcess):
                continue
        if not members or time.monotonic() > deadline:
            return members
        time.sleep(0.1)


def test_timeout_kills_child_and_its_workers(
    tiny_space: Space, tiny_prepared: PreparedData, cache_dir: Path
) -> None:
    # many measured steps with 2 DataLoader workers: it cannot finish in 8 s
    config = tiny_config(gradient_accumulation_steps=1, num_workers=2, prefetch_factor=2)
    request = trial_request(
        tiny_space,
        tiny_prepared,
        cache_dir,
        config,
        measure={"max_steps": 100_000, "max_seconds": 600, "target_ci": 1e-9},
    )
    started = time.perf_counter()
    run = run_child(request, timeout_s=8)
    elapsed = time.perf_counter() - started
    assert run.result.failure_kind == "timeout", (run.result.failure_message, run.log_tail)
    assert "8 s" in (run.result.failure_message or "")
    # it names the phase it reached (start-up under heavy load, else burn-in or the window)
    assert "it was in " in (run.result.failure_message or "")
    assert elapsed < 8 + 6 + 2  # timeout + SIGTERM grace + slack
    assert _live_group_members(run.pid) == []


def test_death_by_signal_without_result_is_killed() -> None:
    result = read_result(Path("/nonexistent/result.json"), -signal.SIGKILL, "log")
    assert result.failure_kind == "killed"
    assert "SIGKILL" in (result.failure_message or "") and "OOM" in (result.failure_message or "")


def test_exit_without_result_keeps_last_log_line() -> None:
    result = read_result(Path("/nonexistent/result.json"), 3, "starting\nImportError: boom\n")
    assert result.failure_kind == "error"
    assert "exited 3" in (result.failure_message or "") and "ImportError: boom" in (
        result.failure_message or ""
    )
    # what the log's traceback says is classified as if raised in the child: a DataLoader's
    # SIGCHLD handler raised while the child was writing a failed trial's result (CI, 8c02300)
    escaped = read_result(
        Path("/nonexistent/result.json"),
        1,
        'Traceback (most recent call last):\n  File ".../torch/utils/data/_utils/signal_handling'
        '.py", line 73, in handler\n    _error_if_any_worker_fails()\nRuntimeError: DataLoader '
        "worker (pid 12924) is killed by signal: Killed. \n",
    )
    assert escaped.failure_kind == "dataloader"
    assert "exited 1 without a result: RuntimeError: DataLoader worker" in (
        escaped.failure_message or ""
    )


def test_an_exit_that_left_nothing_says_why_it_cannot_say_more(tmp_path: Path) -> None:
    """A trial that exited without a word: its directory was removed under it (so its log
    went too), or it found its parent gone at start (the lifeline now says so in its log)."""
    gone = read_result(tmp_path / "removed" / "result.json", 1, "")
    assert "its directory" in (gone.failure_message or "")
    assert "was removed while it ran" in (gone.failure_message or "")
    orphan = subprocess.run(
        [sys.executable, "-c",
         "from sweeper.trial.lifeline import die_with_parent; die_with_parent(1)"],
        capture_output=True, text=True, timeout=60, cwd=REPO,
    )  # fmt: skip
    assert orphan.returncode == 1
    assert "parent 1 is gone (parent now " in orphan.stderr, orphan.stderr


_SWEEP = (
    "import sys; from pathlib import Path; "
    "from sweeper.launcher import sweep_stale_trial_dirs as sweep; "
    "print(sorted(p.name for p in sweep(Path(sys.argv[1]))))"
)
_HOLD = (
    "import sys, time; from pathlib import Path; from sweeper.launcher import _owned; "
    "d = Path(sys.argv[1]); d.mkdir()\n"
    "with _owned(d):\n    print('held', flush=True); time.sleep(600)"
)


def _gone_pid() -> int:
    """A pid no process has now: what a live owner's pid looks like from another namespace."""
    process = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                             capture_output=True, text=True, timeout=60, check=True)  # fmt: skip
    return int(process.stdout)


def test_a_trial_directory_is_swept_only_once_its_owner_is_gone_whatever_its_pid_says(
    tmp_path: Path,
) -> None:
    """CI lost a live trial's directory (test_seed_004, "was removed while it ran"): a launch
    in another PID namespace (the SIGTERM-to-PID-1 test's `unshare --pid`, or a container
    sharing /tmp) saw the owner's pid as dead. The owner's flock answers instead."""
    live = tmp_path / f"sweeper-trial-{_gone_pid()}-live"
    holder = subprocess.Popen([sys.executable, "-c", _HOLD, str(live)], cwd=REPO,
                              stdout=subprocess.PIPE, text=True)  # fmt: skip
    killed_owner = subprocess.Popen([sys.executable, "-c", _HOLD, str(tmp_path / "x")],
                                    cwd=REPO, stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        assert killed_owner.stdout is not None and killed_owner.stdout.readline() == "held\n"
        killed_owner.kill()  # SIGKILL: no clean-up ran, the kernel dropped its lock
        killed_owner.wait(timeout=60)
        dead = tmp_path / f"sweeper-trial-{killed_owner.pid}-dead"
        (tmp_path / "x").rename(dead)
        # no lock: a directory from before the lock, or one whose owner has not taken it yet
        unlocked_old = tmp_path / f"sweeper-trial-{_gone_pid()}-old"
        unlocked_young = tmp_path / f"sweeper-trial-{_gone_pid()}-young"
        for path in (unlocked_old, unlocked_young):
            path.mkdir()
        os.utime(unlocked_old, (time.time() - 3600, time.time() - 3600))
        sweepers = [[sys.executable, "-c", _SWEEP, str(tmp_path)]]
        if can_unshare():  # the failure as CI met it: a sweep from another PID namespace
            sweepers.insert(0, [*UNSHARE, *sweepers[0]])
        outputs = []
        for command in sweepers:
            swept = subprocess.run(command, capture_output=True, text=True, timeout=120, cwd=REPO)
            assert swept.returncode == 0, swept.stderr
            outputs.append(swept.stdout.strip())
        assert outputs[0] == str(sorted([dead.name, unlocked_old.name])), outputs
        assert live.is_dir() and (live / "owner.lock").exists() and unlocked_young.is_dir()
        # the lock file appears already held: made under another name, locked, then renamed
        # (a sweeper once saw it between its creation and its flock and removed a live one)
        assert sorted(p.name for p in live.iterdir()) == ["owner.lock"]
        assert not dead.exists() and not unlocked_old.exists()
        assert holder.poll() is None  # the live owner was never disturbed
        holder.kill()
        holder.wait(timeout=60)
        # once the live owner is gone a new sweeper (this process, not swept yet) takes it,
        # and never one of its own: an unlocked, old directory named by this process
        ours = tmp_path / f"sweeper-trial-{os.getpid()}-ours"
        ours.mkdir()
        os.utime(ours, (time.time() - 3600, time.time() - 3600))
        assert sweep_stale_trial_dirs(tmp_path) == [live]
        assert ours.is_dir()
    finally:
        for process in (holder, killed_owner):
            process.kill()
            process.communicate(timeout=60)  # reaps it and closes its pipe


def test_classify_walks_the_cause_chain() -> None:
    class OutOfMemoryError(RuntimeError):
        pass

    class BackendCompilerFailed(RuntimeError):
        pass

    try:
        try:
            raise OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        except OutOfMemoryError as inner:
            raise BackendCompilerFailed("backend='inductor' raised") from inner
    except BackendCompilerFailed as outer:
        assert classify(outer)[0] == "oom"
    try:
        raise BackendCompilerFailed("backend='inductor' raised: LoweringException")
    except BackendCompilerFailed as exc:
        assert classify(exc) == (
            "compile",
            "BackendCompilerFailed: backend='inductor' raised: LoweringException",
        )
    assert classify(TrialError("nonfinite", "loss became nan"))[0] == "nonfinite"
    assert (
        classify(RuntimeError("DataLoader worker (pid 12) is killed by signal: Killed."))[0]
        == "dataloader"
    )
    assert classify(ValueError("something else"))[0] == "error"
    # a rank of a multi-device trial: gloo's words for a peer gone or a collective too slow
    gone = "[gloo/transport/tcp/pair.cc:534] Connection closed by peer [127.0.0.1]:29500"
    assert classify(RuntimeError(gone))[0] == "collective"
    slow = "[gloo/transport/tcp/unbound_buffer.cc:81] Timed out waiting 5000ms for recv"
    assert classify(RuntimeError(slow))[0] == "collective"
    # and without the file prefix (a CI's rank 0, its peer stopped past the group's timeout)
    closed = "Application timeout caused pair closure"
    assert classify(RuntimeError(closed)) == ("collective", f"RuntimeError: {closed}")
    assert classify(TimeoutError("read timed out"))[0] == "error"  # not a collective's
    # the host's memory, as Python and torch's CPU allocator say it
    assert classify(MemoryError())[0] == "oom"
    allocator = "DefaultCPUAllocator: can't allocate memory: you tried to allocate 8388608 bytes"
    assert classify(RuntimeError(allocator)) == ("oom", f"host memory: RuntimeError: {allocator}")


def test_a_programs_traceback_says_where_its_own_code_raised() -> None:
    """A script trial that died names its own file and 1-based line, not a package's."""
    chained = (
        "Traceback (most recent call last):\n"
        '  File "/w/train.py", line 5, in <module>\n'
        "    first()\n"
        "KeyError: 'a'\n\n"
        "During handling of the above exception, another exception occurred:\n\n"
        "Traceback (most recent call last):\n"
        '  File "/w/train.py", line 40, in <module>\n'
        "    main()\n"
        '  File "/w/train.py", line 31, in main\n'
        "    trainer.train()\n"
        "    ^^^^^^^^^^^^^^^\n"
        '  File "/v/lib/python3.11/site-packages/transformers/trainer.py", line 9, in train\n'
        "    raise ValueError('bad')\n"
        "ValueError: bad\n"
    )
    assert raised_at(chained, "/w") == "train.py:31 (trainer.train())"
    assert raised_at(chained, "/elsewhere") == "/w/train.py:31 (trainer.train())"
    # only packages' frames: the innermost is still somewhere to look
    inside = (
        "Traceback (most recent call last):\n"
        '  File "<frozen runpy>", line 198, in _run_module_as_main\n'
        '  File "/v/lib/python3.11/site-packages/pkg/cli.py", line 7, in main\n'
        "ImportError: no\n"
    )
    assert raised_at(inside) == "/v/lib/python3.11/site-packages/pkg/cli.py:7"
    assert raised_at("Killed") is None


def test_fork_server_starts_trials_without_imports_and_kills_on_timeout(
    tiny_space: Space, tiny_prepared: PreparedData, cache_dir: Path
) -> None:
    config = tiny_config(num_workers=2, prefetch_factor=2)
    with ForkServer(str(cache_dir)) as server:
        assert server.alive
        assert (
            server.preload(trial_request(tiny_space, tiny_prepared, cache_dir, config)) is not None
        )
        run = run_child(
            trial_request(tiny_space, tiny_prepared, cache_dir, config),
            timeout_s=120,
            server=server,
        )
        assert run.result.status == "ok", (run.result.failure_message, run.log_tail)
        phases = run.result.payload["phases_s"]
        # torch, transformers, the tokenizer and the Arrow data were loaded before the fork
        assert phases["imports"] < 0.2 and phases["tokenizer"] < 0.1 and phases["data"] < 0.2
        assert run.result.payload["samples_per_s"] > 0

        # a window that never ends (burn-in capped at 2 steps) and a burn-in that never does:
        # each timeout names the phase it stopped in
        stuck = {
            "the timed window (after 2 burn-in steps)": {"max_steps": 2},
            "burn-in (after step": {"min_steps": 100_000, "max_steps": 100_000},
        }
        for phase, warmup in stuck.items():
            forever = trial_request(
                tiny_space,
                tiny_prepared,
                cache_dir,
                config,
                warmup=warmup,
                measure={"max_steps": 100_000, "max_seconds": 600, "target_ci": 1e-9},
            )
            run = run_child(forever, timeout_s=10, server=server)
            assert run.result.failure_kind == "timeout"
            assert f"it was in {phase}" in (run.result.failure_message or ""), (
                run.result.failure_message
            )
            assert _live_group_members(run.pid) == []
        # the zygote's own temporary files are in a directory owned as a trial's is
        zygote_dir = server.directory
        assert zygote_dir.name.startswith(f"sweeper-trial-{os.getpid()}-zygote-")
        assert (zygote_dir / "owner.lock").exists() and (zygote_dir / "tmp").is_dir()
    assert not zygote_dir.exists()


def test_dead_fork_server_falls_back_to_spawning(
    tiny_space: Space, tiny_prepared: PreparedData, cache_dir: Path
) -> None:
    with ForkServer(str(cache_dir)) as server:
        assert server._process is not None
        server._process.kill()
        server._process.wait()
        run = run_child(
            trial_request(tiny_space, tiny_prepared, cache_dir, tiny_config()),
            timeout_s=120,
            server=server,
        )
        assert run.result.status == "ok", (run.result.failure_message, run.log_tail)
        assert not server.alive
        assert run.result.payload["phases_s"]["imports"] > 0.2  # a fresh interpreter imported


def test_a_forked_trial_runs_in_the_environment_a_spawned_one_has(
    tiny_space: Space, tiny_prepared: PreparedData, cache_dir: Path, monkeypatch: Any
) -> None:
    """The zygote asks torch to count CUDA devices through NVML (PYTORCH_NVML_BASED_CUDA_CHECK),
    so that a package calling torch.cuda.is_available() at import cannot poison its forks; that
    is the zygote's business: the forked trial starts with, and records, the environment a
    spawned one (and the user's run) starts with, a variable the user set included. (deepspeed
    sets the same variable as it is imported, in a trial as in the user's run: the record is
    the trial's start.)"""
    monkeypatch.delenv("PYTORCH_NVML_BASED_CUDA_CHECK", raising=False)
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
    config = tiny_config()
    spawned = run_child(trial_request(tiny_space, tiny_prepared, cache_dir, config), timeout_s=120)
    assert spawned.result.status == "ok", (spawned.result.failure_message, spawned.log_tail)
    recorded = spawned.result.payload["env"]["runtime_env"]
    assert recorded.get("PYTORCH_CUDA_ALLOC_CONF") == "expandable_segments:True"
    assert "PYTORCH_NVML_BASED_CUDA_CHECK" not in recorded
    assert not any(name.endswith("_DIR") for name in recorded)  # per-trial cache paths
    with ForkServer(str(cache_dir)) as server:
        forked = run_child(
            trial_request(tiny_space, tiny_prepared, cache_dir, config),
            timeout_s=120,
            server=server,
        )
        assert forked.result.status == "ok", (forked.result.failure_message, forked.log_tail)
        assert forked.inherited_startup_s > 0.0  # it was forked
        assert forked.result.payload["env"]["runtime_env"] == recorded
        # a value the trial's own environment sets is kept, whatever the zygote did
        asked = run_child(
            trial_request(tiny_space, tiny_prepared, cache_dir, config),
            timeout_s=120,
            server=server,
            env={"PYTORCH_NVML_BASED_CUDA_CHECK": "1"},
        )
        assert asked.inherited_startup_s > 0.0
        assert asked.result.payload["env"]["runtime_env"] == recorded | {
            "PYTORCH_NVML_BASED_CUDA_CHECK": "1"
        }


def test_a_fork_server_that_opened_cuda_stops_forking_says_why_and_trials_spawn(
    tiny_space: Space, tiny_prepared: PreparedData, cache_dir: Path
) -> None:
    """What the fork server does once its imports or preload opened the CUDA context (torchao
    at import, on the H200 of 2026-11-27; no CPU can open one, so the test puts the server in
    that state as the zygote's reply does): no more forks, the zygote ends, the preload a bench
    asks for next is declined, and trials run in fresh interpreters."""
    with ForkServer(str(cache_dir)) as server:
        assert server.alive and server._process is not None
        server._retire("loading the model's code and the data initialized CUDA in the fork server")
        assert server.unfit is not None and "a child forked from it would fail" in server.unfit
        assert server._process.wait(timeout=30) == 0  # its stdin closed: it returns
        request = trial_request(tiny_space, tiny_prepared, cache_dir, tiny_config())
        assert server.preload(request) is None
        run = run_child(request, timeout_s=120, server=server)
        assert run.result.status == "ok", (run.result.failure_message, run.log_tail)
        assert run.inherited_startup_s == 0.0
        assert run.result.payload["phases_s"]["imports"] > 0.2  # a fresh interpreter imported
