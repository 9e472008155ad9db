"""The trainer, sft and dataloader exports pasted as a user pastes them, run as written (their
commented trainer lines uncommented, nothing imported for them) on a tiny model directory and
chat records of the user's own, with trials recorded in a store instead of swept.

What they must reproduce of the measured run: the epochs the hours and $/run were priced for
(TrainingArguments' default is 3), the padding the trial's engine gave each batch (every batch
padded to max_seq_length with workload.padding: max_length, the loop's and Trainer's default),
a LoRA adapter with an optimizer over its parameters only, and the header's figures as
``sweeper best`` shows them."""

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
from sweeper.store import Store
from tests.helpers import STUDY_FIELDS, TINY_SPACE, tiny_config

LENGTH = 128
BATCH = 4


def _texts(n: int) -> list[list[dict[str, str]]]:
    return [
        [
            {"role": "user", "content": f"What is {i} + {i}?" + " Please." * (i % 7)},
            {"role": "assistant", "content": f"{i} + {i} is {2 * i}." + " Indeed." * (i % 4)},
        ]
        for i in range(n)
    ]


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A user's model directory (save_pretrained, a ChatML template without reply markers)
    and chat records beside it."""
    pytest.importorskip("transformers")
    from tests.test_export_runs import PLAIN_CHATML, _model_dir

    root = tmp_path_factory.mktemp("job")
    _model_dir(root, PLAIN_CHATML)
    (root / "chats.jsonl").write_text(
        "".join(json.dumps({"messages": chat}) + "\n" for chat in _texts(40))
    )
    return root


def _space(job: Path | None, **workload: Any) -> str:
    space = yaml.safe_load(TINY_SPACE.read_text())
    if job is not None:
        space["workload"]["model"] = {"id": str(job / "my-model")}
        space["workload"]["tokenizer"] = {}
        space["workload"]["dataset"] = {
            "path": str(job / "chats.jsonl"), "messages_field": "messages",
        }  # fmt: skip
    space["workload"]["engine"] = "trainer"
    space["workload"].update(workload)
    space["search"]["max_seq_length"] = [LENGTH]
    space["baseline"]["max_seq_length"] = LENGTH
    return yaml.safe_dump(space)


def _study(url: str, space_yaml: str, **config: Any) -> tuple[Recommendation, str]:
    """The recommendation of a study whose one trial is recorded with ``config``: 0.031 h and
    $0.0031 a run, a small CPU job's figures."""
    store = Store(url)
    store.migrate()
    try:
        cpu = {"hardware_name": "CPU", "usd_per_hour": 0.10, "device": "cpu"}
        store.upsert_study("mine", **(STUDY_FIELDS | cpu | {"space_yaml": space_yaml}))
        values = {"per_device_batch_size": BATCH, "max_seq_length": LENGTH, **config}
        store.start_trial("mine", 0, tiny_config(**values).model_dump())
        store.finish_trial(
            "mine", 0, "complete", samples_per_s=8.8, it_per_s=0.55,
            hours_per_run=0.031, cost_per_run_usd=0.0031,
        )  # fmt: skip
        return best(store, "mine"), store.get_study("mine").space_yaml
    finally:
        store.dispose()


def _exec(text: str, **names: Any) -> dict[str, Any]:
    """The export run as a script, its commented trainer lines uncommented as they are."""
    script = text.replace("# trainer = ", "trainer = ").replace("# trainer.train()", "")
    namespace: dict[str, Any] = dict(names)
    with warnings.catch_warnings():  # transformers 5.23 renamed gradient_checkpointing
        warnings.simplefilter("ignore", FutureWarning)
        exec(compile(script, "<export>", "exec"), namespace)  # noqa: S102 — our generated code
    return namespace


def _train(trainer: Any, steps: int = 2) -> list[float]:
    trainer.args.max_steps, trainer.args.logging_steps = steps, 1
    trainer.train()
    return [log["loss"] for log in trainer.state.log_history if "loss" in log]


def test_the_header_shows_a_small_jobs_hours_and_dollars_as_best_does(sqlite_url: str) -> None:
    rec, space_yaml = _study(sqlite_url, _space(None))
    for fmt in ("trainer", "sft", "dataloader"):
        header, picked = render(rec, fmt, space_yaml).splitlines()[:2]
        assert "0.031 h and $0.0031 per run" in header, header  # was "0.0 h and $0.00"
        # what it is, said plainly (it read "study 'mine', trial #0 of 1": of what?)
        assert header.startswith(
            "# sweeper's recommended config for study 'mine': trial #0, as measured: 8.8"
        ), header
        assert picked == "# (picked among the study's 1 completed trial, no constraint)", picked


