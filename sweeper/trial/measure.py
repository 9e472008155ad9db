"""One measurement recipe: build, burn in until steady, time a window to a target interval.

Timing rules (why, not what):
- Burn-in steps are synchronized one by one: their times decide when the step time is steady
  (median of the last ``window`` steps within ``tolerance`` of the ``window`` before).
- The timed window is synchronized only at its edges, as a real run is: per-step times come from
  CUDA events (or the host clock on CPU), so no step waits for the device more than training
  would. Losses stay on the device until an edge, where they are checked for NaN/inf.
- Whatever burn-in cost beyond steady-state steps (torch.compile, autotuning, allocator and
  cuDNN warm-up) is reported as ``warmup_excess_s`` — and as ``compile_s`` for compiled
  configs — and never enters the throughput: a real run pays it once.
- Time the host spends blocked on ``next(loader)`` is kept apart: a trial says when it is
  input-bound.
"""

from __future__ import annotations

import contextlib
import math
import os
import platform
import re
import resource
import shutil
import socket
import statistics
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from sweeper.errors import TrialError
from sweeper.hardware import math_mode, peak_flops
from sweeper.space import MeasureSettings, TrialConfig, WarmupSettings, Workload
from sweeper.trial.protocol import ChildRequest, PreparedData
from sweeper.trial.workload import (
    build_loader,
    build_model,
    load_tokenizer,
    mixed_precision,
    resolve_device,
)

# Two-sided 95% Student t quantiles by degrees of freedom; beyond the table, the normal value.
_T95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306,
        9: 2.262, 10: 2.228, 12: 2.179, 15: 2.131, 20: 2.086, 25: 2.060, 30: 2.042, 40: 2.021,
        60: 2.000, 120: 1.980}  # fmt: skip


def t95(df: int) -> float:
    """Conservative t quantile: the table value at the largest tabulated df not above ``df``."""
    if df < 1:
        return math.inf
    if df > 120:
        return 1.960
    return _T95[max(k for k in _T95 if k <= df)]


def ci95_rel(step_times: list[float]) -> float:
    """Half-width of the 95% interval of the mean step time, relative to the mean.

    The same relative half-width bounds throughput (its reciprocal) to first order.

    >>> round(ci95_rel([1.0, 1.1, 0.9, 1.0, 1.0]), 4)
    0.0878
    """
    n = len(step_times)
    if n < 2:
        return math.inf
    mean = statistics.fmean(step_times)
    return t95(n - 1) * statistics.stdev(step_times) / math.sqrt(n) / mean if mean > 0 else math.inf


def is_steady(step_times: list[float], window: int, tolerance: float) -> bool:
    """Median of the last ``window`` steps within ``tolerance`` of the median of those before.

    >>> is_steady([30.0, 0.21, 0.20, 0.20, 0.21, 0.20], window=3, tolerance=0.05)
    True
    >>> is_steady([30.0, 9.0, 0.4, 0.20, 0.21, 0.20], window=3, tolerance=0.05)
    False
    """
    if len(step_times) < 2 * window:
        return False
    recent = statistics.median(step_times[-window:])
    before = statistics.median(step_times[-2 * window : -window])
    return abs(recent / before - 1) <= tolerance


def percentile(values: list[float], q: float) -> float:
    """Linear-interpolated percentile (numpy's default)."""
    ordered = sorted(values)
    position = (len(ordered) - 1) * q / 100
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


@dataclass
class _Step:
    loss: torch.Tensor
    data_wait_s: float
    real_tokens: int
    padded_tokens: int
    samples: int
    time_s: float = 0.0


@dataclass
class _Phase:
    steps: list[_Step] = field(default_factory=list)

    @property
    def times(self) -> list[float]:
        return [s.time_s for s in self.steps]


