"""The user's own data: every file format datasets reads, chat records rendered with a chat
template (and only the replies as labels under loss: completion), and a clear error, naming the
file, the row and the fix, for data a trial would trip over."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from sweeper.errors import TrialError
from sweeper.presets import MODEL_SIZES
from sweeper.space import Space, parse_space
from sweeper.trial.corpus import CHATML, prepare, render_chat
from sweeper.trial.protocol import PreparedData
from sweeper.trial.workload import (
    Collator,
    PackedStream,
    TokenizingDataset,
    load_tokenizer,
    open_rows,
)
from tests.helpers import TINY_SPACE, run_sweeper

TEXTS = [("def f(x):\n    return x * 2\n" * (1 + i % 7)) + f"# sample {i}\n" for i in range(60)]
CHATS = [
    [
        {"role": "system", "content": "You answer in one line."},
        {"role": "user", "content": f"What is {i} + {i}?"},
        {"role": "assistant", "content": f"{i} + {i} is {2 * i}."},
        {"role": "user", "content": "And doubled?"},
        {"role": "assistant", "content": f"Doubled it is {4 * i}."},
    ]
    for i in range(40)
]


def _space(dataset: dict[str, Any], **workload: Any) -> Space:
    data = yaml.safe_load(TINY_SPACE.read_text())
    data["workload"]["dataset"] = dataset
    data["workload"].update(workload)
    return parse_space(yaml.safe_dump(data), "test space")


def _write_jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _formats(tmp_path: Path) -> dict[str, Path]:
    """The same rows as .jsonl, .json, .parquet, .csv and a save_to_disk directory."""
    from datasets import Dataset, DatasetDict

    rows = [{"text": t, "id": i} for i, t in enumerate(TEXTS)]
    dataset = Dataset.from_list(rows)
    paths = {"jsonl": _write_jsonl(tmp_path / "data.jsonl", rows)}
    paths["json"] = tmp_path / "data.json"
    paths["json"].write_text(json.dumps(rows))
    paths["parquet"] = tmp_path / "data.parquet"
    dataset.to_parquet(str(paths["parquet"]))
    paths["csv"] = tmp_path / "data.csv"
    dataset.to_csv(str(paths["csv"]), index=False)
    paths["disk"] = tmp_path / "saved"
    DatasetDict({"train": dataset, "test": dataset.select(range(5))}).save_to_disk(
        str(paths["disk"])
    )
    return paths


def test_every_format_reads_the_same_rows(tmp_path: Path, cache_dir: Path) -> None:
    """JSONL, JSON, Parquet, CSV and save_to_disk hold the same text: the same token stats."""
    stats = {}
    for name, path in _formats(tmp_path).items():
        prepared = prepare(_space({"path": str(path)}).workload, cache_dir)
        assert prepared.stats["dataset_rows"] == len(TEXTS), name
        stats[name] = prepared.stats["token_percentiles"]
        rows = open_rows(prepared, cache_dir)
        assert rows[3]["text"] == TEXTS[3], name
    assert all(s == stats["jsonl"] for s in stats.values()), stats

    with pytest.raises(TrialError, match=r"no split 'validation' \(it has train, test\)"):
        prepare(
            _space({"path": str(tmp_path / "saved"), "split": "validation"}).workload, cache_dir
        )
    test_split = prepare(
        _space({"path": str(tmp_path / "saved"), "split": "test"}).workload, cache_dir
    )
    assert test_split.stats["dataset_rows"] == 5


@pytest.mark.parametrize(
    ("rows", "dataset", "message"),
    [
        ([], {}, r"holds no rows; point it at the training data"),
        (
            [{"body": "x"}],
            {},
            r"has no column 'text' \(columns: body\); set text_field to the text column",
        ),
        (
            [{"text": "a"}, {"text": "b"}, {"text": None}, {"text": "d"}],
            {},
            r"data.jsonl:3 \(row 3\) has no 'text' \(null\); fill or drop the row",
        ),
        (
            [{"text": 1}, {"text": 2}],
            {},
            r"column 'text' of .*data.jsonl holds Value\('int64'\), not text",
        ),
        (
            [{"messages": CHATS[0]}, {"messages": [{"role": "user"}]}],
            {"messages_field": "messages"},
            r"data.jsonl:2 \(row 2\) cannot be rendered as a chat: a message is not "
            # the record's shape, not the template: no "(or set tokenizer.chat_template)"
            r"\{role: str, content: str\}.*fix or drop the row$",
        ),
        (
            [{"messages": CHATS[0][:2]}],
            {"messages_field": "messages", "loss": "completion"},
            r"data.jsonl:1 \(row 1\) .* has no assistant message",
        ),
        (
            [{"messages": CHATS[0]}],
            {"messages_field": "conversation"},
            r"has no column 'conversation' \(columns: messages\); set messages_field",
        ),
    ],
)
def test_bad_data_is_named_before_any_trial(
    tmp_path: Path,
    cache_dir: Path,
    rows: list[dict[str, Any]],
    dataset: dict[str, Any],
    message: str,
) -> None:
    path = tmp_path / "data.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(TrialError, match=message):
        prepare(_space({"path": str(path), **dataset}).workload, cache_dir)


def test_unreadable_files_say_which_and_how(tmp_path: Path, cache_dir: Path) -> None:
    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"text": "fine"}\n\n{"text": "cut off\n')
    with pytest.raises(TrialError, match=r"broken.jsonl:3: not a JSON object \(.*fix or drop"):
        prepare(_space({"path": str(broken)}).workload, cache_dir)
    broken.write_text('{"text": "fine"}\n["a list"]\n')
    with pytest.raises(TrialError, match=r"broken.jsonl:2: not a JSON object \(a list, not an"):
        prepare(_space({"path": str(broken)}).workload, cache_dir)
    dotted = tmp_path / "broken.v2.jsonl"  # a dotted name: pyarrow's 0-based 'row 1' before
    dotted.write_text(broken.read_text())
    with pytest.raises(TrialError, match=r"broken.v2.jsonl:2: not a JSON object \(a list, not"):
        prepare(_space({"path": str(dotted)}).workload, cache_dir)
    (tmp_path / "folder").mkdir()
    with pytest.raises(TrialError, match=r"is a directory but not one datasets' save_to_disk"):
        prepare(_space({"path": str(tmp_path / "folder")}).workload, cache_dir)
    with pytest.raises(TrialError, match=r"no such file or directory"):
        prepare(_space({"path": str(tmp_path / "missing.jsonl")}).workload, cache_dir)


def _chat_prepared(tmp_path: Path, cache_dir: Path, loss: str, **workload: Any) -> PreparedData:
    path = _write_jsonl(tmp_path / f"chats-{loss}.jsonl", [{"messages": c} for c in CHATS])
    space = _space({"path": str(path), "messages_field": "messages", "loss": loss}, **workload)
    return prepare(space.workload, cache_dir)


def test_chat_records_are_rendered_and_only_replies_are_labels(
    tmp_path: Path, cache_dir: Path
) -> None:
    prepared = _chat_prepared(tmp_path, cache_dir, "completion")
    assert prepared.chat_template == CHATML and prepared.completion_only
    tokenizer = load_tokenizer(prepared)
    rows = open_rows(prepared, cache_dir)
    text = rows[7]["text"]
    assert text.startswith("<|im_start|>system\nYou answer in one line.<|im_end|>\n")
    assert "<|im_start|>assistant\n7 + 7 is 14.<|im_end|>\n" in text
    # stats count the rendered text, template markers included
    content_only = sum(len(m["content"]) for m in CHATS[7])
    assert len(text) > content_only + 60

    dataset = TokenizingDataset(rows, "text", tokenizer, max_length=None)
    ids, mask = dataset[7]
    assert mask is not None and len(mask) == len(ids)
    batch = Collator(pad_id=tokenizer.pad_token_id, max_length=len(ids) + 3, pad_to_max=True)(
        [(ids, mask)]
    )
    labelled = batch["labels"][0][batch["labels"][0] != -100].tolist()
    decoded = tokenizer.decode(labelled)
    assert "7 + 7 is 14." in decoded and "Doubled it is 28." in decoded
    assert "What is 7 + 7?" not in decoded and "one line" not in decoded
    assert batch["labels"][0][-3:].tolist() == [-100] * 3  # padding is never a label

    # packing keeps each token's label bit with it across block boundaries
    stream = iter(PackedStream(dataset, block=32))
    blocks = [next(stream) for _ in range(8)]
    assert all(len(ids) == len(mask) == 32 for ids, mask in blocks)
    bits = [bit for _, mask in blocks for bit in mask]
    assert any(bits) and not all(bits)

    # loss: all labels every token of the same rendered text
    everything = _chat_prepared(tmp_path, cache_dir, "all")
    all_rows = open_rows(everything, cache_dir)
    assert all_rows[7]["text"] == text
    ids_all, mask_all = TokenizingDataset(all_rows, "text", tokenizer, max_length=None)[7]
    assert mask_all is None and ids_all == ids


def test_a_template_that_is_not_prefix_stable_is_refused() -> None:
    """If rendering the chat up to a reply is not a prefix of the whole, the replies cannot be
    found: loss: completion must not guess."""
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    tokenizer = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.BPE()))
    # numbers every message from the end: an earlier render is not a prefix of a later one
    template = (
        "{% for m in messages %}[{{ messages|length - loop.index }}]{{ m['content'] }}{% endfor %}"
    )
    with pytest.raises(ValueError, match="not render the conversation up to a reply as a prefix"):
        render_chat(CHATS[0], tokenizer, template, spans=True)
    text, spans = render_chat(CHATS[0], tokenizer, CHATML, spans=True)
    assert [text[a:b] for a, b in spans] == [
        "0 + 0 is 0.<|im_end|>\n",
        "Doubled it is 0.<|im_end|>\n",
    ]


def test_a_tokenizer_without_a_template_needs_one_named(tmp_path: Path, cache_dir: Path) -> None:
    """The user's own tokenizer without a chat template: the space must say which one."""
    tokenizer_dir = _tokenizer_dir(tmp_path, cache_dir)
    path = _write_jsonl(tmp_path / "c.jsonl", [{"messages": c} for c in CHATS])
    dataset = {"path": str(path), "messages_field": "messages"}
    space = _space(dataset)
    workload = space.workload.model_copy(
        update={"tokenizer": space.workload.tokenizer.model_copy(update={"id": str(tokenizer_dir)})}
    )
    with pytest.raises(TrialError, match=r"the tokenizer has no chat template; set "):
        prepare(workload, cache_dir)
    named = workload.model_copy(
        update={"tokenizer": workload.tokenizer.model_copy(update={"chat_template": "chatml"})}
    )
    assert prepare(named, cache_dir).chat_template == CHATML


