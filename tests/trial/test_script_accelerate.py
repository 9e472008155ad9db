"""A user's ``accelerate launch`` line on two devices: two gloo ranks on the CPU.

The line is read with accelerate's own parser and config file; its program runs on the trial's
device count (not the line's ``--num_processes``), each rank with torchrun's environment plus
what accelerate's multi-GPU launcher adds (``ACCELERATE_*``), so ``Accelerator()`` in the
user's loop joins the trial's group and ``accelerator.prepare`` wraps the model in DDP. One run of
the accelerate example checks the group's figures, the world size the script ran and the
checkpoint save timed as the run pays it; a script that ignores the launch's WORLD_SIZE fails as
for torchrun; a rank that crashes takes its group down, classified, with no process left behind.
The line's reading itself (flags, config file, refused modes) is checked without starting ranks.

The knobs accelerate's launcher owns (precision, compile mode, data parallelism) are set on the
launch: one line, ``--mixed_precision bf16``, runs a bf16 trial and an fp32 one, each read back
from what the Accelerator ran; an fp16 trial on the CPU, where accelerate does not autocast
fp16, fails as a mismatch. The args rewrite and the export's line are checked without processes.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import psutil
import pytest
import yaml

from sweeper import knobs
from sweeper.errors import TrialError
from sweeper.job import ScriptSpec
from sweeper.launch_export import accelerate_config
from sweeper.launcher import ChildRun, run_child
from sweeper.space import Space, load_space
from sweeper.trial import accelerate_line
from sweeper.trial.protocol import PreparedData
from sweeper.trial.script import NOTE_ENV, _accelerate_program, devices_problem
from tests.helpers import REPO, SessionForkServer
from tests.trial.test_multi_device import _ok
from tests.trial.test_script_multi import _group_figures, _request

pytestmark = pytest.mark.torch

ACCELERATE = str(Path(sys.executable).with_name("accelerate"))


def test_an_accelerate_config_file_launch_trains_two_ranks_and_times_its_checkpoint(
    run_forked: SessionForkServer,
    job: Path,
    tiny_space: Space,
    tiny_prepared: PreparedData,
    cache_dir: Path,
    tmp_path: Path,
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
    run = run_forked(request, timeout_s=300)
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
    run_forked: SessionForkServer,
    tiny_space: Space,
    tiny_prepared: PreparedData,
    cache_dir: Path,
    tmp_path: Path,
) -> None:
    """Two copies that never make an Accelerator (nor a process group) each train alone: not
    what devices 2 is, whichever launcher started them."""
    script = tmp_path / "alone.py"
    script.write_text(ALONE)
    command = [ACCELERATE, "launch", "--multi_gpu", "--num_processes", "2", str(script)]
    run = run_forked(_request(tiny_space, tiny_prepared, cache_dir, command), timeout_s=300)
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


# -- the knobs accelerate's launcher owns ------------------------------------------------------


@pytest.fixture(scope="module")
def precision_runs(
    job: Path, tiny_space: Space, tiny_prepared: PreparedData, cache_dir: Path
) -> dict[str, ChildRun]:
    """The example loop from one line that says bf16, as a trial of each precision on one
    device (accelerate's simple launcher); the three at once (each is mostly its startup)."""
    command = [ACCELERATE, "launch", "--mixed_precision", "bf16",
               str(REPO / "examples/accelerate_loop/train.py"), "--model", str(job / "model"),
               "--data", str(job / "chats.jsonl")]  # fmt: skip

    def trial(precision: str) -> ChildRun:
        request = _request(
            tiny_space, tiny_prepared, cache_dir, command,
            devices=1, data_parallel=None, precision=precision,
        )  # fmt: skip
        return run_child(request, timeout_s=300)

    precisions = ("bf16", "fp32", "fp16")
    with ThreadPoolExecutor(len(precisions)) as pool:
        return dict(zip(precisions, pool.map(trial, precisions), strict=True))


def test_one_accelerate_line_runs_each_precision_the_trial_asks(
    precision_runs: dict[str, ChildRun],
) -> None:
    """bf16 and fp32 trials of a ``--mixed_precision bf16`` line both train, each at its own
    precision as read back from the layers the Accelerator ran; the fp32 trial's log says what
    it set instead of the line's."""
    bf16, fp32 = _ok(precision_runs["bf16"]), _ok(precision_runs["fp32"])
    assert bf16["effective"]["precision"] == "bf16"
    assert fp32["effective"]["precision"] == "fp32"
    said = "sweeper: accelerate --mixed_precision no (the line says bf16; this trial's precision"
    assert said in precision_runs["fp32"].log_tail
    assert "sweeper: accelerate" not in precision_runs["bf16"].log_tail  # as the line says
    # the launch says the precision: no --bf16/--fp16 flag reached the loop's own parser
    assert "--bf16" not in precision_runs["fp32"].log_tail


def test_a_precision_the_accelerator_does_not_run_fails_as_a_mismatch(
    precision_runs: dict[str, ChildRun],
) -> None:
    """accelerate takes --mixed_precision fp16 on the CPU but does not autocast to fp16 there:
    the layers ran fp32, and the recorder says so rather than recording fp16."""
    run = precision_runs["fp16"]
    assert run.result.status == "failed" and run.result.failure_kind == "mismatch", run.result
    assert "precision: asked 'fp16', ran 'fp32'" in (run.result.failure_message or "")
    assert "--mixed_precision fp16 (the line says bf16" in run.log_tail


def _parsed(words: list[str]) -> Any:
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser  # type: ignore[import-untyped]

    args, _, _ = _validate_launch_command(launch_command_parser().parse_args(words[2:]))
    return args


def test_the_launch_owned_knobs_are_set_on_accelerates_args(tmp_path: Path) -> None:
    """Each knob as accelerate's option, over the line's flags or its config file; what
    differs from the line is said; a value accelerate's launch cannot run is refused."""
    line = [ACCELERATE, "launch", "--mixed_precision", "bf16", "--num_processes", "2", "t.py"]
    config = {"precision": "fp16", "compile_mode": "reduce-overhead", "data_parallel": "fsdp2"}
    _, env, _, torchrun = _accelerate_program(line, 2, "cpu", 29999, config)
    assert torchrun and env["ACCELERATE_MIXED_PRECISION"] == "fp16"
    assert (env["ACCELERATE_DYNAMO_BACKEND"], env["ACCELERATE_DYNAMO_MODE"]) == (
        "INDUCTOR", "reduce-overhead",
    )  # fmt: skip
    assert env["ACCELERATE_USE_FSDP"] == "true" and env["FSDP_VERSION"] == "2"
    assert env["FSDP_RESHARD_AFTER_FORWARD"] == "true"  # FSDP2's full sharding
    assert env["FSDP_AUTO_WRAP_POLICY"] == "TRANSFORMER_BASED_WRAP"  # each decoder layer
    notes = env[NOTE_ENV].splitlines()
    assert notes[0] == (
        "sweeper: accelerate --mixed_precision fp16 (the line says bf16; this trial's "
        "precision knob)"
    )
    assert "--dynamo_mode reduce-overhead (the line says --dynamo_backend no" in notes[1]
    assert "--use_fsdp --fsdp_version 2" in notes[2] and "the line says DDP" in notes[2]
    # a config file's FSDP launch, run as the trial's DDP, at the line's own precision: no note
    file = tmp_path / "fsdp.yaml"
    file.write_text(yaml.safe_dump(accelerate_config({"devices": 2, "data_parallel": "fsdp2"})))
    line = [ACCELERATE, "launch", "--config_file", str(file), "t.py"]
    same = {"precision": "fp32", "compile_mode": "none", "data_parallel": "ddp"}
    _, env, _, _ = _accelerate_program(line, 2, "cpu", 29999, same)
    assert "ACCELERATE_USE_FSDP" not in env and env["ACCELERATE_MIXED_PRECISION"] == "no"
    assert env[NOTE_ENV] == (
        "sweeper: accelerate without --use_fsdp (DDP) (the line says FSDP2 (reshard after "
        "forward: true); this trial's data_parallel knob)"
    )
    # refused, each saying why: ZeRO (DeepSpeed's launcher), a --dynamo_mode accelerate lacks,
    # fp8 on the CPU, another fp8 recipe
    for knob, value, said in (
        ("data_parallel", "zero2", "DeepSpeed's launcher"),
        ("compile_mode", "max-autotune-no-cudagraphs", "--dynamo_mode takes default"),
        ("precision", "fp8", "needs a CUDA device"),
    ):
        with pytest.raises(TrialError, match=said) as refused:
            _accelerate_program([ACCELERATE, "launch", "t.py"], 2, "cpu", 29999, {knob: value})
        assert refused.value.kind == "unsupported"
    te = [ACCELERATE, "launch", "--fp8_backend", "te", "t.py"]
    with pytest.raises(TrialError, match="--fp8_backend te is not torchao's"):
        _accelerate_program(te, 1, "cuda", None, {"precision": "fp8"})


def test_the_exported_line_is_the_users_own_with_the_winners_values() -> None:
    """The export rewrites the user's words (their spelling kept, the program's arguments
    untouched), and accelerate's parser reads the rewritten line as the trial ran it."""
    line = [ACCELERATE, "launch", "--multi-gpu", "--num_processes=8", "--mixed-precision",
            "bf16", "-m", "pkg.train", "--mixed_precision", "fp16"]  # fmt: skip
    winner = {"devices": 4, "precision": "fp32", "compile_mode": "default",
              "data_parallel": "fsdp2"}  # fmt: skip
    words = accelerate_line.line_for(line, winner)
    ddp = {"data_parallel": "ddp"}
    assert words[2:] == [
        "--num_processes=4", "--mixed-precision", "no", "--dynamo_backend", "inductor",
        "--dynamo_mode", "default", "--use_fsdp", "--fsdp_version", "2",
        "--fsdp_reshard_after_forward", "true", "-m", "pkg.train", "--mixed_precision", "fp16",
    ]  # fmt: skip
    args = _parsed(words)
    ran = _parsed(line)
    accelerate_line.apply(ran, winner, cpu=False)
    for option in (*accelerate_line.options(winner), "num_processes"):
        assert str(getattr(args, option)) == str(getattr(ran, option) if option != "num_processes"
                                                 else 4), option  # fmt: skip
    assert args.training_script_args == ["--mixed_precision", "fp16"]  # the program's own
    # one device: no --multi_gpu (it needs two processes), the simple launcher
    single = accelerate_line.line_for(line, {"devices": 1, "precision": "bf16"})
    assert "--multi-gpu" not in single and _parsed(single).num_processes == 1
    # a --cpu line's DDP is --cpu's own (accelerate takes one of --cpu and --multi_gpu)
    cpu = accelerate_line.line_for([ACCELERATE, "launch", "--cpu", "t.py"], winner | ddp)
    assert cpu[2:4] == ["--cpu", "--num_processes"] and _parsed(cpu).num_processes == 4
    # the words that take no value are accelerate's own
    from accelerate.commands.launch import launch_command_parser

    flags = {
        option.lstrip("-").replace("-", "_")
        for action in launch_command_parser()._actions
        if action.nargs == 0
        for option in action.option_strings
        if option.startswith("--")
    }
    assert flags == accelerate_line.FLAGS


def test_the_launch_owned_knobs_are_not_also_flags_under_knobs_flags() -> None:
    """``knobs: flags`` on an accelerate line: the launch says precision, compile and data
    parallelism; ``sft_flags`` says them too (SFTConfig turns bf16 on unless told)."""
    config = knobs.normalize({"per_device_batch_size": 2, "gradient_accumulation_steps": 1,
                              "num_workers": 0, "max_seq_length": 64, "precision": "bf16",
                              "compile_mode": "default", "devices": 2,
                              "data_parallel": "fsdp2"})  # fmt: skip
    line = ScriptSpec(command=[ACCELERATE, "launch", "t.py"])
    flags = knobs.command_flags(accelerate_line.flag_config(line, config), "flags")
    assert "--per_device_train_batch_size" in flags
    assert not {"--bf16", "--fp16", "--torch_compile", "--fsdp"} & set(flags)
    sft = line.model_copy(update={"knobs": "sft_flags"})
    assert "--bf16" in knobs.command_flags(accelerate_line.flag_config(sft, config), "sft_flags")
    plain = ScriptSpec(command=["python", "t.py"])  # not a launch: every knob is a flag
    assert "--bf16" in knobs.command_flags(accelerate_line.flag_config(plain, config), "flags")


READ_COMPILE = """
import types, torch
from accelerate import Accelerator
from sweeper.trial.engines.readback import Running, script_compile_mode
model = torch.nn.Linear(2, 2)
trainer_args = types.SimpleNamespace(torch_compile=False)  # the launch says compile, not they
def mode():
    return script_compile_mode(Running(device=torch.device("cpu"), model=model,
                                       runnables=[model], optimizer=None, loader=None,
                                       args=trainer_args))
before = mode()
Accelerator(cpu=True)
print(before, mode())
"""


def test_a_trainers_compile_is_read_from_the_launch_its_accelerator_took() -> None:
    """A Trainer's callback sees the model before its Accelerator compiles it in prepare;
    with no --torch_compile flag (the launch says it), the Accelerator's dynamo plugin tells."""
    launched = {"ACCELERATE_DYNAMO_BACKEND": "INDUCTOR", "ACCELERATE_DYNAMO_MODE": "max-autotune"}
    out = subprocess.run(
        [sys.executable, "-c", READ_COMPILE], env=os.environ | launched, cwd=REPO,
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["none", "max-autotune"]


def test_preflight_drops_what_an_accelerate_line_cannot_launch(tmp_path: Path) -> None:
    """ZeRO and a compile mode that is no --dynamo_mode are dropped before any trial, on an
    accelerate line only (a torchrun line's Trainer runs ZeRO from its arguments)."""
    from sweeper.preflight import _PreflightRun

    space = yaml.safe_load((REPO / "examples/trainer/space.yaml").read_text())
    space["search"] |= {"devices": [2], "data_parallel": ["ddp", "zero2"],
                        "compile_mode": ["none", "max-autotune-no-cudagraphs"]}  # fmt: skip

    def drops(command: list[str]) -> dict[str, dict[str, str]]:
        space["workload"]["script"]["command"] = command
        path = tmp_path / "space.yaml"
        path.write_text(yaml.safe_dump(space))
        run = _PreflightRun(load_space(path), None, tmp_path, print, None, True, None)  # type: ignore[arg-type]
        return run.flag_drops()

    dropped = drops(["accelerate", "launch", "--num_processes", "2", "train.py"])
    assert list(dropped) == ["compile_mode", "data_parallel"]
    assert list(dropped["data_parallel"]) == ["zero2"] and "DeepSpeed's launcher" in str(dropped)
    assert list(dropped["compile_mode"]) == ["max-autotune-no-cudagraphs"]
    assert drops(["torchrun", "--nproc-per-node", "2", "train.py"]) == {}
