"""``transformers.Trainer`` and TRL's ``SFTTrainer`` as engines.

The Trainer owns its loop; a ``TrainerCallback`` feeds the recipe's recorder (start at
``on_train_begin``, a step at each ``on_step_end``, stop when the recorder is done) and a wrapper
around the Trainer's own DataLoader reports each batch and the wait for it. Everything the
Trainer does per step — its DataLoader (built from ``dataloader_*`` arguments), the optimizer it
builds from ``optim``, its NaN filter and logging, the LR scheduler — is inside the timed steps,
as in the user's run. ``TrainingArguments`` come from ``sweeper.knobs.trainer_arguments``: the
same function the export uses, so the pasted arguments are the measured ones.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from sweeper import knobs
from sweeper.errors import TrialError
from sweeper.trial.corpus import encode
from sweeper.trial.engines import (
    EngineRun,
    TimedBatches,
    TrialContext,
    cross_sample_attention,
    optimizer_name,
    sample_boundaries,
)
from sweeper.trial.engines.readback import (
    ComputeDtype,
    Running,
    check,
    deepspeed_stage,
    has_generation_markers,
)
from sweeper.trial.oneoff import timed_group_save
from sweeper.trial.workload import build_model, build_training_dataset, make_collator, open_rows


def trainer_arguments(ctx: TrialContext) -> dict[str, Any]:
    """``TrainingArguments`` keywords: the config's knobs plus what makes it a trial (a step
    cap far beyond the recorder's, no saving, no reporting)."""
    request = ctx.request
    assert request.config is not None and request.settings is not None
    settings = request.settings
    return {
        **knobs.trainer_arguments(request.config.model_dump()),
        "output_dir": str(ctx.cache_dir / "trainer-output"),
        "learning_rate": request.workload.learning_rate,
        "logging_steps": request.workload.logging_steps,
        # the recorder stops the run; this only bounds it
        "max_steps": settings.warmup.max_steps + settings.measure.max_steps + 2,
        "save_strategy": "no",  # one checkpoint save is timed apart, after the window
        "report_to": "none",
        "disable_tqdm": True,
        "use_cpu": ctx.device.type == "cpu",
        "dataloader_drop_last": True,
        "seed": 0,
    }


def _callback(ctx: TrialContext, engine: str) -> Any:
    from transformers import TrainerCallback

    recorder = ctx.recorder

    class Record(TrainerCallback):
        trainer: Any = None  # set once the trainer exists
        computed: ComputeDtype | None = None
        communication: Any = None  # DDP's wait on its all-reduce (rank.ExposedCommunication)

        def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            ctx.phase_done("trainer_setup")  # accelerate's prepare, the optimizer, the scheduler
            recorder.start()

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            if self.computed is not None:  # the first optimizer step: read back what ran
                self.computed.remove()
                self.trainer.sweeper_effective = _read_back(engine, self.trainer, self.computed)
                self.computed = None
                wrapped = self.trainer.model_wrapped
                if isinstance(wrapped, torch.nn.parallel.DistributedDataParallel):
                    from sweeper.trial.rank import ExposedCommunication

                    self.communication = ExposedCommunication(wrapped)
            if recorder.step_end():
                control.should_training_stop = True
            elif self.communication is not None and recorder.phase == "window":
                self.communication.window_started()

    return Record()


def _read_back(engine: str, trainer: Any, computed: ComputeDtype) -> dict[str, Any]:
    ctx: TrialContext = trainer.sweeper_ctx
    assert ctx.request.config is not None
    loader = trainer.sweeper_loader
    loader.watching = False
    model = getattr(trainer.model, "_orig_mod", trainer.model)
    return check(
        engine,
        Running(
            device=ctx.device,
            model=model,
            runnables=[trainer.model_wrapped, trainer.model],
            optimizer=trainer.optimizer,
            loader=loader,
            args=trainer.args,
            micro_batches=loader.fetched,
            widest_row=loader.widest_row,
            compute_dtype=computed.dtype,
            flattened=loader.flattened,
            separates_samples=trainer.sweeper_separates,
            cut=trainer.sweeper_cut,
        ),
        ctx.request.config.model_dump(),
    )


def _start(
    trainer: Any, ctx: TrialContext, record: Any, separates: bool | None, cut: int | None = None
) -> None:
    trainer.sweeper_ctx = ctx
    trainer.sweeper_separates = separates
    trainer.sweeper_cut = cut
    trainer.sweeper_record = record
    record.trainer = trainer
    record.computed = ComputeDtype(trainer.model)


