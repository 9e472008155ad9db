"""A user's ``accelerate launch`` line on two devices: two gloo ranks on the CPU.

The line is read with accelerate's own parser and config file; its program runs on the trial's
device count (not the line's ``--num_processes``), each rank with torchrun's environment plus
what accelerate's multi-GPU launcher adds (``ACCELERATE_*``), so ``Accelerator()`` in the
user's loop joins the trial's group and ``accelerator.prepare`` wraps the model in DDP. One run of
the accelerate example checks the group's figures, the world size the script ran and the
checkpoint save timed as the run pays it; a script that ignores the launch's WORLD_SIZE fails as
for torchrun; a rank that crashes takes its group down, classified, with no process left behind.
The line's reading itself (flags, config file, refused modes) is checked without starting ranks.
"""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path

import psutil
import pytest
import yaml

from sweeper.errors import TrialError
from sweeper.launch_export import accelerate_config
from sweeper.launcher import ChildRun, run_child
from sweeper.space import Space, load_space
from sweeper.trial.protocol import PreparedData
from sweeper.trial.script import _accelerate_program, devices_problem
from tests.helpers import REPO
from tests.trial.test_multi_device import _ok
from tests.trial.test_script_multi import _group_figures, _request

pytestmark = pytest.mark.torch

ACCELERATE = str(Path(sys.executable).with_name("accelerate"))


def test_an_accelerate_config_file_launch_trains_two_ranks_and_times_its_checkpoint(
    job: Path, tiny_space: Space, tiny_prepared: PreparedData, cache_dir: Path, tmp_path: Path
) -> None:
    """The file ``sweeper export --format accelerate`` writes says 4 processes; the trial's
    devices knob says 2, and 2 ran, each an ``Accelerator`` in the trial's group."""
    config = tmp_path / "accelerate.yaml"
    config.write_text(yaml.safe_dump(accelerate_config({"devices": 4}, device="cpu")))
    command = [
        ACCELERATE, "launch", "--config_file", str(config),
        str(REPO / "examples/accelerate_loop/train.py"), "--model", str(job / "model"),
        "--data", str(job / "chats.jsonl"), "--output_dir", str(tmp_path / "out"),
        "--save_steps", "500",
    ]  # fmt: skip
    request = _request(
        tiny_space, tiny_prepared, cache_dir, command, save_steps=500, gradient_accumulation_steps=2
    )
    run = run_child(request, timeout_s=300)
    payload = _ok(run)
    assert payload["engine"] == "script"
    # both ranks' steps, the world size read back from the group the script's Accelerator made
    _group_figures(payload, batch=2, accumulation=2)
    assert "the accelerate line says --num_processes 4; this trial runs 2" in run.log_tail
    # rank 0 saves what DDP keeps equal on every rank: the weights and AdamW's two moments
    assert payload["checkpoint_source"] in ("measured", "reused")
    floor = 12 * payload["n_params"]
    assert floor <= payload["checkpoint_bytes"] <= floor * 1.3 + 2**20, payload["checkpoint_bytes"]
    assert payload["checkpoint_save_s"] > 0
    assert not (tmp_path / "out").exists()  # the run's own save (step 500) was never reached


ALONE = """
import sys, torch
import sweeper
model = torch.nn.Linear(4, 4)
optimizer = torch.optim.AdamW(model.parameters())
batch = {"input_ids": torch.zeros(2, 16, dtype=torch.long)}
for _ in range(100):
    with sweeper.step(batch, model=model, optimizer=optimizer):
        model(torch.randn(2, 4)).sum().backward(); optimizer.step(); optimizer.zero_grad()
"""


def test_a_script_that_ignores_the_launchs_world_size_fails_as_a_mismatch(
    tiny_space: Space, tiny_prepared: PreparedData, cache_dir: Path, tmp_path: Path
) -> None:
    """Two copies that never make an Accelerator (nor a process group) each train alone: not
    what devices 2 is, whichever launcher started them."""
    script = tmp_path / "alone.py"
    script.write_text(ALONE)
    command = [ACCELERATE, "launch", "--multi_gpu", "--num_processes", "2", str(script)]
    run = run_child(_request(tiny_space, tiny_prepared, cache_dir, command), timeout_s=300)
    assert run.result.status == "failed" and run.result.failure_kind == "mismatch", run.result
    message = run.result.failure_message or ""
    assert "devices: asked 2, ran 1" in message and "without a torch.distributed process" in message
    assert "the script ignored the launch's WORLD_SIZE=2" in message


