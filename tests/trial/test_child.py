"""The child trains a real tiny Llama on CPU and reports a measurement that adds up."""

from __future__ import annotations

import math
import os
from pathlib import Path

import pytest

from sweeper.launcher import ChildRun, run_child
from sweeper.space import Space, TrialConfig
from sweeper.trial.protocol import ChildRequest, PreparedData
from tests.helpers import SessionForkServer, tiny_config, trial_request


def _run(
    run_forked: SessionForkServer,
    space: Space,
    prepared: PreparedData,
    cache_dir: Path,
    config: TrialConfig,
) -> ChildRun:
    return run_forked(trial_request(space, prepared, cache_dir, config), timeout_s=120)


def test_prepare_makes_corpus_tokenizer_and_length_stats(tiny_prepared: PreparedData) -> None:
    assert Path(tiny_prepared.dataset_path).is_file()
    assert (Path(tiny_prepared.tokenizer_path) / "tokenizer.json").is_file()
    stats = tiny_prepared.stats
    assert stats["dataset_rows"] == 400
    assert (
        0 < stats["tokens_p50"] <= stats["tokens_p90"] <= stats["tokens_p99"] <= stats["tokens_max"]
    )
    assert len(stats["token_percentiles"]) == 101


@pytest.mark.parametrize("workers", [0, 2])
def test_child_trains_and_measures(
    run_forked: SessionForkServer,
    tiny_space: Space,
    tiny_prepared: PreparedData,
    cache_dir: Path,
    workers: int,
) -> None:
    config = tiny_config(num_workers=workers, prefetch_factor=2 if workers else None)
    run = _run(run_forked, tiny_space, tiny_prepared, cache_dir, config)
    assert run.result.status == "ok", (run.result.failure_message, run.log_tail)
    m = run.result.payload
    assert m is not None
    settings = tiny_space.trial
    assert m["measured_steps"] == settings.measure.max_steps == len(m["step_times_s"])
    assert 1 <= m["warmup_steps"] == len(m["warmup_step_times_s"]) <= settings.warmup.max_steps
    assert len(m["losses"]) == m["warmup_steps"] + m["measured_steps"]
    # the window's steps add up to its synchronized length (host clock on CPU)
    assert sum(m["step_times_s"]) == pytest.approx(m["window_s"], rel=0.05)
    assert m["throughput_ci95_rel"] > 0 and m["ci_target"] == 0.02
    assert m["mfu"] is None and m["achieved_tflops"] > 0  # no peak-FLOPs entry for a CPU
    # throughput figures are consistent with each other
    assert m["it_per_s"] > 0
    assert m["samples_per_s"] == pytest.approx(m["it_per_s"] * config.effective_batch)
    assert 0 < m["tokens_per_s"] <= m["padded_tokens_per_s"]
    assert m["padded_tokens_per_s"] == pytest.approx(m["samples_per_s"] * config.max_seq_length)
    assert 0 <= m["data_wait_share"] < 1
    assert m["step_time_p50_s"] <= m["step_time_p90_s"]
    # a randomly initialised LM starts near ln(vocab) and trains with finite losses
    vocab = 512
    assert abs(m["loss_first"] - math.log(vocab)) < 1.0
    assert all(math.isfinite(loss) for loss in m["losses"])
    assert m["compile_s"] == 0.0
    assert m["peak_memory_bytes"] > 50 * 2**20 and m["memory_kind"] == "cpu_peak_rss"
    env = m["env"]
    assert env["device_type"] == "cpu" and env["torch"].startswith("2.13.0")
    assert env["dataset_hash"] == tiny_prepared.dataset_hash
    assert len(env["model_config_hash"]) == 16
    assert m["n_params"] > 100_000
    # one real checkpoint (safetensors weights + AdamW's two moments), timed, then deleted
    assert m["checkpoint_save_s"] > 0
    assert m["checkpoint_bytes"] > 3 * 4 * m["n_params"] * 0.95
    assert not any((cache_dir / "checkpoints").iterdir())
    assert m["startup_s"] > 0 and m["device_memory_bytes"] > m["peak_memory_bytes"]


