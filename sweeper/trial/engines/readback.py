"""What ran, read back: each knob's effective value, taken from the objects that trained.

After an engine's first optimizer step, ``Running`` holds what really ran: the model (its
attention kernel, its checkpointing state, its quantized weights), what the engine calls (a
compiled wrapper?), the optimizer object, the DataLoader the batches came from, the arguments
after their defaults, how many batches the step consumed and the dtype its first linear layer
computed in. Each engine declares, in ``READERS``, one reader per knob; ``check`` reads every knob,
records the values and fails the trial, naming the knob, when one differs from what the config
asked. A knob without a reader fails every trial of that engine, so a new knob cannot be
measured before it can be read back (``tests/trial/test_readback.py`` also checks the table).
"""

from __future__ import annotations

import multiprocessing
import re
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, cast

import torch

from sweeper import knobs
from sweeper.errors import BLOCK_FIX, TrialError, asked_ran

Reader = Callable[["Running"], Any]


@dataclass
class Running:
    """What an engine runs, gathered by the end of its first optimizer step."""

    device: torch.device
    model: torch.nn.Module  # unwrapped: no compile wrapper, no accelerate wrapper
    runnables: list[Any]  # what the engine calls, outermost first (a compiled wrapper?)
    optimizer: Any
    loader: Any  # the DataLoader the batches came from (accelerate's wrapper is fine)
    args: Any = None  # TrainingArguments / SFTConfig, after their defaults
    micro_batches: int = 0  # batches the first optimizer step consumed
    widest_row: int = 0  # the widest batch the first step saw, in tokens
    compute_dtype: torch.dtype | None = None  # what the first linear layer computed in
    first_rows: int = 0  # rows of the first micro-batch (a script's loop: no loader to read)
    # the first batch held its samples end to end: position ids, no attention mask
    flattened: bool = False
    # the model's attention kept two samples flattened in one row apart (``separates_samples``;
    # None: not checked, since no row held several samples)
    separates_samples: bool | None = None
    # where sweeper cut the samples it handed an engine that does not cut them itself (TRL's
    # padding-free SFTTrainer takes no max_length); None: the engine cut them
    cut: int | None = None


class Unobserved(str):
    """A knob the engine cannot read back (a user's script that did not show sweeper the
    object): recorded as such, never compared, never taken for the config's value."""


class NotShown(Unobserved):
    """Unobserved because the script did not pass sweeper the object that holds the knob (its
    DataLoader or optimizer to ``sweeper.step``): one keyword shows it."""


class ComputeDtype:
    """A forward hook on the model's first linear layer: the dtype its output has inside the
    training forward, which is the autocast dtype that really ran (an fp32 model under bf16
    autocast computes bf16). Not the LM head, which TRL replaces by a fused kernel, nor the
    outer module: Trainer's and accelerate's autocast wrap its forward, so a hook there would
    run outside it. GPT-2's projections are transformers' Conv1D (a linear layer with its
    weight transposed), its only torch Linear the LM head: they count as linear here."""

    def __init__(self, model: torch.nn.Module) -> None:
        from transformers.pytorch_utils import Conv1D

        self.dtype: torch.dtype | None = None
        base = _base(model)
        head = base.get_output_embeddings()
        first = next(
            (
                m
                for m in base.modules()
                if isinstance(m, (torch.nn.Linear, Conv1D)) and m is not head
            ),
            None,
        )
        self._handle = first.register_forward_hook(self._seen) if first is not None else None

    def _seen(self, module: Any, inputs: Any, output: Any) -> None:
        if self.dtype is None and isinstance(output, torch.Tensor):
            self.dtype = output.dtype

    def remove(self) -> None:
        if self._handle is not None:
            self._handle.remove()


def _base(model: Any) -> Any:
    """The transformers model under a peft wrapper."""
    get_base = getattr(model, "get_base_model", None)
    return get_base() if callable(get_base) else model


def _torch_loader(loader: Any) -> Any:
    """The torch DataLoader under accelerate's wrapper (which proxies some attributes only)."""
    return getattr(loader, "base_dataloader", loader)


def batch_size(run: Running) -> Any:
    loader = _torch_loader(run.loader)
    if loader.batch_size is not None:
        return loader.batch_size
    return getattr(loader.batch_sampler, "batch_size", None)


def micro_batches(run: Running) -> Any:
    return run.micro_batches


def num_workers(run: Running) -> Any:
    return _torch_loader(run.loader).num_workers


