"""The plain loop: a custom AMP training loop (autocast, GradScaler for fp16 on CUDA)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any, cast

import torch

from sweeper.trial.engines import (
    EngineRun,
    TimedBatches,
    TrialContext,
    build_optimizer,
    cross_sample_attention,
    optimizer_name,
    sample_boundaries,
)
from sweeper.trial.engines.readback import ComputeDtype, Running, check
from sweeper.trial.workload import apply_liger, build_loader, build_model, mixed_precision


def train(ctx: TrialContext) -> EngineRun:
    request, device, recorder = ctx.request, ctx.device, ctx.recorder
    assert request.config is not None and request.prepared is not None
    config, workload = request.config, request.workload
    ranks = ctx.ranks
    loader = build_loader(
        workload,
        request.prepared,
        config,
        ctx.tokenizer,
        device,
        ctx.cache_dir,
        shard=None if ranks is None else (ranks.rank, ranks.world),
    )
    ctx.phase_done("data")
    model = build_model(workload, config, ctx.tokenizer, device, ctx.cache_dir)
    if config.gradient_checkpointing:
        model.gradient_checkpointing_enable()  # as Trainer does for gradient_checkpointing=True
    if config.liger_kernel:
        apply_liger(model)  # what Trainer does for use_liger_kernel=True
    separates = sample_boundaries(ctx, model)
    model.train()
    wrapped: torch.nn.Module = model
    if ranks is not None:
        from sweeper.trial.rank import wrap

        # before the optimizer: FSDP2's optimizer must hold the sharded parameters
        wrapped = wrap(model, config.data_parallel, device)
    ctx.phase_done("model")
    runnable = wrapped
    if config.compile_mode != "none":
        runnable = cast(torch.nn.Module, torch.compile(wrapped, mode=config.compile_mode))
    optimizer = build_optimizer(config.optim, model, workload.learning_rate, device)
    ctx.phase_done("optimizer")

    stepper = _Stepper(runnable, optimizer, loader, ctx, wrapped)
    computed = ComputeDtype(model)
    recorder.start()
    stepper.step()
    computed.remove()
    effective = check(
        "loop",
        Running(
            device=device,
            model=model,
            runnables=[runnable, wrapped],
            optimizer=optimizer,
            loader=loader,
            micro_batches=stepper.loader.fetched,
            widest_row=stepper.loader.widest_row,
            compute_dtype=computed.dtype,
            flattened=stepper.loader.flattened,
            separates_samples=separates,
        ),
        config.model_dump(),
    )
    stepper.loader.watching = False
    communication = None
    if isinstance(wrapped, torch.nn.parallel.DistributedDataParallel):
        from sweeper.trial.rank import ExposedCommunication

        communication = ExposedCommunication(wrapped)
    while not recorder.step_end():
        if communication is not None and recorder.phase == "window":
            communication.window_started()
        stepper.step()
    return EngineRun(
        model=model,
        optimizer=optimizer,
        optimizer_name=optimizer_name(optimizer),
        loader_epochs=stepper.loader_epochs,
        effective=effective,
        notes={
            "first_batch": stepper.loader.first_batch,
            "communication_s": None if communication is None else communication.per_step_s(),
            "cross_sample_attention": cross_sample_attention(
                ctx, stepper.loader.flattened, separates
            ),
        },
    )


def _unless(last: bool, no_sync: Any) -> Any:
    """DDP's no_sync() for a micro-batch before the step's last; nothing otherwise."""
    return contextlib.nullcontext() if last or no_sync is None else no_sync()


class _Stepper:
    """One optimizer step = ``accumulation`` micro-batches; no host sync inside."""

    def __init__(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        loader: Any,
        ctx: TrialContext,
        wrapped: torch.nn.Module,
    ) -> None:
        config = ctx.request.config
        assert config is not None
        self.model, self.optimizer, self.recorder = model, optimizer, ctx.recorder
        # DDP all-reduces gradients on the last micro-batch of a step only (no_sync before), as
        # accelerate's accumulate does; FSDP2 reduce-scatters each, keeping gradients sharded
        self.no_sync = getattr(wrapped, "no_sync", None)
        self.loader = TimedBatches(loader, ctx.recorder)
        self.accumulation = config.gradient_accumulation_steps
        self.device = ctx.device
        self.batches: Iterator[dict[str, torch.Tensor]] = iter(self.loader)
        self.loader_epochs = 1
        self.autocast = mixed_precision(ctx.device, config.precision)
        self.scaler = (
            torch.amp.GradScaler(ctx.device.type)
            if config.precision == "fp16" and ctx.device.type == "cuda"
            else None
        )

    def _next_batch(self) -> dict[str, torch.Tensor]:
        try:
            return next(self.batches)
        except StopIteration:
            # the real run turns epochs too; a small demo corpus just turns them sooner
            self.loader_epochs += 1
            sampler: Any = getattr(self.loader, "sampler", None)
            if hasattr(sampler, "set_epoch"):  # a rank's share, shuffled anew each epoch
                sampler.set_epoch(self.loader_epochs - 1)
            self.batches = iter(self.loader)
            return next(self.batches)

    def step(self) -> None:
        loss_total = torch.zeros((), device=self.device)
        for index in range(self.accumulation):
            batch = self._next_batch()
            batch = {k: v.to(self.device, non_blocking=True) for k, v in batch.items()}
            last = index == self.accumulation - 1
            with _unless(last, self.no_sync):
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
        self.recorder.loss(loss_total)