@pytest.mark.parametrize("workers", [0, 2])
def test_packed_trial_has_no_padding_and_counts_samples_by_tokens(
    run_forked: SessionForkServer,
    tiny_space: Space,
    tiny_prepared: PreparedData,
    cache_dir: Path,
    workers: int,
) -> None:
    config = tiny_config(packing=True, num_workers=workers, prefetch_factor=2 if workers else None)
    run = _run(run_forked, tiny_space, tiny_prepared, cache_dir, config)
    assert run.result.status == "ok", (run.result.failure_message, run.log_tail)
    m = run.result.payload
    assert m is not None and m["packing"] is True
    assert m["padding_share"] == 0.0
    assert m["tokens_per_s"] == pytest.approx(m["padded_tokens_per_s"])
    assert m["padded_tokens_per_s"] == pytest.approx(m["rows_per_s"] * config.max_seq_length)
    assert m["samples_per_s"] == pytest.approx(m["tokens_per_s"] / tiny_prepared.tokens_per_sample)


def test_unwritable_checkpoint_dir_is_a_clear_failure(
    run_forked: SessionForkServer,
    tiny_space: Space,
    tiny_prepared: PreparedData,
    cache_dir: Path,
    tmp_path: Path,
) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    checkpoint = tiny_space.workload.checkpoint.model_copy(update={"dir": str(blocker)})
    workload = tiny_space.workload.model_copy(update={"checkpoint": checkpoint})
    space = tiny_space.model_copy(update={"workload": workload})
    run = _run(run_forked, space, tiny_prepared, cache_dir, tiny_config())
    assert run.result.status == "failed" and run.result.failure_kind == "error"
    assert "workload.checkpoint.dir: cannot write a checkpoint under" in run.result.failure_message


def test_unimportable_attention_is_classified_unsupported(
    run_forked: SessionForkServer, tiny_space: Space, tiny_prepared: PreparedData, cache_dir: Path
) -> None:
    run = _run(
        run_forked,
        tiny_space,
        tiny_prepared,
        cache_dir,
        tiny_config(attn_implementation="flash_attention_2"),
    )
    assert run.result.status == "failed"
    assert run.result.failure_kind == "unsupported"
    assert "flash" in (run.result.failure_message or "").lower()
    assert "Traceback" in (run.result.traceback or "")


def test_cuda_requested_without_gpu_is_unsupported(
    run_forked: SessionForkServer, tiny_space: Space, tiny_prepared: PreparedData, cache_dir: Path
) -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    request = trial_request(tiny_space, tiny_prepared, cache_dir, tiny_config(), device="cuda")
    run = run_forked(request, timeout_s=120)
    assert (run.result.status, run.result.failure_kind) == ("failed", "unsupported")
    assert "cuda requested" in (run.result.failure_message or "")


@pytest.mark.gpu
def test_child_trains_on_cuda(
    tiny_space: Space, tiny_prepared: PreparedData, cache_dir: Path
) -> None:
    import torch

    if not torch.cuda.is_available():
        pytest.skip("no CUDA device on this machine")
    bf16 = tiny_space.model_copy(
        update={"workload": tiny_space.workload.model_copy(update={"precision": "bf16"})}
    )
    request = trial_request(bf16, tiny_prepared, cache_dir, tiny_config(), device="cuda")
    run = run_child(request, timeout_s=300)
    assert run.result.status == "ok", (run.result.failure_message, run.log_tail)
    m = run.result.payload
    assert m is not None and m["memory_kind"] == "cuda_max_allocated"
    assert m["env"]["device_type"] == "cuda"


def test_children_use_the_transformers_this_run_expects(
    tiny_space: Space, tiny_prepared: PreparedData, cache_dir: Path
) -> None:
    """scripts/test.sh runs these tests again with transformers at its floor (PYTHONPATH);
    a trial child must really import that version, not the pinned one."""
    import importlib.metadata

    expected = os.environ.get("SWEEPER_EXPECT_TRANSFORMERS") or importlib.metadata.version(
        "transformers"
    )
    request = ChildRequest.for_space("facts", tiny_space, cache_dir, prepared=tiny_prepared)
    run = run_child(request, timeout_s=300)
    assert run.result.status == "ok", (run.result.failure_message, run.log_tail)
    assert run.result.payload is not None
    assert run.result.payload["transformers"] == expected
    assert run.result.payload["model"]["params"] > 0