def run_trial(request: ChildRequest, process_started_at: float) -> dict[str, Any]:
    """Train the trial's config through burn-in and a timed window; return the measurement."""
    assert request.config and request.settings and request.prepared
    imports_done_at = time.time()
    workload, config, settings = request.workload, request.config, request.settings
    device = resolve_device(request.device)
    _configure_backends(device, workload)

    tokenizer = load_tokenizer(request.prepared)
    tokenizer_at = time.time()
    loader = build_loader(
        workload, request.prepared, config, tokenizer, device, Path(request.cache_dir)
    )
    loader_at = time.time()
    model, model_hash = build_model(workload, config, tokenizer, device)
    model_at = time.time()
    matmul_params = _matmul_params(model)
    n_params = sum(p.numel() for p in model.parameters())
    model_config = model.config
    model.train()
    raw_model = model
    if config.compile_mode != "none":
        model = torch.compile(model, mode=config.compile_mode)
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=workload.learning_rate, fused=device.type == "cuda"
    )
    built_at = time.time()

    stepper = _Stepper(model, optimizer, loader, config, workload, device)
    burn_in, steady = _burn_in(stepper, settings.warmup, device)
    _check_finite(burn_in.steps, offset=0)
    warmup_done_at = time.time()
    window, window_s = _timed_window(
        stepper,
        settings.measure,
        device,
        min_steps=max(
            settings.measure.min_steps,
            math.ceil(settings.measure.warmup_multiple * len(burn_in.steps)),
        ),
    )
    _check_finite(window.steps, offset=len(burn_in.steps))
    checkpoint = _time_checkpoint(raw_model, optimizer, workload, Path(request.cache_dir), device)

    times = window.times
    p50 = percentile(times, 50)
    mean_step = statistics.fmean(times)
    warmup_excess_s = max(0.0, sum(burn_in.times) - len(burn_in.steps) * p50)
    rows = sum(s.samples for s in window.steps)
    padded_tokens = sum(s.padded_tokens for s in window.steps)
    real_tokens = sum(s.real_tokens for s in window.steps)
    padded_tokens_per_s = padded_tokens / window_s
    tokens_per_s = real_tokens / window_s
    ci = ci95_rel(times)
    all_steps = burn_in.steps + window.steps
    losses = [float(s.loss) for s in all_steps]
    startup_s = built_at - process_started_at
    return {
        "it_per_s": len(times) / window_s,
        # packed rows hold several samples (and parts of them): count samples by their tokens
        "samples_per_s": tokens_per_s / (request.prepared.tokens_per_sample or math.nan)
        if config.packing
        else rows / window_s,
        "rows_per_s": rows / window_s,
        "tokens_per_s": tokens_per_s,
        "padded_tokens_per_s": padded_tokens_per_s,
        "padding_share": 1 - real_tokens / padded_tokens if padded_tokens else 0.0,
        "data_wait_share": min(1.0, sum(s.data_wait_s for s in window.steps) / window_s),
        "step_time_p50_s": p50,
        "step_time_p90_s": percentile(times, 90),
        "step_time_mean_s": mean_step,
        "step_time_cv": statistics.stdev(times) / mean_step if len(times) > 1 else 0.0,
        "throughput_ci95_rel": ci,
        "ci_target": settings.measure.target_ci,
        "ci_met": ci <= settings.measure.target_ci,
        "measured_steps": len(times),
        "window_s": window_s,
        "warmup_steps": len(burn_in.steps),
        "warmup_steady": steady,
        "warmup_s": sum(burn_in.times),
        "warmup_excess_s": warmup_excess_s,
        "first_step_s": burn_in.times[0],
        "compile_s": warmup_excess_s if config.compile_mode != "none" else 0.0,
        "loss_first": losses[0],
        "loss_last": losses[-1],
        "losses": losses,
        "warmup_step_times_s": burn_in.times,
        "step_times_s": times,
        "data_wait_s": [s.data_wait_s for s in all_steps],
        "loader_epochs": stepper.loader_epochs,
        "n_params": n_params,
        # what ran, read back from torch: the fused CUDA kernel, TF32 matmuls
        "optimizer": "AdamW (fused)" if optimizer.defaults.get("fused") else "AdamW",
        "tf32_matmul": device.type == "cuda" and torch.backends.cuda.matmul.allow_tf32,
        "effective_batch": config.effective_batch,
        "packing": config.packing,
        "startup_s": startup_s,
        **checkpoint,
        **_mfu(
            device,
            workload,
            model_config,
            matmul_params,
            padded_tokens_per_s,
            padded_tokens / rows,
        ),
        **_peak_memory(device),
        "phases_s": {
            "spawn_to_start": max(0.0, process_started_at - request.spawned_at)
            if request.spawned_at
            else None,
            "imports": imports_done_at - process_started_at,
            "tokenizer": tokenizer_at - imports_done_at,
            "data": loader_at - tokenizer_at,
            "model": model_at - loader_at,
            "optimizer": built_at - model_at,
            "warmup": warmup_done_at - built_at,
            "window": window_s,
        },
        "env": environment(device, model_hash, request.prepared),
    }


