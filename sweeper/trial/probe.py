"""Preflight probe (child side): a few training steps of a one-layer model of the workload."""

from __future__ import annotations

import copy
import importlib.util
import statistics
import time
from typing import Any, cast

import torch

from sweeper.trial.protocol import ChildRequest
from sweeper.trial.workload import (
    cuda_index,
    load_tokenizer,
    mixed_precision,
    probe_model,
    resolve_device,
    to_float8,
)

_BATCH, _SEQ = 4, 128


def run_probe(request: ChildRequest) -> dict[str, Any]:
    """Train ``probe.steps`` steps; return the median step time after the first (compile) step.

    With ``compare_fp32`` the same model's steps are timed in turns in the precision and in fp32
    (``compare_precision``), so the parent can refuse a precision that is pathologically slow
    on this device.
    """
    assert request.probe is not None and request.prepared is not None
    probe = request.probe
    device = resolve_device(request.device)
    tokenizer = load_tokenizer(request.prepared)
    result: dict[str, Any] = {
        "device_type": device.type,
        "capabilities": capabilities(device, deepspeed=probe.deepspeed),
        # how many ranks a trial may have: one per GPU (on the CPU, ranks are processes)
        "device_count": torch.cuda.device_count() if device.type == "cuda" else None,
    }
    started = time.perf_counter()
    if probe.compare_fp32 and probe.precision != "fp32" and probe.compile_mode == "none":
        result.update(compare_precision(request, tokenizer, device))
    else:
        result["step_s"] = _time_steps(request, tokenizer, device, probe.precision)
    result["first_step_s"] = time.perf_counter() - started
    return result


# A precision's slowdown against fp32 is timed step against step: the two take turns (ABBA
# order, so a drift of the machine's speed falls on both alike), and the spread of their step
# times says how far the machine's load moved the figure. Under load
# (another process on the CPU, another on the GPU: ``HostWatch``) the round is measured once
# more; if the machine was still shared, the payload says so and the parent does not refuse
# on it alone (``sweeper.preflight_precision.precision_verdict``).
COMPARE_ROUNDS = 2


def compare_precision(
    request: ChildRequest, tokenizer: Any, device: torch.device
) -> dict[str, Any]:
    """``probe.precision`` and fp32 timed in turns: their median step times, each step's time
    and what ``HostWatch`` read, over one round, or two where the first was timed on a shared
    machine."""
    from sweeper.trial.contention import HostWatch

    assert request.probe is not None
    probe = request.probe
    subject = _Stepper(request, tokenizer, device, probe.precision)
    # autocast leaves the weights fp32: one model serves both (no second copy on the device);
    # fp8 converts its Linear layers, so fp32 gets a model of its own
    if probe.precision == "fp8":
        fp32 = _Stepper(request, tokenizer, device, "fp32")
    else:
        fp32 = subject.sharing("fp32")
    subject.step(), fp32.step()  # the first step of each: allocation, kernel selection
    pairs = max(4, probe.steps)
    rounds: list[dict[str, Any]] = []
    for _ in range(COMPARE_ROUNDS):
        watch = HostWatch(cuda_index(device))
        watch.start()
        times: tuple[list[float], list[float]] = ([], [])
        for index in range(pairs):
            order = (subject, fp32) if index % 2 == 0 else (fp32, subject)
            for stepper in order:
                times[stepper is fp32].append(stepper.step())
        host = watch.stop()
        rounds.append({"step_s": times[0], "fp32_step_s": times[1], "host": host})
        if not host["contended"]:
            break
    # the rounds pooled: a second round ran only because the first was shared
    subject_s = [t for r in rounds for t in r["step_s"]]
    fp32_s = [t for r in rounds for t in r["fp32_step_s"]]
    last = rounds[-1]
    return {
        "step_s": statistics.median(subject_s),
        "fp32_step_s": statistics.median(fp32_s),
        "precision_step_times": subject_s,
        "fp32_step_times": fp32_s,
        # None: not shared while the last round ran; else what HostWatch says of each round
        "precision_contended": "; then ".join(r["host"]["contention"] for r in rounds)
        if last["host"]["contended"]
        else None,
        "precision_rounds": len(rounds),
    }