def prefetch_factor(run: Running) -> Any:
    return _torch_loader(run.loader).prefetch_factor


def persistent_workers(run: Running) -> Any:
    return _torch_loader(run.loader).persistent_workers


def multiprocessing_context(run: Running) -> Any:
    context = _torch_loader(run.loader).multiprocessing_context
    if context is None:  # workers start with the interpreter's default method
        return multiprocessing.get_context().get_start_method()
    return context.get_start_method()


def pin_memory(run: Running) -> Any:
    return bool(_torch_loader(run.loader).pin_memory)


_PRECISIONS = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}


def float8_linears(model: torch.nn.Module) -> tuple[int, int]:
    """(Linear layers converted to torchao's Float8Linear, Linear layers): what fp8 really
    trains in, read off the model's modules (torchao is not imported for it)."""
    converted = total = 0
    for module in _base(model).modules():
        if isinstance(module, torch.nn.Linear):
            total += 1
            kind = type(module)
            converted += kind.__name__ == "Float8Linear" and kind.__module__.startswith("torchao")
    return converted, total


def precision(run: Running) -> Any:
    """fp8 where any Linear layer trains in float8 (torchao); otherwise the autocast dtype the
    first linear layer computed in: an fp8 config whose conversion did nothing reads as the
    bf16 it fell back to, and fails as a mismatch."""
    if float8_linears(run.model)[0]:
        return "fp8"
    if run.compute_dtype is None:
        return "not observed (no linear layer ran)"
    return _PRECISIONS.get(run.compute_dtype, str(run.compute_dtype))


def separates_samples(model: torch.nn.Module, device: torch.device, autocast: Any) -> bool:
    """Whether the model keeps two samples flattened in one row apart: the logits of the
    second sample, run after the first with position ids restarting at 0 and no attention
    mask, equal its logits alone (within the precision's rounding: 1e-3 of the largest logit
    in fp32, 2e-2 under autocast). A kernel that attends across samples changes them."""
    base = _base(model)
    vocab = base.get_input_embeddings().num_embeddings
    generator = torch.Generator().manual_seed(0)
    first, second = (torch.randint(0, vocab, (1, 16), generator=generator) for _ in range(2))
    flat = torch.cat([first, second], dim=1).to(device)
    positions = torch.cat([torch.arange(16), torch.arange(16)])[None].to(device)
    was_training = model.training
    model.eval()  # no dropout
    try:
        with torch.no_grad(), autocast():
            alone = model(input_ids=second.to(device), use_cache=False).logits.float()
            packed = model(input_ids=flat, position_ids=positions, use_cache=False).logits
    finally:
        model.train(was_training)
    difference = (packed[:, 16:].float() - alone).abs().max().item()
    half = alone.dtype != torch.float32 or torch.is_autocast_enabled(device.type)
    scale = max(1.0, alone.abs().max().item())
    return difference <= (2e-2 if half else 1e-3) * scale


def _collator(run: Running) -> Any:
    """The collate function the batches came from, under Trainer's column filter and
    sweeper's own wrapper."""
    collate = _torch_loader(run.loader).collate_fn
    collate = getattr(collate, "data_collator", collate)  # transformers' RemoveColumnsCollator
    return getattr(collate, "inner", collate)  # sweeper's Flattening


def padding_free(run: Running) -> Any:
    """True where the collator flattened each batch (transformers' DataCollatorWithFlattening,
    or TRL's collator with padding_free), the batches came without an attention mask, and the
    model's attention kept the samples apart; otherwise what fell short."""
    collate = _collator(run)
    name = type(collate).__name__
    if name != "DataCollatorWithFlattening" and not getattr(collate, "padding_free", False):
        return False
    if not run.flattened:
        return f"{name}, but the batches carried an attention mask"
    if run.separates_samples is None:  # a script's model, which sweeper did not run apart
        return Unobserved(f"{name} flattened the batches; the attention was not checked")
    if not run.separates_samples:
        attention = _base(run.model).config._attn_implementation
        return f"{name}, but the {attention} attention attended across the samples"
    return True


def liger_kernel(run: Running) -> Any:
    """Liger's kernels in the model: modules of liger_kernel, or forwards it patched in (its
    instance patching swaps RMSNorm's forward); an argument that asked for them and found the
    model untouched says so."""
    for module in _base(run.model).modules():
        forward = getattr(module.forward, "__func__", module.forward)
        if type(module).__module__.startswith("liger_kernel") or getattr(
            forward, "__module__", ""
        ).startswith("liger_kernel"):
            return True
    if run.args is not None and getattr(run.args, "use_liger_kernel", False):
        return "use_liger_kernel=True, but no Liger kernel is in the model"
    return False


