"""The exports of an ``engine: sft`` study reproduce, token for token, the samples SFTTrainer
made in its trials, with a tokenizer whose EOS is the token that ends a chat turn (Qwen2's
``<|im_end|>``).

An sft trial hands SFTTrainer the records rendered with the chat template as text (token ids
with an assistant mask for a reply-only loss; sweeper.trial.engines.trainer's train_sft), and
TRL closes a text with its EOS only where the text does not already end with it: a ChatML
text ends with ``<|im_end|>\\n``, so it gets a second ``<|im_end|>``; a template that ends the
last turn with ``<|im_end|>`` itself gets none. SFTTrainer tokenizes with the tokenizer's
special tokens and keeps a long sample's first max_length tokens (its EOS lost). The Trainer
and DataLoader exports appended the EOS id to every sample whatever its text ended with and
cut a long sample to leave room for it; the SFT export handed SFTTrainer the chat records
themselves, which it renders and closes with no EOS at all.

The trial side here is SFTTrainer built as train_sft builds it (the engine's own
``_token_rows``, the winner's SFTConfig keywords from ``sweeper.knobs``), on the records of
the space's own file; the exports are exec'd as pasted."""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import pytest
import yaml

from sweeper import knobs
from sweeper.export import render
from sweeper.recommend import best
from sweeper.store import Store
from tests.helpers import STUDY_FIELDS, TINY_SPACE, tiny_config

pytestmark = pytest.mark.torch

LENGTH = 96
BATCH = 4
EOS = "<|im_end|>"
# Qwen2's ChatML: each turn ends with EOS and a newline; the replies marked for TRL
CHATML_NEWLINE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' }}"
    "{% if message['role'] == 'assistant' %}{% generation %}"
    "{{ message['content'] + '<|im_end|>' }}{% endgeneration %}{{ '\\n' }}"
    "{% else %}{{ message['content'] + '<|im_end|>\\n' }}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
# turns joined by a newline, the last one ending with the EOS itself
CHATML_CLOSED = (
    "{% for message in messages %}{% if not loop.first %}{{ '\\n' }}{% endif %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' }}"
    "{% if message['role'] == 'assistant' %}{% generation %}"
    "{{ message['content'] + '<|im_end|>' }}{% endgeneration %}"
    "{% else %}{{ message['content'] + '<|im_end|>' }}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ '\\n<|im_start|>assistant\\n' }}{% endif %}"
)
TEMPLATES = {"newline": CHATML_NEWLINE, "closed": CHATML_CLOSED}


def _chats() -> list[list[dict[str, str]]]:
    chats = [
        [
            {"role": "system", "content": "You are a concise assistant."},
            {"role": "user", "content": f"What is {i} + {i}?" + " Please." * (i % 5)},
            {"role": "assistant", "content": f"{i} + {i} is {2 * i}." + " Indeed." * (i % 4)},
        ]
        for i in range(24)
    ]
    chats[1] = chats[1] + chats[1][1:] * 8  # longer than max_seq_length: cut
    return chats


