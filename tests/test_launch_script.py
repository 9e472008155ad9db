"""``sweeper launch`` and ``doctor`` on a script space whose program is not there: said when
the file is read (its path, the directory it resolved against, the YAML line, the fix), exit 2,
before any preparation and with nothing written. A launch whose study ends without a completed
trial exits 3 (a real script whose trials all fail), and when it does not (a real SQLite
store's trials, workers and stop)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from sweeper import yamllines
from sweeper.cli_sweep import NO_TRIAL_COMPLETED, outcome
from sweeper.errors import BLOCK_FIX, asked_ran
from sweeper.space_script import program_problem
from sweeper.store import Store
from sweeper.sweep.run import SweepReport
from tests.helpers import STUDY_FIELDS, TINY_SPACE, run_sweeper, script_space


def _script_space(tmp_path: Path, command: list[str], cwd: str | None = None) -> Path:
    """The tiny space as a script space, its command written one word a line (so each word
    has its own YAML line)."""
    space = yaml.safe_load(TINY_SPACE.read_text())
    space["workload"]["engine"] = "script"
    space["workload"]["script"] = {"command": command, **({"cwd": cwd} if cwd else {})}
    path = tmp_path / "space.yaml"
    path.write_text(yaml.safe_dump(space, default_flow_style=False, sort_keys=False))
    return path


def _line_of(path: Path, word: str) -> int:
    return next(i for i, line in enumerate(path.read_text().splitlines(), 1) if word in line)


def test_a_missing_script_is_refused_when_the_space_is_read(tmp_path: Path) -> None:
    cache_dir = tmp_path / "cache"  # its own: nothing is prepared into it
    (tmp_path / "job").mkdir()
    (tmp_path / "job" / "train.py").write_text("import sweeper\nsweeper.callback()\n")
    path = _script_space(tmp_path, [sys.executable, "trian.py", "--bf16", "True"], cwd="job")
    db = tmp_path / "never.db"
    started = time.monotonic()
    launch = run_sweeper(
        "launch", "--space", str(path), "--storage", f"sqlite:///{db}", cache_dir=cache_dir,
        cwd=tmp_path,
    )  # fmt: skip
    took = time.monotonic() - started
    assert launch.returncode == 2, launch.stdout + launch.stderr
    said = " ".join(launch.stderr.split())
    job = (tmp_path / "job").resolve()
    assert f"{path}:{_line_of(path, 'trian.py')}: workload.script.command[1]: trian.py " in said
    assert f"does not exist (resolved against {job}, workload.script.cwd (job)" in said, said
    assert "set workload.script.cwd to the directory it is relative to" in said
    assert "Traceback" not in launch.stderr
    assert not db.exists()  # nothing written, no preparation: the data was never read
    assert not cache_dir.exists() or not any(cache_dir.iterdir())
    # doctor reads the file the same way, before examining anything (its probes take minutes)
    doctor = run_sweeper("doctor", "--space", str(path), cache_dir=cache_dir, cwd=tmp_path)
    assert doctor.returncode == 2 and "trian.py does not exist" in doctor.stderr, doctor.stderr
    assert "Traceback" not in doctor.stderr
    # each was refused in the time a Python start takes, not after a preparation (~40 s)
    assert took < 30, took


def _problem(tmp_path: Path, command: list[str], cwd: str | None = None) -> str | None:
    path = _script_space(tmp_path, command, cwd)
    _, lines = yamllines.load(path.read_text(), str(path), ValueError)
    return program_problem(command, cwd, str(path), lines)


def test_each_launch_form_names_its_program(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """python, accelerate launch, torchrun and python -m lines, relative to the directory
    sweeper runs in when the space sets no cwd."""
    monkeypatch.chdir(tmp_path)
    # the launchers' names on PATH (read, never run: the controller's environment has none)
    shims = tmp_path / "bin"
    shims.mkdir()
    for name in ("python", "accelerate", "torchrun"):
        (shims / name).write_text("#!/bin/sh\nexit 1\n")
        (shims / name).chmod(0o755)
    monkeypatch.setenv("PATH", f"{shims}{os.pathsep}{os.environ.get('PATH', '')}")
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "train.py").write_text("")
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "train.py").write_text("")
    fine = [
        ["python", "-u", "src/train.py", "--x", "1"],
        ["accelerate", "launch", "--num_processes", "2", "--mixed_precision=bf16", "src/train.py"],
        ["torchrun", "--standalone", "--nproc-per-node", "2", "src/train.py", "--lr", "1"],
        [sys.executable, "-m", "torch.distributed.run", "--nnodes=1", "src/train.py"],
        ["python", "-m", "pkg.train"],
        ["torchrun", "-m", "pkg.train"],
        ["python", "-c", "print(1)"],  # no file to check
    ]
    for command in fine:
        assert _problem(tmp_path, command) is None, command
    for command, index in (
        (["accelerate", "launch", "--num_processes", "2", "src/tarin.py"], 4),
        (["torchrun", "--standalone", "--nproc-per-node", "2", "tarin.py"], 4),
        (["python", "-W", "ignore", "src"], 3),  # a directory is not a script
    ):
        problem = _problem(tmp_path, command)
        assert problem is not None and f"workload.script.command[{index}]: " in problem, problem
        assert f"resolved against {tmp_path.resolve()}, the directory sweeper was started in" in (
            problem
        )
    module = _problem(tmp_path, [sys.executable, "-m", "pkg_that_is_not.train"])
    assert module is not None and "module pkg_that_is_not.train is neither under" in module
    assert f"nor importable by {sys.executable}" in module
    unknown = _problem(tmp_path, ["no-such-python-here", "src/train.py"])
    assert unknown is not None and "no-such-python-here is not a program on PATH" in unknown
    absent = _problem(tmp_path, [str(tmp_path / "venv" / "bin" / "python"), "src/train.py"])
    assert absent is not None and "workload.script.command[0]: " in absent
    assert "venv/bin/python does not exist" in absent


_FAILS = """import sweeper  # sweeper's line would be below, but the script fails before it

