"""The launch of a multi-device winner, exported: the command, and an ``accelerate launch``
config file that accelerate itself reads (its config class, its launcher's validation and
environment, and the FSDP plugin built from that environment, as ``accelerate launch`` does)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from sweeper.launch_export import accelerate_config_yaml, launch_command
from tests.helpers import tiny_config

# accelerate (and torch, which it imports) are the trial side's: not in the controller's
# environment (scripts/test.sh step 2)
pytestmark = pytest.mark.torch


def _launched(tmp_path: Path, config: dict[str, Any], **kwargs: Any) -> tuple[Any, Any]:
    """The file as accelerate's config class and its launcher's validated arguments."""
    from accelerate.commands.config.config_args import ClusterConfig, load_config_from_file
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser

    path = tmp_path / "accelerate.yaml"
    path.write_text(accelerate_config_yaml(config, **kwargs))
    loaded = load_config_from_file(str(path))
    assert isinstance(loaded, ClusterConfig)
    args = launch_command_parser().parse_args(["--config_file", str(path), "train.py"])
    return loaded, _validate_launch_command(args)[0]


def test_fsdp2_config_is_accelerates_fsdp_version_2_full_shard(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from accelerate.utils import DistributedType, FullyShardedDataParallelPlugin
    from accelerate.utils.launch import prepare_multi_gpu_env

    config = tiny_config(devices=2, data_parallel="fsdp2", precision="bf16").model_dump()
    loaded, args = _launched(tmp_path, config, layer_class="LlamaDecoderLayer")
    assert loaded.distributed_type == DistributedType.FSDP
    assert (loaded.num_processes, loaded.mixed_precision) == (2, "bf16")
    assert args.use_fsdp and args.num_processes == 2 and args.fsdp_version == 2
    for key, value in prepare_multi_gpu_env(args).items():  # what the ranks would see
        monkeypatch.setenv(key, value)
    plugin = FullyShardedDataParallelPlugin()
    assert plugin.fsdp_version == 2 and plugin.reshard_after_forward is True
    assert plugin.transformer_cls_names_to_wrap == ["LlamaDecoderLayer"]


def test_ddp_config_is_multi_gpu_and_the_command_is_torchrun(tmp_path: Path) -> None:
    from accelerate.utils import DistributedType

    config = tiny_config(devices=4, data_parallel="ddp").model_dump()
    loaded, args = _launched(tmp_path, config)
    assert loaded.distributed_type == DistributedType.MULTI_GPU and loaded.mixed_precision == "no"
    assert args.multi_gpu and args.num_processes == 4 and not args.use_fsdp
    assert launch_command(config) == "torchrun --standalone --nproc-per-node 4 train.py"
    on_cpu, _ = _launched(tmp_path, config, device="cpu")
    assert on_cpu.distributed_type == DistributedType.MULTI_CPU and on_cpu.use_cpu
    one = tiny_config().model_dump()
    assert launch_command(one) == "python train.py"
    assert _launched(tmp_path, one)[0].distributed_type == DistributedType.NO


def test_an_fp8_winner_is_accelerates_fp8_with_torchaos_backend(tmp_path: Path) -> None:
    """sweeper's fp8 is torchao's float8 training: the file says so as accelerate reads it
    (it wrote mixed_precision: no for an fp8 winner before, a bf16-less fp32 run)."""
    config = tiny_config(devices=2, data_parallel="ddp", precision="fp8").model_dump()
    loaded, args = _launched(tmp_path, config)
    assert loaded.mixed_precision == "fp8" and loaded.fp8_config == {"backend": "AO"}
    assert args.mixed_precision == "fp8" and str(args.fp8_backend).lower() == "ao"


@pytest.mark.parametrize("strategy", ["zero2", "zero3"])
def test_zero_exports_carry_the_deepspeed_config_the_trainer_ran(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, strategy: str
) -> None:
    """The trainer export's TrainingArguments carry the DeepSpeed config as a dict (the one
    the trial's Trainer ran, knob_values.deepspeed_config, its "auto" filled from the knobs); the
    accelerate file's DEEPSPEED section gives accelerate's own DeepSpeed plugin, built from
    the environment its launcher gives the ranks, the same stage and accumulation."""
    pytest.importorskip("deepspeed")
    from accelerate.utils import DeepSpeedPlugin, DistributedType
    from accelerate.utils.launch import prepare_deepspeed_cmd_env
    from transformers import TrainingArguments

    from sweeper import knob_values, knobs

    stage = int(strategy[-1])
    config = tiny_config(devices=2, data_parallel=strategy, gradient_accumulation_steps=4)
    arguments = knobs.trainer_arguments(config.model_dump())
    assert arguments["deepspeed"] == knob_values.deepspeed_config(stage)
    # transformers 5.23 renamed gradient_checkpointing (the engines pass the new name too)
    arguments["activation_checkpointing"] = arguments.pop("gradient_checkpointing")
    args = TrainingArguments(output_dir=str(tmp_path / "out"), use_cpu=True, **arguments)
    ran = args.hf_deepspeed_config.config  # after the Trainer filled its "auto" values
    assert ran["zero_optimization"]["stage"] == stage
    assert ran["gradient_accumulation_steps"] == 4 and ran["bf16"] == {"enabled": False}
    assert ran["train_micro_batch_size_per_gpu"] == config.per_device_batch_size

    loaded, launched = _launched(tmp_path, config.model_dump())
    assert loaded.distributed_type == DistributedType.DEEPSPEED
    assert loaded.deepspeed_config["zero_stage"] == stage
    # as accelerate's launch_command does before its DeepSpeed launcher
    launched.deepspeed_fields_from_accelerate_config = ",".join(loaded.deepspeed_config)
    for key, value in prepare_deepspeed_cmd_env(launched)[1].items():  # the ranks' environment
        monkeypatch.setenv(key, value)
    plugin = DeepSpeedPlugin()
    assert plugin.zero_stage == stage and plugin.gradient_accumulation_steps == 4
    assert plugin.zero3_save_16bit_model == (stage == 3)
    # launched as the trial was: torchrun, the Trainer building DeepSpeed's engine itself
    command = launch_command(config.model_dump())
    assert command == "torchrun --standalone --nproc-per-node 2 train.py"


def test_export_format_accelerate_of_a_study_whose_winner_ran_on_two_devices(
    tmp_path: Path, sqlite_url: str
) -> None:
    from accelerate.commands.config.config_args import load_config_from_file
    from accelerate.utils import DistributedType
    from fastapi.testclient import TestClient

    from api.app import create_app
    from sweeper.store import Store
    from tests.helpers import STUDY_FIELDS, TINY_SPACE

    store = Store(sqlite_url)
    store.migrate()
    try:
        store.upsert_study("pair", **(STUDY_FIELDS | {"space_yaml": TINY_SPACE.read_text()}))
        config = tiny_config(devices=2, data_parallel="fsdp2").model_dump()
        store.start_trial("pair", 0, config)
        store.finish_trial(
            "pair", 0, "complete", samples_per_s=50.0, hours_per_run=10.0, cost_per_run_usd=50.0
        )
    finally:
        store.dispose()
    with TestClient(create_app(sqlite_url)) as client:
        response = client.get("/api/studies/pair/export", params={"format": "accelerate"})
        trainer = client.get("/api/studies/pair/export", params={"format": "trainer"}).text
    assert response.status_code == 200 and response.headers["content-type"].startswith(
        "application/yaml"
    )
    assert "accelerate launch --config_file accelerate.yaml" in trainer
    path = tmp_path / "accelerate.yaml"
    path.write_text(response.text)
    loaded = load_config_from_file(str(path))
    # the tiny space runs on the CPU: its ranks, sharded as FSDP2
    assert loaded.distributed_type == DistributedType.FSDP and loaded.num_processes == 2
    assert loaded.fsdp_config["fsdp_version"] == 2 and loaded.use_cpu
    assert response.text.startswith(
        "# sweeper's recommended config for study 'pair': trial #0, as "
    )
    assert "measured:" in response.text.splitlines()[0]
