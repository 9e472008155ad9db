"""A user's script on two devices (``engine: script``, ``devices: 2``): two gloo ranks on the CPU.

The trial's leader starts two ranks with torchrun's environment and each runs the user's real
program: the Trainer example (accelerate wraps the model in DDP under that environment) and the
AMP-loop example (its own init_process_group, DistributedSampler and DDP), each given as the
torchrun line a user already has. The hook in each rank records its steps, the ranks end the
window together, and rank 0 writes the group's figures. A script that ignores the launch
(no process group: each rank trains alone) fails as a mismatch that says so; a rank that crashes
takes its group down, classified, with no process left behind.
"""

from __future__ import annotations

import shutil
import sys
import threading
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

from sweeper.job import ScriptSpec
from sweeper.launcher import ChildRun, run_child
from sweeper.space import Space
from sweeper.trial.protocol import ChildRequest, PreparedData
from sweeper.trial.script import devices_problem
from tests.helpers import REPO, tiny_config, trial_request
from tests.trial.test_multi_device import _group_figures as _engine_group_figures
from tests.trial.test_multi_device import _ok

pytestmark = pytest.mark.torch

TORCHRUN = str(Path(sys.executable).with_name("torchrun"))


def _request(
    space: Space,
    prepared: PreparedData,
    cache_dir: Path,
    command: list[str],
    *,
    collective_timeout_s: float = 60,
    **config: Any,
) -> ChildRequest:
    saves = space.workload.checkpoint.model_copy(update={"save_steps": None})
    workload = space.workload.model_copy(
        update={
            "engine": "script",
            "script": ScriptSpec(command=command),
            "checkpoint": saves,
        }
    )
    space = space.model_copy(
        update={
            "workload": workload,
            "trial": space.trial.model_copy(update={"collective_timeout_s": collective_timeout_s}),
        }
    )
    values: dict[str, Any] = {
        "devices": 2,
        "data_parallel": "ddp",
        "per_device_batch_size": 2,
        "gradient_accumulation_steps": 1,
    }
    return trial_request(
        space,
        prepared,
        cache_dir,
        tiny_config(**(values | config)),
        warmup={"min_steps": 1, "max_steps": 2},
        measure={"min_steps": 3, "max_steps": 3, "min_seconds": 0},
    )


def _group_figures(payload: dict[str, Any], batch: int, accumulation: int) -> None:
    """The built-in engines' group figures (test_multi_device), and what the script ran."""
    _engine_group_figures(payload, batch, accumulation)
    assert payload["effective"]["devices"] == 2
    assert payload["effective"]["data_parallel"] == "ddp"
    # DDP's own stats, read from the wrapper the script trained in
    assert 0 <= payload["communication_share"] < 1


def _trainer_line(job: Path, out: Path) -> list[str]:
    """The Trainer example as a user launches it on several devices."""
    return [
        TORCHRUN, "--standalone", "--nproc-per-node", "4", str(REPO / "examples/trainer/train.py"),
        "--model_name_or_path", str(job / "model"), "--data_file", str(job / "chats.jsonl"),
        "--output_dir", str(out), "--report_to", "none", "--save_strategy", "no",
        "--use_cpu", "True",
    ]  # fmt: skip


def test_the_trainer_example_trains_two_ranks_with_ddp_from_its_torchrun_line(
    job: Path, tiny_space: Space, tiny_prepared: PreparedData, cache_dir: Path, tmp_path: Path
) -> None:
    """The line says 4 processes; the trial's devices knob says 2, and 2 ran."""
    request = _request(
        tiny_space, tiny_prepared, cache_dir, _trainer_line(job, tmp_path / "out"),
        gradient_accumulation_steps=2,
    )  # fmt: skip
    run = run_child(request, timeout_s=300)
    payload = _ok(run)
    assert payload["engine"] == "script"
    _group_figures(payload, batch=2, accumulation=2)
    assert "this trial runs 2 (its devices knob)" in run.log_tail