raise RuntimeError("CUDA error: no kernel image is available for execution on the device")
"""


def _launch_failing(
    tmp_path: Path, n_trials: int, batch_sizes: list[int] | None = None
) -> tuple[Path, str, subprocess.CompletedProcess[str]]:
    """`sweeper launch` of the tiny space as a script that fails at import (``_FAILS``), no
    baseline: the space, the study's URL and the launch."""
    (tmp_path / "train.py").write_text(_FAILS)
    path = _script_space(tmp_path, [sys.executable, "train.py"], cwd=str(tmp_path))
    space = yaml.safe_load(path.read_text())
    space["budget"]["n_trials"] = n_trials
    if batch_sizes is not None:
        space["search"]["per_device_batch_size"] = batch_sizes
    del space["baseline"]
    path.write_text(yaml.safe_dump(space))
    url = f"sqlite:///{tmp_path / 's.db'}"
    launch = run_sweeper("launch", "--space", str(path), "--storage", url,
                         cache_dir=tmp_path / "cache")  # fmt: skip
    return path, url, launch


@pytest.mark.torch  # its trials run (the script's child side)
def test_a_launch_whose_trials_all_fail_exits_3_with_what_to_do(tmp_path: Path) -> None:
    """`sweeper launch && sweeper best` stops at the launch when no trial completed; its last
    line says how many ran, failed by kind, and what to do."""
    path, url, launch = _launch_failing(tmp_path, n_trials=2)
    assert launch.returncode == NO_TRIAL_COMPLETED == 3, launch.stdout + launch.stderr
    last = " ".join(launch.stderr.split())  # one message, wrapped to the terminal
    assert last.startswith("error: no trial completed, so there is nothing to recommend: "), last
    assert "this sweep ran 2 trials, 2 failed (error 2)" in last, last
    assert f"`sweeper doctor --space {path}`" in last and "(exit 3)" in last
    assert "Traceback" not in launch.stderr
    best = run_sweeper("best", "--study", "tiny", "--storage", url)
    assert best.returncode != 0
    # --fill has nothing left to run: the study's plan is spent, on failures
    fill = run_sweeper("launch", "--space", str(path), "--storage", url, "--fill",
                       cache_dir=tmp_path / "cache")  # fmt: skip
    assert fill.returncode == 3, fill.stdout + fill.stderr
    assert "has run its trials and none completed" in " ".join(fill.stderr.split())