def tf32_matmul() -> bool:
    """Whether float32 matmuls on CUDA may run on TF32 tensor cores, read from torch's flags.

    torch 2.9 added ``fp32_precision`` settings beside the legacy ``allow_tf32``. Once a
    program turns TF32 on through the new API alone (transformers' ``TrainingArguments(tf32=
    True)`` does on torch >= 2.9, so does a user's script), reading the legacy flag raises
    "you have used mix of the legacy and new APIs": a user's Trainer script run as a trial
    failed so on an H200 (2026-11-28). The new API is read instead, the matmul's own setting
    first, else the global one it inherits; torch before 2.9 has the legacy flag alone."""
    matmul = torch.backends.cuda.matmul
    precision = getattr(matmul, "fp32_precision", None)
    if precision is None:
        return bool(matmul.allow_tf32)
    if precision == "none":
        precision = getattr(torch.backends, "fp32_precision", "none")
    return precision == "tf32"


def tf32(run: Running) -> Any:
    return tf32_matmul()


def compile_mode(run: Running) -> Any:
    """The mode of the compiled wrapper the engine calls, from its Inductor settings (each
    mode is a pair of them: max_autotune, CUDA graphs)."""
    for runnable in run.runnables:
        if isinstance(runnable, torch._dynamo.eval_frame.OptimizedModule):
            settings = runnable.get_compiler_config() or {}
            autotune = bool(settings.get("max_autotune"))
            graphs = bool(settings.get("triton.cudagraphs"))
            if autotune:
                return "max-autotune" if graphs else "max-autotune-no-cudagraphs"
            return "reduce-overhead" if graphs else "default"
    return "none"


def attn_implementation(run: Running) -> Any:
    return _base(run.model).config._attn_implementation


def gradient_checkpointing(run: Running) -> Any:
    base = _base(run.model)
    # transformers 5.23 renamed it (the old name warns); 5.17 has only the old one
    if hasattr(type(base), "is_activation_checkpointing"):
        return bool(base.is_activation_checkpointing)
    return bool(base.is_gradient_checkpointing)


def innermost_optimizer(optimizer: Any) -> Any:
    """The optimizer that updates the weights, under its wrappers (accelerate's, and under
    it DeepSpeed's ZeRO optimizer holding the Trainer's own as ``optimizer``)."""
    inner = optimizer
    while getattr(inner, "optimizer", None) is not None:
        inner = inner.optimizer
    return inner


def optim(run: Running) -> Any:
    inner = innermost_optimizer(run.optimizer)
    kind = type(inner).__name__
    if kind == "AdamW":
        return "adamw_torch_fused" if inner.defaults.get("fused") else "adamw_torch"
    return {"AdamW8bit": "adamw_8bit", "Adafactor": "adafactor"}.get(kind, kind)


def quantization(run: Running) -> Any:
    settings = getattr(_base(run.model).config, "quantization_config", None)
    if settings is None:
        return "none"
    get = settings.get if isinstance(settings, Mapping) else lambda k: getattr(settings, k, None)
    return "4bit" if get("load_in_4bit") else "8bit" if get("load_in_8bit") else "none"


def devices(run: Running) -> Any:
    """Ranks in the process group that trained (1 without one)."""
    distributed = torch.distributed
    if distributed.is_available() and distributed.is_initialized():
        return distributed.get_world_size()
    return 1


def data_parallel(run: Running) -> Any:
    """The wrapper the model really trained in: DDP around it, FSDP2's module class on it
    with every parameter a DTensor shard (HF Trainer asked for FSDP on a CPU runs DDP), or
    DeepSpeed's engine with the ZeRO stage it runs (``deepspeed_stage``)."""
    from torch.distributed.fsdp import FSDPModule
    from torch.nn.parallel import DistributedDataParallel

    for wrapped in [*run.runnables, run.model]:
        inner = getattr(wrapped, "_orig_mod", wrapped)  # under a torch.compile wrapper
        if isinstance(inner, DistributedDataParallel):
            return "ddp"
        if isinstance(inner, FSDPModule):
            sharded = sharded_share(cast(torch.nn.Module, inner)) is not None
            return "fsdp2" if sharded else "fsdp2 (not sharded)"
        stage = deepspeed_stage(inner)
        if stage is not None:
            return stage
    return "none"