def _timed(trainer_class: type) -> type:
    """``trainer_class`` with its DataLoader timed and its losses handed to the recorder."""

    class Timed(trainer_class):  # type: ignore[misc, valid-type]
        sweeper_ctx: TrialContext
        sweeper_loader: TimedBatches
        sweeper_record: Any  # the callback feeding the recorder
        sweeper_effective: dict[str, Any] | None = None
        sweeper_separates: bool | None = None  # sample_boundaries of the model it trains
        sweeper_cut: int | None = None  # where sweeper cut the samples it handed over

        def get_train_dataloader(self) -> Any:
            self.sweeper_loader = TimedBatches(
                super().get_train_dataloader(), self.sweeper_ctx.recorder
            )
            return self.sweeper_loader

        def training_step(self, *args: Any, **kwargs: Any) -> torch.Tensor:
            loss = super().training_step(*args, **kwargs)
            self.sweeper_ctx.recorder.loss(loss.detach())
            return loss

    return Timed


def _finish(ctx: TrialContext, trainer: Any) -> EngineRun:
    if not ctx.recorder.done:
        raise TrialError(
            "error",
            f"the Trainer stopped after {trainer.state.global_step} steps, before the measurement "
            "was complete (its data ran out?)",
        )
    model = trainer.model
    model = getattr(model, "_orig_mod", model)  # torch.compile's wrapper
    return EngineRun(
        model=model,
        optimizer=trainer.optimizer,
        optimizer_name=optimizer_name(trainer.optimizer),
        loader_epochs=max(1, math.ceil(trainer.state.epoch or 1)),
        effective=trainer.sweeper_effective or {},
        notes={
            "sharded_save": _deepspeed_save(ctx, trainer),
            "first_batch": trainer.sweeper_loader.first_batch,
            "communication_s": None
            if trainer.sweeper_record.communication is None
            else trainer.sweeper_record.communication.per_step_s(),
            "cross_sample_attention": cross_sample_attention(
                ctx, trainer.sweeper_loader.flattened, trainer.sweeper_separates
            ),
        },
    )


def _deepspeed_save(ctx: TrialContext, trainer: Any) -> Callable[[], dict[str, Any]] | None:
    """Under DeepSpeed, one checkpoint save as the user's Trainer makes it at save_steps, to
    be timed on every rank (None: not DeepSpeed's engine). The Trainer's own
    ``_save_checkpoint``: the model (ZeRO-3 gathers its 16-bit weights to rank 0) and, unless
    the checkpoint is the model only, DeepSpeed's ``save_checkpoint`` where each rank writes
    its partitions of the optimizer state (ZeRO-3: of the weights too). A save of one rank's
    ``state_dict`` would time a ZeRO-3 model's empty partitions."""
    ranks = ctx.ranks
    if ranks is None or deepspeed_stage(trainer.model_wrapped) is None:
        return None  # (data_parallel applies on several devices only)
    spec = ctx.request.workload.checkpoint

    def save() -> dict[str, Any]:
        target = Path(spec.dir).expanduser() if spec.dir else ctx.cache_dir / "checkpoints"
        # one folder for the group: the ranks share their leader (their parent)
        folder = target / f"sweeper-checkpoint-{os.getppid()}-deepspeed"
        trainer.args.output_dir = str(folder)
        trainer.args.save_only_model = not spec.save_optimizer
        return timed_group_save(
            ranks,
            folder,
            lambda: trainer._save_checkpoint(trainer.model, trial=None),
            "a DeepSpeed checkpoint",
        )

    return save


def _require(module: str, engine: str) -> None:
    try:
        __import__(module)
    except ImportError as e:
        raise TrialError(
            "unsupported",
            f"workload.engine {engine} needs the {module} package, which does not import "
            f"here ({e}); pip install {module}",
        ) from e


def train_trainer(ctx: TrialContext) -> EngineRun:
    """Train with ``transformers.Trainer`` on the sweep's dataset and collator."""
    _require("accelerate", "trainer")
    from transformers import Trainer, TrainingArguments

    request = ctx.request
    assert request.config is not None and request.prepared is not None
    config, workload = request.config, request.workload
    dataset = build_training_dataset(
        workload, request.prepared, config, ctx.tokenizer, ctx.cache_dir
    )
    ctx.phase_done("data")
    model = build_model(workload, config, ctx.tokenizer, ctx.device, ctx.cache_dir)
    separates = sample_boundaries(ctx, model)
    ctx.phase_done("model")
    args = _arguments(TrainingArguments, trainer_arguments(ctx))
    record = _callback(ctx, "trainer")
    trainer = _timed(Trainer)(
        model=model,
        args=args,
        train_dataset=dataset,
        data_collator=make_collator(workload, config, ctx.tokenizer),
        callbacks=[record],
    )
    _start(trainer, ctx, record, separates)
    _train(trainer)
    return _finish(ctx, trainer)