@pytest.mark.torch  # its trials run (the script's child side)
def test_trials_that_all_fail_alike_stop_the_sweep_after_three(tmp_path: Path) -> None:
    """A script that fails the same way whatever the config (here at import) would fail every
    trial of the plan, each paying its start-up: after 3 alike, with nothing measured, the
    sweep stops, says why with the failure, and the launch exits 3 as for any sweep with no
    completed trial. A plan of 8 runs 3."""
    _, url, launch = _launch_failing(tmp_path, n_trials=8, batch_sizes=[1, 2, 3, 4])
    assert launch.returncode == NO_TRIAL_COMPLETED == 3, launch.stdout + launch.stderr
    said = " ".join((launch.stdout + launch.stderr).split())
    assert "the last 3 trials failed the same way whatever their config" in said, said
    assert "no kernel image is available" in said and "fix that, then launch again" in said
    assert "this sweep ran 3 trials, 3 failed (error 3)" in said, said
    assert "Traceback" not in launch.stderr
    store = Store(url)
    try:
        trials = store.list_trials("tiny")
    finally:
        store.dispose()
    assert len(trials) == 3 and len({json.dumps(t.config, sort_keys=True) for t in trials}) == 3


def _store(tmp_path: Path) -> Store:
    store = Store(f"sqlite:///{tmp_path / 'o.db'}")
    store.migrate()
    store.upsert_study("s", **STUDY_FIELDS)
    return store


def _report(**fields: Any) -> SweepReport:
    base: dict[str, Any] = dict(
        study="s", storage_url="", trials_run=2, completed=0, failed=2, wall_s=1.0,
        worker_id="me",
    )  # fmt: skip
    return SweepReport(**(base | fields))


def _trials(store: Store, *rows: tuple[str, str, str | None]) -> None:
    for number, (worker, state, kind) in enumerate(rows):
        store.start_trial("s", number, {"per_device_batch_size": 2}, worker)
        store.finish_trial("s", number, state, failure_kind=kind)


def test_the_exit_status_counts_the_studys_trials_not_only_this_workers(
    tmp_path: Path,
) -> None:
    """3 only when the study holds no completed trial once this worker ends: not when the
    user stopped it, not while other workers of the study still run (theirs may complete; a
    cluster restarts a worker that exits non-zero), and not when other workers or earlier
    launches completed trials (0, saying this worker's own all failed). Real SQLite."""
    url = f"sqlite:///{tmp_path / 'o.db'}"
    store = _store(tmp_path)
    _trials(store, ("me", "failed", "oom"), ("me", "failed", "mismatch"), ("me", "failed", "oom"))
    report = _report(trials_run=3, failed=3)
    said, code = outcome(url, report, "space.yaml", 60.0)
    assert code == 3
    assert "this sweep ran 3 trials, 3 failed (oom 2, mismatch 1)" in said, said
    assert "`sweeper doctor --space space.yaml`" in said
    said, code = outcome(url, _report(trials_run=3, stopped=True), None, 60.0)
    assert code == 0 and said.startswith("stopped on request before any trial completed"), said
    # a worker elsewhere, beating: its trials may still complete
    store.register_worker("s", "other", "another-host", 1)
    said, code = outcome(url, report, None, 60.0)
    assert code == 0 and "1 other worker of it still running" in said, said
    store.end_worker("other")
    said, code = outcome(url, report, None, 0.0)  # and once it is done, 3 again
    assert code == 3, said
    # another worker's trial completed: the study has a recommendation
    store.start_trial("s", 3, {"per_device_batch_size": 4}, "other")
    store.finish_trial("s", 3, "complete")
    said, code = outcome(url, report, None, 60.0)
    assert code == 0
    assert "none of them completed; the study's 1 completed trial" in said, said
    assert outcome(url, _report(trials_run=1, completed=1, failed=0), None, 60.0) == ("", 0)
    store.dispose()