CRASH = """
import os, sys, time, torch
from accelerate import Accelerator
from transformers import AutoModelForCausalLM
import sweeper
accelerator = Accelerator()
model = AutoModelForCausalLM.from_pretrained(sys.argv[1])
optimizer = torch.optim.AdamW(model.parameters())
model, optimizer = accelerator.prepare(model, optimizer)
step = 0
while True:
    batch = {"input_ids": torch.randint(0, 100, (2, 16))}
    batch["labels"] = batch["input_ids"]
    with sweeper.step(batch, model=model, optimizer=optimizer):
        accelerator.backward(model(**batch).loss); optimizer.step(); optimizer.zero_grad()
    step += 1
    if accelerator.process_index == 1 and step == 3:
        open(sys.argv[2], "w").close()
        while not os.path.exists(sys.argv[3]):  # until the test has seen every process
            time.sleep(0.05)
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
    command = [ACCELERATE, "launch", "--num_processes", "2", str(script), str(job / "model"),
               str(reached), str(seen)]  # fmt: skip
    request = _request(tiny_space, tiny_prepared, cache_dir, command)
    assert request.settings is not None
    long = request.settings.measure.model_copy(
        update={"min_steps": 1000, "max_steps": 2000, "min_seconds": 600, "max_seconds": 900}
    )
    request = request.model_copy(
        update={"settings": request.settings.model_copy(update={"measure": long})}
    )
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
    assert reached.exists(), ("rank 1 never reached its third step", out and out[0].log_tail)
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


def test_the_line_is_read_with_accelerates_own_parser_and_config_file(
    tmp_path: Path,
) -> None:
    """What each rank runs and the environment accelerate's launcher would give it."""
    line = [ACCELERATE, "launch", "--multi_gpu", "--num_processes", "4", "--mixed_precision",
            "fp16", "--gpu_ids", "0,1", "-m", "pkg.train", "--lr", "1"]  # fmt: skip
    program, env, asked, torchrun = _accelerate_program(line, 2, "cpu", port=29999)
    assert program[1:] == ["-u", "-m", "pkg.train", "--lr", "1"] and asked == 4 and torchrun
    assert env["ACCELERATE_MIXED_PRECISION"] == "fp16"
    assert "CUDA_VISIBLE_DEVICES" not in env  # the trial's devices are its device pool's
    assert env["ACCELERATE_USE_CPU"] == "True"  # a CPU trial: as --cpu
    # one device: accelerate's simple launcher, no torchrun variables
    program, env, _, torchrun = _accelerate_program(line, 1)
    assert program[1:] == ["-m", "pkg.train", "--lr", "1"] and not torchrun
    assert env["ACCELERATE_MIXED_PRECISION"] == "fp16"
    # a config file's launch: its mode and process count
    config = tmp_path / "ds.yaml"
    document = accelerate_config({"devices": 8, "data_parallel": "zero2"})
    config.write_text(yaml.safe_dump(document))
    with pytest.raises(TrialError, match="DEEPSPEED|--use_deepspeed") as refused:
        _accelerate_program([ACCELERATE, "launch", "--config_file", str(config), "t.py"], 2)
    assert refused.value.kind == "unsupported"
    with pytest.raises(TrialError, match="accelerate launch does not take") as bad:
        _accelerate_program([ACCELERATE, "launch", "--num_processes", "x", "t.py"], 2)
    assert bad.value.kind == "error"
    assert devices_problem([ACCELERATE, "launch", "--use_deepspeed", "t.py"], 2)
    assert devices_problem([ACCELERATE, "launch", "--use_deepspeed", "t.py"], 1) is None
    assert devices_problem([ACCELERATE, "launch", "--num_processes", "2", "t.py"], 2) is None
    # the example's space: its line reads as 2 processes, and runs on the trial's devices
    example = load_space(REPO / "examples/accelerate_loop/space.yaml")
    assert example.workload.script is not None and example.search.devices == [2]
    assert devices_problem(example.workload.script.command, 2) is None
    program, env, asked, _ = _accelerate_program(example.workload.script.command, 2, "cpu", 1)
    assert asked == 2 and program[2].endswith("examples/accelerate_loop/train.py")
