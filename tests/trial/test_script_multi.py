"""A user's script on two devices (``engine: script``, ``devices: 2``): two gloo ranks on the CPU.

The trial's leader starts two ranks with torchrun's environment and each runs the user's real
program: the Trainer example (accelerate wraps the model in DDP under that environment) given as
the torchrun line a user already has, and the AMP-loop example (its own init_process_group and
DistributedSampler, sharding with FSDP2, its checkpoint torch's distributed checkpoint). The
hook in each rank records its steps, the ranks end the window together, and rank 0 writes the
group's figures. A script that joins the group but never wraps its model fails as a mismatch.
An ``accelerate launch`` line (DDP in a custom loop), a script that ignores the launch and a
rank that crashes: tests/trial/test_script_accelerate.py.

Each test is one group run (two rank start-ups, each importing torch and transformers): what a
run shows is checked on that run rather than in a run of its own.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest

from sweeper.job import ScriptSpec
from sweeper.space import Space
from sweeper.trial.protocol import ChildRequest, PreparedData
from tests.helpers import REPO, SessionForkServer, tiny_config, trial_request
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
    save_steps: int | None = None,
    warmup: dict[str, Any] | None = None,
    measure: dict[str, Any] | None = None,
    **config: Any,
) -> ChildRequest:
    """A script trial on 2 ranks; ``save_steps``: the run saves a checkpoint that often, so
    the trial times one save as the run pays it."""
    saves = space.workload.checkpoint.model_copy(update={"save_steps": save_steps})
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
        warmup=warmup or {"min_steps": 1, "max_steps": 2},
        measure=measure or {"min_steps": 3, "max_steps": 3, "min_seconds": 0},
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
        "--use_cpu", "True", "--disable_tqdm", "True",
    ]  # fmt: skip


def test_the_trainer_example_trains_two_ranks_with_ddp_from_its_torchrun_line(
    run_forked: SessionForkServer,
    job: Path,
    tiny_space: Space,
    tiny_prepared: PreparedData,
    cache_dir: Path,
    tmp_path: Path,
) -> None:
    """The line says 4 processes; the trial's devices knob says 2, and 2 ran."""
    request = _request(
        tiny_space, tiny_prepared, cache_dir, _trainer_line(job, tmp_path / "out"),
        gradient_accumulation_steps=2,
    )  # fmt: skip
    run = run_forked(request, timeout_s=300)
    payload = _ok(run)
    assert payload["engine"] == "script"
    _group_figures(payload, batch=2, accumulation=2)
    assert "this trial runs 2 (its devices knob)" in run.log_tail


def test_the_amp_loop_example_shards_with_fsdp2_and_has_its_checkpoint_timed_as_sharded(
    run_forked: SessionForkServer,
    job: Path,
    tiny_space: Space,
    tiny_prepared: PreparedData,
    cache_dir: Path,
    tmp_path: Path,
) -> None:
    """A custom loop given as [python, train.py]: sweeper starts it on each device, and it
    shards with FSDP2 from the knobs' own flags (--fsdp full_shard). The run saves a
    checkpoint (every rank its shards); the trial times one save of the same state as the run
    pays it: every rank writes at once, from a barrier to the last rank's end."""
    command = [
        sys.executable, str(REPO / "examples/amp_loop/train.py"), "--model", str(job / "model"),
        "--data", str(job / "chats.jsonl"), "--gradient_checkpointing", "False",
        "--output_dir", str(tmp_path / "out"),
    ]  # fmt: skip
    request = _request(
        tiny_space, tiny_prepared, cache_dir, command, save_steps=500, data_parallel="fsdp2"
    )
    payload = _ok(run_forked(request, timeout_s=300))
    _engine_group_figures(payload, batch=2, accumulation=1)
    assert payload["effective"]["devices"] == 2
    assert payload["effective"]["data_parallel"] == "fsdp2"
    assert payload["checkpoint_source"] == "measured"
    # both ranks' shards: fp32 weights and AdamW's two fp32 moments per parameter, and the
    # metadata (one rank's shards alone would be 6 bytes a parameter)
    floor = 12 * payload["n_params"]
    assert floor <= payload["checkpoint_bytes"] <= floor * 1.3 + 2**20, payload["checkpoint_bytes"]
    assert 0 < payload["checkpoint_save_s"] <= payload["phases_s"]["checkpoint"]
    assert not (tmp_path / "out").exists()  # the run's own save, at its end, was not reached


