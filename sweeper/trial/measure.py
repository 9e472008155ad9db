"""One measurement recipe: build, warm up, time a synchronized window, report with spread.

Timing rules (why, not what):
- The device is synchronized after every optimizer step, so a step's time is its real cost and
  the window's edges are exact; ``loss.item()`` would sync anyway on CUDA.
- Time blocked on ``next(loader)`` is kept apart from compute: a trial can say it is input-bound.
- The first step holds torch.compile's compilation (and lazy CUDA init); it is reported as
  ``first_step_s``/``compile_s`` and never enters the throughput.
"""

from __future__ import annotations

import contextlib
import math
import os
import platform
import resource
import socket
import statistics
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from sweeper.errors import TrialError
from sweeper.space import TrialConfig, Workload
from sweeper.trial.protocol import ChildRequest, PreparedData
from sweeper.trial.workload import build_loader, build_model, load_tokenizer, resolve_device

_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def run_trial(request: ChildRequest, process_started_at: float) -> dict[str, Any]:
    """Train the trial's config through warm-up and a timed window; return the measurement."""
    assert request.config and request.settings and request.prepared
    imports_done_at = time.time()
    workload, config, settings = request.workload, request.config, request.settings
    device = resolve_device(request.device)
    _configure_backends(device, workload)

    tokenizer = load_tokenizer(request.prepared)
    loader = build_loader(
        workload, request.prepared, config, tokenizer, device, Path(request.cache_dir)
    )
    model, model_hash = build_model(workload, config, tokenizer, device)
    n_params = sum(p.numel() for p in model.parameters())
    model.train()
    if config.compile_mode != "none":
        model = torch.compile(model, mode=config.compile_mode)
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=workload.learning_rate, fused=device.type == "cuda"
    )
    built_at = time.time()

    stepper = _Stepper(model, optimizer, loader, config, workload, device)
    steps: list[dict[str, float]] = []
    for _ in range(settings.warmup_steps):
        steps.append(stepper.step())
    warmup_done_at = time.time()

    _sync(device)
    window_start = time.perf_counter()
    window: list[dict[str, float]] = []
    while len(window) < settings.measure_steps:
        window.append(stepper.step())
        elapsed = time.perf_counter() - window_start
        if len(window) >= 2 and elapsed >= settings.max_measure_seconds:
            break
    window_s = time.perf_counter() - window_start  # step() ends synchronized
    steps.extend(window)

    losses = [s["loss"] for s in steps]
    for index, loss in enumerate(losses):
        if not math.isfinite(loss):
            raise TrialError("nonfinite", f"loss became {loss} at optimizer step {index + 1}")

    step_times = [s["time_s"] for s in window]
    mean_step = statistics.fmean(step_times)
    stdev = statistics.stdev(step_times) if len(step_times) > 1 else 0.0
    p50 = _percentile(step_times, 50)
    samples = len(window) * config.effective_batch
    first_step_s = steps[0]["time_s"]
    return {
        "it_per_s": len(window) / window_s,
        "samples_per_s": samples / window_s,
        "tokens_per_s": sum(s["real_tokens"] for s in window) / window_s,
        "padded_tokens_per_s": sum(s["padded_tokens"] for s in window) / window_s,
        "data_wait_share": sum(s["data_wait_s"] for s in window) / window_s,
        "step_time_p50_s": p50,
        "step_time_p90_s": _percentile(step_times, 90),
        "step_time_cv": stdev / mean_step if mean_step > 0 else 0.0,
        # 95% interval of the mean step time, relative (normal approx.; refined in issue 3)
        "throughput_ci95_rel": 1.96 * stdev / math.sqrt(len(step_times)) / mean_step
        if mean_step > 0
        else 0.0,
        "measured_steps": len(window),
        "window_s": window_s,
        "warmup_steps": settings.warmup_steps,
        "first_step_s": first_step_s,
        "compile_s": max(0.0, first_step_s - p50) if config.compile_mode != "none" else 0.0,
        "loss_first": losses[0],
        "loss_last": losses[-1],
        "losses": losses,
        "step_times_s": [s["time_s"] for s in steps],
        "data_wait_s": [s["data_wait_s"] for s in steps],
        "loader_epochs": stepper.loader_epochs,
        "n_params": n_params,
        "effective_batch": config.effective_batch,
        **_peak_memory(device),
        "phases_s": {
            "spawn_to_start": max(0.0, process_started_at - request.spawned_at)
            if request.spawned_at
            else None,
            "imports": imports_done_at - process_started_at,
            "build": built_at - imports_done_at,
            "warmup": warmup_done_at - built_at,
            "window": window_s,
        },
        "env": environment(device, model_hash, request.prepared),
    }


