"""Exports are real code and data: the TrainingArguments snippet constructs with the installed
transformers, the DataLoader snippet runs, the YAML parses back to the config."""

from __future__ import annotations

import ast
import json
import shlex
import warnings

import pytest
import yaml
from fastapi.testclient import TestClient

from api.app import create_app
from sweeper.errors import ConflictError
from sweeper.export import render, trainer_kwargs
from sweeper.recommend import best
from sweeper.store import Store
from tests.helpers import STUDY_FIELDS, TINY_SPACE, tiny_config

CONFIG = tiny_config(
    per_device_batch_size=8,
    gradient_accumulation_steps=4,
    num_workers=2,
    prefetch_factor=4,
    max_seq_length=1024,
    persistent_workers=True,
    compile_mode="max-autotune",
    attn_implementation="sdpa",
    gradient_checkpointing=True,
    optim="adafactor",
).model_dump()
# a config as stored before precision, tf32 and the other newer knobs existed
LEGACY_CONFIG = {
    k: CONFIG[k]
    for k in (
        "per_device_batch_size", "gradient_accumulation_steps", "num_workers", "prefetch_factor",
        "max_seq_length", "compile_mode", "attn_implementation",
    )
}  # fmt: skip
CPU_SPACE = TINY_SPACE.read_text()
GPU_SPACE = CPU_SPACE.replace("device: cpu", "device: cuda").replace(
    "  epochs: 1\n", "  epochs: 1\n  precision: bf16\n  tf32: true\n"
)


@pytest.fixture
def url(sqlite_url: str) -> str:
    store = Store(sqlite_url)
    store.migrate()
    for name, space_yaml in (("cpu", CPU_SPACE), ("gpu", GPU_SPACE)):
        store.upsert_study(name, **(STUDY_FIELDS | {"space_yaml": space_yaml}))
        store.start_trial(name, 0, CONFIG if name == "cpu" else LEGACY_CONFIG)
        store.finish_trial(
            name,
            0,
            "complete",
            samples_per_s=50.0,
            it_per_s=1.5,
            hours_per_run=10.0,
            cost_per_run_usd=25.0,
        )
    store.dispose()
    return sqlite_url


def _recommendation(url: str, study: str):  # noqa: ANN202
    store = Store(url)
    try:
        return best(store, study), store.get_study(study).space_yaml
    finally:
        store.dispose()


def _one_trial_study(url: str, study: str, space_yaml: str, config: dict = CONFIG):  # noqa: ANN202
    """A study of ``space_yaml`` with one complete trial of ``config``: its recommendation and
    its stored space."""
    store = Store(url)
    try:
        store.upsert_study(study, **(STUDY_FIELDS | {"space_yaml": space_yaml}))
        store.start_trial(study, 0, config)
        store.finish_trial(study, 0, "complete", samples_per_s=50.0, it_per_s=1.5,
                           hours_per_run=10.0, cost_per_run_usd=25.0)  # fmt: skip
    finally:
        store.dispose()
    return _recommendation(url, study)


def _call_kwargs(text: str, name: str) -> dict:
    """The literal keyword arguments of the one call to ``name`` in generated code."""
    tree = ast.parse(text)  # valid Python
    (call,) = [
        n for n in ast.walk(tree) if isinstance(n, ast.Call) and getattr(n.func, "id", None) == name
    ]
    return {k.arg: ast.literal_eval(k.value) for k in call.keywords}