UNWRAPPED = """
import sys, torch
import torch.distributed as dist
from transformers import AutoModelForCausalLM
import sweeper
dist.init_process_group("gloo")
model = AutoModelForCausalLM.from_pretrained(sys.argv[1])
optimizer = torch.optim.AdamW(model.parameters())
batch = {"input_ids": torch.randint(0, 100, (2, 16))}
batch["labels"] = batch["input_ids"]
for _ in range(100):
    with sweeper.step(batch, model=model, optimizer=optimizer):
        model(**batch).loss.backward(); optimizer.step(); optimizer.zero_grad()
"""


def test_a_script_that_joins_the_group_but_never_wraps_the_model_fails_as_a_mismatch(
    run_forked: SessionForkServer,
    job: Path,
    tiny_space: Space,
    tiny_prepared: PreparedData,
    cache_dir: Path,
    tmp_path: Path,
) -> None:
    """A process group, but each rank's model trains unwrapped: no gradient is shared."""
    script = tmp_path / "unwrapped.py"
    script.write_text(UNWRAPPED)
    command = [sys.executable, str(script), str(job / "model")]
    run = run_forked(_request(tiny_space, tiny_prepared, cache_dir, command), timeout_s=300)
    assert run.result.status == "failed" and run.result.failure_kind == "mismatch", run.result
    assert "data_parallel: asked 'ddp', ran 'none'" in (run.result.failure_message or "")


@pytest.mark.skipif(shutil.which(TORCHRUN) is None, reason="no torchrun beside this python")
def test_the_torchrun_line_is_read_with_torchruns_own_parser() -> None:
    from sweeper.trial.script import _torchrun_program

    program, asked = _torchrun_program(
        [TORCHRUN, "--standalone", "--nproc_per_node=2", "-m", "pkg.train", "--lr", "1"]
    )
    assert program[1:] == ["-u", "-m", "pkg.train", "--lr", "1"] and asked == "2"
    program, _ = _torchrun_program([TORCHRUN, "--no-python", "./train.sh", "x"])
    assert program == ["./train.sh", "x"]


def test_preflight_drops_several_devices_for_accelerate_deepspeed(
    tmp_path: Path,
) -> None:
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

    dropped = drops(["accelerate", "launch", "--use_deepspeed", "train.py"])
    assert list(dropped["devices"]) == ["2"]
    assert "with --use_deepspeed runs through a launcher other than" in dropped["devices"]["2"]
    assert "devices" not in drops(["accelerate", "launch", "--num_processes", "2", "train.py"])
    assert "devices" not in drops([TORCHRUN, "--nproc-per-node", "2", "train.py"])
    assert "devices" not in drops(["python", "train.py"])


DDP_LOOP = """
import sys, torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from transformers import AutoModelForCausalLM
import sweeper
steps, destroy = int(sys.argv[2]), sys.argv[3] == "destroy"
dist.init_process_group("gloo")
model = DistributedDataParallel(AutoModelForCausalLM.from_pretrained(sys.argv[1]))
optimizer = torch.optim.AdamW(model.parameters())
torch.manual_seed(dist.get_rank())
batch = {"input_ids": torch.randint(0, 100, (2, 16))}
batch["labels"] = batch["input_ids"]
for _ in range(steps):  # the program's own run, which ends as a run does
    with sweeper.step(batch, model=model, optimizer=optimizer):
        model(**batch).loss.backward(); optimizer.step(); optimizer.zero_grad()
print(f"done {steps} steps", file=sys.stderr)
if destroy:  # as torch's own DDP examples end
    dist.destroy_process_group()
"""


