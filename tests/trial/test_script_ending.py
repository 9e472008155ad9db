"""A script trial whose program ends on its own inside the timed window, or crashes in its loop.

Real children: the trial runs a tiny real loop (or the Trainer example) on the CPU, with sweeper's
line in it, and the window set so that only the program's own end can close it (an interval
target no run reaches, caps far away).
"""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Any

import pytest

from sweeper.job import ScriptSpec
from sweeper.launcher import ChildRun, run_child
from sweeper.measurement import parse_measurement
from sweeper.space import Space
from sweeper.trial.protocol import PreparedData
from tests.helpers import REPO, tiny_config, trial_request

pytestmark = pytest.mark.torch

LOOP = """
import sys
import torch
from transformers import LlamaConfig, LlamaForCausalLM
import sweeper
steps, status, crash_at = (int(word) for word in sys.argv[1:4])
model = LlamaForCausalLM(LlamaConfig(
    vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
    num_attention_heads=2, num_key_value_heads=2))
optimizer = torch.optim.AdamW(model.parameters())
batch = {"input_ids": torch.randint(0, 64, (2, 16))}
batch["labels"] = batch["input_ids"]
for step in range(steps):  # the program's own run, which ends as a run does
    with sweeper.step(batch, model=model, optimizer=optimizer):
        if step == crash_at:
            raise RuntimeError(f"boom at step {step}: bad batch")
        model(**batch).loss.backward(); optimizer.step(); optimizer.zero_grad()
print(f"done {steps} steps", file=sys.stderr)
sys.exit(status)
"""

# burn-in ends at its 4th step (steady, or capped); the window closes only at the program's end
WARMUP = {"min_steps": 1, "max_steps": 4, "window": 2}
OPEN_WINDOW = {"min_steps": 3, "max_steps": 500, "min_seconds": 0, "max_seconds": 120,
               "target_ci": 1e-6}  # fmt: skip


def _run(
    space: Space,
    prepared: PreparedData,
    cache_dir: Path,
    command: list[str],
    *,
    knobs: str = "flags",
    **measure: Any,
) -> ChildRun:
    workload = space.workload.model_copy(
        update={"engine": "script", "script": ScriptSpec(command=command, knobs=knobs)}
    )
    request = trial_request(
        space.model_copy(update={"workload": workload}),
        prepared,
        cache_dir,
        tiny_config(per_device_batch_size=2, gradient_accumulation_steps=1),
        warmup=WARMUP,
        measure=OPEN_WINDOW | measure,
    )
    return run_child(request, timeout_s=300)


@pytest.fixture
def loop(tmp_path: Path) -> Path:
    script = tmp_path / "train_loop.py"
    script.write_text(LOOP)
    return script


def test_a_run_that_ends_inside_a_long_enough_window_is_kept_with_the_interval_reached(
    tiny_space: Space, tiny_prepared: PreparedData, cache_dir: Path, loop: Path
) -> None:
    """A walk's loop ran 300 steps ("done 300 steps in 9.5s") inside a 15 s window whose
    interval target was not met yet, and was failed as if its window had fewer than 24 steps."""
    run = _run(
        tiny_space, tiny_prepared, cache_dir, [sys.executable, str(loop), "30", "0", "-1"],
        warmup_multiple=1,
    )  # fmt: skip
    assert run.result.status == "ok", run.log_tail
    measured = parse_measurement(run.result.payload)
    assert measured.warmup_steps == 4
    assert measured.measured_steps == 30 - measured.warmup_steps  # every step timed is kept
    # kept as a capped window is: the interval reached, as is
    assert not measured.ci_met and math.isfinite(measured.throughput_ci95_rel)
    assert measured.throughput_ci95_rel > 0
    # its time is its steps' own, not what the program did after its loop
    assert measured.window_s == pytest.approx(sum(measured.step_times_s), rel=1e-6)
    assert "done 30 steps" in run.log_tail
    note = (
        f"sweeper: your program ended inside the timed window after {measured.measured_steps} "
        f"timed steps ({measured.window_s:.3g} s), before the interval reached ±0.0% "
        f"(trial.measure.target_ci); the measurement is kept as a capped window's is, with the "
        f"interval it reached: ±{measured.throughput_ci95_rel:.1%}"
    )
    assert note in run.log_tail, run.log_tail[-3000:]
    # and recorded with the measurement, which `best` warns with (a re-walk found it only in
    # the trial's log, which is kept for failed trials)
    assert measured.ended_in_window == note.removeprefix("sweeper: ")
    from sweeper.caveats import ran_warnings

    assert ran_warnings(measured.model_dump(), None)[0] == measured.ended_in_window

    # a program that then exits with a failure of its own is not measured: its status stands
    run = _run(
        tiny_space, tiny_prepared, cache_dir, [sys.executable, str(loop), "30", "3", "-1"],
        warmup_multiple=1,
    )  # fmt: skip
    assert run.result.status == "failed" and run.result.failure_kind == "error"
    assert (run.result.failure_message or "").startswith("your command exited 3"), run.result