def test_the_amp_loop_example_trains_two_ranks_with_ddp(
    job: Path, tiny_space: Space, tiny_prepared: PreparedData, cache_dir: Path
) -> None:
    """A custom loop given as [python, train.py]: sweeper starts it on each device."""
    command = [
        sys.executable, str(REPO / "examples/amp_loop/train.py"), "--model", str(job / "model"),
        "--data", str(job / "chats.jsonl"), "--gradient_checkpointing", "False",
    ]  # fmt: skip
    payload = _ok(run_child(_request(tiny_space, tiny_prepared, cache_dir, command), timeout_s=300))
    _group_figures(payload, batch=2, accumulation=1)


ALONE = """
import sys, torch
from transformers import AutoModelForCausalLM
import sweeper
model = AutoModelForCausalLM.from_pretrained(sys.argv[1])
optimizer = torch.optim.AdamW(model.parameters())
batch = {"input_ids": torch.randint(0, 100, (2, 16))}
batch["labels"] = batch["input_ids"]
for _ in range(100):
    with sweeper.step(batch, model=model, optimizer=optimizer):
        model(**batch).loss.backward(); optimizer.step(); optimizer.zero_grad()
"""


def test_a_script_that_ignores_the_device_count_fails_as_a_mismatch(
    job: Path, tiny_space: Space, tiny_prepared: PreparedData, cache_dir: Path, tmp_path: Path
) -> None:
    """Two copies that never join a process group each train alone: not what devices 2 is."""
    script = tmp_path / "alone.py"
    script.write_text(ALONE)
    command = [sys.executable, str(script), str(job / "model")]
    run = run_child(_request(tiny_space, tiny_prepared, cache_dir, command), timeout_s=300)
    assert run.result.status == "failed" and run.result.failure_kind == "mismatch", run.result
    message = run.result.failure_message or ""
    assert "devices: asked 2, ran 1" in message and "without a torch.distributed process" in message
    assert "the script ignored the launch's WORLD_SIZE=2" in message


def test_a_script_that_joins_the_group_but_never_wraps_the_model_fails_as_a_mismatch(
    job: Path, tiny_space: Space, tiny_prepared: PreparedData, cache_dir: Path, tmp_path: Path
) -> None:
    """A process group, but each rank's model trains unwrapped: no gradient is shared."""
    script = tmp_path / "unwrapped.py"
    script.write_text(ALONE.replace("import sweeper", "import sweeper, torch.distributed as d\n"
                                    "d.init_process_group('gloo')"))  # fmt: skip
    command = [sys.executable, str(script), str(job / "model")]
    run = run_child(_request(tiny_space, tiny_prepared, cache_dir, command), timeout_s=300)
    assert run.result.status == "failed" and run.result.failure_kind == "mismatch", run.result
    assert "data_parallel: asked 'ddp', ran 'none'" in (run.result.failure_message or "")


CRASH = """
import os, sys, torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from transformers import AutoModelForCausalLM
import sweeper
dist.init_process_group("gloo")
model = DistributedDataParallel(AutoModelForCausalLM.from_pretrained(sys.argv[1]))
optimizer = torch.optim.AdamW(model.parameters())
rank = dist.get_rank()
step = 0
while True:
    batch = {"input_ids": torch.randint(0, 100, (2, 16))}
    batch["labels"] = batch["input_ids"]
    with sweeper.step(batch, model=model, optimizer=optimizer):
        model(**batch).loss.backward(); optimizer.step(); optimizer.zero_grad()
    step += 1
    if rank == 1 and step == 3:
        open(sys.argv[2], "w").close()
        while not os.path.exists(sys.argv[3]):  # until the test has seen every process
            pass
        raise ValueError("rank 1's own bug")
"""


def _processes_of(folder: Path) -> list[psutil.Process]:
    """Every process whose command line names ``folder``: the trial's leader and its ranks
    (their request files are there), the programs they run (the script is there)."""
    found = []
    for process in psutil.process_iter(["cmdline"]):
        words = " ".join(process.info["cmdline"] or [])
        if str(folder) in words and process.pid != psutil.Process().pid:
            found.append(process)
    return found


