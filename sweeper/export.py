"""The recommended config, written the way users paste it: Trainer, DataLoader, YAML, JSON.

One renderer per format, all from a ``Recommendation`` plus the study's workload settings
(precision, TF32, device), so the CLI (``sweeper export``) and the REST API say the same.
"""

from __future__ import annotations

from typing import Any, Literal

import yaml

from sweeper.errors import SpaceError
from sweeper.recommend import Recommendation
from sweeper.space import parse_space

ExportFormat = Literal["trainer", "dataloader", "yaml", "json"]
FORMATS: tuple[ExportFormat, ...] = ("trainer", "dataloader", "yaml", "json")
MEDIA_TYPES = {
    "trainer": "text/x-python",
    "dataloader": "text/x-python",
    "yaml": "application/yaml",
    "json": "application/json",
}


def workload_settings(space_yaml: str) -> dict[str, Any]:
    """Precision, TF32 and device of the study's space (defaults if it cannot be read)."""
    try:
        space = parse_space(space_yaml)
    except SpaceError:
        return {"precision": "fp32", "tf32": False, "device": "cpu", "save_steps": None}
    return {
        "precision": space.workload.precision,
        "tf32": space.workload.tf32,
        "device": space.hardware.device,
        "save_steps": space.workload.checkpoint.save_steps,
    }


def trainer_kwargs(rec: Recommendation, settings: dict[str, Any]) -> dict[str, Any]:
    """Keyword arguments of ``transformers.TrainingArguments`` for the recommended config."""
    config = rec.config
    workers = config["num_workers"]
    kwargs: dict[str, Any] = {
        "per_device_train_batch_size": config["per_device_batch_size"],
        "gradient_accumulation_steps": config["gradient_accumulation_steps"],
        "dataloader_num_workers": workers,
    }
    if workers > 0 and config.get("prefetch_factor"):
        kwargs["dataloader_prefetch_factor"] = config["prefetch_factor"]
    if settings["precision"] == "bf16":
        kwargs["bf16"] = True
    elif settings["precision"] == "fp16":
        kwargs["fp16"] = True
    if settings["tf32"] and settings["device"] == "cuda":
        kwargs["tf32"] = True  # TrainingArguments refuses tf32 without an Ampere+ GPU
    if config["compile_mode"] != "none":
        kwargs["torch_compile"] = True
        kwargs["torch_compile_mode"] = config["compile_mode"]
    # scaled when the effective batch differs from the baseline's (see the header's warning)
    learning_rate = rec.suggested_learning_rate or rec.learning_rate
    if learning_rate is not None:
        kwargs["learning_rate"] = learning_rate
    if settings.get("save_steps"):
        kwargs["save_steps"] = settings["save_steps"]  # what the $/run counted
    return kwargs


def _header(rec: Recommendation) -> str:
    lines = [
        f"# sweeper: study {rec.study!r}, trial #{rec.trial_number} of {rec.completed_trials}: "
        f"{rec.samples_per_s:,.1f} samples/s, {rec.hours_per_run or 0:,.1f} h and "
        f"${rec.cost_per_run_usd:,.2f} per run on {rec.hardware_name} at "
        f"${rec.usd_per_hour:.2f}/h"
    ]
    if rec.speedup_vs_baseline is not None and rec.usd_saved_per_run is not None:
        lines.append(
            f"# vs your baseline (trial #{rec.baseline_trial_number}): "
            f"{rec.speedup_vs_baseline:.2f}x faster, ${rec.usd_saved_per_run:,.2f} saved per run"
        )
    lines += [f"# warning: {w}" for w in rec.warnings]
    return "\n".join(lines)


def render(rec: Recommendation, fmt: ExportFormat, space_yaml: str) -> str:
    settings = workload_settings(space_yaml)
    config = rec.config
    if fmt == "json":
        return rec.model_dump_json(indent=2) + "\n"
    if fmt == "yaml":
        document = {
            "study": rec.study,
            "trial": rec.trial_number,
            # paste as `baseline:` into a space file to compare a later sweep against it
            "config": {k: v for k, v in config.items() if v is not None},
            "per_run": {
                "hours": rec.hours_per_run,
                "usd": rec.cost_per_run_usd,
                "usd_per_hour": rec.usd_per_hour,
            },
            "measured": {"samples_per_s": rec.samples_per_s, "tokens_per_s": rec.tokens_per_s},
        }
        return yaml.safe_dump(document, sort_keys=False)
    if fmt == "trainer":
        kwargs = trainer_kwargs(rec, settings)
        arguments = "\n".join(f"    {key}={value!r}," for key, value in kwargs.items())
        return (
            f"{_header(rec)}\n"
            "from transformers import AutoModelForCausalLM, TrainingArguments\n\n"
            "model = AutoModelForCausalLM.from_pretrained(\n"
            f'    MODEL_ID, attn_implementation="{config["attn_implementation"]}"\n'
            ")\n"
            "training_args = TrainingArguments(\n"
            '    output_dir="output",\n'
            f"{arguments}\n"
            ")\n"
            + (
                f"# pack samples into blocks of {config['max_seq_length']} tokens, e.g. "
                f"SFTConfig(packing=True, max_length={config['max_seq_length']})\n"
                if config.get("packing")
                else f"# cut samples at max_seq_length={config['max_seq_length']} tokens, e.g. "
                f"SFTConfig(max_length={config['max_seq_length']})\n"
            )
        )
    if fmt == "dataloader":
        workers = config["num_workers"]
        prefetch = config.get("prefetch_factor") if workers > 0 else None
        return (
            f"{_header(rec)}\n"
            "from torch.utils.data import DataLoader\n\n"
            "loader = DataLoader(\n"
            "    dataset,  # samples tokenized and truncated to "
            f"{config['max_seq_length']} tokens\n"
            f"    batch_size={config['per_device_batch_size']},\n"
            "    shuffle=True,\n"
            "    drop_last=True,\n"
            f"    num_workers={workers},\n"
            f"    prefetch_factor={prefetch!r},\n"
            f"    pin_memory={settings['device'] == 'cuda'!r},\n"
            ")\n"
            f"# step the optimizer every {config['gradient_accumulation_steps']} batches "
            "(gradient accumulation)\n"
        )
    raise ValueError(f"unknown export format {fmt!r}; use one of {', '.join(FORMATS)}")