@pytest.mark.torch
def test_trainer_snippet_builds_the_measured_training_arguments(url: str) -> None:
    from transformers import TrainingArguments

    rec, space_yaml = _recommendation(url, "cpu")
    text = render(rec, "trainer", space_yaml)
    kwargs = _call_kwargs(text, "TrainingArguments")
    assert "tf32" not in kwargs  # a CPU study: TrainingArguments would refuse it
    # the space's learning rate and save interval (the one the $/run counted) come along
    assert kwargs["learning_rate"] == 1e-4 and kwargs["save_steps"] == 500
    with warnings.catch_warnings():  # transformers 5.23 renamed it activation_checkpointing
        warnings.filterwarnings("ignore", "`gradient_checkpointing` is deprecated")
        args = TrainingArguments(**kwargs)
    # every knob of the measured config is what the built arguments say
    assert args.per_device_train_batch_size == CONFIG["per_device_batch_size"]
    assert args.gradient_accumulation_steps == CONFIG["gradient_accumulation_steps"]
    assert args.dataloader_num_workers == CONFIG["num_workers"]
    assert args.dataloader_prefetch_factor == CONFIG["prefetch_factor"]
    assert args.dataloader_persistent_workers is CONFIG["persistent_workers"]
    assert args.dataloader_pin_memory is CONFIG["pin_memory"]
    assert args.torch_compile and args.torch_compile_mode == CONFIG["compile_mode"]
    assert args.gradient_checkpointing is CONFIG["gradient_checkpointing"]
    assert args.optim == CONFIG["optim"]
    assert not args.bf16 and not args.fp16  # fp32
    assert args.save_steps == 500
    assert "attn_implementation='sdpa'" in text and "max_length=1024" in text
    assert "MODEL_ID = " in text  # defined, with what to put there


@pytest.mark.torch
def test_sft_snippet_builds_the_measured_sft_config(url: str) -> None:
    from trl import SFTConfig

    rec, space_yaml = _recommendation(url, "cpu")
    packed = rec.model_copy(update={"config": rec.config | {"packing": True}})
    kwargs = _call_kwargs(render(packed, "sft", space_yaml), "SFTConfig")
    with warnings.catch_warnings():  # transformers 5.23 renamed it activation_checkpointing
        warnings.filterwarnings("ignore", "`gradient_checkpointing` is deprecated")
        config = SFTConfig(**kwargs)
    assert config.packing is True and config.max_length == CONFIG["max_seq_length"]
    assert config.per_device_train_batch_size == CONFIG["per_device_batch_size"]
    assert config.gradient_checkpointing and config.optim == CONFIG["optim"]


def test_gpu_study_exports_bf16_and_tf32(url: str) -> None:
    rec, space_yaml = _recommendation(url, "gpu")
    kwargs = trainer_kwargs(rec, space_yaml)
    # the stored config predates the precision and tf32 knobs: the space's only choice counts
    assert kwargs["bf16"] is True and kwargs["tf32"] is True
    assert "pin_memory=True" not in render(rec, "dataloader", space_yaml)  # measured unpinned


@pytest.mark.torch
def test_dataloader_snippet_runs_with_the_measured_knobs(url: str) -> None:
    import torch

    rec, space_yaml = _recommendation(url, "cpu")
    text = render(rec, "dataloader", space_yaml)
    namespace: dict = {"dataset": list(range(64))}
    exec(compile(text, "<export>", "exec"), namespace)  # noqa: S102 — our own generated code
    loader = namespace["loader"]
    assert loader.batch_size == 8 and loader.num_workers == 2 and loader.prefetch_factor == 4
    assert loader.persistent_workers is True and loader.pin_memory is False
    assert len(loader) == 8
    assert namespace["ACCUMULATION_STEPS"] == CONFIG["gradient_accumulation_steps"]
    model = torch.nn.Linear(4, 4)
    model.gradient_checkpointing_enable = lambda: setattr(model, "checkpointed", True)
    with warnings.catch_warnings():  # importing transformers' optimizers: torch.jit notices
        warnings.simplefilter("ignore", DeprecationWarning)
        prepared, optimizer = namespace["prepare"](model)
    assert type(optimizer).__name__ == "Adafactor" and model.checkpointed
    assert "torch.compile(model, mode='max-autotune')" in text