def test_a_run_on_two_devices_that_ends_inside_the_window_is_kept_or_failed_as_on_one(
    run_forked: SessionForkServer,
    job: Path,
    tiny_space: Space,
    tiny_prepared: PreparedData,
    cache_dir: Path,
    tmp_path: Path,
) -> None:
    """A re-walk's leftover: on several devices a run that ended inside the window was never
    kept ("sweeper keeps a window only when its own rule ends it"), however many steps it
    timed. The ranks now agree at the run's end, before a destroy_process_group() ends their
    exchanges: kept when every rank holds the window's steps, failed with the counts when not.
    """
    from sweeper.measurement import parse_measurement
    from tests.trial.test_script_ending import OPEN_WINDOW, WARMUP

    script = tmp_path / "ddp_loop.py"
    script.write_text(DDP_LOOP)

    def run(steps: int, end: str, warmup_multiple: float) -> Any:
        command = [sys.executable, str(script), str(job / "model"), str(steps), end]
        measure = OPEN_WINDOW | {"warmup_multiple": warmup_multiple}
        request = _request(tiny_space, tiny_prepared, cache_dir, command, warmup=WARMUP,
                           measure=measure)  # fmt: skip
        return run_forked(request, timeout_s=300)

    kept = run(30, "destroy", 1)
    payload = _ok(kept)
    measured = parse_measurement(payload)
    assert measured.devices == 2 and measured.warmup_steps == 4
    assert measured.measured_steps == 30 - 4  # every step each rank timed
    assert measured.ended_in_window is not None
    assert measured.ended_in_window.startswith("your program ended inside the timed window")
    assert [r["rank"] for r in payload["ranks"]] == [0, 1]
    short = run(6, "exit", 4)  # settled at the interpreter's exit, the group still there
    assert short.result.status == "failed" and short.result.failure_kind == "error", short.result
    message = short.result.failure_message or ""
    assert "ended inside the timed window after 2 timed steps (" in message, message
    assert "the window needs at least 16 steps" in message, message


@pytest.mark.skipif(shutil.which(TORCHRUN) is None, reason="no torchrun beside this python")
@pytest.mark.parametrize("processes", [1, 2])
@pytest.mark.parametrize("set_outside", [None, "3"])
def test_a_torchrun_trial_has_the_threads_torchrun_gives(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    tiny_space: Space,
    tiny_prepared: PreparedData,
    cache_dir: Path,
    processes: int,
    set_outside: str | None,
) -> None:
    """A walk's 1-device trial of a torchrun line ran with OMP_NUM_THREADS=1 (19 steps/s) and
    its exported `torchrun --nproc_per_node 1` line with torch's default (1.3): torchrun sets
    it to 1 only on several processes, and only where it is not set. The trial's environment
    (the one rank's, or each rank's of a group) is compared with real torchrun's."""
    import json
    import subprocess

    from sweeper.trial.group import torchrun_threads
    from sweeper.trial.script import launch_of

    if set_outside is None:
        monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    else:
        monkeypatch.setenv("OMP_NUM_THREADS", set_outside)
    (tmp_path / "env.py").write_text(
        "import json, os\n"
        "if os.environ['RANK'] == '0':\n"
        "    print(json.dumps(os.environ.get('OMP_NUM_THREADS')))\n"
    )
    line = [TORCHRUN, "--standalone", "--nproc_per_node", str(processes), "env.py"]
    real = subprocess.run(
        line, cwd=tmp_path, capture_output=True, text=True, timeout=120, check=True
    )
    torchruns = json.loads(real.stdout.strip().splitlines()[-1])
    if processes == 1:
        request = _request(
            tiny_space, tiny_prepared, cache_dir, line, devices=1, data_parallel="none"
        )
        _, added = launch_of(request)
        environ = dict(os.environ) | added
    else:  # the group's leader gives each rank torchrun's variables (group._start)
        environ = dict(os.environ) | torchrun_threads(processes, os.environ)
    assert environ.get("OMP_NUM_THREADS") == torchruns