def _tokenizer_dir(tmp_path: Path, cache_dir: Path) -> Path:
    """A tokenizer saved with save_pretrained, as a user's own would be."""
    from sweeper.trial.corpus import train_tokenizer

    out = tmp_path / "tokenizer"
    if not out.exists():
        train_tokenizer(TEXTS * 3, 300, out)
    return out


def test_users_model_directory_sweeps_with_its_own_tokenizer(
    tmp_path: Path, cache_dir: Path
) -> None:
    """A model and tokenizer written with save_pretrained (random weights, built here) are
    swept from their directory: the tokenizer comes from the same place, nothing is trained."""
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig

    model_dir = tmp_path / "my-model"
    train_dir = _tokenizer_dir(tmp_path, cache_dir)
    tokenizer = AutoTokenizer.from_pretrained(str(train_dir))
    tokenizer.save_pretrained(str(model_dir))
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    AutoModelForCausalLM.from_config(config).save_pretrained(str(model_dir))
    data = _write_jsonl(tmp_path / "train.jsonl", [{"text": t} for t in TEXTS])

    text = yaml.safe_load(TINY_SPACE.read_text())
    text["workload"]["model"] = {"id": str(model_dir)}
    text["workload"]["tokenizer"] = {}
    text["workload"]["dataset"] = {"path": str(data)}
    text["budget"] = {"n_trials": 2}
    space_file = tmp_path / "mine.yaml"
    space_file.write_text(yaml.safe_dump(text))
    result = run_sweeper(
        "launch",
        "--space",
        str(space_file),
        "--storage",
        f"sqlite:///{tmp_path}/s.db",
        cache_dir=cache_dir,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "2 trials (2 complete, 0 failed)" in " ".join(result.stdout.split())
    assert not (cache_dir / "tokenizers").exists() or not any(
        str(data) in str(p) for p in (cache_dir / "tokenizers").iterdir()
    )

    # a tokenizer with more tokens than the model's embedding is refused before any trial
    text["workload"]["tokenizer"] = {"id": str(_bigger_tokenizer(tmp_path))}
    space_file.write_text(yaml.safe_dump(text))
    refused = run_sweeper(
        "launch",
        "--space",
        str(space_file),
        "--storage",
        f"sqlite:///{tmp_path}/r.db",
        cache_dir=cache_dir,
    )
    assert refused.returncode != 0 and "Traceback" not in refused.stderr
    assert "embedding has" in refused.stderr and "use the model's own tokenizer" in refused.stderr

    # a directory with a tokenizer but no config.json (not what save_pretrained wrote for a
    # model): said as `sweeper init --model` says it, not transformers' "Unrecognized model"
    bare = tmp_path / "no-config"
    AutoTokenizer.from_pretrained(str(model_dir)).save_pretrained(str(bare))
    text["workload"]["model"] = {"id": str(bare)}
    text["workload"]["tokenizer"] = {}
    space_file.write_text(yaml.safe_dump(text))
    refused = run_sweeper(
        "launch", "--space", str(space_file), "--storage", f"sqlite:///{tmp_path}/n.db",
        cache_dir=cache_dir,
    )  # fmt: skip
    assert refused.returncode != 0 and "Traceback" not in refused.stderr
    said = " ".join(refused.stderr.split())
    assert f"workload.model.id: {bare} has no config.json, so it is not a directory" in said
    assert "Unrecognized model" not in said, said


def _bigger_tokenizer(tmp_path: Path) -> Path:
    from sweeper.trial.corpus import train_tokenizer

    out = tmp_path / "bigger-tokenizer"
    train_tokenizer(TEXTS * 3 + [json.dumps(c) for c in CHATS], 1024, out)
    return out


@pytest.mark.parametrize("engine", ["loop", "trainer", "sft"])
def test_chat_records_train_replies_only_with_every_engine(
    tmp_path: Path, cache_dir: Path, engine: str
) -> None:
    """A sweep of chat records with loss: completion trains through each engine (SFTTrainer
    takes the token ids with an assistant mask, as assistant_only_loss makes them)."""
    if engine == "sft":
        pytest.importorskip("trl")
    data = _write_jsonl(tmp_path / "chats.jsonl", [{"messages": c} for c in CHATS])
    text = yaml.safe_load(TINY_SPACE.read_text())
    text["study"] = f"chat-{engine}"
    text["workload"]["dataset"] = {
        "path": str(data), "messages_field": "messages", "loss": "completion",
    }  # fmt: skip
    text["workload"]["engine"] = engine
    # whole chats (174 tokens): cut at 64, no reply would be left to learn from
    text["search"]["max_seq_length"] = [256]
    text["baseline"]["max_seq_length"] = 256
    text["budget"] = {"n_trials": 1}
    space_file = tmp_path / "chat.yaml"
    space_file.write_text(yaml.safe_dump(text))
    result = run_sweeper(
        "launch", "--space", str(space_file), "--storage", f"sqlite:///{tmp_path}/c.db",
        cache_dir=cache_dir, timeout=600,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert "1 trial (1 complete, 0 failed)" in " ".join(result.stdout.split()), result.stdout


def test_lora_trains_only_the_adapter_and_quantization_is_dropped_on_a_cpu(
    tmp_path: Path, cache_dir: Path, sqlite_url: str
) -> None:
    """workload.adapter: LoRA through peft trains on the CPU; 4-bit quantization needs
    bitsandbytes on CUDA, so preflight drops it with the reason and the sweep goes on."""
    from sweeper.store import Store

    text = yaml.safe_load(TINY_SPACE.read_text())
    text["study"] = "tiny-lora"
    text["workload"]["adapter"] = {"r": 4, "alpha": 8, "target_modules": ["q_proj", "v_proj"]}
    text["search"]["quantization"] = ["none", "4bit"]
    text["search"]["gradient_checkpointing"] = [False, True]
    # the baseline without checkpointing, then the same with it, whatever the sampler picks
    text["also_try"] = [text["baseline"] | {"gradient_checkpointing": True}]
    text["trial"]["preflight"] = True
    text["budget"] = {"n_trials": 3}
    space_file = tmp_path / "lora.yaml"
    space_file.write_text(yaml.safe_dump(text))
    result = run_sweeper(
        "launch", "--space", str(space_file), "--storage", sqlite_url,
        cache_dir=cache_dir, timeout=600,
    )  # fmt: skip
    output = " ".join((result.stdout + result.stderr).split())
    assert result.returncode == 0, output
    assert "quantization=4bit: needs bitsandbytes with a CUDA device" in output, output
    store = Store(sqlite_url)
    try:
        trials = store.list_trials("tiny-lora", states=["complete"], include_measurement=True)
    finally:
        store.dispose()
    assert len(trials) == 3, output
    assert {t.config["gradient_checkpointing"] for t in trials} == {False, True}
    for trial in trials:
        m = trial.measurement
        assert trial.config["quantization"] == "none"
        # r=4 on q_proj and v_proj (each width → width here) of the tiny model's layers
        size = MODEL_SIZES["llama"]["tiny"]
        width, layers = size["hidden_size"], size["num_hidden_layers"]
        assert m["trainable_params"] == layers * 2 * (width * 4 + 4 * width)
        assert m["trainable_params"] < m["n_params"] / 20
        # the adapter's weight gradients are a sliver: about 4 FLOPs per weight per token
        assert m["flops_per_token"] < 4.3 * m["n_params"]
        assert m["checkpoint_bytes"] < 200_000  # the adapter is saved, not the model