@pytest.mark.torch  # readback's words for the script (sweeper.trial.engines imports torch)
def test_a_program_that_ignores_a_knob_stops_the_sweep_and_best_says_so(tmp_path: Path) -> None:
    """A walk's script with sweeper's line alone (its DataLoader's batch size and workers its
    own) failed 7 of 8 trials as mismatch: each trial asking another batch size paid its
    start-up to fail alike, and `best` named the one config that ran as asked without a
    word. Two trials asking two other values that ran the same one now stop the sweep, with
    what to do; `best` says which knobs were never measured."""
    from sweeper.recommend import best
    from sweeper.space import parse_space
    from sweeper.sweep.outcome import Outcome
    from sweeper.sweep.stopping import Stopping, TimeBudget
    from sweeper.trial.engines.readback import SCRIPT_FIX

    def message(asked: int, workers: int) -> str:  # readback.check's words for the script
        return (
            "the script engine did not run the config as asked (read back from what trained): "
            f"per_device_batch_size: asked {asked}, ran 1; num_workers: asked {workers}, ran 0"
            + SCRIPT_FIX
        )

    assert "sweeper.trial_config()" in SCRIPT_FIX
    stopping = Stopping(parse_space(TINY_SPACE.read_text()), [], TimeBudget())
    first = Outcome(number=0, failure_kind="mismatch", message=message(8, 2))
    assert stopping.after_trial(first) is None  # one trial: maybe that value only
    assert stopping.after_trial(Outcome(number=1, cost=1.0)) is None  # bs1 w0: ran as asked
    why = stopping.after_trial(Outcome(number=2, failure_kind="mismatch", message=message(4, 0)))
    assert why is not None and why.startswith(
        "your program ran per_device_batch_size 1 whatever was asked (asked 8 in #0, asked 4 "
        "in #2): it does not take it from sweeper"
    ), why
    assert "read per_device_batch_size from `sweeper.trial_config()`" in why
    assert "or list only 1 for it in search:" in why
    assert stopping.program_defect  # the sweep exits 3 though #1 completed (below)
    # an out of memory is the config's own doing: the search learns from it, no stop
    again = Stopping(parse_space(TINY_SPACE.read_text()), [], TimeBudget())
    for n in range(4):
        assert again.after_trial(Outcome(number=n, failure_kind="oom", message="asked")) is None
    assert not again.program_defect

    store = _store(tmp_path)
    try:
        for number, asked in ((0, 8), (2, 4)):
            store.start_trial("s", number, {"per_device_batch_size": asked}, "me")
            store.finish_trial(
                "s", number, "failed", failure_kind="mismatch", failure_message=message(asked, 2)
            )
        store.start_trial("s", 1, {"per_device_batch_size": 1}, "me")
        store.finish_trial(
            "s", 1, "complete", it_per_s=2.0, samples_per_s=2.0, hours_per_run=1.0,
            cost_per_run_usd=2.5,
        )  # fmt: skip
        said = [w for w in best(store, "s").warnings if "did not run the config as asked" in w]
    finally:
        store.dispose()
    # a walk's CI read exit 0 from a sweep stopped so: it says so, and exits 3
    stopped = _report(trials_run=3, completed=1, program_defect=True, stop_reason=why)
    line, code = outcome(f"sqlite:///{tmp_path / 'o.db'}", stopped, None, 60.0)
    assert code == 3 and line.startswith("the sweep stopped early on a defect of your program")
    assert "The 1 completed trial makes the recommendation above" in line and "(exit 3" in line
    # none completed: no recommendation to point at (a re-walk read "The 0 completed trials
    # make the recommendation above")
    (tmp_path / "none").mkdir()
    empty = _store(tmp_path / "none")
    empty.dispose()
    line, code = outcome(f"sqlite:///{tmp_path / 'none' / 'o.db'}", stopped, None, 60.0)
    assert code == 3 and "No trial completed, so there is no recommendation." in line, line
    assert len(said) == 1, said
    assert (
        "2 trials failed because the program did not run the config as asked (#0, #2: " in (said[0])
    )
    assert (
        "per_device_batch_size, num_workers): the values it ignored were never measured"
        in (said[0])
    )
    assert "sweeper.trial_config()" in said[0]
    # a loop whose block wraps each micro-batch took its accumulation from sweeper already:
    # `best` says where the block goes, as the failure did (a re-walk read trial_config())
    store = _store(tmp_path)
    try:
        store.start_trial("s", 3, {"gradient_accumulation_steps": 4}, "me")
        block = asked_ran("gradient_accumulation_steps", 4, 1) + f". {BLOCK_FIX}: it held one"
        store.finish_trial("s", 3, "failed", failure_kind="mismatch", failure_message=block)
        said = [w for w in best(store, "s").warnings if "did not run the config as asked" in w]
    finally:
        store.dispose()
    assert "around a whole optimizer step, passing its micro-batches as a list" in said[0]