class _Stepper:
    """One optimizer step = ``accumulation`` micro-batches, timed and synchronized."""

    def __init__(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        loader: Any,
        config: TrialConfig,
        workload: Workload,
        device: torch.device,
    ) -> None:
        self.model, self.optimizer, self.loader = model, optimizer, loader
        self.accumulation = config.gradient_accumulation_steps
        self.device = device
        self.batches: Iterator[dict[str, torch.Tensor]] = iter(loader)
        self.loader_epochs = 1
        dtype = _DTYPES.get(workload.precision)
        self.autocast = (
            (lambda: torch.autocast(device_type=device.type, dtype=dtype))
            if dtype is not None
            else contextlib.nullcontext
        )
        self.scaler = (
            torch.amp.GradScaler(device.type)
            if workload.precision == "fp16" and device.type == "cuda"
            else None
        )

    def _next_batch(self) -> dict[str, torch.Tensor]:
        try:
            return next(self.batches)
        except StopIteration:
            # the real run turns epochs too; a small demo corpus just turns them sooner
            self.loader_epochs += 1
            self.batches = iter(self.loader)
            return next(self.batches)

    def step(self) -> dict[str, float]:
        started = time.perf_counter()
        data_wait_s = 0.0
        real_tokens = padded_tokens = 0
        loss_total = torch.zeros((), device=self.device)
        for _ in range(self.accumulation):
            waited = time.perf_counter()
            batch = self._next_batch()
            data_wait_s += time.perf_counter() - waited
            real_tokens += int(batch["attention_mask"].sum())
            padded_tokens += batch["input_ids"].numel()
            batch = {k: v.to(self.device, non_blocking=True) for k, v in batch.items()}
            with self.autocast():
                loss = self.model(**batch).loss / self.accumulation
            if self.scaler is not None:
                self.scaler.scale(loss).backward()
            else:
                loss.backward()
            loss_total += loss.detach()
        if self.scaler is not None:
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        loss_value = float(loss_total.item())
        _sync(self.device)
        return {
            "time_s": time.perf_counter() - started,
            "data_wait_s": data_wait_s,
            "real_tokens": real_tokens,
            "padded_tokens": padded_tokens,
            "loss": loss_value,
        }


def _configure_backends(device: torch.device, workload: Workload) -> None:
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = workload.tf32
        torch.backends.cudnn.allow_tf32 = workload.tf32
        if workload.precision == "bf16" and not torch.cuda.is_bf16_supported():
            raise TrialError("unsupported", "bf16 is not supported on this GPU; use fp16 or fp32")


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    position = (len(ordered) - 1) * q / 100
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def _peak_memory(device: torch.device) -> dict[str, Any]:
    if device.type == "cuda":
        return {
            "peak_memory_bytes": torch.cuda.max_memory_allocated(device),
            "peak_memory_reserved_bytes": torch.cuda.max_memory_reserved(device),
            "memory_kind": "cuda_max_allocated",
        }
    # ru_maxrss is KiB on Linux; it covers this process, not DataLoader workers
    return {
        "peak_memory_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "memory_kind": "cpu_peak_rss",
    }


def environment(device: torch.device, model_hash: str, prepared: PreparedData) -> dict[str, Any]:
    """What the numbers were measured on: enough to refuse comparing apples with pears."""
    import transformers

    device_name = torch.cuda.get_device_name(device) if device.type == "cuda" else _cpu_name()
    return {
        "device_type": device.type,
        "device_name": device_name,
        "cuda": torch.version.cuda,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
        "host": socket.gethostname(),
        "cpu_threads": torch.get_num_threads(),
        "cpu_count": os.cpu_count(),
        "model_config_hash": model_hash,
        "dataset_hash": prepared.dataset_hash,
    }


def _cpu_name() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or "cpu"