def _time_checkpoint(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    workload: Workload,
    cache_dir: Path,
    device: torch.device,
) -> dict[str, Any]:
    """Save one checkpoint as Trainer does (safetensors weights, optimizer state), fsync it,
    time it, delete it. The real run pays this every ``checkpoint.save_steps`` steps."""
    spec = workload.checkpoint
    if spec.save_steps is None:
        return {"checkpoint_save_s": None, "checkpoint_bytes": None}
    target = Path(spec.dir).expanduser() if spec.dir else cache_dir / "checkpoints"
    try:
        target.mkdir(parents=True, exist_ok=True)
        folder = Path(tempfile.mkdtemp(prefix="sweeper-checkpoint-", dir=target))
    except OSError as e:
        raise TrialError(
            "error",
            f"workload.checkpoint.dir: cannot write a checkpoint under {target}: {e.strerror}; "
            "point it at a writable directory on the disk the run saves to",
        ) from e
    try:
        _sync(device)
        started = time.perf_counter()
        model.save_pretrained(str(folder), safe_serialization=True)
        if spec.save_optimizer:
            torch.save(optimizer.state_dict(), folder / "optimizer.pt")
        written = [f for f in folder.iterdir() if f.is_file()]
        for path in written:  # on the disk, not just in the page cache
            with path.open("rb") as f:
                os.fsync(f.fileno())
        save_s = time.perf_counter() - started
        size = sum(f.stat().st_size for f in written)
    except OSError as e:
        raise TrialError(
            "error", f"saving a checkpoint under {target} failed: {e.strerror or e}"
        ) from e
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return {"checkpoint_save_s": save_s, "checkpoint_bytes": size}


def _burn_in(stepper: _Stepper, rule: WarmupSettings, device: torch.device) -> tuple[_Phase, bool]:
    phase = _Phase()
    started = time.perf_counter()
    while True:
        step_started = time.perf_counter()
        step = stepper.step()
        _sync(device)
        step.time_s = time.perf_counter() - step_started
        phase.steps.append(step)
        count = len(phase.steps)
        if count >= rule.min_steps and is_steady(phase.times, rule.window, rule.tolerance):
            return phase, True
        if count >= rule.max_steps or time.perf_counter() - started >= rule.max_seconds:
            return phase, False


def _timed_window(
    stepper: _Stepper, rule: MeasureSettings, device: torch.device, min_steps: int
) -> tuple[_Phase, float]:
    """Steps until the interval target (after ``min_steps`` and ``min_seconds``), the step cap
    or the time cap; synchronized at the edges only. ``min_steps`` here includes the burn-in
    multiple, which the caps may cut short."""
    phase = _Phase()
    cuda = device.type == "cuda"
    _sync(device)
    started = time.perf_counter()
    marks: list[Any] = []
    if cuda:
        marks.append(torch.cuda.Event(enable_timing=True))
        marks[0].record()
    done = 0  # steps whose end the device has reached (CUDA) — their times are known
    previous = started
    while True:
        step = stepper.step()
        phase.steps.append(step)
        if cuda:
            mark = torch.cuda.Event(enable_timing=True)
            mark.record()
            marks.append(mark)
            while done < len(phase.steps) and marks[done + 1].query():
                phase.steps[done].time_s = marks[done].elapsed_time(marks[done + 1]) / 1000
                done += 1
        else:
            now = time.perf_counter()
            step.time_s = now - previous
            previous = now
            done = len(phase.steps)
        known = [s.time_s for s in phase.steps[:done]]
        elapsed = time.perf_counter() - started
        enough = (
            done >= min_steps and elapsed >= rule.min_seconds and ci95_rel(known) <= rule.target_ci
        )
        capped = len(phase.steps) >= rule.max_steps or elapsed >= rule.max_seconds
        # the caps may cut the burn-in multiple short, never the space's own min_steps
        if (enough or capped) and len(phase.steps) >= rule.min_steps:
            break
    _sync(device)
    window_s = time.perf_counter() - started
    if cuda:
        for index in range(done, len(phase.steps)):
            phase.steps[index].time_s = marks[index].elapsed_time(marks[index + 1]) / 1000
    return phase, window_s


