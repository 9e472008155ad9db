"""Every export runs with the user's own files: a sweep of a model directory (save_pretrained)
and chat records, once with a chat template that marks the replies ({% generation %}) and once
with one that does not; each export of its recommendation is pasted into a training script
that trains a few steps with real transformers and TRL on the CPU.

Where the template has no markers, TRL's assistant_only_loss cannot run: the sft trial trains
on every token, records it, and the SFTConfig export leaves assistant_only_loss out and says
why in a comment."""

from __future__ import annotations

import ast
import json
import warnings
from pathlib import Path
from typing import Any

import pytest
import yaml

from sweeper.export import render
from sweeper.recommend import best
from sweeper.recommendation import Recommendation
from sweeper.space import parse_space
from sweeper.store import Store
from sweeper.trial.corpus import CHATML
from tests.helpers import TINY_SPACE, run_sweeper

pytestmark = pytest.mark.torch

# ChatML without the {% generation %} markers: what most tokenizers' templates look like
PLAIN_CHATML = CHATML.replace("{% generation %}", "").replace("{% endgeneration %}", "")
CHATS = [
    [
        {"role": "user", "content": f"What is {i} + {i}?" + " Please." * (i % 5)},
        {"role": "assistant", "content": f"{i} + {i} is {2 * i}." + " Indeed." * (i % 3)},
    ]
    for i in range(60)
]
STEPS = 2


def _model_dir(root: Path, template: str) -> Path:
    """A tiny Llama and its tokenizer, saved as a user's own would be."""
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig

    from sweeper.trial.corpus import train_tokenizer

    train_tokenizer([json.dumps(c) for c in CHATS] * 3, 300, root / "bpe")
    tokenizer = AutoTokenizer.from_pretrained(str(root / "bpe"))
    tokenizer.chat_template = template
    model_dir = root / "my-model"
    tokenizer.save_pretrained(str(model_dir))
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=256,
        pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
        bos_token_id=tokenizer.bos_token_id,
    )  # fmt: skip
    AutoModelForCausalLM.from_config(config).save_pretrained(str(model_dir))
    return model_dir


def _sweep(root: Path, cache_dir: Path, template: str) -> tuple[Recommendation, str]:
    model_dir = _model_dir(root, template)
    data = root / "chats.jsonl"
    # the chat records under a column of the user's own name, beside another column
    data.write_text(
        "".join(json.dumps({"id": i, "conversation": c}) + "\n" for i, c in enumerate(CHATS))
    )
    space = yaml.safe_load(TINY_SPACE.read_text())
    space["study"] = "mine"
    space["workload"]["model"] = {"id": str(model_dir)}
    space["workload"]["tokenizer"] = {}
    space["workload"]["dataset"] = {
        "path": str(data), "messages_field": "conversation", "loss": "completion",
    }  # fmt: skip
    space["workload"]["engine"] = "sft"
    space["workload"]["learning_rate"] = 2e-4
    space["workload"]["coverage_percentile"] = 100
    space["search"]["max_seq_length"] = [128]
    space["search"]["attn_implementation"] = ["sdpa"]
    space["baseline"] = {
        "per_device_batch_size": 2, "gradient_accumulation_steps": 2, "num_workers": 0,
        "max_seq_length": 128, "attn_implementation": "sdpa",
    }  # fmt: skip
    space["budget"] = {"n_trials": 1}
    space_file = root / "mine.yaml"
    space_file.write_text(yaml.safe_dump(space))
    url = f"sqlite:///{root}/s.db"
    result = run_sweeper(
        "launch", "--space", str(space_file), "--storage", url, cache_dir=cache_dir, timeout=600
    )
    assert result.returncode == 0, result.stdout + result.stderr
    store = Store(url)
    try:
        return best(store, "mine"), store.get_study("mine").space_yaml
    finally:
        store.dispose()


def _call_kwargs(text: str, name: str) -> dict[str, Any]:
    (call,) = [
        n
        for n in ast.walk(ast.parse(text))
        if isinstance(n, ast.Call) and getattr(n.func, "id", None) == name
    ]
    return {k.arg: ast.literal_eval(k.value) for k in call.keywords}


def _exec(text: str, **names: Any) -> dict[str, Any]:
    namespace: dict[str, Any] = dict(names)
    with warnings.catch_warnings():  # transformers 5.23 renamed gradient_checkpointing
        warnings.simplefilter("ignore", FutureWarning)
        exec(compile(text, "<export>", "exec"), namespace)  # noqa: S102 — our generated code
    return namespace


