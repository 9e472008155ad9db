"""The values knobs take, and what some of them become in the user's code.

The types are the knobs' value sets (``TrialConfig``'s and the space's fields use them). Beyond a
plain keyword argument, the ``sweeper.knobs`` table points here for a value that turns into several
``TrainingArguments`` fields (precision's bf16/fp16, compile's mode, sharding: FSDP2's fields or
DeepSpeed's ZeRO config) or into lines of an export (fp8's conversion, the padding-free
collator, Liger's patch of the plain loop), by place (``Knob.code``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import Field

CompileMode = Literal[
    "none", "default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"
]
AttnImplementation = Literal["eager", "sdpa", "flash_attention_2", "flex_attention"]
# fp8: the Linear layers' matmuls in float8 (torchao's float8 training, dynamic tensorwise
# scaling), everything else under bf16 autocast
Precision = Literal["fp32", "bf16", "fp16", "fp8"]
Optimizer = Literal["adamw_torch", "adamw_torch_fused", "adamw_8bit", "adafactor"]
Quantization = Literal["none", "4bit", "8bit"]
PackingStrategy = Literal["wrapped", "bfd", "bfd_split"]
# how N devices share the training: DDP (every rank holds the whole model), FSDP2 (parameters,
# gradients and optimizer state sharded: torch.distributed.fsdp.fully_shard), DeepSpeed ZeRO
# stages 2 and 3 (through accelerate)
DataParallel = Literal["ddp", "fsdp2", "zero2", "zero3"]

PositiveInt = Annotated[int, Field(gt=0)]
WorkerCount = Annotated[int, Field(ge=0)]
SeqLength = Annotated[int, Field(ge=8)]
WorkerStart = Literal["fork", "spawn", "forkserver"]


# what the dashboard and the printed recommendation add to a knob a script ran at its own value
OWN_LABEL = "your script's own"
# a knob whose value in the script's run sweeper did not see: it never reached the script (no
# flag, no variable, no sweeper.trial_config()) or could not be read back from what ran (a
# DataLoader or optimizer not given to sweeper.step); the value shown is the config's, not
# known to be what ran
UNREACHED_LABEL = "unseen: what your script ran here was not read back"
UNREACHED_WHY = (
    "sweeper did not see the value the trials ran: it gave your script none (not a flag or "
    "variable of your script's, or it never called sweeper.trial_config()), or could not "
    "read back what ran (pass loader= and optimizer= to sweeper.step)"
)


def as_ran(config: Mapping[str, Any], own_values: Mapping[str, Any] | None) -> dict[str, Any]:
    """A trial's config as it ran: the config it was asked (``TrialRow.config``, the study's
    key of it) with the values a script ran of the knobs it owns (``TrialRow.own_values``:
    not searched, not given to it) in their place. Every trial the recommendation, the
    exports, the REST API and the dashboard show as what ran goes through here.

    >>> as_ran({"precision": "fp32", "per_device_batch_size": 8}, {"precision": "bf16"})
    {'precision': 'bf16', 'per_device_batch_size': 8}
    >>> as_ran({"precision": "fp32"}, None)
    {'precision': 'fp32'}
    """
    return dict(config) | dict(own_values or {})


def deepspeed_config(stage: int) -> dict[str, Any]:
    """The DeepSpeed config a ZeRO stage runs with, as ``TrainingArguments(deepspeed=...)``
    takes it: "auto" where the Trainer fills the value from its own arguments (batch sizes
    and accumulation from the batch knobs, bf16/fp16 from ``precision``, clipping, bucket
    sizes and ZeRO-3's persistence threshold from the model's hidden size). No optimizer or
    scheduler section: the Trainer's own (``optim``) goes to DeepSpeed as a client optimizer.

    >>> deepspeed_config(3)["zero_optimization"]["stage"], deepspeed_config(2)["bf16"]
    (3, {'enabled': 'auto'})
    """
    zero: dict[str, Any] = {"stage": stage, "overlap_comm": True, "reduce_bucket_size": "auto"}
    if stage == 3:
        zero |= {
            "stage3_prefetch_bucket_size": "auto",
            "stage3_param_persistence_threshold": "auto",
            "stage3_gather_16bit_weights_on_model_save": True,
        }
    else:
        zero |= {"allgather_partitions": True, "contiguous_gradients": True}
    return {
        "zero_optimization": zero,
        "bf16": {"enabled": "auto"},
        "fp16": {"enabled": "auto"},
        "train_micro_batch_size_per_gpu": "auto",
        "train_batch_size": "auto",
        "gradient_accumulation_steps": "auto",
        "gradient_clipping": "auto",
    }


def data_parallel_args(value: str) -> dict[str, Any]:
    """TrainingArguments' sharding fields (DDP is what Trainer runs under torchrun without
    them; ZeRO: the DeepSpeed config as a dict, which accelerate's DeepSpeed plugin runs)."""
    if value == "fsdp2":
        return {"fsdp": "full_shard", "fsdp_config": {"fsdp_version": 2}}
    if value in ("zero2", "zero3"):
        return {"deepspeed": deepspeed_config(int(value[-1]))}
    return {}


def precision_args(value: str) -> dict[str, Any]:
    # fp8: what is not a converted Linear runs under bf16 autocast, as torchao's recipes do
    return {"bf16": value in ("bf16", "fp8"), "fp16": value == "fp16"}


def precision_code(value: str) -> Mapping[str, tuple[str, ...]]:
    if value != "fp8":
        return {}
    return {
        "model": (
            "# fp8: torchao's float8 training; Linear layers whose dimensions are not multiples",
            "# of 16 (and the LM head) stay bf16. Check it converted: count Float8Linear modules",
            "from torchao.float8 import Float8Linear, convert_to_float8_training",
            "",
            "convert_to_float8_training(model, module_filter_fn=lambda module, name: name != "
            "'lm_head' and module.in_features % 16 == 0 and module.out_features % 16 == 0)",
            "assert any(isinstance(m, Float8Linear) for m in model.modules()), 'fp8 fell back'",
        )
    }


def padding_free_code(value: bool) -> Mapping[str, tuple[str, ...]]:
    if not value:
        return {}
    flatten = (
        "# padding-free: each batch's samples concatenated in one row, position ids restarting",
        "# per sample, no attention mask: the attention kernel separates the samples (flash",
        "# attention; sdpa/eager/flex through transformers' packed-sequence mask). Keep",
        "# use_cache=False: a cache turns the packed-sequence detection off",
        "from transformers import DataCollatorWithFlattening",
    )
    return {
        # the export's own data lines then say `collate = DataCollatorWithFlattening()` and
        # pass it as the Trainer's data_collator
        "trainer": flatten,
        "sft": (
            "# padding_free: TRL does not cut samples without packing (max_length=None): give it",
            "# samples already cut at max_seq_length (input_ids), as the trials did",
        ),
        # the DataLoader's collate_fn, and what the export says above it
        "collate_fn": ("DataCollatorWithFlattening()",),
        "loader": (
            *flatten,
            "# dataset: samples as {'input_ids': ids} (and 'labels'), cut at max_seq_length",
        ),
    }


def liger_code(value: bool) -> Mapping[str, tuple[str, ...]]:
    if not value:
        return {}
    return {
        "loop": (
            "    from liger_kernel.transformers import _apply_liger_kernel_to_instance",
            "",
            "    _apply_liger_kernel_to_instance(model=model)  # what use_liger_kernel=True does",
        )
    }


def compile_args(value: str) -> dict[str, Any]:
    if value == "none":
        return {"torch_compile": False}
    return {"torch_compile": True, "torch_compile_mode": value}
