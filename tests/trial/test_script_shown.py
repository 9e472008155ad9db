"""A custom loop's ``sweeper.step`` that does not show sweeper what it needs to read a knob back.

A walk's loop (seed 004's kind: its own DataLoader, spawn workers, manual accumulation) took
sweeper's hint without ``loader=``: its trials of a ``prefetch_factor: [2, 4]`` search both ran
its own 4 and were recorded as 2 and 4, a 2.3x "effect" of the prefetch that nothing ran; and
its block around each micro-batch was told to read ``sweeper.trial_config()``, which it did.
Real trial children: a tiny real loop on the CPU under ``knobs: env``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from sweeper.errors import NOT_SHOWN
from sweeper.job import ScriptSpec
from sweeper.launcher import ChildRun, run_child
from sweeper.measurement import parse_measurement
from sweeper.space import Space
from sweeper.sweep.outcome import Outcome
from sweeper.sweep.stopping import Stopping, TimeBudget
from sweeper.trial.protocol import PreparedData
from tests.helpers import tiny_config, trial_request

pytestmark = pytest.mark.torch

# argv: whether the block is given the loader ("loader" / "none"), whether it wraps the
# optimizer step's micro-batches ("step") or each micro-batch ("micro"), and the seconds of
# its own code after each step (optional)
LOOP = """
import sys
import time
import torch
from torch.utils.data import DataLoader
from transformers import LlamaConfig, LlamaForCausalLM
import sweeper
show, wrap = sys.argv[1:3]
pause = float(sys.argv[3]) if len(sys.argv) > 3 else 0.0  # its own code between two steps
cfg = sweeper.trial_config() or {}
accumulate = cfg.get("gradient_accumulation_steps", 1)
model = LlamaForCausalLM(LlamaConfig(
    vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
    num_attention_heads=2, num_key_value_heads=2))
optimizer = torch.optim.AdamW(model.parameters())
# its own schedule: the peak (3e-4) is what the learning-rate advice scales
scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=3e-4, total_steps=100000)
rows = [torch.randint(0, 64, (16,)) for _ in range(4000)]
collate = lambda b: {"input_ids": torch.stack(b), "labels": torch.stack(b)}
# its own loader: batch size from sweeper, pinning its own
loader = DataLoader(rows, batch_size=cfg.get("per_device_batch_size", 2), collate_fn=collate,
                    pin_memory=False)
given = {"loader": loader} if show == "loader" else {}
batches = iter(loader)
while True:
    micro = [next(batches) for _ in range(accumulate)]
    if wrap == "step":
        with sweeper.step(micro, model=model, optimizer=optimizer, **given):
            for one in micro:
                (model(**one).loss / accumulate).backward()
            optimizer.step(); optimizer.zero_grad(); scheduler.step()
        time.sleep(pause)  # its logging, an eval, a save: after the block
    else:
        for i, one in enumerate(micro):
            with sweeper.step(one, model=model, optimizer=optimizer, **given):
                (model(**one).loss / accumulate).backward()
                if i == accumulate - 1:
                    optimizer.step(); optimizer.zero_grad(); scheduler.step()
