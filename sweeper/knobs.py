"""The knobs a sweep turns, declared once.

Each ``Knob`` says what values it takes, when it applies (``active``), what a machine needs to run
a value (``needs``), what it falls back to where none of its values can run, how it reads in a
table, and what it becomes in the user's ``TrainingArguments`` and ``DataLoader``. From this one
table come the search space's lists, the Optuna parameters, the grid, the baseline checks,
preflight's machine checks, the exports and the labels; the config types (``TrialConfig``,
``sweeper.space_search.SearchSpace`` and ``sweeper.space.Baseline``) are written out, so a type
checker reads them, and tests/test_knobs.py checks each field against this table.

Adding a knob is one entry here, its field in those three classes (the test names what is
missing), its effect in the engines (``sweeper/trial/engines``) and its read-back there
(``readback.READERS``: how each engine reads the value that really ran; a trial of an engine
without one fails, and a test checks every knob × engine pair). What a value needs beyond
keyword arguments in an export (a collator, a model conversion, a patch in the loop) is its
``code``, by place, which every export reads (the value types, and what a value becomes
beyond a keyword, are in ``sweeper.knob_values``). The ``trainer`` and ``sft``
keywords say every value, defaults included: SFTConfig's defaults are not TrainingArguments'
(it turns gradient checkpointing on), so nothing is left to them.

>>> [k.name for k in KNOBS][:3]
['per_device_batch_size', 'gradient_accumulation_steps', 'num_workers']
>>> describe({"per_device_batch_size": 8, "gradient_accumulation_steps": 2, "num_workers": 0,
...           "max_seq_length": 512, "attn_implementation": "sdpa", "compile_mode": "none"})
'bs8×ga2 seq512 w0 sdpa compile=none'
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, model_validator

from sweeper.knob_values import (
    AttnImplementation,
    CompileMode,
    DataParallel,
    Optimizer,
    PackingStrategy,
    PositiveInt,
    Precision,
    Quantization,
    SeqLength,
    WorkerCount,
    WorkerStart,
    compile_args,
    data_parallel_args,
    liger_code,
    padding_free_code,
    precision_args,
    precision_code,
)

# What a machine may lack; preflight learns each from a probe child (``capabilities``).
Capability = Literal["cuda", "bitsandbytes", "deepspeed", "liger", "fp8", "cuda_graphs"]
CAPABILITY_NEEDS = {
    "cuda": "needs a CUDA device",
    "bitsandbytes": "needs bitsandbytes with a CUDA device",
    "deepspeed": "needs deepspeed and accelerate",
    "liger": "needs liger-kernel and Triton on a CUDA device",
    "fp8": "needs torchao and a CUDA device of compute capability 8.9 or newer (Ada, Hopper)",
    "cuda_graphs": "needs CUDA graphs, so a CUDA device (elsewhere the mode compiles as "
    "'default' does: there is nothing of its own to measure)",
}

FREE = "free"  # a knob's ``memory``: its value does not change the device's peak memory


def _with_workers(config: Mapping[str, Any]) -> bool:
    return bool(config.get("num_workers"))


def _packed(config: Mapping[str, Any]) -> bool:
    return bool(config.get("packing"))


def _unpacked(config: Mapping[str, Any]) -> bool:
    return not config.get("packing")


# the engines that train on several devices: the plain loop (DDP, FSDP2), transformers'
# Trainer and TRL's SFTTrainer (accelerate wraps the model as TrainingArguments say; the
# read-back judges what ran), and a user's script (one copy per rank with torchrun's
# environment; the hook in each rank records its steps)
MULTI_DEVICE_ENGINES = ("loop", "trainer", "sft", "script")


# DeepSpeed's ZeRO stages, and the engines that run them: TrainingArguments(deepspeed=...)
# makes accelerate wrap the model in DeepSpeed's engine (the plain loop wraps ddp and fsdp2)
ZERO_STAGES = ("zero2", "zero3")
ZERO_ENGINES = ("trainer", "sft")


def _several_devices(config: Mapping[str, Any]) -> bool:
    return (config.get("devices") or 1) > 1


@dataclass(frozen=True, kw_only=True)
class Knob:
    """One knob. ``value_type`` is the pydantic type of one value; ``default`` is the value a
    config takes when it does not say (configs stored before the knob existed, a baseline that
    leaves it out) and, as a one-item list, the search space's default; ``required`` knobs have
    no default and must be listed in ``search:``."""

    name: str
    value_type: Any
    label: str
    help: str
    default: Any = None
    required: bool = False
    # the knob applies only when this holds for the rest of the config; otherwise its value
    # is None (``inactive`` says why, for errors)
    active: Callable[[Mapping[str, Any]], bool] | None = None
    inactive: str = ""
    # value → what a machine needs to run it; preflight drops a value the machine lacks
    needs: Mapping[Any, Capability] = field(default_factory=dict)
    # the value that runs anywhere, used where none of the listed values can (tf32 on a CPU)
    fallback: Any = None
    # how the value reads in a compact config line (None: leave the knob out)
    short: Callable[[Any], str | None] = lambda value: None
    # what the value becomes in transformers.TrainingArguments / torch DataLoader
    trainer: Callable[[Any], dict[str, Any]] = lambda value: {}
    dataloader: Callable[[Any], dict[str, Any]] = lambda value: {}
    # why a change of this knob is more than a speed-up (the recommendation says so when the
    # winner's value differs from the baseline's)
    caveat: str = ""
    # what the value adds in TRL's SFTConfig (beyond TrainingArguments)
    sft: Callable[[Any], dict[str, Any]] = lambda value: {}
    # how the value weighs on the device's peak memory: a rank (higher: at least as much
    # memory, the rest of the config equal), FREE (it does not change peak memory), or None
    # (unknown: only the same value is known to weigh the same). A config that is at least as
    # heavy as one that ran out of memory on every knob is not run (``sweeper.search``).
    memory: Callable[[Any], float] | str | None = None
    # lines the exports add for the value, by place: "model" (after the model is loaded: the
    # trainer and sft exports), "trainer" / "sft" (beside their arguments), "loop" (in the
    # loop's prepare(model), indented), "loader" (above the DataLoader), "collate_fn" (the
    # DataLoader's collate_fn, one Python expression)
    code: Callable[[Any], Mapping[str, tuple[str, ...]]] = lambda value: {}

    def is_active(self, config: Mapping[str, Any]) -> bool:
        return self.active is None or self.active(config)

    def choices(self) -> tuple[Any, ...] | None:
        """The values a Literal knob allows (None: an open type such as int)."""
        if getattr(self.value_type, "__origin__", None) is Literal:
            return get_args(self.value_type)
        if self.value_type is bool:
            return (False, True)
        return None


KNOBS: tuple[Knob, ...] = (
    Knob(
        name="per_device_batch_size",
        value_type=PositiveInt,
        label="batch size",
        help="samples (rows) per forward pass on one device",
        required=True,
        short=lambda v: f"b{v}",
        trainer=lambda v: {"per_device_train_batch_size": v},
        dataloader=lambda v: {"batch_size": v},
        memory=lambda v: v,
    ),
    Knob(
        name="gradient_accumulation_steps",
        value_type=PositiveInt,
        label="grad. accumulation",
        help="forward/backward passes per optimizer step",
        required=True,
        short=lambda v: f"×{v}",
        trainer=lambda v: {"gradient_accumulation_steps": v},
        memory=FREE,  # micro-batches reuse the same activation and gradient buffers
    ),
    Knob(
        name="num_workers",
        value_type=WorkerCount,
        label="workers",
        help="DataLoader worker processes (0: the training process loads data itself)",
        required=True,
        short=lambda v: f"w{v}",
        trainer=lambda v: {"dataloader_num_workers": v},
        dataloader=lambda v: {"num_workers": v},
        memory=FREE,
    ),
    Knob(
        name="prefetch_factor",
        value_type=PositiveInt,
        label="prefetch",
        help="batches each worker loads ahead",
        default=2,
        active=_with_workers,
        inactive="it only applies with num_workers > 0",
        short=lambda v: f"pf{v}",
        trainer=lambda v: {"dataloader_prefetch_factor": v},
        dataloader=lambda v: {"prefetch_factor": v},
        memory=FREE,
    ),
    Knob(
        name="persistent_workers",
        value_type=bool,
        label="persistent workers",
        help="keep DataLoader workers alive between epochs",
        default=False,
        active=_with_workers,
        inactive="it only applies with num_workers > 0",
        short=lambda v: "persist" if v else None,
        trainer=lambda v: {"dataloader_persistent_workers": v},
        dataloader=lambda v: {"persistent_workers": v},
        memory=FREE,
    ),
    Knob(
        name="multiprocessing_context",
        value_type=WorkerStart,
        label="worker start",
        help="how DataLoader workers start: fork (Linux's default) or spawn/forkserver (a "
        "fresh interpreter per worker: slower to start, safe with threads and CUDA)",
        default="fork",
        active=_with_workers,
        inactive="it only applies with num_workers > 0",
        short=lambda v: None if v == "fork" else v,
        # TrainingArguments has no such argument: the Trainer engines run fork only
        dataloader=lambda v: {} if v == "fork" else {"multiprocessing_context": v},
        memory=FREE,
    ),
    Knob(
        name="pin_memory",
        value_type=bool,
        label="pin memory",
        help="page-locked host batches, copied to the GPU asynchronously",
        default=False,
        needs={True: "cuda"},
        fallback=False,
        short=lambda v: "pinned" if v else None,
        # TrainingArguments pins by default: say it either way
        trainer=lambda v: {"dataloader_pin_memory": v},
        dataloader=lambda v: {"pin_memory": v},
        memory=FREE,
    ),
    Knob(
        name="max_seq_length",
        value_type=SeqLength,
        label="max seq length",
        help="tokens per row: samples are cut here, or packed into rows this long",
        required=True,
        short=lambda v: f"seq{v}",
        sft=lambda v: {"max_length": v},
        memory=lambda v: v,
    ),
    Knob(
        name="packing",
        value_type=bool,
        label="packing",
        help="concatenate samples into max_seq_length rows (no padding, no truncation); the "
        "run's work is then counted in tokens",
        default=False,
        short=lambda v: "packed" if v else None,
        caveat="packed rows attend across sample boundaries unless the attention kernel "
        "separates them (TRL's padding-free packing with flash attention does)",
        sft=lambda v: {"packing": v},
        memory=lambda v: int(bool(v)),  # packed rows are all full length
    ),
    Knob(
        name="packing_strategy",
        value_type=PackingStrategy,
        label="packing strategy",
        help="how packed rows are filled: wrapped (samples concatenated and cut into rows; a "
        "long sample continues in the next row, no token is lost; sweeper's own packing and "
        "TRL's 'wrapped'), bfd (TRL's default best-fit decreasing: samples stay whole within "
        "a row and what overflows max_seq_length is DROPPED), bfd_split (best-fit decreasing "
        "that splits an overflowing sample instead of dropping it); bfd and bfd_split are "
        "TRL's (engine: sft)",
        default="wrapped",
        active=_packed,
        inactive="it only applies with packing: true",
        short=lambda v: None if v == "wrapped" else v,
        caveat="bfd keeps each sample within one row but drops the tokens beyond "
        "max_seq_length; wrapped and bfd_split keep every token",
        sft=lambda v: {"packing_strategy": v},
        memory=FREE,
    ),
    Knob(
        name="padding_free",
        value_type=bool,
        label="padding-free",
        help="each batch's samples concatenated in one row without padding, position ids "
        "restarting per sample and no cross-sample attention (transformers' "
        "DataCollatorWithFlattening, TRL's padding_free); the attention kernel must separate "
        "the samples: each trial checks that it does on the model it trains",
        default=False,
        active=_unpacked,
        inactive="packed rows hold no padding already (packing: true)",
        short=lambda v: "padfree" if v else None,
        caveat="padding-free only pays where batches held padding and the kernel skips the "
        "masked-out blocks (flash attention); at batch size 1 there is nothing to remove, and "
        "sdpa/eager compute the whole row's scores and mask them",
        # after max_seq_length: TRL refuses max_length without packing when padding-free
        sft=lambda v: {"padding_free": True, "max_length": None} if v else {},  # as Liger's
        memory=lambda v: 0 if v else 1,  # no pad tokens' activations
        code=padding_free_code,
    ),
    Knob(
        name="precision",
        value_type=Precision,
        label="precision",
        help="fp32, or bf16/fp16 autocast (weights stay fp32, as Trainer's bf16=True), or fp8: "
        "torchao's float8 training of the Linear layers (dimensions multiples of 16, not the "
        "LM head), the rest under bf16 autocast",
        default="fp32",
        needs={"fp8": "fp8"},
        fallback="fp32",
        short=lambda v: None if v == "fp32" else v,
        caveat="the arithmetic changes: compare the loss of a short run (fp16 needs loss "
        "scaling and can overflow; bf16 keeps fp32's range with fewer mantissa bits; fp8 "
        "pays a cast per matmul, which small matrices (~1B models) do not earn back: torchao "
        "measures 0.8x there; the trial fails as a mismatch when nothing was converted)",
        # said when False too: SFTConfig turns bf16 on by default (TrainingArguments does not)
        trainer=precision_args,
        memory=lambda v: 1 if v == "fp32" else 0,  # fp32 activations weigh twice as much
        code=precision_code,
    ),
    Knob(
        name="tf32",
        value_type=bool,
        label="TF32",
        help="TF32 tensor-core matmuls for fp32 math (CUDA, Ampere and newer)",
        default=False,
        needs={True: "cuda"},
        fallback=False,
        short=lambda v: "tf32" if v else None,
        trainer=lambda v: {"tf32": v},
        memory=FREE,
    ),
    Knob(
        name="compile_mode",
        value_type=CompileMode,
        label="torch.compile",
        help="torch.compile mode (none: eager); reduce-overhead adds CUDA graphs",
        default="none",
        needs={"reduce-overhead": "cuda_graphs"},
        fallback="none",
        short=lambda v: None if v == "none" else f"compile:{v}",
        caveat="compiled graphs are specialised to input shapes: padded batches of varying "
        "width recompile, and reduce-overhead records a CUDA graph per shape (its static "
        "memory pool included), which can eat the whole gain in real training",
        trainer=compile_args,
    ),
    Knob(
        name="attn_implementation",
        value_type=AttnImplementation,
        label="attention",
        help="the model's attention kernel (from_pretrained's attn_implementation)",
        default="sdpa",
        short=lambda v: v,
        memory=lambda v: 1 if v == "eager" else 0,  # eager materializes the score matrix
    ),
    Knob(
        name="gradient_checkpointing",
        value_type=bool,
        label="grad. checkpointing",
        help="recompute activations in the backward pass: less memory, more compute",
        default=False,
        short=lambda v: "ckpt" if v else None,
        # every transformers 5.x takes this name (5.23 also calls it activation_checkpointing);
        # said when False too: SFTConfig's default is True
        trainer=lambda v: {"gradient_checkpointing": v},
        memory=lambda v: 0 if v else 1,
    ),
    Knob(
        name="liger_kernel",
        value_type=bool,
        label="Liger kernels",
        help="Liger's Triton kernels in the model (RMSNorm, RoPE, SwiGLU, fused linear "
        "cross-entropy that never holds the logits): TrainingArguments' use_liger_kernel",
        default=False,
        needs={True: "liger"},
        fallback=False,
        short=lambda v: "liger" if v else None,
        caveat="Liger's gains are reported on 8B models at large batch; at small batch it "
        "can run slower than the plain model, and its fused loss changes the numerics a little",
        # said only when on: TrainingArguments' default is off, and a script's own parser
        # (knobs: flags) need not know the flag until it searches it
        trainer=lambda v: {"use_liger_kernel": True} if v else {},
        memory=lambda v: 0 if v else 1,  # the fused loss never materialises the logits
        code=liger_code,
    ),
    Knob(
        name="optim",
        value_type=Optimizer,
        label="optimizer",
        help="TrainingArguments' optim: AdamW (torch, its fused kernel, bitsandbytes 8-bit) "
        "or Adafactor",
        default="adamw_torch",
        # torch's fused AdamW runs on the CPU too (since torch 2.4; sweeper needs 2.11): a
        # walk's own SFTConfig(optim="adamw_torch_fused") trained there while preflight dropped it
        needs={"adamw_8bit": "bitsandbytes"},
        fallback="adamw_torch",
        short=lambda v: None if v == "adamw_torch" else v,
        caveat="a different optimizer (or its 8-bit state) converges differently: compare the "
        "loss of a short run before trusting the $/run, which assumes the same number of steps",
        trainer=lambda v: {"optim": v},
        memory=lambda v: {"adamw_torch": 2, "adamw_torch_fused": 2, "adamw_8bit": 1}.get(v, 0),
    ),
    Knob(
        name="quantization",
        value_type=Quantization,
        label="quantization",
        help="the frozen base weights loaded in 4-bit NF4 or 8-bit through bitsandbytes (QLoRA; "
        "needs workload.adapter, since quantized weights cannot be trained directly)",
        default="none",
        needs={"4bit": "bitsandbytes", "8bit": "bitsandbytes"},
        fallback="none",
        short=lambda v: None if v == "none" else f"q{v}",
        caveat="quantized base weights change the model's outputs: compare the loss of a short "
        "run, and the memory it frees only pays if a larger batch then fits",
        memory=lambda v: {"none": 2, "8bit": 1, "4bit": 0}[v],
    ),
    Knob(
        name="devices",
        value_type=PositiveInt,
        label="devices",
        help="devices one trial trains on, one process (rank) each, launched as torchrun "
        "--nproc-per-node does (gloo ranks on the CPU, NCCL on CUDA); samples/s is the "
        "group's, from its slowest rank",
        default=1,
        fallback=1,  # where preflight drops every listed count (too few GPUs)
        short=lambda v: None if v == 1 else f"{v}dev",
        caveat="the global batch is per_device_batch_size × gradient_accumulation_steps × "
        "devices: the learning rate that suited one device may not suit it",
        # per device: the same (DDP) or less (sharded), depending on data_parallel
        memory=None,
    ),
    Knob(
        name="data_parallel",
        value_type=DataParallel,
        label="data parallel",
        help="how the devices share the training: ddp (each holds the whole model, gradients "
        "all-reduced), fsdp2 (parameters, gradients and optimizer state sharded: "
        "fully_shard), zero2/zero3 (DeepSpeed ZeRO through accelerate)",
        default="ddp",
        active=_several_devices,
        inactive="it only applies with devices > 1",
        needs={"zero2": "deepspeed", "zero3": "deepspeed"},
        fallback="ddp",
        short=lambda v: v,
        trainer=data_parallel_args,
        memory=lambda v: {"ddp": 2, "zero2": 1, "fsdp2": 0, "zero3": 0}[v],
    ),
)

KNOB = {knob.name: knob for knob in KNOBS}
NAMES = tuple(KNOB)


class _Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class _ConfigBase(_Frozen):
    """One point of the search space: what a trial runs. Knobs added later have defaults, so
    configs stored before them still load; a knob that does not apply is None."""

    @model_validator(mode="before")
    @classmethod
    def _conditions(cls, data: Any) -> Any:
        return normalize(data) if isinstance(data, Mapping) else data


class TrialConfig(_ConfigBase):
    """A trial's config, one field per knob in ``KNOBS``' order: a required knob has no
    default, a conditional one (``active``) is None where it does not apply, the others take
    their ``default``. tests/test_knobs.py checks the fields against ``KNOBS``; adding a knob
    adds its field here."""

    per_device_batch_size: PositiveInt
    gradient_accumulation_steps: PositiveInt
    num_workers: WorkerCount
    prefetch_factor: PositiveInt | None = None
    persistent_workers: bool | None = None
    multiprocessing_context: WorkerStart | None = None
    pin_memory: bool = False
    max_seq_length: SeqLength
    packing: bool = False
    packing_strategy: PackingStrategy | None = None
    padding_free: bool | None = None
    precision: Precision = "fp32"
    tf32: bool = False
    compile_mode: CompileMode = "none"
    attn_implementation: AttnImplementation = "sdpa"
    gradient_checkpointing: bool = False
    liger_kernel: bool = False
    optim: Optimizer = "adamw_torch"
    quantization: Quantization = "none"
    devices: PositiveInt = 1
    data_parallel: DataParallel | None = None

    @property
    def effective_batch(self) -> int:
        """Samples per optimizer step over every device (the global batch)."""
        return self.per_device_batch_size * self.gradient_accumulation_steps * self.devices


def normalize(values: Mapping[str, Any]) -> dict[str, Any]:
    """A config's values with inactive knobs set to None and missing optional ones defaulted.

    >>> normalize({"num_workers": 0, "prefetch_factor": 4})["prefetch_factor"] is None
    True
    """
    out = dict(values)
    for knob in KNOBS:
        if not knob.required and knob.name not in out and knob.active is None:
            out[knob.name] = knob.default
    for knob in KNOBS:
        if not knob.is_active(out):
            out[knob.name] = None
        elif knob.active is not None and out.get(knob.name) is None:
            out[knob.name] = knob.default
    return out


def in_order(config: Mapping[str, Any]) -> dict[str, Any]:
    """The config with its knobs in the order they are declared (Postgres's JSONB stores an
    object's keys in its own order), any other keys after them.

    >>> list(in_order({"tf32": False, "optim": "sgd", "per_device_batch_size": 2, "x": 1}))
    ['per_device_batch_size', 'tf32', 'optim', 'x']
    """
    ordered = {name: config[name] for name in NAMES if name in config}
    return ordered | {k: v for k, v in config.items() if k not in ordered}


def inactive_problem(config: Mapping[str, Any]) -> str | None:
    """Why a config sets a knob that does not apply, or leaves out one that does."""
    for knob in KNOBS:
        if knob.active is None:
            continue
        value = config.get(knob.name)
        if not knob.is_active(config) and value is not None:
            return f"{knob.name} must be null here: {knob.inactive}"
        if knob.is_active(config) and value is None:
            return f"{knob.name} is missing (it applies to this config)"
    return None


# the head of a config line, in this order; the other knobs follow where they say something
_HEAD = ("per_device_batch_size", "max_seq_length", "num_workers", "attn_implementation")


def describe(config: Mapping[str, Any]) -> str:
    """A compact line for tables and logs.

    >>> describe({"per_device_batch_size": 8, "gradient_accumulation_steps": 2,
    ...           "num_workers": 2, "prefetch_factor": 4, "max_seq_length": 512,
    ...           "attn_implementation": "sdpa", "compile_mode": "none", "packing": True,
    ...           "precision": "bf16", "optim": "adamw_torch_fused"})
    'bs8×ga2 seq512 w2/pf4 sdpa compile=none packed bf16 adamw_torch_fused'
    """
    get = config.get
    head = [
        f"bs{get('per_device_batch_size', '?')}×ga{get('gradient_accumulation_steps', '?')}",
        f"seq{get('max_seq_length', '?')}",
        f"w{get('num_workers', '?')}"
        + (f"/pf{get('prefetch_factor')}" if get("prefetch_factor") else ""),
        str(get("attn_implementation", "?")),
        f"compile={get('compile_mode', '?')}",
    ]
    tail = []
    for knob in KNOBS:
        value = get(knob.name)
        if knob.name in (*_HEAD, "gradient_accumulation_steps", "prefetch_factor", "compile_mode"):
            continue
        if value is not None and (text := knob.short(value)) is not None:
            tail.append(text)
    return " ".join(head + tail)


def _arguments(config: Mapping[str, Any], target: str) -> dict[str, Any]:
    """The keywords each applying knob of ``config`` adds to ``target`` (a Knob mapping)."""
    kwargs: dict[str, Any] = {}
    for knob in KNOBS:
        value = config.get(knob.name)
        if value is not None and knob.is_active(config):
            kwargs.update(getattr(knob, target)(value))
    return kwargs


def trainer_arguments(config: Mapping[str, Any]) -> dict[str, Any]:
    """``TrainingArguments`` keywords for every knob of ``config`` that has one."""
    return _arguments(config, "trainer")


def sft_arguments(config: Mapping[str, Any]) -> dict[str, Any]:
    """``trl.SFTConfig`` keywords beyond ``TrainingArguments``' (max_length, packing)."""
    return _arguments(config, "sft")


def dataloader_arguments(config: Mapping[str, Any]) -> dict[str, Any]:
    """``torch.utils.data.DataLoader`` keywords for every knob of ``config`` that has one."""
    return _arguments(config, "dataloader")


def code_lines(config: Mapping[str, Any], place: str) -> list[str]:
    """The lines each applying knob of ``config`` adds to an export at ``place`` (``Knob.code``).

    >>> code_lines({"liger_kernel": True}, "loop")[-1].strip()
    '_apply_liger_kernel_to_instance(model=model)  # what use_liger_kernel=True does'
    """
    lines: list[str] = []
    for knob in KNOBS:
        value = config.get(knob.name)
        if value is not None and knob.is_active(config):
            lines += knob.code(value).get(place, ())
    return lines


def machine_drops(
    search_values: Mapping[str, list[Any]], capabilities: Mapping[str, str | None]
) -> dict[str, dict[str, str]]:
    """Values this machine cannot run, knob → value → reason. ``capabilities`` maps each
    capability to None (present) or why it is missing.

    >>> machine_drops({"tf32": [False, True]}, {"cuda": "the trial device is the CPU"})
    {'tf32': {'True': 'needs a CUDA device (the trial device is the CPU)'}}
    """
    dropped: dict[str, dict[str, str]] = {}
    for name, values in search_values.items():
        knob = KNOB[name]
        for value in values:
            need = knob.needs.get(value)
            if need is None:
                continue
            missing = capabilities.get(need, "not checked")
            if missing is not None:
                dropped.setdefault(name, {})[str(value)] = f"{CAPABILITY_NEEDS[need]} ({missing})"
    return dropped


# SFTConfig fields whose None no flag can say: HfArgumentParser parses an ``int | None`` field
# with a non-None default as a plain int (transformers 5.23: max_length's type is int, default
# 1024; "None" is no int), so a left-out flag keeps the default instead
_NO_NONE_FLAG = {"max_length": "SFTConfig's max_length (default 1024)"}


def flag_problems(config: Mapping[str, Any], form: str) -> list[str]:
    """What ``config`` asks of a script that its knobs form (``workload.script.knobs``) cannot
    say as flags (empty: every argument can be said).

    >>> flag_problems({"padding_free": True, "packing": False}, "sft_flags")[0][:65]
    'padding_free=True is SFTConfig(padding_free=True, max_length=None'
    """
    if form != "sft_flags":
        return []
    problems = []
    for knob in KNOBS:
        value = config.get(knob.name)
        if value is None or not knob.is_active(config):
            continue
        for key, argument in knob.sft(value).items():
            if argument is None and key in _NO_NONE_FLAG:
                said = ", ".join(f"{k}={v!r}" for k, v in knob.sft(value).items())
                problems.append(
                    f"{knob.name}={value!r} is SFTConfig({said}), and no command-line flag "
                    f"says {key}=None to {_NO_NONE_FLAG[key]}: HfArgumentParser parses it "
                    "as an int, so left out it stays at its default and TRL refuses the "
                    "combination. Use knobs: env and build SFTConfig from "
                    f"sweeper.trial_config() in the script, or leave {knob.name} out of "
                    "the search"
                )
    return problems


# knobs whose flag is the user's own parser's (a dataclass of theirs beside TrainingArguments),
# not TrainingArguments': a trial gives the flag its value when the command already says it,
# so the script evidently takes it (a walk's train.py cut at its own --max_seq_length 1536
# while the trials recorded sweeper's 2432, and "truncates 0.0%")
OWN_PARSER_FLAGS: dict[str, tuple[str, ...]] = {"max_seq_length": ("max_seq_length", "max_length")}


def said_flags(
    config: Mapping[str, Any], command: Sequence[str], given: Sequence[str]
) -> list[str]:
    """Flags for ``OWN_PARSER_FLAGS``' knobs that ``command`` already says (``--name value``
    or ``--name=value``), with the config's values; none already in ``given`` (the knobs
    form's own flags, ``command_flags``).

    >>> said_flags({"max_seq_length": 2048}, ["python", "t.py", "--max_seq_length=512"], [])
    ['--max_seq_length', '2048']
    >>> said_flags({"max_seq_length": 2048}, ["python", "t.py", "--max_length", "512"],
    ...            ["--max_length", "2048"]), said_flags({"max_seq_length": 2048}, ["t.py"], [])
    ([], [])
    """
    words: list[str] = []
    for knob, names in OWN_PARSER_FLAGS.items():
        value = config.get(knob)
        if value is None:
            continue
        for name in names:
            flag = f"--{name}"
            if flag not in given and any(w == flag or w.startswith(f"{flag}=") for w in command):
                words += [flag, str(value)]
    return words


def command_flags(config: Mapping[str, Any], form: str) -> list[str]:
    """The config as command-line flags in HfArgumentParser's form, for a user's script
    (``workload.script.knobs``): flags: TrainingArguments' fields; sft_flags: SFTConfig's too
    (max_length, packing); env: none. An argument whose value is None is left out, keeping
    its default, which is None for each such TrainingArguments field; a None no flag can say
    (``flag_problems``) is a ValueError rather than the default said instead.

    >>> command_flags({"per_device_batch_size": 8, "precision": "bf16", "num_workers": 0},
    ...               "flags")  # doctest: +NORMALIZE_WHITESPACE
    ['--per_device_train_batch_size', '8', '--dataloader_num_workers', '0', '--bf16', 'True',
     '--fp16', 'False']
    """
    if form == "env":
        return []
    problems = flag_problems(config, form)
    if problems:
        raise ValueError("; ".join(problems))
    arguments = trainer_arguments(config)
    if form == "sft_flags":
        arguments |= sft_arguments(config)
    words: list[str] = []
    for key, value in arguments.items():
        if value is not None:  # a dict (fsdp_config) as the JSON TrainingArguments parses
            words += [f"--{key}", json.dumps(value) if isinstance(value, dict) else str(value)]
    return words