@pytest.mark.torch
def test_the_trainer_export_trains_the_priced_epochs_on_batches_padded_as_measured(
    job: Path, sqlite_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # output_dir="output"
    rec, space_yaml = _study(sqlite_url, _space(job))
    text = render(rec, "trainer", space_yaml)
    assert "num_train_epochs=1," in text
    namespace = _exec(text)
    trainer = namespace["trainer"]
    assert trainer.args.num_train_epochs == 1  # TrainingArguments' default is 3
    batch = next(iter(trainer.get_train_dataloader()))
    # workload.padding: max_length (the default): every batch as wide as max_seq_length
    assert tuple(batch["input_ids"].shape) == (BATCH, LENGTH)
    assert bool((batch["labels"][batch["attention_mask"] == 0] == -100).all())
    assert len(_train(trainer)) == 2


@pytest.mark.torch
@pytest.mark.parametrize("engine", ["trainer", "sft"])
def test_the_sft_export_runs_as_written_with_the_priced_epochs_and_padding(
    job: Path, sqlite_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, engine: str
) -> None:
    """Uncommented, the SFTTrainer line runs without an import of the user's (it raised
    NameError: SFTTrainer); its batches are padded as the study's engine padded them:
    SFTTrainer's own (the longest sample) for an sft study, max_seq_length for a Trainer one."""
    monkeypatch.chdir(tmp_path)
    rec, space_yaml = _study(sqlite_url, _space(job, engine=engine, epochs=2))
    text = render(rec, "sft", space_yaml)
    assert "from trl import SFTConfig, SFTTrainer" in text
    trainer = _exec(text)["trainer"]
    assert trainer.args.num_train_epochs == 2
    batch = next(iter(trainer.get_train_dataloader()))
    width = batch["input_ids"].shape[1]
    if engine == "trainer":
        assert trainer.args.pad_to_multiple_of == LENGTH and width == LENGTH
    else:
        assert trainer.args.pad_to_multiple_of is None and width < LENGTH
    assert len(_train(trainer)) == 2


@pytest.mark.torch
@pytest.mark.parametrize("padding", ["max_length", "longest"])
def test_the_dataloader_export_batches_what_the_trial_batched(
    job: Path, sqlite_url: str, tmp_path: Path, padding: str
) -> None:
    """The exported tokenize and collate_fn make the very tensors the trial's dataset and
    collator made from the same records (sweeper.trial.workload), and the exported loader
    reads the space's file into batches of the measured shape (it had no collate_fn: samples
    of different lengths did not even stack)."""
    import torch
    from datasets import Dataset

    from sweeper.space import parse_space
    from sweeper.trial.workload import TokenizingDataset, make_collator

    rec, space_yaml = _study(sqlite_url, _space(job, padding=padding))
    namespace = _exec(render(rec, "dataloader", space_yaml))
    tokenizer = namespace["tokenizer"]
    texts = [tokenizer.apply_chat_template(c, tokenize=False) for c in _texts(40)]
    texts[3] = texts[3] * 20  # longer than max_seq_length: cut, as the trial cut it
    ours = namespace["collate"]([namespace["tokenize"](tokenizer, t) for t in texts[:BATCH]])
    workload = parse_space(space_yaml).workload
    trial_rows = TokenizingDataset(Dataset.from_dict({"text": texts}), "text", tokenizer, LENGTH)
    config = tiny_config(per_device_batch_size=BATCH, max_seq_length=LENGTH)
    theirs = make_collator(workload, config, tokenizer)([trial_rows[i] for i in range(BATCH)])
    assert ours.keys() == theirs.keys()
    for key in theirs:
        assert torch.equal(ours[key], theirs[key]), key

    lengths = {len(namespace["tokenize"](tokenizer, t)["input_ids"]) for t in texts[4:]}
    assert max(lengths) < LENGTH  # the records themselves are short
    widths = set()
    for batch in namespace["loader"]:
        assert batch["input_ids"].shape[0] == BATCH
        widths.add(batch["input_ids"].shape[1])
    if padding == "max_length":
        assert widths == {LENGTH}
    else:  # each batch as wide as its longest sample
        assert widths <= lengths


@pytest.mark.torch
@pytest.mark.parametrize("checkpointing", [False, True])
def test_the_dataloader_export_of_a_lora_study_trains_the_adapter_only(
    job: Path, sqlite_url: str, checkpointing: bool
) -> None:
    """prepare(model) puts the space's LoRA adapter on the model as the trial did and its
    optimizer holds the adapter's parameters only (it built AdamW over all of them, no peft)."""
    import torch
    from transformers import AutoModelForCausalLM

    from sweeper.job import AdapterSpec
    from sweeper.trial.workload import with_adapter

    adapter = {"r": 4, "alpha": 8, "target_modules": ["q_proj", "v_proj"]}
    rec, space_yaml = _study(
        sqlite_url, _space(job, adapter=adapter), gradient_checkpointing=checkpointing
    )
    namespace = _exec(render(rec, "dataloader", space_yaml))
    with warnings.catch_warnings():  # peft reads transformers 5.23's renamed checkpointing
        warnings.simplefilter("ignore", FutureWarning)
        model, optimizer = namespace["prepare"](
            AutoModelForCausalLM.from_pretrained(str(job / "my-model"))
        )
        # the trial's adapter on the same model
        trial = with_adapter(
            AutoModelForCausalLM.from_pretrained(str(job / "my-model")),
            AdapterSpec.model_validate(adapter),
            tiny_config(gradient_checkpointing=checkpointing),
        )
    trainable = {id(p) for p in model.parameters() if p.requires_grad}
    optimized = {id(p) for group in optimizer.param_groups for p in group["params"]}
    total = sum(p.numel() for p in model.parameters())
    assert trainable and optimized == trainable
    # the trial's adapter trains as many parameters
    assert sum(p.numel() for p in model.parameters() if p.requires_grad) == sum(
        p.numel() for p in trial.parameters() if p.requires_grad
    )
    assert sum(p.numel() for p in model.parameters() if p.requires_grad) < total / 10

    frozen = {n: p.detach().clone() for n, p in model.named_parameters() if not p.requires_grad}
    lora = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    model.train()
    batch = next(iter(namespace["loader"]))
    with namespace["AUTOCAST"]():
        loss = model(**batch).loss
    loss.backward()
    optimizer.step()
    assert all(torch.equal(p, frozen[n]) for n, p in model.named_parameters() if n in frozen)
    assert any(not torch.equal(p, lora[n]) for n, p in model.named_parameters() if n in lora)


def test_the_dataloader_export_of_a_qlora_study_loads_and_prepares_as_measured(
    sqlite_url: str,
) -> None:
    rec, space_yaml = _study(
        sqlite_url,
        _space(None, adapter={"r": 8}).replace("device: cpu", "device: cuda"),
        quantization="4bit",
        precision="bf16",
        gradient_checkpointing=True,
    )
    text = render(rec, "dataloader", space_yaml)
    ast.parse(text)
    assert "load_in_4bit=True" in text and "quantization_config=quantization" in text
    prepare = text[text.index("def prepare(model):") :]
    assert "prepare_model_for_kbit_training(model, use_gradient_checkpointing=True)" in prepare
    assert "get_peft_model(model, LoraConfig(r=8," in prepare
    assert "params = [p for p in model.parameters() if p.requires_grad]" in prepare
    assert "AdamW(params," in prepare and "model.parameters(), lr" not in prepare


@pytest.mark.torch
def test_a_replies_only_export_labels_the_replies_as_the_trial_did(
    job: Path, sqlite_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """loss: completion: the Trainer and DataLoader exports label the assistant's replies only,
    the very labels the trial's dataset and collator made from the same records (they took the
    loss on every token, with a comment saying how to do otherwise), and the Trainer export
    trains on them as pasted."""
    import torch
    from datasets import Dataset

    from sweeper.space import parse_space
    from sweeper.trial.corpus import render_chat
    from sweeper.trial.workload import TokenizingDataset, make_collator

    monkeypatch.chdir(tmp_path)
    space_yaml = _space(job)
    space = yaml.safe_load(space_yaml)
    space["workload"]["dataset"]["loss"] = "completion"
    rec, space_yaml = _study(sqlite_url, yaml.safe_dump(space))
    chats = _texts(40)
    chats[3] = chats[3] * 12  # a long record: cut at max_seq_length, its later replies lost
    chats[5] = [*chats[5], {"role": "user", "content": "And?"}, chats[5][1]]  # two replies

    for fmt in ("dataloader", "trainer"):
        text = render(rec, fmt, space_yaml)
        assert "tokenize_replies(tokenizer, row['messages'])" in text
        namespace = _exec(text)
        tokenizer = namespace["tokenizer"]
        rows = [namespace["tokenize_replies"](tokenizer, chat) for chat in chats]
        rendered = [render_chat(c, tokenizer, tokenizer.chat_template, True) for c in chats]
        trial_rows = TokenizingDataset(
            Dataset.from_dict(
                {"text": [t for t, _ in rendered], "completion_spans": [s for _, s in rendered]}
            ),
            "text",
            tokenizer,
            LENGTH,
        )
        collate = make_collator(
            parse_space(space_yaml).workload,
            tiny_config(per_device_batch_size=BATCH, max_seq_length=LENGTH),
            tokenizer,
        )
        for start in (0, 4):  # the long record's batch, and the two-reply one's
            ours = namespace["collate"](rows[start : start + BATCH])
            theirs = collate([trial_rows[i] for i in range(start, start + BATCH)])
            assert ours.keys() == theirs.keys()
            for key in theirs:
                assert torch.equal(ours[key], theirs[key]), (fmt, start, key)
        prompts = (ours["labels"] == -100) & (ours["attention_mask"] == 1)
        assert bool(prompts.any()) and bool((ours["labels"] != -100).any())

    trainer = namespace["trainer"]  # the Trainer export, its dataset the space's file
    batch = next(iter(trainer.get_train_dataloader()))
    assert bool(((batch["labels"] == -100) & (batch["attention_mask"] == 1)).any())
    assert len(_train(trainer)) == 2


@pytest.mark.torch
def test_the_padding_free_trainer_export_runs_as_written(
    job: Path, sqlite_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The padding-free Trainer export builds its collator once (it also told the user to
    pass a second one to the Trainer) and trains on flattened batches as pasted."""
    monkeypatch.chdir(tmp_path)
    rec, space_yaml = _study(sqlite_url, _space(job), padding_free=True)
    text = render(rec, "trainer", space_yaml)
    code = [line for line in text.splitlines() if not line.lstrip().startswith("#")]
    assert sum("DataCollatorWithFlattening()" in line for line in code) == 1
    assert sum("DataCollatorWithFlattening" in line for line in text.splitlines()) == 2  # import
    trainer = _exec(text)["trainer"]
    batch = next(iter(trainer.get_train_dataloader()))
    assert batch["input_ids"].shape[0] == 1 and "attention_mask" not in batch
    assert int((batch["position_ids"] == 0).sum()) == BATCH  # one start per sample
    assert len(_train(trainer)) == 2


@pytest.mark.torch
@pytest.mark.parametrize("loss", ["all", "completion"])
def test_the_packed_exports_read_the_data_and_pack_it_as_the_trials_did(
    job: Path, sqlite_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, loss: str
) -> None:
    """A packed winner's DataLoader export ended in NameError: 'dataset' (no tokenizer, no
    data: `dataset = PackedBlocks(dataset)`), and its Trainer export held no data code at all
    (a comment pointing at the sft export). Both now read the space's file, tokenize each
    sample whole with its EOS as the trial's dataset does (labels on the replies only under
    loss: completion), and split the concatenation into full max_seq_length blocks; the
    Trainer export trains on them as pasted."""
    from datasets import Dataset

    from sweeper.trial.corpus import render_chat
    from sweeper.trial.workload import TokenizingDataset

    monkeypatch.chdir(tmp_path)
    space = yaml.safe_load(_space(job))
    space["workload"]["dataset"]["loss"] = loss
    rec, space_yaml = _study(sqlite_url, yaml.safe_dump(space), packing=True)
    for fmt in ("dataloader", "trainer"):
        text = render(rec, fmt, space_yaml)
        assert "truncat" not in text and "cut at" not in text
        namespace = _exec(text)
        tokenizer = namespace["tokenizer"]
        rendered = [render_chat(c, tokenizer, tokenizer.chat_template, True) for c in _texts(40)]
        columns = {"text": [t for t, _ in rendered]}
        if loss == "completion":
            columns["completion_spans"] = [spans for _, spans in rendered]
        trial_rows = TokenizingDataset(Dataset.from_dict(columns), "text", tokenizer, None)
        stream_ids, stream_labels = [], []
        for i in range(40):  # the trial's samples, whole, in the file's order
            ids, mask = trial_rows[i]
            stream_ids += ids
            stream_labels += (
                ids if mask is None else [t if m else -100 for t, m in zip(ids, mask, strict=True)]
            )
        blocks = list(namespace["dataset"])
        assert len(blocks) == len(stream_ids) // LENGTH > BATCH
        assert [t for b in blocks for t in b["input_ids"]] == stream_ids[: len(blocks) * LENGTH]
        assert [t for b in blocks for t in b["labels"]] == stream_labels[: len(blocks) * LENGTH]
        if loss == "completion":
            assert -100 in stream_labels
        batch = namespace["collate"](blocks[:BATCH])
        assert batch["input_ids"].shape == (BATCH, LENGTH)
        assert bool((batch["attention_mask"] == 1).all())
    loader = namespace.get("loader") or _exec(render(rec, "dataloader", space_yaml))["loader"]
    assert next(iter(loader))["input_ids"].shape == (BATCH, LENGTH)
    trainer = namespace["trainer"]
    assert next(iter(trainer.get_train_dataloader()))["labels"].shape == (BATCH, LENGTH)
    assert len(_train(trainer)) == 2