def _job(root: Path, template: str) -> Path:
    """A Qwen2 model directory as a user's own: a local byte-level BPE whose EOS is
    ``<|im_end|>`` (no BOS), its chat template, a tiny model; and the chat records beside."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    chats = _chats()
    bpe = Tokenizer(models.BPE(unk_token=None))
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    bpe.train_from_iterator(
        [m["content"] for chat in chats for m in chat],
        trainers.BpeTrainer(
            vocab_size=300,
            special_tokens=["<|endoftext|>", "<|im_start|>", EOS],
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        ),
    )
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=bpe, eos_token=EOS, pad_token="<|endoftext|>", chat_template=template
    )
    model_dir = root / "model"
    tokenizer.save_pretrained(str(model_dir))
    config = Qwen2Config(
        vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=512,
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=True,
    )  # fmt: skip
    Qwen2ForCausalLM(config).save_pretrained(str(model_dir))
    (root / "chats.jsonl").write_text("".join(json.dumps({"messages": c}) + "\n" for c in chats))
    return root


@pytest.fixture(scope="module", params=sorted(TEMPLATES))
def job(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("trl")
    return _job(tmp_path_factory.mktemp(f"job-{request.param}"), TEMPLATES[request.param])


def _rec(url: str, job: Path, loss: str, **config: Any) -> tuple[Any, str, dict[str, Any]]:
    """The recommendation of an sft study of the job whose one trial ran ``config``."""
    space = yaml.safe_load(TINY_SPACE.read_text())
    space["workload"]["model"] = {"id": str(job / "model")}
    space["workload"]["tokenizer"] = {}
    space["workload"]["dataset"] = {
        "path": str(job / "chats.jsonl"), "messages_field": "messages", "loss": loss,
    }  # fmt: skip
    space["workload"]["engine"] = "sft"
    space["search"]["max_seq_length"] = [LENGTH]
    space["baseline"]["max_seq_length"] = LENGTH
    space_yaml = yaml.safe_dump(space)
    trial = tiny_config(per_device_batch_size=BATCH, max_seq_length=LENGTH, **config)
    store = Store(url)
    store.migrate()
    try:
        store.upsert_study("mine", **(STUDY_FIELDS | {"space_yaml": space_yaml}))
        store.start_trial("mine", 0, trial.model_dump())
        store.finish_trial(
            "mine", 0, "complete", samples_per_s=8.0, it_per_s=1.0,
            hours_per_run=0.031, cost_per_run_usd=0.0031,
        )  # fmt: skip
        rec, space_yaml = best(store, "mine"), store.get_study("mine").space_yaml
    finally:
        store.dispose()
    return rec, space_yaml, knobs.normalize(trial.model_dump())


def _exec(text: str) -> dict[str, Any]:
    """An export run as a script, its commented trainer lines uncommented."""
    script = text.replace("# trainer = ", "trainer = ").replace("# trainer.train()", "")
    namespace: dict[str, Any] = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        exec(compile(script, "<export>", "exec"), namespace)  # noqa: S102 — our generated code
    return namespace


def _trial(job: Path, config: dict[str, Any], replies: bool, tmp_path: Path) -> Any:
    """SFTTrainer as the sft engine built it (train_sft): the records rendered as the trial
    renders them (sweeper.trial.corpus.render_chat), handed over as text, or as the engine's
    own token rows for a reply-only loss or padding-free; the trial's SFTConfig keywords."""
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import SFTConfig, SFTTrainer

    from sweeper.trial.corpus import render_chat
    from sweeper.trial.engines.trainer import _token_rows

    tokenizer = AutoTokenizer.from_pretrained(str(job / "model"))
    rendered = [render_chat(c, tokenizer, tokenizer.chat_template, replies) for c in _chats()]
    columns: dict[str, Any] = {"text": [text for text, _ in rendered]}
    if replies:
        columns["completion_spans"] = [spans for _, spans in rendered]
    rows = Dataset.from_dict(columns)
    cut = config["max_seq_length"] if config.get("padding_free") else None
    if replies or cut is not None:
        rows = rows.map(
            _token_rows,
            batched=True,
            fn_kwargs={"tokenizer": tokenizer, "field": "text", "replies": replies, "cut": cut},
            remove_columns=rows.column_names,
        )
    with warnings.catch_warnings():  # transformers 5.23 renamed gradient_checkpointing
        warnings.simplefilter("ignore")
        args = SFTConfig(
            output_dir=str(tmp_path / "trial"), per_device_train_batch_size=BATCH,
            report_to="none", use_cpu=True, dataset_text_field="text",
            remove_unused_columns=True, **knobs.sft_arguments(config),
        )  # fmt: skip
        return SFTTrainer(
            model=AutoModelForCausalLM.from_pretrained(str(job / "model")),
            args=args,
            train_dataset=rows,
            processing_class=tokenizer,
        )