def test_a_length_the_data_chose_is_the_scripts_own_where_the_script_keeps_its_own() -> None:
    """A walk's space listed no length (auto → [320] from the data) and its script kept its
    own --max_seq_length 512, which `knobs: flags` does not pass: 4 of 4 trials failed as
    mismatch (asked 320, ran 512), though the README says an unsearched knob the script keeps
    is recorded as the script's own. The one length the data chose is not an ask; lengths the
    data chose several of, or a length the user listed, are."""
    from sweeper import seqlen
    from sweeper.trial.protocol import ChildRequest
    from sweeper.trial.script import owned

    stats = {"token_percentiles": list(range(100, 301, 2)), "tokens_max": 300}

    def owned_after_auto(search: str) -> set[str]:
        space = script_space(
            ["python", "train.py"], search="  per_device_batch_size: [2, 4]\n" + search,
            length=False,
        )  # fmt: skip
        resolved = seqlen.resolve(space, stats)
        config = next(resolved.search.grid())
        return owned(ChildRequest.for_space("trial", resolved, "/tmp", config=config))

    assert "max_seq_length" in owned_after_auto("")  # auto → [320]: the script's own
    assert "max_seq_length" not in owned_after_auto("  max_seq_length: [320]\n")  # listed
    assert "max_seq_length" not in owned_after_auto("  packing: [false, true]\n")  # 3 lengths


def test_a_knob_the_space_lists_once_that_the_program_ignores_stops_the_sweep() -> None:
    """Every trial asks the one value the space lists; two that ran another alike say the
    rest would fail so, and the sweep stops with the fix (a walk ran 4 of 4 to mismatch)."""
    from sweeper.space import parse_space
    from sweeper.sweep.outcome import Outcome
    from sweeper.sweep.stopping import Stopping, TimeBudget

    stopping = Stopping(parse_space(TINY_SPACE.read_text()), [], TimeBudget())  # length [64]
    failed = asked_ran("max_seq_length", 64, 512)
    assert stopping.after_trial(Outcome(number=0, failure_kind="mismatch", message=failed)) is None
    why = stopping.after_trial(Outcome(number=1, failure_kind="mismatch", message=failed))
    assert why is not None and why.startswith(
        "your program ran max_seq_length 512 in #0 and #1, where the space has only 64 for it"
    ), why
    assert "List 512 for max_seq_length in search:" in why and "sweeper.trial_config()" in why
    assert stopping.program_defect


