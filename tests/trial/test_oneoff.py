"""A study measures its one-off costs once and prices them in every trial: the checkpoint save
per state signature, the cold compile per graph signature (sweeper/trial/oneoff.py)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import torch

from sweeper.space import Space, TrialConfig
from sweeper.trial.oneoff import (
    LOADER_ONLY_KNOBS,
    CheckpointCosts,
    compile_slot,
    graph_signature,
    signature,
    study_dir,
)
from sweeper.trial.protocol import PreparedData
from sweeper.trial.workload import build_model, load_tokenizer
from tests.helpers import SessionForkServer, tiny_config, trial_request


def _trial(
    run_forked: SessionForkServer,
    space: Space,
    prepared: PreparedData,
    cache_dir: Path,
    config: TrialConfig,
    study: str,
) -> dict[str, Any]:
    request = trial_request(space, prepared, cache_dir, config).model_copy(update={"study": study})
    run = run_forked(request, timeout_s=300)
    assert run.result.status == "ok", (run.result.failure_message, run.log_tail)
    assert run.result.payload is not None
    return run.result.payload


@pytest.mark.torch
def test_a_checkpoint_is_saved_once_per_state_and_priced_in_every_trial(
    run_forked: SessionForkServer, tiny_space: Space, tiny_prepared: PreparedData, cache_dir: Path
) -> None:
    study = "oneoff-checkpoint"
    first = _trial(run_forked, tiny_space, tiny_prepared, cache_dir, tiny_config(), study)
    assert first["checkpoint_source"] == "measured" and first["checkpoint_save_s"] > 0
    # another batch size and length: the same weights and optimizer state, the same save
    second = _trial(
        run_forked,
        tiny_space,
        tiny_prepared,
        cache_dir,
        tiny_config(per_device_batch_size=2, max_seq_length=32),
        study,
    )
    assert second["checkpoint_source"] == "reused"
    assert second["checkpoint_signature"] == first["checkpoint_signature"]
    assert second["checkpoint_save_s"] == first["checkpoint_save_s"]
    assert second["checkpoint_bytes"] == first["checkpoint_bytes"]
    # the lookup is what the trial spends on it now
    assert second["phases_s"]["checkpoint"] < first["phases_s"]["checkpoint"]
    # Adafactor keeps factored moments: other bytes, measured again
    third = _trial(
        run_forked, tiny_space, tiny_prepared, cache_dir, tiny_config(optim="adafactor"), study
    )
    assert third["checkpoint_source"] == "measured"
    assert third["checkpoint_signature"] != first["checkpoint_signature"]
    assert third["checkpoint_bytes"] < first["checkpoint_bytes"]
    # another study shares nothing
    other = _trial(run_forked, tiny_space, tiny_prepared, cache_dir, tiny_config(), "oneoff-other")
    assert other["checkpoint_source"] == "measured"


@pytest.mark.torch
def test_a_repeated_shape_compiles_warm_and_prices_the_cold_compile(
    run_forked: SessionForkServer, tiny_space: Space, tiny_prepared: PreparedData, cache_dir: Path
) -> None:
    study = "oneoff-compile"
    config = tiny_config(compile_mode="default")
    cold = _trial(run_forked, tiny_space, tiny_prepared, cache_dir, config, study)
    assert cold["compile_cache"] == "cold"
    assert cold["compile_s"] == cold["compile_measured_s"] > 0
    warm = _trial(run_forked, tiny_space, tiny_prepared, cache_dir, config, study)
    assert warm["compile_cache"] == "warm"
    assert warm["compile_signature"] == cold["compile_signature"]
    # $/run counts the compile the user's fresh run pays, not the warm one measured here
    assert warm["compile_s"] == cold["compile_s"]
    assert warm["compile_measured_s"] is not None
    # Inductor's on-disk cache served it: far less than the cold compile (a ratio, with room
    # for a loaded machine; measured 0.1-0.3 idle)
    assert warm["compile_measured_s"] < 0.8 * cold["compile_measured_s"]
    root = study_dir(cache_dir, study)
    assert root is not None
    assert any((root / "compile" / cold["compile_signature"] / "inductor").iterdir())


def test_a_shape_compiled_by_another_trial_right_now_compiles_cold_in_private(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    graph = graph_signature({"per_device_batch_size": 8}, {"model": "m"}, "2.13")
    first = compile_slot(tmp_path, graph)  # holds the signature's lock until it records
    assert first.directory is not None and not first.warm
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(first.directory / "inductor")
    second = compile_slot(tmp_path, graph)  # another trial meanwhile (another open file)
    assert second.directory is None and not second.warm
    first.record_cold(12.5)
    third = compile_slot(tmp_path, graph)
    assert third.warm and third.cold_s == 12.5 and third.directory == first.directory


def test_a_cache_left_without_its_cold_figure_is_emptied_first(tmp_path: Path) -> None:
    graph = graph_signature({"per_device_batch_size": 8}, {}, "2.13")
    failed = compile_slot(tmp_path, graph)
    assert failed.directory is not None
    leftover = failed.directory / "inductor" / "fxgraph" / "entry"
    leftover.parent.mkdir(parents=True)
    leftover.write_text("compiled by a trial that then ran out of memory")
    failed.release()  # its process ended without a cold figure
    again = compile_slot(tmp_path, graph)
    assert not again.warm and not leftover.exists()
    again.release()


def test_dataloader_knobs_do_not_change_the_graphs_and_the_rest_do() -> None:
    from sweeper.knobs import KNOBS

    names = {knob.name for knob in KNOBS}
    assert set(LOADER_ONLY_KNOBS) <= names
    for knob in KNOBS:
        if knob.name in LOADER_ONLY_KNOBS:
            # they reach only the DataLoader (Trainer's dataloader_* arguments)
            sample = knob.default if knob.default is not None else 2
            assert all(key.startswith("dataloader_") for key in knob.trainer(sample)), knob.name
    base = {"per_device_batch_size": 8, "num_workers": 0, "max_seq_length": 512}
    same = graph_signature(base | {"num_workers": 4, "pin_memory": True}, {}, "2.13")
    assert signature(same) == signature(graph_signature(base, {}, "2.13"))
    other = graph_signature(base | {"max_seq_length": 1024}, {}, "2.13")
    assert signature(other) != signature(graph_signature(base, {}, "2.13"))


def test_the_first_checkpoint_figure_of_a_state_stands(tmp_path: Path) -> None:
    costs = CheckpointCosts(tmp_path)
    assert costs.get("abc") is None
    costs.put("abc", 3.0, 100)
    costs.put("abc", 9.0, 100)  # a second worker that measured it meanwhile
    entry = costs.get("abc")
    assert entry is not None and (entry["save_s"], entry["bytes"]) == (3.0, 100)
    assert study_dir(tmp_path, None) is None
    assert study_dir(tmp_path, "a/b") != study_dir(tmp_path, "a_b")


@pytest.mark.torch
def test_a_model_from_a_config_is_made_on_its_device(
    tiny_space: Space, tiny_prepared: PreparedData, cache_dir: Path
) -> None:
    """Created where it trains (the meta device shows it: no host copy exists), with the same
    weights as a model built on the host when that is the device."""
    tokenizer = load_tokenizer(tiny_prepared)
    config = tiny_config()
    meta = build_model(tiny_space.workload, config, tokenizer, torch.device("meta"), cache_dir)
    assert {p.device.type for p in meta.parameters()} == {"meta"}
    host = build_model(tiny_space.workload, config, tokenizer, torch.device("cpu"), cache_dir)
    assert sum(p.numel() for p in meta.parameters()) == sum(p.numel() for p in host.parameters())
    from transformers import AutoModelForCausalLM

    from sweeper.trial.workload import model_config

    torch.manual_seed(0)
    reference = AutoModelForCausalLM.from_config(
        model_config(tiny_space.workload, tokenizer, config.max_seq_length),
        attn_implementation=config.attn_implementation,
        dtype=torch.float32,
    )
    for (name, a), (_, b) in zip(
        host.state_dict().items(), reference.state_dict().items(), strict=True
    ):
        assert torch.equal(a, b), name