def sft_rows(ctx: TrialContext, available: int) -> int:
    """Rows SFTTrainer needs to tokenize for the trial's longest possible run (it tokenizes
    and packs its whole dataset before training: the real run pays that once, a trial should
    not pay it for rows it never reads)."""
    request = ctx.request
    assert request.config is not None and request.settings is not None and request.prepared
    config, settings = request.config, request.settings
    steps = settings.warmup.max_steps + settings.measure.max_steps + 2
    rows = steps * config.effective_batch  # the global batch: each rank trains its share
    if config.packing:
        per_sample = request.prepared.tokens_per_sample or 64.0
        rows = math.ceil(rows * (config.max_seq_length / per_sample + 1))
    return min(available, rows)


def train_sft(ctx: TrialContext) -> EngineRun:
    """Train with TRL's ``SFTTrainer``: it tokenizes, truncates or packs the text itself."""
    _require("trl", "sft")
    from trl import SFTConfig, SFTTrainer

    request = ctx.request
    assert request.config is not None and request.prepared is not None
    config, workload, prepared = request.config, request.workload, request.prepared
    rows = open_rows(prepared, ctx.cache_dir)
    rows = rows.select(range(sft_rows(ctx, len(rows))))
    if prepared.completion_only and not has_generation_markers(prepared.chat_template):
        # TRL's assistant_only_loss needs {% generation %} markers in the template: without
        # them the user's SFTTrainer trains on every token, so the trial does too (and the
        # export says so) rather than measure a loss the user's run cannot have
        rows = rows.remove_columns("completion_spans")
        ctx.loss_labels = "all"
    replies = prepared.completion_only and ctx.loss_labels == "replies"
    # padding-free without packing TRL takes no max_length: it gets samples cut already
    cut = config.max_seq_length if config.padding_free else None
    if replies or cut is not None:
        # token ids (with an assistant mask for a reply-only loss): SFTTrainer takes them as
        # they are and labels only the replies, as assistant_only_loss does from messages
        rows = rows.map(
            _token_rows,
            batched=True,
            fn_kwargs={
                "tokenizer": ctx.tokenizer,
                "field": prepared.text_field,
                "replies": replies,
                "cut": cut,
            },
            remove_columns=rows.column_names,
        )
    elif prepared.text_field != "text":
        rows = rows.rename_column(prepared.text_field, "text")
    ctx.phase_done("data")
    model = build_model(workload, config, ctx.tokenizer, ctx.device, ctx.cache_dir)
    separates = sample_boundaries(ctx, model)
    ctx.phase_done("model")
    args = _arguments(
        SFTConfig,
        {
            **trainer_arguments(ctx),
            **knobs.sft_arguments(config.model_dump()),
            "dataset_text_field": "text",
            "remove_unused_columns": True,
        },
    )
    record = _callback(ctx, "sft")
    trainer = _timed(SFTTrainer)(
        model=model,
        args=args,
        train_dataset=rows,
        processing_class=ctx.tokenizer,
        callbacks=[record],
    )
    ctx.phase_done("dataset")  # SFTTrainer tokenizes (and packs) its dataset in __init__
    _start(trainer, ctx, record, separates, cut)
    _train(trainer)
    return _finish(ctx, trainer)


def _token_rows(
    batch: dict[str, list[Any]], tokenizer: Any, field: str, replies: bool, cut: int | None
) -> dict[str, Any]:
    """Token ids closed by EOS, cut at ``cut`` tokens with it (None: whole), and with
    ``replies`` the assistant mask TRL's collator labels from."""
    eos = [] if tokenizer.eos_token_id is None else [tokenizer.eos_token_id]
    limit = {} if cut is None else {"truncation": True, "max_length": cut - len(eos)}
    spans = batch["completion_spans"] if replies else None
    ids, masks = encode(tokenizer, batch[field], spans, **limit)
    rows: dict[str, Any] = {"input_ids": [row + eos for row in ids]}
    if masks is not None:
        rows["assistant_masks"] = [[int(bit) for bit in mask] + [1] * len(eos) for mask in masks]
    return rows


def _arguments(kind: type, kwargs: dict[str, Any]) -> Any:
    fields = getattr(kind, "__dataclass_fields__", {})
    if "activation_checkpointing" in fields and "gradient_checkpointing" in kwargs:
        # transformers 5.23 renamed it (the old name still works, with a warning)
        kwargs = {**kwargs, "activation_checkpointing": kwargs["gradient_checkpointing"]}
        del kwargs["gradient_checkpointing"]
    try:
        return kind(**kwargs)
    except (ValueError, ImportError) as e:  # e.g. tf32 without an Ampere GPU, fp16 on a CPU
        raise TrialError("unsupported", f"{kind.__name__} refuses this config: {e}") from e


def _train(trainer: Any) -> None:
    try:
        trainer.train()
    except torch.OutOfMemoryError:
        raise
    except (ValueError, NotImplementedError) as e:
        raise TrialError("unsupported", f"{type(trainer).__mro__[1].__name__}: {e}") from e