"""

LISTED = ("per_device_batch_size", "gradient_accumulation_steps", "pin_memory")


def _run(
    space: Space,
    prepared: PreparedData,
    cache_dir: Path,
    script: Path,
    *args: str,
    varied: tuple[str, ...] = (),
    listed: tuple[str, ...] = LISTED,
    accumulate: int = 1,
) -> ChildRun:
    workload = space.workload.model_copy(
        update={
            "engine": "script",
            "script": ScriptSpec(command=[sys.executable, str(script), *args], knobs="env"),
        }
    )
    request = trial_request(
        space.model_copy(update={"workload": workload}),
        prepared,
        cache_dir,
        tiny_config(per_device_batch_size=2, gradient_accumulation_steps=accumulate),
        warmup={"min_steps": 1, "max_steps": 2},
        measure={"min_steps": 2, "max_steps": 3},
    )
    return run_child(request.model_copy(update={"listed": listed, "varied": varied}), timeout_s=300)


@pytest.fixture
def loop(tmp_path: Path) -> Path:
    script = tmp_path / "train_loop.py"
    script.write_text(LOOP)
    return script


def test_a_searched_loader_knob_the_step_cannot_read_fails_and_an_owned_one_is_marked(
    tiny_space: Space, tiny_prepared: PreparedData, cache_dir: Path, loop: Path
) -> None:
    """pin_memory is searched: without loader= the trial fails, naming the keyword to pass,
    and the sweep stops at once (every config would fail alike). Listed once, it fails too
    (a re-walk listed prefetch 2, its script ran 4, and the export said 2). Left out, the
    trial runs: the loader knobs the script owns are recorded as unseen, not as sweeper's
    defaults; given the loader, they are read back as its own."""
    searched = _run(
        tiny_space, tiny_prepared, cache_dir, loop, "none", "step", varied=("pin_memory",)
    )
    assert searched.result.failure_kind == "mismatch", searched.result
    message = searched.result.failure_message or ""
    assert f"searches pin_memory, {NOT_SHOWN} your DataLoader" in message, message
    assert "loader=loader" in message and "leave it out of search:" in message, message
    # the sweep's stop rule reads it as the program's defect, from this trial alone
    stopping = Stopping(tiny_space, [], TimeBudget())
    said = stopping.after_trial(Outcome(number=0, failure_kind="mismatch", message=message))
    assert said is not None and stopping.program_defect and "(loader= or optimizer=)" in said

    listed = _run(tiny_space, tiny_prepared, cache_dir, loop, "none", "step")
    assert listed.result.failure_kind == "mismatch", listed.result
    assert f"lists pin_memory, {NOT_SHOWN}" in (listed.result.failure_message or "")

    left_out = _run(tiny_space, tiny_prepared, cache_dir, loop, "none", "step", listed=LISTED[:2])
    assert left_out.result.status == "ok", (left_out.result, left_out.log_tail[-2000:])
    measured = parse_measurement(left_out.result.payload)
    assert "pass loader= to sweeper.step" in measured.effective["prefetch_factor"]
    unseen = {"num_workers", "prefetch_factor", "persistent_workers", "pin_memory"}
    assert unseen <= set(measured.unreached or ()), measured.unreached

    shown = _run(tiny_space, tiny_prepared, cache_dir, loop, "loader", "step")
    assert shown.result.status == "ok", (shown.result, shown.log_tail[-2000:])
    measured = parse_measurement(shown.result.payload)
    assert measured.effective["num_workers"] == 0 and not measured.unreached, measured
    # the peak learning rate as it ran, not the scheduler's current step's
    assert measured.program_run is not None
    assert measured.program_run.learning_rate == pytest.approx(3e-4), measured.program_run


def test_a_block_around_each_micro_batch_is_told_to_wrap_the_optimizer_step(
    tiny_space: Space, tiny_prepared: PreparedData, cache_dir: Path, loop: Path
) -> None:
    """The config accumulates 2; the loop read it from trial_config() but wraps each
    micro-batch: the mismatch says where the block goes, not to read trial_config()."""
    run = _run(tiny_space, tiny_prepared, cache_dir, loop, "loader", "micro", accumulate=2)
    assert run.result.failure_kind == "mismatch", run.result
    message = run.result.failure_message or ""
    assert "gradient_accumulation_steps: asked 2, ran 1" in message, message
    assert "block is one optimizer step" in message and "micro-batches as a list" in message
    assert "trial_config()" not in message, message
    fixed = _run(tiny_space, tiny_prepared, cache_dir, loop, "loader", "step", accumulate=2)
    assert fixed.result.status == "ok", (fixed.result, fixed.log_tail[-2000:])
    assert parse_measurement(fixed.result.payload).effective["gradient_accumulation_steps"] == 2


def test_the_scripts_own_code_between_steps_is_step_time_not_data_wait(
    tiny_space: Space, tiny_prepared: PreparedData, cache_dir: Path, loop: Path
) -> None:
    """0.3 s of the loop's own code after each step (where logging or a save goes) is in the
    step's time, so $/run pays it, but not in the data wait: its DataLoader gave each batch at
    once (a walk read 44% data wait with num_workers 0 and looked at the loader)."""
    run = _run(tiny_space, tiny_prepared, cache_dir, loop, "loader", "step", "0.3")
    assert run.result.status == "ok", (run.result, run.log_tail[-2000:])
    measured = parse_measurement(run.result.payload)
    assert measured.step_time_p50_s >= 0.3, measured.step_time_p50_s
    assert measured.data_wait_share < 0.1, (measured.data_wait_share, measured.data_wait_s)