@pytest.mark.torch
def test_packed_dataloader_snippet_packs_instead_of_cutting(url: str) -> None:
    """A packed winner's DataLoader concatenates whole samples into blocks: pasting it keeps
    long samples whole and gets the measured speed (it used to say 'truncated')."""
    rec, space_yaml = _recommendation(url, "cpu")
    packed = rec.model_copy(update={"config": rec.config | {"packing": True}})
    text = render(packed, "dataloader", space_yaml)
    assert "truncat" not in text and "cut at" not in text and "packing" in text
    from datasets import Dataset

    samples = [[1] * 700, [2] * 900, [3] * 1500, [4] * 3000] * 4
    namespace: dict = {"dataset": Dataset.from_dict({"input_ids": samples})}
    exec(compile(text, "<export>", "exec"), namespace)  # noqa: S102 — our own generated code
    blocks = [row.tolist() for batch in namespace["loader"] for row in batch["input_ids"]]
    assert blocks and all(len(row) == CONFIG["max_seq_length"] for row in blocks)
    assert sum(len(r) for r in blocks) > 0.9 * sum(len(s) for s in samples) - 8 * 1024


def test_yaml_and_json_round_trip(url: str) -> None:
    rec, space_yaml = _recommendation(url, "cpu")
    document = yaml.safe_load(render(rec, "yaml", space_yaml))
    applying = {k: v for k, v in CONFIG.items() if v is not None}  # packing_strategy: unpacked
    assert document["config"] == applying and document["per_run"]["usd"] == 25.0
    assert json.loads(render(rec, "json", space_yaml))["trial_number"] == 0


def test_rest_export(url: str) -> None:
    with TestClient(create_app(url)) as client:
        response = client.get("/api/studies/cpu/export", params={"format": "yaml"})
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("application/yaml")
        assert yaml.safe_load(response.text)["config"]["per_device_batch_size"] == 8
        trainer = client.get("/api/studies/cpu/export").text
        assert "TrainingArguments(" in trainer
        assert client.get("/api/studies/cpu/export", params={"format": "xml"}).status_code == 422
        assert client.get("/api/studies/nope/export").status_code == 404


SCRIPT_SPACE = CPU_SPACE.replace(
    "  samples: 10000\n",
    "  samples: 10000\n  engine: script\n"
    "  script: {command: [python, train.py, --output_dir, 'my out'], knobs: flags}\n",
)


def test_the_command_export_is_the_users_command_with_the_measured_flags(url: str) -> None:
    rec, space_yaml = _one_trial_study(url, "mine", SCRIPT_SPACE)
    text = render(rec, "command", space_yaml)
    command = shlex.split(text.strip().splitlines()[-1])
    assert command[:4] == ["python", "train.py", "--output_dir", "my out"]  # quoted as given
    flags = dict(zip(command[4::2], command[5::2], strict=True))
    assert flags["--per_device_train_batch_size"] == str(CONFIG["per_device_batch_size"])
    assert flags["--gradient_accumulation_steps"] == str(CONFIG["gradient_accumulation_steps"])
    assert f"#   attn_implementation: {CONFIG['attn_implementation']}" in text  # not a flag
    assert "--attn_implementation" not in flags and "--max_length" not in flags
    # a study of a built-in engine has no command of the user's to export
    rec, space_yaml = _recommendation(url, "cpu")
    with pytest.raises(ConflictError, match="does not train with a script of yours"):
        render(rec, "command", space_yaml)
    with TestClient(create_app(url)) as client:
        answer = client.get("/api/studies/cpu/export", params={"format": "command"})
        assert answer.status_code == 409 and "script" in answer.json()["detail"]
        answer = client.get("/api/studies/mine/export", params={"format": "command"})
        assert answer.status_code == 200 and "train.py" in answer.text