def _rows(dataset: Any) -> list[tuple[list[int], list[int]]]:
    return [
        (list(row["input_ids"]), list(row.get("labels") or row["input_ids"])) for row in dataset
    ]


@pytest.mark.parametrize("loss", ["all", "completion"])
@pytest.mark.parametrize("fmt", ["trainer", "dataloader"])
def test_the_trainer_and_dataloader_exports_of_an_sft_study_make_its_samples_and_batches(
    job: Path,
    sqlite_url: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    fmt: str,
    loss: str,
) -> None:
    """Every sample the export reads from the space's file is the trial's, EOS for EOS (the
    ChatML text's second ``<|im_end|>``, none after a text that ends with it), the long one
    cut where SFTTrainer cut it; the first batch is the trial collator's, tensor for tensor."""
    import torch

    monkeypatch.chdir(tmp_path)
    rec, space_yaml, config = _rec(sqlite_url, job, loss)
    ours = _exec(render(rec, fmt, space_yaml))
    trial = _trial(job, config, loss == "completion", tmp_path)
    theirs = trial.train_dataset
    assert _rows(ours["dataset"]) == _rows(theirs)
    tokenizer = trial.processing_class
    newline = tokenizer.apply_chat_template(_chats()[0], tokenize=False).endswith("\n")
    # TRL closes a text with EOS unless it ends with it (ChatML's newline: a second one);
    # the engine's token rows of a reply-only loss are closed with EOS whatever the text
    second = newline or loss == "completion"
    closing = EOS + ("\n" if newline else "") + (EOS if second else "")
    end = tokenizer(closing, add_special_tokens=False)["input_ids"]
    for ids, _ in _rows(theirs):
        if len(ids) < LENGTH:
            assert ids[-len(end) :] == end and ids[-len(end) - 1] != tokenizer.eos_token_id
    long = _rows(theirs)[1][0]
    assert len(long) == LENGTH and long[-1] != tokenizer.eos_token_id  # SFTTrainer's cut

    batch = ours["collate"]([ours["dataset"][i] for i in range(BATCH)])
    expected = trial.data_collator([theirs[i] for i in range(BATCH)])
    for key in ("input_ids", "attention_mask", "labels"):
        assert torch.equal(batch[key], expected[key]), key
    if loss == "completion":
        assert bool(((batch["labels"] == -100) & (batch["attention_mask"] == 1)).any())


@pytest.mark.parametrize("loss", ["all", "completion"])
def test_the_packed_exports_of_an_sft_study_pack_its_samples(
    job: Path, sqlite_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, loss: str
) -> None:
    """Packed, each sample whole with its EOS as SFTTrainer closed it, the blocks its
    wrapped packing made (the export drops the last, partial one)."""
    monkeypatch.chdir(tmp_path)
    rec, space_yaml, config = _rec(sqlite_url, job, loss, packing=True)
    assert config["packing_strategy"] == "wrapped"
    theirs = _rows(_trial(job, config, loss == "completion", tmp_path).train_dataset)
    for fmt in ("trainer", "dataloader"):
        ours = _rows(_exec(render(rec, fmt, space_yaml))["dataset"])
        assert len(ours) == len(theirs) - 1 and len(theirs[-1][0]) < LENGTH
        assert ours == theirs[:-1], fmt


def test_the_sft_export_of_an_sft_study_hands_sfttrainer_what_the_trial_did(
    job: Path, sqlite_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The SFT export's SFTTrainer tokenizes the space's file into the trial's samples: the
    records rendered as text, closed by EOS unless they end with it (handed the chat records,
    SFTTrainer rendered them itself and closed none: one token fewer a sample than
    measured)."""
    monkeypatch.chdir(tmp_path)
    rec, space_yaml, config = _rec(sqlite_url, job, "all")
    ours = _exec(render(rec, "sft", space_yaml))["trainer"].train_dataset
    theirs = _trial(job, config, False, tmp_path).train_dataset
    assert _rows(ours) == _rows(theirs)
