"""The levers of issue 36 as the user pastes them: TrainingArguments and SFTConfig built from
the exported keywords take them (constructed here), the DataLoader export batches padding-free,
the model lines convert to fp8 and check it, and a packed winner whose rows attended across
samples is flagged by ``best`` from its own record."""

from __future__ import annotations

import ast
import warnings

import pytest

from sweeper.export import render, sft_kwargs, trainer_kwargs
from sweeper.measurement import sample_measurement
from sweeper.store import Store
from tests.helpers import STUDY_FIELDS, TINY_SPACE, tiny_config
from tests.test_export import _call_kwargs, _recommendation

CPU_SPACE = TINY_SPACE.read_text()
GPU_SPACE = CPU_SPACE.replace("device: cpu", "device: cuda")
LEVERS = tiny_config(
    per_device_batch_size=8,
    max_seq_length=512,
    padding_free=True,
    liger_kernel=True,
    precision="fp8",
    compile_mode="reduce-overhead",
).model_dump()
PACKED = tiny_config(packing=True, max_seq_length=256).model_dump()


def _store(url: str) -> None:
    store = Store(url)
    store.migrate()
    for name, space_yaml, config, cross in (
        ("gpu", GPU_SPACE, LEVERS, False),
        ("cpu", CPU_SPACE, LEVERS | {"liger_kernel": False, "precision": "fp32"}, False),
        ("packed", CPU_SPACE, PACKED, True),
    ):
        store.upsert_study(name, **(STUDY_FIELDS | {"space_yaml": space_yaml}))
        store.start_trial(name, 0, config)
        measured = sample_measurement(cross_sample_attention=cross, packing=config["packing"])
        store.finish_trial(
            name,
            0,
            "complete",
            samples_per_s=50.0,
            it_per_s=1.5,
            hours_per_run=10.0,
            cost_per_run_usd=25.0,
            measurement=measured.model_dump(),
        )
    store.dispose()


@pytest.fixture
def url(sqlite_url: str) -> str:
    _store(sqlite_url)
    return sqlite_url


_best = _recommendation  # the study's recommendation and its space, as test_export reads them


def test_the_levers_reach_the_exported_text(url: str) -> None:
    rec, space_yaml = _best(url, "gpu")
    kwargs = trainer_kwargs(rec, space_yaml)
    assert kwargs["use_liger_kernel"] is True and kwargs["bf16"] is True
    assert kwargs["torch_compile_mode"] == "reduce-overhead"
    assert "padding_free" not in kwargs  # not a TrainingArguments field: the collator says it
    trainer = render(rec, "trainer", space_yaml)
    assert "convert_to_float8_training(model" in trainer and "Float8Linear" in trainer
    assert "collate = DataCollatorWithFlattening()" in trainer
    assert "data_collator=collate" in trainer
    sft = sft_kwargs(rec, space_yaml)
    # TRL refuses max_length without packing when padding-free: the samples come cut
    assert sft["padding_free"] is True and sft["max_length"] is None
    assert "cut at max_seq_length" in render(rec, "sft", space_yaml)
    loop = render(rec, "dataloader", space_yaml)
    assert "_apply_liger_kernel_to_instance(model=model)" in loop
    assert "torch.compile(model, mode='reduce-overhead')" in loop
    assert "    convert_to_float8_training(model" in loop  # inside prepare(model)
    assert "dtype=torch.bfloat16)" in loop  # fp8's other layers under bf16 autocast
    ast.parse(loop)
    flags = render(rec, "json", space_yaml)
    assert '"padding_free": true' in flags


@pytest.mark.torch
def test_training_arguments_and_sft_config_take_the_exported_levers(url: str) -> None:
    from transformers import TrainingArguments
    from trl import SFTConfig

    rec, space_yaml = _best(url, "gpu")
    # use_cpu: this machine has no GPU for bf16; everything else is the export's
    with warnings.catch_warnings():  # transformers 5.23 renamed it activation_checkpointing
        warnings.filterwarnings("ignore", "`gradient_checkpointing` is deprecated")
        args = TrainingArguments(
            **_call_kwargs(render(rec, "trainer", space_yaml), "TrainingArguments"), use_cpu=True
        )
        config = SFTConfig(
            **_call_kwargs(render(rec, "sft", space_yaml), "SFTConfig"), use_cpu=True
        )
    assert args.use_liger_kernel and args.bf16 and not args.fp16
    assert args.torch_compile and args.torch_compile_mode == "reduce-overhead"
    assert config.padding_free and config.max_length is None and config.use_liger_kernel


@pytest.mark.torch
def test_the_padding_free_dataloader_export_flattens_its_batches(url: str) -> None:
    rec, space_yaml = _best(url, "cpu")
    text = render(rec, "dataloader", space_yaml)
    samples = [{"input_ids": list(range(1, 1 + n))} for n in (5, 9, 3, 7, 11, 4, 6, 8)]
    namespace: dict = {"dataset": samples}
    exec(compile(text, "<export>", "exec"), namespace)  # noqa: S102 — our own generated code
    (batch,) = list(namespace["loader"])  # 8 samples, batch 8
    assert "attention_mask" not in batch and batch["input_ids"].shape == (1, 53)
    assert int((batch["position_ids"] == 0).sum()) == 8  # one start per sample


def test_a_packed_winner_that_attended_across_samples_is_flagged(url: str) -> None:
    rec, _ = _best(url, "packed")
    assert any("attended across sample boundaries" in w for w in rec.warnings), rec.warnings
    clean, _ = _best(url, "cpu")
    assert not any("attended across" in w for w in clean.warnings)
