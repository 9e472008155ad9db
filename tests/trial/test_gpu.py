"""The CUDA paths of a trial, on a real GPU (skipped without one): bf16 autocast, the timed window
read from CUDA events, MFU from the peak table, fused AdamW and TF32, device memory, and a real
out-of-memory classified as ``oom``. scripts/gpu-record.sh runs these (pytest -m gpu)."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

from sweeper.hardware import peak_flops
from sweeper.launcher import ChildRun, ForkServer, run_child
from sweeper.space import Space
from sweeper.trial.protocol import PreparedData
from tests.helpers import tiny_config, trial_request

pytestmark = [pytest.mark.gpu, pytest.mark.torch]


@pytest.fixture(scope="module")
def cuda_name() -> str:
    import torch

    if not torch.cuda.is_available():
        pytest.skip("no CUDA device on this machine")
    return torch.cuda.get_device_name(0)


def test_bf16_trial_is_timed_by_cuda_events_with_mfu_and_memory(
    cuda_name: str, tiny_space: Space, tiny_prepared: PreparedData, cache_dir: Path
) -> None:
    request = trial_request(
        tiny_space,
        tiny_prepared,
        cache_dir,
        # precision and tf32 are knobs of the config (a space's workload.precision/tf32 become
        # one-value search lists when the space is read; a copied Space skips that)
        tiny_config(
            per_device_batch_size=8,
            gradient_accumulation_steps=2,
            optim="adamw_torch_fused",
            precision="bf16",
            tf32=True,
        ),
        device="cuda",
        measure={"min_steps": 20, "max_steps": 200, "min_seconds": 2},
    )
    run = run_child(request, timeout_s=600)
    assert run.result.status == "ok", (run.result.failure_message, run.log_tail)
    m = run.result.payload
    assert m is not None
    assert m["env"]["device_type"] == "cuda" and m["env"]["device_name"] == cuda_name
    assert m["env"]["driver"] and m["env"]["cuda"]
    assert m["optimizer"] == "AdamW (fused)" and m["tf32_matmul"] is True
    assert all(t > 0 for t in m["step_times_s"])
    # per-step times come from CUDA events; together they cover the host-timed window
    covered = sum(m["step_times_s"]) / m["window_s"]
    assert 0.5 < covered <= 1.05, covered
    assert m["memory_kind"] == "cuda_max_allocated"
    assert 0 < m["peak_memory_bytes"] <= m["peak_memory_reserved_bytes"] <= m["device_memory_bytes"]
    if peak_flops(cuda_name) is not None:
        assert m["peak_name"] == peak_flops(cuda_name).name  # type: ignore[union-attr]
        assert m["peak_tflops"] == peak_flops(cuda_name).bf16  # type: ignore[union-attr]
        assert 0 < m["mfu"] < 1
    assert m["loss_last"] < m["loss_first"]  # it trains


def test_cuda_out_of_memory_is_classified_oom(
    cuda_name: str, tiny_space: Space, tiny_prepared: PreparedData, cache_dir: Path
) -> None:
    """Eager attention over 256 × 8192 tokens needs a 256 GiB score matrix per layer."""
    request = trial_request(
        tiny_space,
        tiny_prepared,
        cache_dir,
        tiny_config(per_device_batch_size=256, max_seq_length=8192, attn_implementation="eager"),
        device="cuda",
    )
    run = run_child(request, timeout_s=600)
    assert run.result.status == "failed"
    assert run.result.failure_kind == "oom", (run.result.failure_message, run.log_tail)


def test_a_4bit_lora_trial_trains_only_the_adapter(
    cuda_name: str, tiny_space: Space, tiny_prepared: PreparedData, cache_dir: Path
) -> None:
    """QLoRA as seed 003 runs it: the base loaded in 4-bit NF4 through bitsandbytes (the tiny
    model is built from its config, saved once and loaded back quantized), LoRA on q_proj and
    v_proj, gradient checkpointing; only the adapter trains and is saved."""
    pytest.importorskip("bitsandbytes", reason="4-bit needs bitsandbytes")
    pytest.importorskip("peft", reason="LoRA needs peft")
    from sweeper.job import AdapterSpec

    workload = tiny_space.workload.model_copy(
        update={
            "precision": "bf16",
            "adapter": AdapterSpec(r=4, alpha=8, target_modules=["q_proj", "v_proj"]),
        }
    )
    space = tiny_space.model_copy(update={"workload": workload})
    request = trial_request(
        space,
        tiny_prepared,
        cache_dir,
        tiny_config(quantization="4bit", gradient_checkpointing=True),
        device="cuda",
    )
    run = run_child(request, timeout_s=600)
    assert run.result.status == "ok", (run.result.failure_message, run.log_tail)
    m = run.result.payload
    assert m is not None and m["env"]["device_name"] == cuda_name
    # 4-bit weights count packed (two per byte), so the base looks half its size here
    assert 0 < m["trainable_params"] < m["n_params"] / 5
    assert m["checkpoint_bytes"] < 200_000  # the adapter is saved, not the base
    assert m["loss_last"] < m["loss_first"]


@pytest.mark.parametrize("engine", ["loop", "trainer", "sft"])
def test_cuda_only_knob_values_are_read_back_from_what_ran(
    cuda_name: str, tiny_space: Space, tiny_prepared: PreparedData, cache_dir: Path, engine: str
) -> None:
    """The values a CPU cannot run (pinned batches, TF32, the fused AdamW kernel) reach what
    each engine runs on a GPU; tests/trial/test_readback.py covers the rest on the CPU."""
    space = tiny_space.model_copy(
        update={"workload": tiny_space.workload.model_copy(update={"engine": engine})}
    )
    config = tiny_config(
        pin_memory=True, tf32=True, optim="adamw_torch_fused", precision="bf16", num_workers=1
    )
    run = run_child(
        trial_request(space, tiny_prepared, cache_dir, config, device="cuda"), timeout_s=600
    )
    assert run.result.status == "ok", (run.result.failure_message, run.log_tail)
    effective = (run.result.payload or {})["effective"]
    for knob in ("pin_memory", "tf32", "optim", "precision"):
        assert effective[knob] == getattr(config, knob), (knob, effective[knob])


def _short_bf16_trial(
    space: Space, prepared: PreparedData, cache_dir: Path, server: ForkServer
) -> ChildRun:
    """A short bf16 trial of the tiny model on the GPU, through ``server``."""
    request = trial_request(
        space,
        prepared,
        cache_dir,
        tiny_config(per_device_batch_size=8, precision="bf16"),
        device="cuda",
        measure={"min_steps": 10, "max_steps": 100, "min_seconds": 1},
    )
    return run_child(request, timeout_s=600, server=server)


def test_a_fork_server_whose_model_code_opens_cuda_spawns_its_trials(
    cuda_name: str, tiny_space: Space, tiny_prepared: PreparedData, cache_dir: Path
) -> None:
    """torchao, which transformers' model code imports whenever it is installed, asks triton at
    import whether the device can run it, which opens the CUDA context in the fork server; every
    child forked after that failed at its first CUDA call ("Cannot re-initialize CUDA in forked
    subprocess": the whole H200 sweep of 2026-11-27 dropped every attention implementation).
    The preload now leaves the model code to the children where torchao is installed, so the
    server forks; where anything else opens CUDA in it, it must notice, say so and spawn."""
    from sweeper.sweep.prepare import workload_server

    notes: list[str] = []
    with workload_server(tiny_space, tiny_prepared, cache_dir, notes.append) as server:
        run = _short_bf16_trial(tiny_space, tiny_prepared, cache_dir, server)
    assert run.result.status == "ok", (run.result.failure_message, run.log_tail)
    has_torchao = importlib.util.find_spec("torchao") is not None
    if server.unfit is not None:
        assert "initialized CUDA" in server.unfit and notes == [server.unfit]
        assert run.inherited_startup_s == 0.0  # spawned: it paid its own imports
    else:
        assert notes == []
        assert run.inherited_startup_s > 0.0  # forked from the zygote
    if has_torchao:  # the preload left the model code (and torchao) to the children
        assert server.unfit is None


# A package that asks torch.cuda.is_available() at import, as transformers' bitsandbytes and
# flash-attn checks and deepspeed's accelerator do: it runs in the fork server only, as
# transformers is imported there (after torch, so after the zygote's watch on the device count).
_ASKS_AT_IMPORT = """
import importlib.abc
import sys


class _AsksCuda(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "transformers" and "torch" in sys.modules:
            sys.meta_path.remove(self)
            import torch

            torch.cuda.is_available()
        return None


if any("sweeper.trial.zygote" in arg for arg in sys.orig_argv):
    sys.meta_path.insert(0, _AsksCuda())
"""


@pytest.mark.parametrize("nvml_check", [None, "0"])
def test_a_package_asking_for_cuda_devices_at_import_cannot_poison_the_forks(
    cuda_name: str,
    tiny_space: Space,
    tiny_prepared: PreparedData,
    cache_dir: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    nvml_check: str | None,
) -> None:
    """torch.cuda.is_available() asks the CUDA runtime for its devices unless
    PYTORCH_NVML_BASED_CUDA_CHECK=1, and torch then marks every child forked afterwards, whose
    first CUDA call fails, though torch.cuda.is_initialized() still says False in the parent.
    The zygote sets the variable for itself (NVML answers; the trial forks and runs on the GPU);
    where the user turned it off, the zygote sees the runtime's count called, says from where,
    and the trial is spawned."""
    (tmp_path / "sitecustomize.py").write_text(_ASKS_AT_IMPORT)
    monkeypatch.setenv(
        "PYTHONPATH", os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")]))
    )
    if nvml_check is None:
        monkeypatch.delenv("PYTORCH_NVML_BASED_CUDA_CHECK", raising=False)
    else:
        monkeypatch.setenv("PYTORCH_NVML_BASED_CUDA_CHECK", nvml_check)
    with ForkServer(str(cache_dir)) as server:
        run = _short_bf16_trial(tiny_space, tiny_prepared, cache_dir, server)
    assert run.result.status == "ok", (run.result.failure_message, run.log_tail)
    if nvml_check is None:
        assert server.unfit is None
        assert run.inherited_startup_s > 0.0  # forked, and CUDA worked in it
        assert "PYTORCH_NVML_BASED_CUDA_CHECK" not in run.result.payload["env"]["runtime_env"]
    else:
        assert server.unfit is not None and "asked the CUDA runtime" in server.unfit
        assert "sitecustomize.py" in server.unfit  # where the call came from
        assert run.inherited_startup_s == 0.0  # spawned


def test_tf32_set_by_training_arguments_reads_back(cuda_name: str, tmp_path: Path) -> None:
    """TrainingArguments(tf32=True) sets TF32 through torch's new fp32_precision API (torch >=
    2.9); the recorder reads it back without the legacy flag's "mix of APIs" error, which failed
    a Trainer script trial on an H200 (2026-11-28). In a fresh interpreter: the flags are
    process-wide."""
    import subprocess
    import sys

    code = (
        "from transformers import TrainingArguments\n"
        f"TrainingArguments(output_dir={str(tmp_path)!r}, tf32=True, bf16=True)\n"
        "from sweeper.trial.engines.readback import tf32_matmul\n"
        "print(tf32_matmul())\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True
    )
    assert out.stdout.strip().splitlines()[-1] == "True", out.stdout + out.stderr