class _Stepper:
    """A model, its optimizer and its batch, trained a step at a time in one precision."""

    def __init__(
        self,
        request: ChildRequest,
        tokenizer: Any,
        device: torch.device,
        precision: str,
        compile_mode: str = "none",
    ) -> None:
        assert request.probe is not None
        self.device = device
        model = probe_model(request.workload, tokenizer, request.probe.attn_implementation, device)
        if precision == "fp8":
            to_float8(model, device)
        model.train()
        self.optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
        self.model = (
            model
            if compile_mode == "none"
            else cast(torch.nn.Module, torch.compile(model, mode=compile_mode))
        )
        generator = torch.Generator().manual_seed(0)
        self.ids = torch.randint(0, len(tokenizer), (_BATCH, _SEQ), generator=generator).to(device)
        self.autocast = mixed_precision(device, precision)

    def sharing(self, precision: str) -> _Stepper:
        """Another precision's steps on this same model, optimizer and batch."""
        other = copy.copy(self)
        other.autocast = mixed_precision(self.device, precision)
        return other

    def step(self) -> float:
        started = time.perf_counter()
        with self.autocast():
            loss = self.model(input_ids=self.ids, labels=self.ids).loss
        loss.backward()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return time.perf_counter() - started


def capabilities(device: torch.device, deepspeed: bool = False) -> dict[str, str | None]:
    """What knob values need (``sweeper.knobs.Capability``): None when present, else why not.
    ``deepspeed``: whether to import it (2-3 s on a loaded CPU) to say if ZeRO runs here; left
    out, the answer is not in the dict (preflight reads that as "not checked")."""
    cuda = None if device.type == "cuda" else f"the trial device is the {device.type.upper()}"
    bnb = cuda
    if cuda is None:
        try:
            import bitsandbytes  # noqa: F401
        except Exception as e:  # ImportError, or its CUDA setup failing at import
            bnb = f"bitsandbytes does not import: {e}"[:300]
    engines = {
        f"engine:{engine}": None
        if all(importlib.util.find_spec(m) is not None for m in modules)
        else f"{', '.join(modules)} not installed: pip install {' '.join(modules)}"
        for engine, modules in (("trainer", ("accelerate",)), ("sft", ("accelerate", "trl")))
    }
    lora = None if importlib.util.find_spec("peft") is not None else "pip install peft"
    return {
        "cuda": cuda,
        "bitsandbytes": bnb,
        **({"deepspeed": _deepspeed()} if deepspeed else {}),
        "liger": cuda or _liger(),
        "fp8": cuda or _float8(device),
        "cuda_graphs": cuda,
        **engines,
        "adapter:lora": lora,
    }


def _liger() -> str | None:
    """Why Liger's kernels cannot run on this CUDA device (None: liger-kernel and Triton
    import)."""
    try:
        import liger_kernel.transformers  # type: ignore[import-not-found]  # noqa: F401
    except Exception as e:  # ImportError, or Triton failing at import
        return f"liger-kernel does not import: {e}; pip install liger-kernel"[:300]
    return None


def _float8(device: torch.device) -> str | None:
    """Why float8 training cannot run on this CUDA device (None: compute capability 8.9 or
    newer, and torchao's float8 imports)."""
    major, minor = torch.cuda.get_device_capability(device)
    if (major, minor) < (8, 9):
        name = torch.cuda.get_device_name(device)
        return f"{name} has compute capability {major}.{minor}; float8 matmuls need 8.9"
    try:
        import torchao.float8  # type: ignore[import-not-found]  # noqa: F401
    except Exception as e:
        return f"torchao does not import: {e}; pip install torchao"[:300]
    return None


def _deepspeed() -> str | None:
    """Why DeepSpeed's ZeRO stages cannot run here (None: deepspeed and accelerate import)."""
    if importlib.util.find_spec("accelerate") is None:
        return "accelerate is not installed: pip install accelerate deepspeed"
    try:
        import deepspeed  # type: ignore[import-not-found]  # noqa: F401
    except Exception as e:  # ImportError, or its CUDA/compiler checks failing at import
        return f"deepspeed does not import: {e}"[:300]
    return None


def _time_steps(
    request: ChildRequest, tokenizer: Any, device: torch.device, precision: str
) -> float:
    """The median step time of ``probe.steps`` steps in ``precision``, after the first."""
    assert request.probe is not None
    stepper = _Stepper(request, tokenizer, device, precision, request.probe.compile_mode)
    times = [stepper.step() for _ in range(max(2, request.probe.steps))]
    return statistics.median(times[1:])
