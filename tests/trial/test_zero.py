"""DeepSpeed ZeRO through the Trainer and SFT engines: two gloo ranks on the CPU.

A real trial child starts two real rank processes; ``TrainingArguments(deepspeed={...})``
with ZeRO stage 2 or 3 makes accelerate wrap the tiny Llama in DeepSpeed's engine. The
read-back says what ran, from the engine itself (its ZeRO stage, its optimizer's partitions)
and, for ZeRO-3, from the parameters (each rank holds its partition of the ones it released:
about half of the elements). Skipped where deepspeed does not import (preflight drops the
values there, tests/test_preflight_zero.py).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest

from sweeper.space import Space
from sweeper.trial.protocol import PreparedData
from tests.helpers import SessionForkServer
from tests.trial.test_multi_device import _group_figures, _ok, _run

pytestmark = [
    pytest.mark.torch,
    pytest.mark.skipif(
        importlib.util.find_spec("deepspeed") is None,
        reason="deepspeed is not installed (scripts/setup.sh installs it)",
    ),
]


def _zero_trial(
    run_forked: SessionForkServer,
    space: Space,
    prepared: PreparedData,
    cache_dir: Path,
    strategy: str,
    engine: str = "trainer",
    **knobs: Any,
) -> dict[str, Any]:
    run = _run(
        run_forked,
        space,
        prepared,
        cache_dir,
        engine=engine,
        data_parallel=strategy,
        per_device_batch_size=2,
        gradient_accumulation_steps=2,
        **knobs,
    )
    return _ok(run)


def test_sfttrainer_runs_zero2_with_the_optimizer_state_partitioned(
    run_forked: SessionForkServer, tiny_space: Space, tiny_prepared: PreparedData, cache_dir: Path
) -> None:
    """SFTTrainer is a Trainer: SFTConfig(deepspeed={...}) gives DeepSpeed's engine as
    TrainingArguments does (the ZeRO-3 test below runs the Trainer engine; one group run
    each, as each costs two ranks importing deepspeed)."""
    payload = _zero_trial(run_forked, tiny_space, tiny_prepared, cache_dir, "zero2", engine="sft")
    assert payload["engine"] == "sft"
    effective = payload["effective"]
    # read back from DeepSpeed's engine: stage 2, its optimizer partitioned over both ranks
    assert effective["data_parallel"] == "zero2"
    assert effective["devices"] == 2
    assert effective["optim"] == "adamw_torch"  # the Trainer's own, under ZeRO's optimizer
    assert effective["gradient_accumulation_steps"] == 2
    # ZeRO-2 keeps the whole model on each rank
    assert [r["parameter_share"] for r in payload["ranks"]] == [1.0, 1.0]
    _group_figures(payload, batch=2, accumulation=2)


def test_zero3_partitions_the_parameters(
    run_forked: SessionForkServer, tiny_space: Space, tiny_prepared: PreparedData, cache_dir: Path
) -> None:
    payload = _zero_trial(
        run_forked, tiny_space, tiny_prepared, cache_dir, "zero3", checkpoint=True
    )
    assert payload["engine"] == "trainer"
    assert payload["effective"]["data_parallel"] == "zero3"
    # the model's size counts each parameter whole (ds_numel), not this rank's empty copy
    assert payload["n_params"] == _tiny_model_params(tiny_space, tiny_prepared)
    # the Trainer's own save under DeepSpeed, on both ranks: the gathered weights, and each
    # rank's partitions of the fp32 weights and AdamW's two moments
    assert payload["checkpoint_source"] == "measured" and payload["checkpoint_save_s"] > 0
    assert payload["checkpoint_bytes"] >= 0.9 * 4 * 4 * payload["n_params"]
    shares = [r["parameter_share"] for r in payload["ranks"]]
    # each rank holds its half of every partitioned parameter (plus DeepSpeed's padding and
    # the small ones kept whole below the persistence threshold): about half, not all
    assert all(0.45 < share < 0.6 for share in shares), shares
    assert shares[0] == pytest.approx(shares[1], abs=0.02)
    _group_figures(payload, batch=2, accumulation=2)


def _tiny_model_params(space: Space, prepared: PreparedData) -> int:
    """The tiny model's parameter count, built whole on the meta device from its config."""
    import torch
    from transformers import AutoModelForCausalLM

    from sweeper.trial.workload import load_tokenizer, model_config

    config = model_config(space.workload, load_tokenizer(prepared), 64)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    return sum(p.numel() for p in model.parameters())
