"""Each engine trains the tiny model in a real child through the one recipe, with the knobs the
config asks for; the Trainer engines run transformers' Trainer and TRL's SFTTrainer themselves."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from sweeper.space import Space
from sweeper.trial.protocol import PreparedData
from tests.helpers import SessionForkServer, tiny_config, trial_request

pytestmark = pytest.mark.torch


def _measure(
    run_forked: SessionForkServer,
    space: Space,
    prepared: PreparedData,
    cache_dir: Path,
    engine: str,
    **knobs,  # noqa: ANN003
):  # noqa: ANN202
    engine_space = space.model_copy(
        update={"workload": space.workload.model_copy(update={"engine": engine})}
    )
    config = tiny_config(**knobs)
    run = run_forked(
        trial_request(engine_space, prepared, cache_dir, config, measure={"max_steps": 4}),
        timeout_s=300,
    )
    assert run.result.status == "ok", (run.result.failure_message, run.log_tail)
    assert run.result.payload is not None
    return run.result.payload, config


@pytest.mark.parametrize("engine", ["loop", "trainer", "sft"])
def test_every_engine_feeds_the_one_recipe(
    run_forked: SessionForkServer,
    tiny_space: Space,
    tiny_prepared: PreparedData,
    cache_dir: Path,
    engine: str,
) -> None:
    m, config = _measure(run_forked, tiny_space, tiny_prepared, cache_dir, engine)
    assert m["engine"] == engine
    assert m["measured_steps"] == 4 == len(m["step_times_s"])
    assert 1 <= m["warmup_steps"] <= tiny_space.trial.warmup.max_steps
    assert len(m["losses"]) == m["warmup_steps"] + m["measured_steps"]
    assert all(math.isfinite(loss) for loss in m["losses"])
    assert sum(m["step_times_s"]) == pytest.approx(m["window_s"], rel=0.05)
    assert m["it_per_s"] > 0 and 0 < m["tokens_per_s"] <= m["padded_tokens_per_s"]
    # every optimizer step saw batch × accumulation rows (Trainer's own DataLoader too)
    assert m["rows_per_s"] == pytest.approx(m["it_per_s"] * config.effective_batch)
    assert m["optimizer"] == "AdamW"  # adamw_torch, built by the engine or by Trainer
    assert m["trainable_params"] == m["n_params"] > 0
    assert m["phases_s"]["model"] > 0 and m["phases_s"]["window"] == m["window_s"]


def test_trainer_engine_applies_the_knobs_through_training_arguments(
    run_forked: SessionForkServer, tiny_space: Space, tiny_prepared: PreparedData, cache_dir: Path
) -> None:
    m, _ = _measure(
        run_forked,
        tiny_space,
        tiny_prepared,
        cache_dir,
        "trainer",
        optim="adafactor",
        gradient_checkpointing=True,
        num_workers=1,
        prefetch_factor=2,
        persistent_workers=True,
    )
    assert m["optimizer"] == "Adafactor"  # what Trainer built from optim="adafactor"
    assert m["data_wait_share"] < 1


def test_sft_engine_packs_with_trl(
    run_forked: SessionForkServer, tiny_space: Space, tiny_prepared: PreparedData, cache_dir: Path
) -> None:
    m, config = _measure(run_forked, tiny_space, tiny_prepared, cache_dir, "sft", packing=True)
    # TRL packs best-fit without padding: every token of a packed batch is real
    assert m["padding_share"] == pytest.approx(0.0)
    assert m["samples_per_s"] == pytest.approx(
        m["tokens_per_s"] / tiny_prepared.tokens_per_sample, rel=1e-6
    )
    assert m["phases_s"]["dataset"] > 0  # SFTTrainer tokenized and packed its rows


def test_loop_engine_applies_optimizer_and_checkpointing(
    run_forked: SessionForkServer, tiny_space: Space, tiny_prepared: PreparedData, cache_dir: Path
) -> None:
    m, _ = _measure(
        run_forked,
        tiny_space,
        tiny_prepared,
        cache_dir,
        "loop",
        optim="adafactor",
        gradient_checkpointing=True,
    )
    assert m["optimizer"] == "Adafactor"


@pytest.mark.parametrize("engine", ["loop", "trainer"])
def test_the_fused_adamw_runs_on_the_cpu_and_is_read_back(
    engine: str,
    run_forked: SessionForkServer,
    tiny_space: Space,
    tiny_prepared: PreparedData,
    cache_dir: Path,
) -> None:
    """A walk's own SFTConfig(optim="adamw_torch_fused") trained on this CPU while preflight
    dropped the value as needing CUDA: torch's fused AdamW has a CPU kernel."""
    m, _ = _measure(
        run_forked, tiny_space, tiny_prepared, cache_dir, engine, optim="adamw_torch_fused"
    )
    assert m["optimizer"] == "AdamW (fused)"


def test_a_knob_the_device_lacks_fails_as_data(
    run_forked: SessionForkServer, tiny_space: Space, tiny_prepared: PreparedData, cache_dir: Path
) -> None:
    try:
        import bitsandbytes  # noqa: F401
    except Exception:
        pass
    else:
        pytest.skip("bitsandbytes imports here: adamw_8bit may run")
    config = tiny_config(optim="adamw_8bit")
    run = run_forked(trial_request(tiny_space, tiny_prepared, cache_dir, config), timeout_s=120)
    assert run.result.status == "failed" and run.result.failure_kind == "unsupported"
    assert "bitsandbytes" in (run.result.failure_message or "")
