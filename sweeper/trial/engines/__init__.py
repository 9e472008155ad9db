"""Engines: what trains a trial, the way the user's run trains.

Each engine builds its model, data and optimizer from the trial's config and feeds the one
``Recorder`` (``sweeper/trial/recipe.py``) as it trains; the recipe decides when it is done.

- ``loop``: a plain PyTorch loop (autocast, GradScaler for fp16), the shape of a custom AMP
  loop;
- ``trainer``: ``transformers.Trainer`` with ``TrainingArguments`` from the config;
- ``sft``: TRL's ``SFTTrainer`` with ``SFTConfig`` (it tokenizes and packs the data itself).

After its first optimizer step each engine reads every knob back from what runs
(``readback.check``): a value that differs from the config's fails the trial as a mismatch.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from sweeper.errors import TrialError
from sweeper.trial import progress
from sweeper.trial.protocol import ChildRequest
from sweeper.trial.recipe import HostTimer, Recorder, Timer


class CudaTimer:
    """Device time from CUDA events: marks are recorded in the stream, read when reached."""

    def __init__(self, device: torch.device) -> None:
        self.device = device

    def now(self) -> float:
        return time.perf_counter()

    def sync(self) -> None:
        torch.cuda.synchronize(self.device)

    def mark(self) -> torch.cuda.Event:
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def between(self, start: torch.cuda.Event, end: torch.cuda.Event) -> float | None:
        if not end.query():
            return None
        return start.elapsed_time(end) / 1000


def timer_for(device: torch.device) -> Timer:
    return CudaTimer(device) if device.type == "cuda" else HostTimer()


@dataclass
class TrialContext:
    """What every engine gets: the request, the device, the tokenizer and a fresh recorder."""

    request: ChildRequest
    device: torch.device
    tokenizer: Any
    recorder: Recorder
    cache_dir: Path
    phases: dict[str, float | None] = field(default_factory=dict)
    # time.time() when the last build phase ended: the engine starts the recorder right after
    last_phase_end: float = field(default_factory=time.time)
    # the tokens the loss is taken on: every token, or only the assistant's replies (loss:
    # completion); an engine that cannot mask the replies as the user's run would says "all"
    loss_labels: str = "all"
    # start-up as the run pays it, where the engine measures it otherwise (a script: from its
    # own process start to its first step, not the trial child's)
    startup_s: float | None = None
    # this process's rank of a multi-device trial (``sweeper.trial.rank.Ranks``); None on one
    ranks: Any = None

    def phase_done(self, name: str) -> None:
        """Close a build phase (``data``, ``model``, ``optimizer``...) at the current time."""
        now = time.time()
        self.phases[name] = (self.phases.get(name) or 0.0) + now - self.last_phase_end
        self.last_phase_end = now
        progress.mark(name)


@dataclass
class EngineRun:
    """What an engine hands back once the recorder is done."""

    model: torch.nn.Module  # unwrapped (not compiled), for the checkpoint and the FLOPs count
    optimizer: torch.optim.Optimizer
    optimizer_name: str  # what ran, read back from the optimizer object
    loader_epochs: int = 1
    notes: dict[str, Any] = field(default_factory=dict)
    # each knob's value read back from what ran (``readback.check``)
    effective: dict[str, Any] = field(default_factory=dict)


def flattened(batch: dict[str, Any]) -> bool:
    """A padding-free batch: its samples end to end in a row, position ids restarting at 0
    for each, and no attention mask (the attention kernel separates them by position)."""
    return batch.get("position_ids") is not None and batch.get("attention_mask") is None


def count_batch(batch: dict[str, Any]) -> dict[str, Any]:
    """Rows (samples: a padding-free row holds several, counted where their positions
    restart), real and padded tokens of a collated batch, without waiting for the device: a
    device-side sum stays a tensor until the recorder reads it at the window's edge."""
    ids = batch["input_ids"]
    mask = batch.get("attention_mask")
    real: Any = ids.numel() if mask is None else mask.sum()  # padding-free batches have no mask
    rows: Any = ids.shape[0]
    if flattened(batch):
        rows = (batch["position_ids"] == 0).sum()
    if isinstance(real, torch.Tensor) and real.device.type == "cpu":
        real = int(real)
    if isinstance(rows, torch.Tensor) and rows.device.type == "cpu":
        rows = int(rows)
    return {"rows": rows, "real_tokens": real, "padded_tokens": ids.numel()}


def widest_row(batch: dict[str, Any]) -> int:
    """Tokens in the batch's longest sequence. A padding-free batch (TRL's packing) holds its
    sequences end to end in one row, each starting where its position ids restart at 0."""
    ids = batch["input_ids"]
    positions = batch.get("position_ids")
    if positions is None or batch.get("attention_mask") is not None:
        return int(ids.shape[-1])
    flat = positions.reshape(-1)
    starts = [*(flat == 0).nonzero().reshape(-1).tolist(), flat.numel()]
    return max((end - start for start, end in zip(starts, starts[1:], strict=False)), default=0)


