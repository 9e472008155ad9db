"""How to launch a winner that ran on several devices: the command, and an ``accelerate``
config file for a user who runs with ``accelerate launch``.

The trial ran its N ranks as ``torchrun --standalone --nproc-per-node N`` does
(``sweeper.trial.group``), so that is the command; the accelerate file says the same in
accelerate's words: ``distributed_type`` MULTI_GPU (DDP), FSDP with ``fsdp_version: 2`` and
full sharding of each decoder layer (what the loop's ``fully_shard`` and the Trainer's
``fsdp="full_shard"`` do), or DEEPSPEED with the ZeRO stage of the DeepSpeed config the
Trainer ran (``knob_values.deepspeed_config``, which the exported TrainingArguments carry whole).
``sweeper export --format accelerate`` writes it; tests/test_launch_export.py parses it
with accelerate's own ``load_config_from_file``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import yaml

from sweeper import knob_values, knobs
from sweeper.cost import device_count

ACCELERATE_FILE = "accelerate.yaml"
# fp8: torchao float8 training, as the trial ran it (accelerate's AO backend; accelerate_line)
_MIXED = {"bf16": "bf16", "fp16": "fp16", "fp32": "no", "fp8": "fp8"}


def launch_command(config: Mapping[str, Any], script: str = "train.py") -> str:
    """The command that runs ``script`` as the trial ran: one process on one device, else
    ``torchrun`` (ZeRO too: the Trainer carries the DeepSpeed config in
    ``TrainingArguments(deepspeed=...)`` and builds DeepSpeed's engine under torchrun, as the
    trial did; ``accelerate launch`` with the exported file is the alternative).

    >>> launch_command({"devices": 2, "data_parallel": "ddp"})
    'torchrun --standalone --nproc-per-node 2 train.py'
    >>> launch_command({"devices": 4, "data_parallel": "zero3"})
    'torchrun --standalone --nproc-per-node 4 train.py'
    >>> launch_command({})
    'python train.py'
    """
    devices = device_count(config)
    if devices == 1:
        return f"python {script}"
    return f"torchrun --standalone --nproc-per-node {devices} {script}"


def on_devices(command: list[str], devices: int) -> list[str]:
    """The user's command as it runs on ``devices``: a torchrun line with its process count
    set to it; a ``python train.py ...`` command on several devices started by torchrun, as
    the trial started it; anything else as it is.

    >>> on_devices(["python", "train.py", "--lr", "1"], 2)
    ['torchrun', '--standalone', '--nproc-per-node', '2', 'train.py', '--lr', '1']
    >>> on_devices(["torchrun", "--nproc_per_node=4", "-m", "pkg.train"], 2)
    ['torchrun', '--nproc_per_node=2', '-m', 'pkg.train']
    >>> on_devices(["torchrun", "--standalone", "train.py"], 2)
    ['torchrun', '--nproc-per-node', '2', '--standalone', 'train.py']
    >>> on_devices(["python", "train.py"], 1)
    ['python', 'train.py']
    """
    from pathlib import Path

    from sweeper.space_script import script_of
    from sweeper.trial.launch_line import launcher

    found = script_of(command)
    if found is None:
        return list(command)
    index, _, module = found
    if launcher(command) == "torchrun":
        words = list(command)
        for i, word in enumerate(words[:index]):
            name, eq, _ = word.partition("=")
            if name in ("--nproc-per-node", "--nproc_per_node"):
                if eq:
                    words[i] = f"{name}={devices}"
                else:
                    words[i + 1] = str(devices)
                return words
        start = 3 if Path(command[0]).name.startswith("python") else 1
        return [*words[:start], "--nproc-per-node", str(devices), *words[start:]]
    if devices == 1 or not Path(command[0]).name.startswith("python"):
        return list(command)
    program = ["-m", command[index]] if module else [command[index]]
    launch = ["torchrun", "--standalone", "--nproc-per-node", str(devices)]
    return [*launch, *program, *command[index + 1 :]]


def accelerate_launch_command(script: str = "train.py") -> str:
    return f"accelerate launch --config_file {ACCELERATE_FILE} {script}"


def accelerate_config(
    config: Mapping[str, Any], *, device: str = "cuda", layer_class: str | None = None
) -> dict[str, Any]:
    """``accelerate launch``'s config file (as ``accelerate config`` writes it) for ``config``
    on ``device`` ("cpu": the ranks the trial measured; anything else: GPUs).
    ``layer_class``: the model's decoder layer class (e.g. ``LlamaDecoderLayer``), the unit
    FSDP shards; without it accelerate wraps by the model's ``_no_split_modules``.

    >>> c = accelerate_config({"devices": 2, "data_parallel": "fsdp2", "precision": "bf16"})
    >>> c["distributed_type"], c["num_processes"], c["fsdp_config"]["fsdp_version"]
    ('FSDP', 2, 2)
    """
    devices = device_count(config)
    strategy = config.get("data_parallel") if devices > 1 else None
    cpu = device == "cpu"
    document: dict[str, Any] = {
        "compute_environment": "LOCAL_MACHINE",
        "distributed_type": _distributed_type(strategy, devices, cpu),
        "mixed_precision": _MIXED.get(str(config.get("precision")), "no"),
        "use_cpu": cpu,
        "num_machines": 1,
        "machine_rank": 0,
        "num_processes": devices,
        "gpu_ids": "all",
        "rdzv_backend": "static",
        "same_network": True,
        "main_training_function": "main",
        "downcast_bf16": "no",
        "debug": False,
    }
    if document["mixed_precision"] == "fp8":
        document["fp8_config"] = {"backend": "AO"}  # as `accelerate config` writes torchao's
    if strategy == "fsdp2":
        fsdp: dict[str, Any] = {
            "fsdp_version": 2,
            "fsdp_reshard_after_forward": True,  # full sharding: FSDP2's FULL_SHARD
            "fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
            "fsdp_offload_params": False,
            "fsdp_state_dict_type": "SHARDED_STATE_DICT",
            "fsdp_cpu_ram_efficient_loading": True,
            "fsdp_activation_checkpointing": bool(config.get("gradient_checkpointing")),
        }
        if layer_class:
            fsdp["fsdp_transformer_layer_cls_to_wrap"] = layer_class
        document["fsdp_config"] = fsdp
    elif strategy in knobs.ZERO_STAGES:
        document["deepspeed_config"] = _deepspeed_section(config, int(strategy[-1]))
    return document


def _deepspeed_section(config: Mapping[str, Any], stage: int) -> dict[str, Any]:
    """accelerate's DeepSpeed keys for the DeepSpeed config the trial's TrainingArguments
    carried (``knob_values.deepspeed_config``): its stage, the accumulation its "auto" took from
    the config, no offload, and ZeRO-3's 16-bit save where that config gathers one."""
    zero = knob_values.deepspeed_config(stage)["zero_optimization"]
    return {
        "zero_stage": zero["stage"],
        "gradient_accumulation_steps": config.get("gradient_accumulation_steps") or 1,
        "offload_optimizer_device": "none",
        "offload_param_device": "none",
        "zero3_init_flag": stage == 3,
        "zero3_save_16bit_model": bool(zero.get("stage3_gather_16bit_weights_on_model_save")),
    }


def _distributed_type(strategy: Any, devices: int, cpu: bool) -> str:
    if devices == 1:
        return "NO"
    if strategy == "fsdp2":
        return "FSDP"
    if strategy in knobs.ZERO_STAGES:
        return "DEEPSPEED"
    return "MULTI_CPU" if cpu else "MULTI_GPU"


def accelerate_config_yaml(
    config: Mapping[str, Any],
    *,
    device: str = "cuda",
    layer_class: str | None = None,
    header: str = "",
    launched: str | None = None,
) -> str:
    """The file's text, with a comment saying what it is and how to launch with it
    (``launched``: how the trial was launched, where not ``launch_command``'s; a script's)."""
    lines = [
        f"# {header}" if header else "# sweeper's recommended config",
        f"# save as {ACCELERATE_FILE}, then: {accelerate_launch_command()}",
        f"# (or, as the trial was launched: {launched or launch_command(config)})",
    ]
    body = yaml.safe_dump(
        accelerate_config(config, device=device, layer_class=layer_class), sort_keys=False
    )
    return "\n".join(lines) + "\n" + body