def deepspeed_stage(wrapped: Any) -> str | None:
    """What a DeepSpeed engine runs, read from the engine and the objects it made: "zero2"
    where its ZeRO optimizer partitions the fp32 master weights over the world's ranks,
    "zero3" where the module's parameters are partitioned too (``zero3_share``); anything
    else says what it is. None: not a DeepSpeed engine (deepspeed never imported: none)."""
    import sys

    if "deepspeed" not in sys.modules:
        return None
    from deepspeed import DeepSpeedEngine

    if not isinstance(wrapped, DeepSpeedEngine):
        return None
    stage = int(wrapped.zero_optimization_stage())
    world = torch.distributed.get_world_size()
    if stage == 3:
        share = zero3_share(wrapped.module)
        return "zero3" if share is not None and share < 1 else "zero3 (not partitioned)"
    partitions = getattr(wrapped.optimizer, "partition_count", None)
    if stage in (1, 2) and partitions is not None and set(partitions) != {world}:
        return f"zero{stage} (optimizer state in {sorted(set(partitions))} partitions)"
    return f"zero{stage}"


def zero3_share(model: torch.nn.Module) -> float | None:
    """This rank's share of the parameters' elements under ZeRO-3: a parameter released
    after its use holds only its partition here (``ds_tensor``; DeepSpeed's padding
    included), one kept whole (below the persistence threshold) all of its ``ds_numel``.
    None when no parameter is DeepSpeed's."""
    local = total = 0
    for parameter in model.parameters():
        whole = getattr(parameter, "ds_numel", None)
        if whole is None:
            return None
        partition = parameter.ds_tensor  # type: ignore[attr-defined]  # DeepSpeed's own
        local += partition.numel() if parameter.data.numel() == 0 else whole
        total += whole
    return local / total if total else None


def parameter_share(model: torch.nn.Module) -> float:
    """This rank's share of the parameters' elements: FSDP2's DTensor shards, ZeRO-3's
    partitions, 1.0 where the model is whole here (DDP, ZeRO-2)."""
    share = sharded_share(model)
    if share is None:
        share = zero3_share(model)
    return 1.0 if share is None else share


def sharded_share(model: torch.nn.Module) -> float | None:
    """This rank's share of the parameters' elements when every parameter is a DTensor
    sharded on the world's ranks; None when any is whole here."""
    from torch.distributed.tensor import DTensor, Shard

    local = total = 0
    for parameter in model.parameters():
        if not isinstance(parameter, DTensor):
            return None
        if not any(isinstance(p, Shard) for p in parameter.placements):
            return None
        local += parameter.to_local().numel()
        total += parameter.numel()
    return local / total if total else None


def dataset_max_length(run: Running) -> Any:
    """sweeper's own datasets (loop, trainer): the packed block, or where samples are cut;
    never less than the widest row a batch really had."""
    dataset = _torch_loader(run.loader).dataset
    block = getattr(dataset, "block", None)  # PackedStream
    if block is not None:
        cut = block
    elif getattr(dataset, "max_length", None) is not None:  # TokenizingDataset
        cut = dataset.max_length
    elif getattr(dataset, "keep", None) is not None:  # PretokenizedDataset
        cut = dataset.keep + len(dataset.suffix)
    else:
        return f"uncut (a batch was {run.widest_row} tokens wide)"
    return max(cut, run.widest_row)


def dataset_packing(run: Running) -> Any:
    return getattr(_torch_loader(run.loader).dataset, "block", None) is not None


def dataset_packing_strategy(run: Running) -> Any:
    """sweeper's own packing concatenates samples and cuts rows: TRL calls that 'wrapped'."""
    return "wrapped" if dataset_packing(run) else None


def args_packing_strategy(run: Running) -> Any:
    return run.args.packing_strategy if run.args.packing else None


def args_max_length(run: Running) -> Any:
    """SFTConfig's max_length after its defaults (or, padding-free, where sweeper cut the
    samples it gave TRL); never less than the widest row seen."""
    cut = run.args.max_length if run.args.max_length is not None else run.cut
    if cut is None:
        return f"uncut (a batch was {run.widest_row} tokens wide)"
    return max(cut, run.widest_row)


def args_packing(run: Running) -> Any:
    return bool(run.args.packing)