def timed(batches: Iterator[Any]) -> Iterator[tuple[Any, float]]:
    """Each batch of ``batches`` with the seconds the host waited for it."""
    while True:
        started = time.perf_counter()
        try:
            batch = next(batches)
        except StopIteration:
            return
        yield batch, time.perf_counter() - started


class TimedBatches:
    """An iterable over ``loader`` that reports each batch, and the wait for it, to the
    recorder: the time the host is blocked on the data pipeline."""

    def __init__(self, loader: Any, recorder: Recorder) -> None:
        self._loader, self._recorder = loader, recorder
        # read back after the first optimizer step: batches it took, the widest row; the
        # engine stops watching then (the widest row of a padding-free batch is read from the
        # device, a sync the timed steps must not have)
        self.fetched = 0
        self.widest_row = 0
        self.watching = True
        # a digest of the first batch's token ids: the ranks of a multi-device trial each read
        # their own share of the data, so theirs differ
        self.first_batch: str | None = None
        self.flattened = False  # the first batch was padding-free (``flattened``)

    def __iter__(self) -> Any:
        for batch, waited_s in timed(iter(self._loader)):
            self._recorder.batch(**count_batch(batch), data_wait_s=waited_s)
            if self.watching:
                if self.first_batch is None:
                    self.flattened = flattened(batch)
                    ids = batch["input_ids"].detach().cpu().contiguous()
                    self.first_batch = hashlib.sha256(ids.numpy().tobytes()).hexdigest()[:16]
                self.fetched += 1
                self.widest_row = max(self.widest_row, widest_row(batch))
            yield batch

    def __len__(self) -> int:
        return len(self._loader)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._loader, name)


def sample_boundaries(ctx: TrialContext, model: torch.nn.Module) -> bool | None:
    """Whether the model keeps samples that share a row apart (``readback.separates_samples``),
    checked where rows hold several (packing, padding-free); None elsewhere."""
    config = ctx.request.config
    assert config is not None
    if not (config.packing or config.padding_free):
        return None
    from sweeper.trial.engines.readback import separates_samples
    from sweeper.trial.workload import mixed_precision

    return separates_samples(model, ctx.device, mixed_precision(ctx.device, config.precision))


def cross_sample_attention(
    ctx: TrialContext, flattened: bool, separates: bool | None
) -> bool | None:
    """Rows held several samples and attended across them: rows with a mask of ones (no
    position ids to tell the kernel where a sample starts), or a kernel that ignored them.
    None where each row holds one sample."""
    config = ctx.request.config
    assert config is not None
    if not (config.packing or config.padding_free):
        return None
    return not (flattened and bool(separates))


def build_optimizer(
    name: str, model: torch.nn.Module, learning_rate: float, device: torch.device
) -> torch.optim.Optimizer:
    """The optimizer ``TrainingArguments(optim=name)`` would build, for the plain loop."""
    params = [p for p in model.parameters() if p.requires_grad]
    if name == "adamw_torch":
        return torch.optim.AdamW(params, lr=learning_rate)
    if name == "adamw_torch_fused":  # a CUDA kernel, and a CPU one since torch 2.4
        return torch.optim.AdamW(params, lr=learning_rate, fused=True)
    if name == "adamw_8bit":
        try:
            import bitsandbytes as bnb
        except Exception as e:  # ImportError, or a CUDA setup error raised at import
            raise TrialError(
                "unsupported", f"optim adamw_8bit needs bitsandbytes, which does not import: {e}"
            ) from e
        return bnb.optim.AdamW8bit(params, lr=learning_rate)
    if name == "adafactor":
        from transformers.optimization import Adafactor

        # Trainer's settings for optim="adafactor": a fixed learning rate
        return Adafactor(params, lr=learning_rate, scale_parameter=False, relative_step=False)
    raise TrialError("error", f"unknown optim {name!r}")


def optimizer_name(optimizer: Any) -> str:
    """What the optimizer object is, read back (the fused kernel, 8-bit, Adafactor)."""
    inner = optimizer  # accelerate wraps it, and DeepSpeed's ZeRO optimizer under that
    while getattr(inner, "optimizer", None) is not None:
        inner = inner.optimizer
    kind = type(inner).__name__
    if getattr(inner, "defaults", {}).get("fused"):
        return f"{kind} (fused)"
    return kind


def engine(name: str) -> Callable[[TrialContext], EngineRun]:
    """The engine's train function, imported only when a trial uses it."""
    if name == "loop":
        from sweeper.trial.engines.loop import train
    elif name == "trainer":
        from sweeper.trial.engines.trainer import train_trainer as train
    elif name == "sft":
        from sweeper.trial.engines.trainer import train_sft as train
    elif name == "script":
        raise TrialError("error", "engine script runs the user's command (runner.execute)")
    else:
        raise TrialError("error", f"unknown engine {name!r}")
    return train
