"""The model-loading lines of an export (``sweeper.export``): the model with the trial's
attention kernel, its quantized base weights and its LoRA adapter, as the trial loaded them."""

from __future__ import annotations

from typing import Any

from sweeper import knobs
from sweeper.export_data import space_of
from sweeper.job import AdapterSpec
from sweeper.recommendation import Recommendation


def model_lines(config: dict[str, Any], space_yaml: str, rec: Recommendation | None = None) -> str:
    """Loading the model as the trial did: its attention kernel, its quantized base weights
    and its LoRA adapter; a script's own adapter (``rec`` trained fewer parameters than the
    model has, with no ``workload.adapter``) said, not left out silently."""
    space = space_of(space_yaml)
    model_id = space.workload.model.id if space is not None else None
    adapter = space.workload.adapter if space is not None else None
    lines = [
        f"MODEL_ID = {model_id!r}"
        if model_id
        else 'MODEL_ID = "your-org/your-model"  # the hub id or local path of the model you train'
    ]
    loading = [f"    MODEL_ID, attn_implementation={config['attn_implementation']!r},"]
    if quantized(config):
        lines += quantization_lines(config)
        loading.append("    quantization_config=quantization, device_map={'': 0},")
    lines += ["model = AutoModelForCausalLM.from_pretrained(", *loading, ")"]
    if adapter is not None:
        lines += adapter_lines(config, adapter)
    elif rec is not None and (own := own_adapter(rec)):
        lines += own
    lines += knobs.code_lines(config, "model")
    return "\n".join(lines) + "\n"


def own_adapter(rec: Recommendation) -> list[str]:
    """What to say where the trial trained a part of the model that the space does not
    describe (a script's own peft LoRA: a walk's snippet fine-tuned the whole model, where
    the trial trained 28.7K of 184K parameters)."""
    if rec.n_params is None or rec.trainable_params is None:
        return []
    if rec.trainable_params >= rec.n_params:
        return []
    return [
        f"# the trial {rec.trainable_text()}:",
        "# an adapter of your program's own (peft's LoRA, say), which this snippet does not",
        "# build; give the model the same one to train what was measured, e.g.",
        "# model = peft.get_peft_model(model, your_lora_config), or SFTTrainer(..., "
        "peft_config=your_lora_config)",
    ]


def quantized(config: dict[str, Any]) -> bool:
    return (config.get("quantization") or "none") != "none"


def quantization_lines(config: dict[str, Any]) -> list[str]:
    """The BitsAndBytesConfig the trial loaded the base weights with (``quantization``)."""
    compute = "torch.float16" if config.get("precision") == "fp16" else "torch.bfloat16"
    return [
        "import torch",
        "from transformers import BitsAndBytesConfig",
        "",
        "quantization = BitsAndBytesConfig("
        + (
            "\n    load_in_4bit=True,\n    bnb_4bit_quant_type='nf4',\n"
            f"    bnb_4bit_use_double_quant=True,\n    bnb_4bit_compute_dtype={compute},\n"
            if config.get("quantization") == "4bit"
            else "load_in_8bit=True"
        )
        + ")",
    ]


def adapter_lines(config: dict[str, Any], adapter: AdapterSpec, *, loop: bool = False) -> list[str]:
    """The LoRA adapter the trial trained (``sweeper.trial.workload.with_adapter``): a
    quantized base prepared for k-bit training; in the plain loop, a checkpointed model's
    embedding output made to require grads (Trainer does that itself)."""
    is_quantized = quantized(config)
    kbit = ", prepare_model_for_kbit_training" if is_quantized else ""
    lines = [f"from peft import LoraConfig, get_peft_model{kbit}", ""]
    checkpointing = bool(config.get("gradient_checkpointing"))
    if is_quantized:
        lines.append(
            "model = prepare_model_for_kbit_training(model, use_gradient_checkpointing="
            f"{checkpointing})"
        )
    elif loop and checkpointing:
        lines.append(
            "model.enable_input_require_grads()  # checkpointed blocks see a frozen embedding's "
            "output"
        )
    lines.append(
        "model = get_peft_model(model, LoraConfig("
        f"r={adapter.r}, lora_alpha={adapter.alpha}, lora_dropout={adapter.dropout}, "
        f"target_modules={adapter.target_modules!r}, task_type='CAUSAL_LM'))"
    )
    return lines