_COMMON: dict[str, Reader] = {
    "per_device_batch_size": batch_size,
    "gradient_accumulation_steps": micro_batches,
    "num_workers": num_workers,
    "prefetch_factor": prefetch_factor,
    "persistent_workers": persistent_workers,
    "multiprocessing_context": multiprocessing_context,
    "pin_memory": pin_memory,
    "precision": precision,
    "tf32": tf32,
    "compile_mode": compile_mode,
    "attn_implementation": attn_implementation,
    "gradient_checkpointing": gradient_checkpointing,
    "liger_kernel": liger_kernel,
    "optim": optim,
    "quantization": quantization,
    "devices": devices,
    "data_parallel": data_parallel,
    "padding_free": padding_free,
}
_OWN_DATA = {
    "max_seq_length": dataset_max_length,
    "packing": dataset_packing,
    "packing_strategy": dataset_packing_strategy,
}


def _needs(reader: Reader, *parts: str, how: str) -> Reader:
    """``reader`` where the script showed sweeper each of ``parts``; Unobserved otherwise."""

    def read(run: Running) -> Any:
        if any(getattr(run, part) is None for part in parts):
            return NotShown(f"not observed ({how})")
        return reader(run)

    return read


def script_batch_size(run: Running) -> Any:
    return batch_size(run) if run.loader is not None else run.first_rows


def script_max_length(run: Running) -> Any:
    """SFTConfig's max_length where the script has one, else the widest row a batch had:
    a script that ignores max_seq_length shows it in its batches' width."""
    if run.args is not None and getattr(run.args, "max_length", None) is not None:
        return args_max_length(run)
    return Unobserved(f"cut not observed (the widest batch was {run.widest_row} tokens)")


def script_compile_mode(run: Running) -> Any:
    """The compiled wrapper where the script shows it; a Trainer's callback sees the model
    before accelerate compiles it, so its arguments after their defaults say, else its
    Accelerator's dynamo plugin (an accelerate launch's ``--dynamo_backend``)."""
    mode = compile_mode(run)
    if mode == "none" and run.args is not None and getattr(run.args, "torch_compile", False):
        return run.args.torch_compile_mode or "default"
    if mode == "none" and run.args is not None:
        return _accelerator_compile_mode() or mode
    return mode


def _accelerator_compile_mode() -> str | None:
    """The mode this process's Accelerator compiles the model with in ``prepare`` (None: no
    Accelerator, or one that does not compile)."""
    if "accelerate" not in sys.modules:
        return None
    from accelerate.state import AcceleratorState  # type: ignore[import-untyped]

    plugin = AcceleratorState._shared_state.get("dynamo_plugin")
    if plugin is None or str(plugin.backend.value).upper() == "NO":
        return None
    return str(plugin.mode or "default")


def script_packing(run: Running) -> Any:
    if run.args is not None and hasattr(run.args, "packing"):
        return args_packing(run)
    return Unobserved("not observed (the script's own data; packing is not in its arguments)")


def script_packing_strategy(run: Running) -> Any:
    if run.args is not None and hasattr(run.args, "packing_strategy"):
        return args_packing_strategy(run)
    return Unobserved("not observed (the script's own data)")


_LOADER = "pass loader= to sweeper.step, or use Trainer"
_SCRIPT: dict[str, Reader] = {
    **{
        name: _needs(reader, "loader", how=_LOADER)
        for name, reader in _COMMON.items()
        if name
        in (
            "num_workers",
            "prefetch_factor",
            "persistent_workers",
            "multiprocessing_context",
            "pin_memory",
        )  # fmt: skip
    },
    "per_device_batch_size": script_batch_size,
    "gradient_accumulation_steps": micro_batches,
    "precision": precision,
    "tf32": tf32,
    "compile_mode": script_compile_mode,
    "attn_implementation": attn_implementation,
    "gradient_checkpointing": gradient_checkpointing,
    "optim": _needs(optim, "optimizer", how="pass optimizer= to sweeper.step"),
    "quantization": quantization,
    "devices": devices,
    "data_parallel": data_parallel,
    "max_seq_length": script_max_length,
    "packing": script_packing,
    "packing_strategy": script_packing_strategy,
    "liger_kernel": liger_kernel,
    "padding_free": _needs(padding_free, "loader", how=_LOADER),
}

# engine → knob → how its effective value is read back
READERS: dict[str, dict[str, Reader]] = {
    "loop": _COMMON | _OWN_DATA,
    "trainer": _COMMON | _OWN_DATA,
    "sft": _COMMON
    | {
        "max_seq_length": args_max_length,
        "packing": args_packing,
        "packing_strategy": args_packing_strategy,
    },
    "script": _SCRIPT,
}


