"""Exports are real code and data: the TrainingArguments snippet constructs with the installed
transformers, the DataLoader snippet runs, the YAML parses back to the config."""

from __future__ import annotations

import ast
import json

import pytest
import yaml
from fastapi.testclient import TestClient

from api.app import create_app
from sweeper.export import render, trainer_kwargs, workload_settings
from sweeper.recommend import best
from sweeper.store import Store
from tests.helpers import STUDY_FIELDS, TINY_SPACE, tiny_config

CONFIG = tiny_config(
    per_device_batch_size=8,
    gradient_accumulation_steps=4,
    num_workers=2,
    prefetch_factor=4,
    max_seq_length=1024,
    compile_mode="max-autotune",
    attn_implementation="sdpa",
).model_dump()
CPU_SPACE = TINY_SPACE.read_text()
GPU_SPACE = CPU_SPACE.replace("device: cpu", "device: cuda").replace(
    "  epochs: 1\n", "  epochs: 1\n  precision: bf16\n"
)


@pytest.fixture
def url(sqlite_url: str) -> str:
    store = Store(sqlite_url)
    store.migrate()
    for name, space_yaml in (("cpu", CPU_SPACE), ("gpu", GPU_SPACE)):
        store.upsert_study(name, **(STUDY_FIELDS | {"space_yaml": space_yaml}))
        store.start_trial(name, 0, CONFIG)
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


@pytest.mark.torch
def test_trainer_snippet_builds_real_training_arguments(url: str) -> None:
    from transformers import TrainingArguments

    rec, space_yaml = _recommendation(url, "cpu")
    text = render(rec, "trainer", space_yaml)
    tree = ast.parse(text)  # valid Python
    (call,) = [
        n
        for n in ast.walk(tree)
        if isinstance(n, ast.Call) and getattr(n.func, "id", None) == "TrainingArguments"
    ]
    kwargs = {k.arg: ast.literal_eval(k.value) for k in call.keywords}
    assert kwargs["per_device_train_batch_size"] == 8
    assert kwargs["gradient_accumulation_steps"] == 4
    assert kwargs["dataloader_num_workers"] == 2 and kwargs["dataloader_prefetch_factor"] == 4
    assert kwargs["torch_compile_mode"] == "max-autotune"
    assert "tf32" not in kwargs  # a CPU study: TrainingArguments would refuse it
    # the space's learning rate and save interval (the one the $/run counted) come along
    assert kwargs["learning_rate"] == 1e-4 and kwargs["save_steps"] == 500
    args = TrainingArguments(**kwargs | {"output_dir": str(kwargs["output_dir"])})
    assert args.gradient_accumulation_steps == 4 and args.torch_compile
    assert args.save_steps == 500
    assert 'attn_implementation="sdpa"' in text and "max_length=1024" in text


def test_gpu_study_exports_bf16_and_tf32(url: str) -> None:
    rec, space_yaml = _recommendation(url, "gpu")
    kwargs = trainer_kwargs(rec, workload_settings(space_yaml))
    assert kwargs["bf16"] is True and kwargs["tf32"] is True


@pytest.mark.torch
def test_dataloader_snippet_runs(url: str) -> None:
    rec, space_yaml = _recommendation(url, "cpu")
    text = render(rec, "dataloader", space_yaml)
    namespace: dict = {"dataset": list(range(64))}
    exec(compile(text, "<export>", "exec"), namespace)  # noqa: S102 — our own generated code
    loader = namespace["loader"]
    assert loader.batch_size == 8 and loader.num_workers == 2 and loader.prefetch_factor == 4
    assert len(loader) == 8


def test_yaml_and_json_round_trip(url: str) -> None:
    rec, space_yaml = _recommendation(url, "cpu")
    document = yaml.safe_load(render(rec, "yaml", space_yaml))
    assert document["config"] == CONFIG and document["per_run"]["usd"] == 25.0
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


def test_scaled_learning_rate_and_packing_are_exported(url: str) -> None:
    rec, space_yaml = _recommendation(url, "cpu")
    packed = rec.model_copy(
        update={"suggested_learning_rate": 7.07e-05, "config": rec.config | {"packing": True}}
    )
    kwargs = trainer_kwargs(packed, workload_settings(space_yaml))
    assert kwargs["learning_rate"] == 7.07e-05
    assert "SFTConfig(packing=True, max_length=1024)" in render(packed, "trainer", space_yaml)
