"""The issue-36 levers where they run, on a real CUDA device (skipped without one, and each
without what it needs: torchao and compute capability 8.9 for fp8, liger-kernel for Liger):
what ran is read back from the objects that trained. scripts/gpu-record.sh runs these."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest

from sweeper.launcher import run_child
from sweeper.space import Space
from sweeper.trial.protocol import PreparedData
from tests.helpers import tiny_config, trial_request

pytestmark = [pytest.mark.gpu, pytest.mark.torch]


@pytest.fixture(scope="module")
def capability() -> tuple[int, int]:
    import torch

    if not torch.cuda.is_available():
        pytest.skip("no CUDA device on this machine")
    return torch.cuda.get_device_capability(0)


def _trial(
    space: Space, prepared: PreparedData, cache_dir: Path, engine: str = "loop", **knobs: Any
) -> dict[str, Any]:
    engine_space = space.model_copy(
        update={"workload": space.workload.model_copy(update={"engine": engine})}
    )
    request = trial_request(
        engine_space,
        prepared,
        cache_dir,
        tiny_config(per_device_batch_size=8, gradient_accumulation_steps=1, **knobs),
        device="cuda",
        measure={"min_steps": 10, "max_steps": 60, "min_seconds": 1},
    )
    run = run_child(request, timeout_s=600)
    assert run.result.status == "ok", (run.result.failure_message, run.log_tail[-2000:])
    assert run.result.payload is not None
    return run.result.payload


@pytest.mark.parametrize("engine", ["loop", "trainer"])
def test_fp8_trains_in_float8_and_says_how_much(
    capability: tuple[int, int],
    tiny_space: Space,
    tiny_prepared: PreparedData,
    cache_dir: Path,
    engine: str,
) -> None:
    if capability < (8, 9) or importlib.util.find_spec("torchao") is None:
        pytest.skip("fp8 needs compute capability 8.9 and torchao")
    m = _trial(tiny_space, tiny_prepared, cache_dir, engine, precision="fp8")
    assert m["effective"]["precision"] == "fp8"
    assert 0 < m["float8_share"] < 1  # the LM head stays bf16
    assert m["mfu"] is None or 0 < m["mfu"] < 1


def test_liger_kernels_are_in_the_model_that_trained(
    capability: tuple[int, int], tiny_space: Space, tiny_prepared: PreparedData, cache_dir: Path
) -> None:
    if importlib.util.find_spec("liger_kernel") is None:
        pytest.skip("liger-kernel is not installed")
    for engine in ("loop", "trainer"):
        m = _trial(tiny_space, tiny_prepared, cache_dir, engine, liger_kernel=True)
        assert m["effective"]["liger_kernel"] is True, engine


def test_reduce_overhead_compiles_with_cuda_graphs(
    capability: tuple[int, int], tiny_space: Space, tiny_prepared: PreparedData, cache_dir: Path
) -> None:
    m = _trial(tiny_space, tiny_prepared, cache_dir, compile_mode="reduce-overhead")
    assert m["effective"]["compile_mode"] == "reduce-overhead" and m["compile_s"] > 0


def test_padding_free_on_cuda_keeps_samples_apart_and_removes_the_padding(
    capability: tuple[int, int], tiny_space: Space, tiny_prepared: PreparedData, cache_dir: Path
) -> None:
    knobs = {"max_seq_length": 384, "precision": "bf16"}
    flat = _trial(tiny_space, tiny_prepared, cache_dir, padding_free=True, **knobs)
    padded = _trial(tiny_space, tiny_prepared, cache_dir, **knobs)
    assert flat["effective"]["padding_free"] is True and flat["cross_sample_attention"] is False
    assert flat["padding_share"] == 0 < padded["padding_share"]
    # both count real tokens only: MFU's FLOPs are tokens_per_s's
    for m in (flat, padded):
        assert m["achieved_tflops"] * 1e12 == pytest.approx(
            m["flops_per_token"] * m["tokens_per_s"]
        )