def test_the_command_export_of_an_accelerate_line_says_the_winner_in_its_options(
    url: str,
) -> None:
    """An accelerate launch line comes back in the user's own words with the winner's devices,
    precision, compile mode and data parallelism in accelerate's options, not as flags."""
    space_yaml = CPU_SPACE.replace(
        "  samples: 10000\n",
        "  samples: 10000\n  engine: script\n  script: {command: [accelerate, launch, "
        "--mixed-precision=bf16, --num_processes, '8', train.py, --lr, '1']}\n",
    )
    rec, stored_yaml = _one_trial_study(url, "launched", space_yaml, CONFIG | {"precision": "fp16"})
    text = render(rec, "command", stored_yaml)
    command = shlex.split(text.strip().splitlines()[-1])
    assert command[:9] == [
        "accelerate", "launch", "--mixed-precision=fp16", "--num_processes", "1",
        "--dynamo_backend", "inductor", "--dynamo_mode", "max-autotune",
    ]  # fmt: skip
    assert command[9:12] == ["train.py", "--lr", "1"]
    flags = dict(zip(command[12::2], command[13::2], strict=True))
    assert flags["--per_device_train_batch_size"] == "8"
    assert not {"--bf16", "--fp16", "--torch_compile", "--torch_compile_mode"} & set(flags)
    assert "precision:" not in text and "compile_mode:" not in text  # not trial_config()'s
    # the accelerate file's note points at that line, not at a `python train.py` it never ran
    accelerate = render(rec, "accelerate", stored_yaml)
    assert "# (or, as the trial was launched: your command with the winner's options: sweeper " in (
        accelerate
    )
    assert "python train.py" not in accelerate


def test_scaled_learning_rate_and_packing_are_exported(url: str) -> None:
    rec, space_yaml = _recommendation(url, "cpu")
    packed = rec.model_copy(
        update={"suggested_learning_rate": 7.07e-05, "config": rec.config | {"packing": True}}
    )
    kwargs = trainer_kwargs(packed, space_yaml)
    assert kwargs["learning_rate"] == 7.07e-05
    trainer = render(packed, "trainer", space_yaml)  # packs as the trials did, itself
    assert "def pack(rows, block=1024):" in trainer
    assert "dataset = dataset.map(pack, batched=True" in trainer
    assert "data_collator=collate" in trainer


@pytest.mark.torch
def test_lora_and_quantization_are_loaded_as_measured(url: str) -> None:
    """The sft export of a QLoRA study: the same 4-bit BitsAndBytesConfig, the same LoRA
    adapter, and assistant_only_loss for a space that trains on the replies; the LoraConfig
    line builds a real peft config."""
    from peft import LoraConfig

    data = yaml.safe_load(CPU_SPACE)
    data["hardware"]["device"] = "cuda"
    data["workload"]["adapter"] = {"r": 8, "alpha": 16, "target_modules": ["q_proj", "v_proj"]}
    data["workload"]["dataset"] = {
        "path": "chats.jsonl", "messages_field": "messages", "loss": "completion",
    }  # fmt: skip
    data["search"]["quantization"] = ["none", "4bit"]
    data["search"]["gradient_checkpointing"] = [True]
    space_yaml = yaml.safe_dump(data)
    rec, _ = _recommendation(url, "cpu")
    qlora = rec.model_copy(
        update={"config": rec.config | {"quantization": "4bit", "precision": "bf16"}}
    )
    text = render(qlora, "sft", space_yaml)
    for part in (
        "load_in_4bit=True", "bnb_4bit_quant_type='nf4'", "bnb_4bit_use_double_quant=True",
        "bnb_4bit_compute_dtype=torch.bfloat16",
    ):  # fmt: skip
        assert part in text
    assert "quantization_config=quantization" in text
    assert "prepare_model_for_kbit_training(model, use_gradient_checkpointing=True)" in text
    lora = _call_kwargs(text, "LoraConfig")
    assert lora == {
        "r": 8, "lora_alpha": 16, "lora_dropout": 0.05, "target_modules": ["q_proj", "v_proj"],
        "task_type": "CAUSAL_LM",
    }  # fmt: skip
    LoraConfig(**lora)
    assert _call_kwargs(text, "SFTConfig")["assistant_only_loss"] is True
    # a plain LoRA (no quantization) neither prepares nor imports k-bit training
    lora_only = render(rec, "sft", space_yaml)
    assert "from peft import LoraConfig, get_peft_model\n" in lora_only
    assert "prepare_model_for_kbit_training" not in lora_only
    # the full fine-tune of the same study loads no adapter and no quantization
    plain = render(rec, "trainer", CPU_SPACE)
    assert "LoraConfig" not in plain and "BitsAndBytesConfig" not in plain