def test_a_rank_that_crashes_takes_its_group_down_with_no_process_left(
    job: Path, tiny_space: Space, tiny_prepared: PreparedData, cache_dir: Path, tmp_path: Path
) -> None:
    script = tmp_path / "crash.py"
    script.write_text(CRASH)
    reached, seen = tmp_path / "reached", tmp_path / "seen"
    command = [sys.executable, str(script), str(job / "model"), str(reached), str(seen)]
    request = _request(tiny_space, tiny_prepared, cache_dir, command)
    request = request.model_copy(
        update={
            "settings": request.settings.model_copy(  # type: ignore[union-attr]
                update={"measure": request.settings.measure.model_copy(  # type: ignore[union-attr]
                    update={"min_steps": 1000, "max_steps": 2000, "min_seconds": 600,
                            "max_seconds": 900}
                )}
            )
        }
    )  # fmt: skip
    workdir = tmp_path / "trial"
    workdir.mkdir()
    out: list[ChildRun] = []
    thread = threading.Thread(
        target=lambda: out.append(run_child(request, timeout_s=300, workdir=workdir))
    )
    thread.start()
    deadline = time.monotonic() + 240
    while not reached.exists() and time.monotonic() < deadline and thread.is_alive():
        time.sleep(0.2)
    assert reached.exists(), "rank 1 never reached its third step"
    # the leader, two ranks and the two programs they run
    processes = [p for p in _processes_of(tmp_path) if p.is_running()]
    programs = [p for p in processes if str(script) in " ".join(p.cmdline())]
    assert len(programs) == 2 and len(processes) >= 5, processes  # + the leader, 2 ranks
    seen.touch()
    started = time.monotonic()
    thread.join(timeout=240)
    assert not thread.is_alive()
    (run,) = out
    assert run.result.status == "failed" and run.result.failure_kind == "error", run.result
    message = run.result.failure_message or ""
    assert "rank 1 of 2: ValueError: rank 1's own bug" in message, message
    assert "the group was stopped" in message
    assert time.monotonic() - started < 120  # at once, not at the trial's timeout
    gone = time.monotonic() + 30
    while time.monotonic() < gone and any(
        p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in processes
    ):
        time.sleep(0.1)
    left = [p for p in processes if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    assert not left, left


def test_an_accelerate_launch_line_is_refused_on_several_devices() -> None:
    line = ["accelerate", "launch", "train.py"]
    assert devices_problem(line, 1) is None
    problem = devices_problem(line, 2) or ""
    assert "accelerate launch line runs on one device" in problem and "torchrun" in problem
    assert devices_problem([TORCHRUN, "train.py"], 2) is None


@pytest.mark.skipif(shutil.which(TORCHRUN) is None, reason="no torchrun beside this python")
def test_the_torchrun_line_is_read_with_torchruns_own_parser() -> None:
    from sweeper.trial.script import _torchrun_program

    program, asked = _torchrun_program(
        [TORCHRUN, "--standalone", "--nproc_per_node=2", "-m", "pkg.train", "--lr", "1"]
    )
    assert program[1:] == ["-u", "-m", "pkg.train", "--lr", "1"] and asked == "2"
    program, _ = _torchrun_program([TORCHRUN, "--no-python", "./train.sh", "x"])
    assert program == ["./train.sh", "x"]


def test_preflight_drops_several_devices_for_an_accelerate_line_only(tmp_path: Path) -> None:
    import yaml

    from sweeper.preflight import _PreflightRun
    from sweeper.space import load_space

    space = yaml.safe_load((REPO / "examples/trainer/space.yaml").read_text())
    space["search"]["devices"] = [1, 2]

    def drops(command: list[str]) -> dict[str, dict[str, str]]:
        space["workload"]["script"]["command"] = command
        path = tmp_path / "space.yaml"
        path.write_text(yaml.safe_dump(space))
        run = _PreflightRun(load_space(path), None, tmp_path, print, None, True, None)  # type: ignore[arg-type]
        return run.multi_device_drops()

    dropped = drops(["accelerate", "launch", "--num_processes", "2", "train.py"])
    assert list(dropped["devices"]) == ["2"]
    assert "accelerate launch line runs on one device" in dropped["devices"]["2"]
    assert "devices" not in drops([TORCHRUN, "--nproc-per-node", "2", "train.py"])
    assert "devices" not in drops(["python", "train.py"])