def _run_sft(text: str) -> list[float]:
    """The sft export as a script: its own tokenizer and data lines (the space's file, its
    'conversation' column renamed as SFTTrainer needs) and its trainer line, uncommented as
    it is (the export imports SFTTrainer itself)."""
    assert "# trainer = SFTTrainer(" in text and "# trainer.train()" in text
    trainer = _exec(text.replace("# trainer = ", "trainer = "))["trainer"]
    trainer.args.max_steps, trainer.args.logging_steps = STEPS, 1
    trainer.train()
    return [log["loss"] for log in trainer.state.log_history if "loss" in log]


def _run_trainer(text: str) -> list[float]:
    """The trainer export as a script: its own tokenizer, data (the space's file rendered with
    the chat template, tokenized and cut as the trials did) and collator, its trainer line
    uncommented."""
    assert "# trainer = Trainer(" in text
    trainer = _exec(text.replace("# trainer = ", "trainer = "))["trainer"]
    trainer.args.max_steps, trainer.args.logging_steps = STEPS, 1
    trainer.train()
    return [log["loss"] for log in trainer.state.log_history if "loss" in log]


def _run_loop(text: str, model_dir: Path) -> list[float]:
    """The DataLoader export (its own data and collate_fn) and its ``prepare``/``AUTOCAST``
    in a plain training loop."""
    from transformers import AutoModelForCausalLM

    namespace = _exec(text)
    model, optimizer = namespace["prepare"](AutoModelForCausalLM.from_pretrained(str(model_dir)))
    losses = []
    for step, batch in enumerate(namespace["loader"]):
        with namespace["AUTOCAST"]():
            loss = model(**batch).loss / namespace["ACCUMULATION_STEPS"]
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(float(loss.detach()))
        if step + 1 == STEPS:
            break
    return losses


@pytest.mark.parametrize("markers", [True, False], ids=["with-generation", "without-generation"])
def test_every_export_runs_with_the_users_model_and_template(
    tmp_path: Path, cache_dir: Path, monkeypatch: pytest.MonkeyPatch, markers: bool
) -> None:
    rec, space_yaml = _sweep(tmp_path, cache_dir, CHATML if markers else PLAIN_CHATML)
    monkeypatch.chdir(tmp_path)  # the exports' output_dir="output"
    model_dir = tmp_path / "my-model"

    # what the trial trained on, recorded: the replies where TRL can mask them, else all
    assert rec.reply_markers is markers
    assert rec.loss_labels == ("replies" if markers else "all")

    sft = render(rec, "sft", space_yaml)
    kwargs = _call_kwargs(sft, "SFTConfig")
    assert kwargs["learning_rate"] == 2e-4  # the space's workload.learning_rate
    assert kwargs["gradient_checkpointing"] is False  # SFTConfig's default (True) overridden
    if markers:
        assert kwargs["assistant_only_loss"] is True
    else:
        assert "assistant_only_loss" not in kwargs
        assert "# loss on every token" in sft and "{% generation %}" in sft
        assert "the trials measured this loss" in sft
        # the reason: TRL refuses assistant_only_loss with this template
        refused = sft.replace(
            "sft_config = SFTConfig(", "sft_config = SFTConfig(\n    assistant_only_loss=True,"
        )
        with pytest.raises((ValueError, RuntimeError)):
            _run_sft(refused)
    assert len(_run_sft(sft)) == STEPS

    trainer = render(rec, "trainer", space_yaml)
    assert _call_kwargs(trainer, "TrainingArguments")["learning_rate"] == 2e-4
    assert len(_run_trainer(trainer)) == STEPS

    loop = render(rec, "dataloader", space_yaml)
    assert "LEARNING_RATE = 0.0002" in loop
    losses = _run_loop(loop, model_dir)
    assert len(losses) == STEPS and all(loss == loss for loss in losses)

    # the YAML's config is a baseline a later space can take as it is; the JSON round-trips
    document = yaml.safe_load(render(rec, "yaml", space_yaml))
    later = yaml.safe_load(space_yaml)
    later["baseline"] = document["config"]
    assert parse_space(yaml.safe_dump(later)).known_configs()[0].model_dump() == {
        **document["config"],
        **{k: None for k in rec.config if k not in document["config"]},
    }
    again = Recommendation.model_validate_json(render(rec, "json", space_yaml))
    assert again.reply_markers is markers and again.config == rec.config