def test_a_run_that_ends_inside_a_short_window_fails_with_the_windows_own_counts(
    tiny_space: Space, tiny_prepared: PreparedData, cache_dir: Path, loop: Path
) -> None:
    run = _run(
        tiny_space, tiny_prepared, cache_dir, [sys.executable, str(loop), "6", "0", "-1"],
        warmup_multiple=4,
    )  # fmt: skip
    assert run.result.status == "failed" and run.result.failure_kind == "error", run.result
    message = run.result.failure_message or ""
    assert "done 6 steps" in run.log_tail
    # 6 steps: 4 of burn-in, 2 timed; the window needs max(3, 4 × 4)
    assert f"{loop} 6 0 -1 ended inside the timed window after 2 timed steps (" in message
    assert ", interval reached ±" in message, message
    assert (
        "the window needs at least 16 steps (trial.measure.min_steps 3, and warmup_multiple 4 "
        "× the 4 burn-in steps)" in message
    ), message
    assert "never reached" not in message and "let the run go on longer" in message


def test_a_crash_inside_the_loop_says_where_the_program_raised_it(
    tiny_space: Space, tiny_prepared: PreparedData, cache_dir: Path, loop: Path
) -> None:
    """A walk's train_crash.py raised at its line 75, after sweeper's line was reached: the
    failure named the error but not where; one before the line named both."""
    line = next(
        number
        for number, text in enumerate(LOOP.splitlines(), start=1)
        if "raise RuntimeError" in text
    )
    run = _run(tiny_space, tiny_prepared, cache_dir, [sys.executable, str(loop), "30", "0", "2"])
    assert run.result.status == "failed" and run.result.failure_kind == "error", run.result
    message = run.result.failure_message or ""
    assert message.startswith("RuntimeError: boom at step 2: bad batch (raised at "), message
    assert f'{loop}:{line} (raise RuntimeError(f"boom at step {{step}}: bad batch"))' in message


def test_a_trainer_whose_run_ends_inside_the_window_is_kept(
    job: Path, tmp_path: Path, tiny_space: Space, tiny_prepared: PreparedData, cache_dir: Path
) -> None:
    """The Trainer example with --max_steps 10: its train() ends inside the window (the
    callback's on_train_end), and the 6 steps timed are the measurement."""
    command = [
        sys.executable, str(REPO / "examples/trainer/train.py"),
        "--model_name_or_path", str(job / "model"), "--data_file", str(job / "chats.jsonl"),
        "--output_dir", str(tmp_path / "out"), "--report_to", "none", "--use_cpu", "True",
        "--save_strategy", "no", "--max_steps", "10",
    ]  # fmt: skip
    run = _run(tiny_space, tiny_prepared, cache_dir, command, warmup_multiple=1)
    assert run.result.status == "ok", run.log_tail
    measured = parse_measurement(run.result.payload)
    assert measured.measured_steps == 10 - measured.warmup_steps and not measured.ci_met
    assert measured.program_run is not None and measured.program_run.max_steps == 10
    assert "sweeper: your program ended inside the timed window after" in run.log_tail
    # the rest of the program (its save_model) is not the trial's, as after a closed window
    assert not (tmp_path / "out" / "model.safetensors").exists()