class _Stepper:
    """One optimizer step = ``accumulation`` micro-batches; no host sync inside."""

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
        self.autocast = mixed_precision(device, workload.precision)
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

    def step(self) -> _Step:
        data_wait_s = 0.0
        real_tokens = padded_tokens = samples = 0
        loss_total = torch.zeros((), device=self.device)
        for _ in range(self.accumulation):
            waited = time.perf_counter()
            batch = self._next_batch()
            data_wait_s += time.perf_counter() - waited
            real_tokens += int(batch["attention_mask"].sum())
            padded_tokens += batch["input_ids"].numel()
            samples += batch["input_ids"].shape[0]
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
        return _Step(loss_total, data_wait_s, real_tokens, padded_tokens, samples)


def _check_finite(steps: list[_Step], offset: int) -> None:
    for index, step in enumerate(steps):
        value = float(step.loss)
        if not math.isfinite(value):
            raise TrialError(
                "nonfinite", f"loss became {value} at optimizer step {offset + index + 1}"
            )


def _configure_backends(device: torch.device, workload: Workload) -> None:
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = workload.tf32
        torch.backends.cudnn.allow_tf32 = workload.tf32
        if workload.precision == "bf16" and not torch.cuda.is_bf16_supported():
            raise TrialError("unsupported", "bf16 is not supported on this GPU; use fp16 or fp32")


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _matmul_params(model: torch.nn.Module) -> int:
    """Parameters that do matmuls per token: all but embedding lookups; a tied LM head counts."""
    total = sum(p.numel() for p in model.parameters())
    embeddings = model.get_input_embeddings().weight
    output = model.get_output_embeddings()
    tied = output is not None and output.weight is embeddings
    lookups = 0 if tied else embeddings.numel()
    position = getattr(
        getattr(model, "transformer", None), "wpe", None
    )  # GPT-2's learned positions
    if position is not None:
        lookups += position.weight.numel()
    return total - lookups


def _mfu(
    device: torch.device,
    workload: Workload,
    model_config: Any,
    matmul_params: int,
    padded_tokens_per_s: float,
    mean_width: float,
) -> dict[str, Any]:
    """Model FLOPs utilisation (PaLM appendix B: 6N + 12·L·d·T per token, fwd + bwd)."""
    flops_per_token = 6 * matmul_params + 12 * model_config.num_hidden_layers * (
        model_config.hidden_size * mean_width
    )
    achieved = flops_per_token * padded_tokens_per_s
    result: dict[str, Any] = {
        "flops_per_token": flops_per_token,
        "achieved_tflops": achieved / 1e12,
        "mfu": None,
        "peak_tflops": None,
    }
    if device.type == "cuda":
        peak = peak_flops(torch.cuda.get_device_name(device))
        if peak is not None:
            tflops = peak.tflops(math_mode(workload.precision, workload.tf32))
            result.update(mfu=achieved / (tflops * 1e12), peak_tflops=tflops, peak_name=peak.name)
    return result


def _peak_memory(device: torch.device) -> dict[str, Any]:
    if device.type == "cuda":
        return {
            "peak_memory_bytes": torch.cuda.max_memory_allocated(device),
            "peak_memory_reserved_bytes": torch.cuda.max_memory_reserved(device),
            "device_memory_bytes": torch.cuda.get_device_properties(device).total_memory,
            "memory_kind": "cuda_max_allocated",
        }
    # ru_maxrss is KiB on Linux; it covers this process, not DataLoader workers
    return {
        "peak_memory_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "device_memory_bytes": host_memory_bytes(),
        "memory_kind": "cpu_peak_rss",
    }


def host_memory_bytes() -> int:
    """Physical memory, or the cgroup's limit when it is lower (a container)."""
    physical = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    with contextlib.suppress(OSError, ValueError):
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        if limit != "max":
            return min(physical, int(limit))
    return physical


def environment(device: torch.device, model_hash: str, prepared: PreparedData) -> dict[str, Any]:
    """What the numbers were measured on: enough to refuse comparing apples with pears."""
    import transformers

    cuda = device.type == "cuda"
    return {
        "device_type": device.type,
        "device_name": torch.cuda.get_device_name(device) if cuda else cpu_name(),
        "driver": nvidia_driver() if cuda else None,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if cuda else None,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
        "host": socket.gethostname(),
        "cpu_threads": torch.get_num_threads(),
        "cpu_count": os.cpu_count(),
        "model_config_hash": model_hash,
        "dataset_hash": prepared.dataset_hash,
    }


def nvidia_driver() -> str | None:
    with contextlib.suppress(OSError):
        text = Path("/proc/driver/nvidia/version").read_text()
        match = re.search(r"Kernel Module(?: for x86_64)?\s+([\d.]+)", text)
        if match:
            return match.group(1)
    return None


def cpu_name() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or "cpu"