def test_the_learning_rate_is_the_spaces_rounded_to_three_digits(url: str) -> None:
    """The space's workload.learning_rate, scaled by the square-root rule where the effective
    batch changed, reads as a person would write it in every snippet."""
    rec, space_yaml = _recommendation(url, "cpu")
    scaled = rec.model_copy(update={"suggested_learning_rate": 1e-4 * 0.5**0.5})
    for fmt in ("trainer", "sft"):
        text = render(scaled, fmt, space_yaml)
        assert "learning_rate=7.07e-05," in text and "7.071067811865475e-05" not in text
    assert "LEARNING_RATE = 7.07e-05" in render(scaled, "dataloader", space_yaml)
    own = yaml.safe_load(CPU_SPACE)
    own["workload"]["learning_rate"] = 3e-5
    unscaled = rec.model_copy(update={"learning_rate": None, "suggested_learning_rate": None})
    assert trainer_kwargs(unscaled, yaml.safe_dump(own))["learning_rate"] == 3e-5


def test_a_script_studys_own_adapter_is_said_in_its_snippets(url: str) -> None:
    """A walk's LoRA script (its own peft_config, no workload.adapter) trained 28.7K of 184K
    parameters; its sft and trainer snippets fine-tuned the whole model without a word."""
    script = "  engine: script\n  script: {command: [python, train.py], knobs: sft_flags}\n"
    space_yaml = CPU_SPACE.replace("  samples: 10000\n", f"  samples: 10000\n{script}")
    rec, stored_yaml = _one_trial_study(url, "lora", space_yaml)
    adapted = rec.model_copy(update={"n_params": 184_000, "trainable_params": 28_700})
    for fmt in ("sft", "trainer"):
        text = render(adapted, fmt, stored_yaml)  # type: ignore[arg-type]
        said = " ".join(line.removeprefix("# ") for line in text.splitlines())
        assert "the trial trains 28.7K of 184K parameters" in said, text
        assert "an adapter of your program's own" in said and "peft_config=" in said, text
        whole = rec.model_copy(update={"n_params": 184_000, "trainable_params": 184_000})
        assert "adapter of your program's own" not in render(whole, fmt, stored_yaml)  # type: ignore[arg-type]


def test_a_script_studys_snippets_leave_out_a_learning_rate_its_trials_never_ran(
    url: str,
) -> None:
    """A script's trials run its own learning rate and logging (sweeper passes neither): the
    TrainingArguments/SFTConfig snippets say the space's only where the space says one."""
    script = "  engine: script\n  script: {command: [python, train.py], knobs: sft_flags}\n"
    store = Store(url)
    for name, extra in (("own", ""), ("said", "  learning_rate: 3.0e-4\n  logging_steps: 5\n")):
        space_yaml = CPU_SPACE.replace("  samples: 10000\n", f"  samples: 10000\n{script}{extra}")
        store.upsert_study(name, **(STUDY_FIELDS | {"space_yaml": space_yaml}))
        store.start_trial(name, 0, CONFIG)
        store.finish_trial(name, 0, "complete", samples_per_s=50.0, it_per_s=1.5,
                           hours_per_run=10.0, cost_per_run_usd=25.0)  # fmt: skip
    store.dispose()
    rec, stored_yaml = _recommendation(url, "own")
    own = _call_kwargs(render(rec, "sft", stored_yaml), "SFTConfig")
    assert "learning_rate" not in own and "logging_steps" not in own, own
    assert own["per_device_train_batch_size"] == 8  # the measured knobs are all there
    rec, stored_yaml = _recommendation(url, "said")
    said = _call_kwargs(render(rec, "trainer", stored_yaml), "TrainingArguments")
    assert said["learning_rate"] == 3e-4 and said["logging_steps"] == 5