def test_a_failure_whose_config_was_measured_since_is_not_warned_of(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A walk's 4 configs failed as mismatch; it fixed its command and relaunched, and the 4
    completed as #4-#7. `best`, every export and every later launch still said "4 trials failed
    because the program did not run the config as asked ... never measured" and reprinted the
    4 failures whole. A failure whose config completed in a later trial is history: one line
    after the leaderboard, no warning; one whose config never completed is still warned of."""
    from sweeper.console import print_leaderboard
    from sweeper.recommend import best

    store = _store(tmp_path)
    try:
        for number, batch in ((0, 8), (1, 4), (2, 2)):
            store.start_trial("s", number, {"per_device_batch_size": batch}, "me")
            store.finish_trial(
                "s", number, "failed", failure_kind="mismatch",
                failure_message=asked_ran("per_device_batch_size", batch, 1),
            )  # fmt: skip
        for number, batch in ((3, 8), (4, 4)):
            store.start_trial("s", number, {"per_device_batch_size": batch}, "me")
            store.finish_trial(
                "s", number, "complete", it_per_s=2.0, samples_per_s=2.0, hours_per_run=1.0,
                cost_per_run_usd=2.5 + number,
            )  # fmt: skip
        said = [w for w in best(store, "s").warnings if "did not run the config as asked" in w]
    finally:
        store.dispose()
    assert len(said) == 1 and said[0].startswith("1 trial failed because"), said
    assert "(#2: per_device_batch_size)" in said[0], said
    print_leaderboard(f"sqlite:///{tmp_path / 'o.db'}", "s")
    out = " ".join(capsys.readouterr().out.split())
    assert "failed earlier, their configs measured since: #0, #1" in out, out
    assert "GET /api/studies/s/trials keep them" in out and "NAME" not in out, out
    assert "failed #2 " in out and "failed #0" not in out and "failed #1" not in out, out


@pytest.mark.torch  # the launch prepares the data before preflight
def test_a_script_preflight_refuses_leaves_no_study_behind(tmp_path: Path) -> None:
    """A walk's script without sweeper's line was refused by preflight before any trial, and
    left a `failed` study with nothing in it in `study list`: nothing is half-written."""
    (tmp_path / "train.py").write_text("print('trained, with no line of sweeper')\n")
    path = _script_space(tmp_path, [sys.executable, "train.py"], cwd=str(tmp_path))
    space = yaml.safe_load(path.read_text())
    space["trial"]["preflight"] = True
    path.write_text(yaml.safe_dump(space))
    url = f"sqlite:///{tmp_path / 's.db'}"
    launch = run_sweeper("launch", "--space", str(path), "--storage", url, cwd=tmp_path)
    assert launch.returncode == 2, launch.stdout + launch.stderr
    assert "preflight:" in launch.stderr and "Traceback" not in launch.stderr
    store = Store(url)
    try:
        assert not store.has_study("tiny")
    finally:
        store.dispose()
    # a study made before (its rows, as an earlier launch left them) is kept, whatever this
    # launch's preflight says
    store = Store(url)
    try:
        store.upsert_study("tiny", **STUDY_FIELDS)
    finally:
        store.dispose()
    again = run_sweeper("launch", "--space", str(path), "--storage", url, cwd=tmp_path)
    assert again.returncode == 2 and "preflight:" in again.stderr, again.stderr
    store = Store(url)
    try:
        assert store.has_study("tiny")
    finally:
        store.dispose()


_FIXED = """
import torch
from torch.utils.data import DataLoader
from transformers import LlamaConfig, LlamaForCausalLM
import sweeper
cfg = sweeper.trial_config() or {}
accumulate = cfg.get("gradient_accumulation_steps", 1)
model = LlamaForCausalLM(LlamaConfig(
    vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
    num_attention_heads=2, num_key_value_heads=2))
optimizer = torch.optim.AdamW(model.parameters())
rows = [torch.randint(0, 64, (16,)) for _ in range(4000)]
collate = lambda b: {"input_ids": torch.stack(b), "labels": torch.stack(b)}
loader = DataLoader(rows, batch_size=cfg.get("per_device_batch_size", 2), collate_fn=collate,
                    num_workers=cfg.get("num_workers", 0), pin_memory=cfg.get("pin_memory", False))
batches = iter(loader)
while True:
    micro = [next(batches) for _ in range(accumulate)]
    with sweeper.step(micro, model=model, optimizer=optimizer, loader=loader):
        for one in micro:
            (model(**one).loss / accumulate).backward()
        optimizer.step(); optimizer.zero_grad()
"""


@pytest.mark.torch  # its trials run (the script's child side)
def test_configs_that_failed_in_the_program_run_again_once_it_is_fixed(tmp_path: Path) -> None:
    """A walk's script crashed on every trial; the last line said to fix it and launch again
    (the study resumes). Fixed, the launch said "all 2 runnable configs of the space are
    measured" and ran nothing: a failure in the program counted as its config's. It is its
    config's only for the program that failed: unchanged, nothing runs again; changed, those
    configs run first."""
    (tmp_path / "train.py").write_text(_FAILS)
    path = _script_space(tmp_path, [sys.executable, "train.py"], cwd=str(tmp_path))
    space = yaml.safe_load(path.read_text())
    space["workload"]["script"]["knobs"] = "env"
    space["search"]["gradient_accumulation_steps"] = [1]  # two configs: the batch's two sizes
    space["search"]["attn_implementation"] = ["sdpa"]
    space["budget"]["n_trials"] = 2
    del space["baseline"]
    path.write_text(yaml.safe_dump(space))
    url = f"sqlite:///{tmp_path / 's.db'}"

    def launch() -> tuple[int, str]:
        done = run_sweeper("launch", "--space", str(path), "--storage", url,
                           cache_dir=tmp_path / "cache")  # fmt: skip
        return done.returncode, " ".join((done.stdout + done.stderr).split())

    code, said = launch()
    assert code == 3, said
    assert "runs again the configs that failed in your program once its command or files" in said
    code, said = launch()  # the same program: its failures stand, nothing runs
    assert code == 3 and "all 2 runnable configs of the space are measured" in said, said
    assert "your program changed" not in said
    (tmp_path / "train.py").write_text(_FIXED)
    code, said = launch()
    assert code == 0, said
    assert "your program changed since #0, #1 failed in it: their configs run again first" in said
    store = Store(url)
    try:
        trials = store.list_trials("tiny")
    finally:
        store.dispose()
    assert [t.state for t in trials] == ["failed", "failed", "complete", "complete"], [
        (t.number, t.state, t.failure_message) for t in trials
    ]
    assert {json.dumps(t.config, sort_keys=True) for t in trials[:2]} == {
        json.dumps(t.config, sort_keys=True) for t in trials[2:]
    }