@dataclass
class Readback:
    """Every knob's effective value, and the knobs whose value differs from the config's."""

    effective: dict[str, Any] = field(default_factory=dict)
    mismatches: list[str] = field(default_factory=list)


def read(engine: str, run: Running, config: Mapping[str, Any]) -> Readback:
    """Read every knob back; a knob that does not apply (None in the config) is recorded but
    not compared, since what the object holds then is its own default."""
    readers = READERS.get(engine, {})
    result = Readback()
    for knob in knobs.KNOBS:
        reader = readers.get(knob.name)
        if reader is None:
            raise TrialError(
                "error",
                f"engine {engine} has no read-back for knob {knob.name}: add one to "
                "sweeper/trial/engines/readback.py READERS before measuring with it",
            )
        value = reader(run)
        result.effective[knob.name] = value
        asked = config.get(knob.name)
        if knob.name == "max_seq_length" and asked is not None and run.widest_row > asked:
            # whatever the objects say, a batch wider than the cut says it was not applied
            result.mismatches.append(
                f"max_seq_length: asked {asked!r}, a batch was {run.widest_row} tokens wide"
            )
            continue
        if asked is not None and value != asked and not isinstance(value, Unobserved):
            result.mismatches.append(asked_ran(knob.name, asked, value))
    return result


def check(engine: str, run: Running, config: Mapping[str, Any]) -> dict[str, Any]:
    """The effective values, or a ``mismatch`` failure naming each knob that differs."""
    result = read(engine, run, config)
    if result.mismatches:
        raise TrialError(
            "mismatch",
            f"the {engine} engine did not run the config as asked (read back from what "
            f"trained): {'; '.join(result.mismatches)}"
            + (_script_fix(run, config, result.mismatches) if engine == "script" else ""),
        )
    return result.effective


def _script_fix(run: Running, config: Mapping[str, Any], mismatches: list[str]) -> str:
    """What a script whose run differs from the config does. A loop whose block held one
    batch where the config accumulates wraps each micro-batch, not the optimizer step (a
    walk's loop did, and read SCRIPT_FIX's trial_config() advice, which it already followed)."""
    asked = config.get("gradient_accumulation_steps")
    if any(m.startswith("data_parallel") for m in mismatches):
        # nothing wrapped the model for its ranks: a DataLoader's argument would not help (a
        # walk's SFTConfig on a CPU without use_cpu=True, which Trainer needs to join DDP there)
        wraps = (
            ". Nothing wrapped the model for its ranks: a Trainer (SFTTrainer) joins DDP by "
            "itself under torchrun on GPUs, and on a CPU only with `use_cpu=True` in its "
            "arguments"
            if run.args is not None
            else ". Nothing wrapped the model for its ranks: after "
            "`torch.distributed.init_process_group()`, wrap it: `model = "
            "torch.nn.parallel.DistributedDataParallel(model)` (FSDP: `fully_shard(model)`)"
        )
        others = [m for m in mismatches if not m.startswith("data_parallel")]
        return wraps + (SCRIPT_FIX if others else "")
    if run.args is not None or asked in (None, 1) or run.micro_batches != 1:
        return SCRIPT_FIX
    block = (
        f". {BLOCK_FIX}: it held one batch where "
        f"the config accumulates {asked}. Put the block around the whole step and pass its "
        "micro-batches as a list (`with sweeper.step(micro_batches, model=model, "
        "optimizer=optimizer, loader=loader):`, then backward each and step once)"
    )
    others = [m for m in mismatches if not m.startswith("gradient_accumulation_steps")]
    return block + (SCRIPT_FIX if others else "")


# what a user whose script ignores a knob does (a walk read the mismatch and did not know)
SCRIPT_FIX = (
    ". Your program set these itself: where it sets each (its DataLoader, its Trainer's "
    "arguments), take sweeper's value instead: `cfg = sweeper.trial_config()`, then e.g. "
    "`DataLoader(..., batch_size=cfg['per_device_batch_size'], "
    "num_workers=cfg['num_workers'])`, or the flags or environment the space's `knobs:` "
    "passes; or list only the value it uses in search:"
)


_GENERATION = re.compile(r"{%-?\s*generation\s*-?%}")


def has_generation_markers(template: str | None) -> bool:
    """Whether a chat template marks the assistant's replies (``{% generation %}``), which
    TRL's assistant_only_loss needs."""
    return bool(template and _GENERATION.search(template))
