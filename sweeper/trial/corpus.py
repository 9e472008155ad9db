"""The prepare step, run once per sweep in a child: the corpus, the tokenizer, length statistics.

Nothing is downloaded. The demo corpus is cut from this Python's own stdlib sources (real text
every machine has) with sample lengths drawn log-normally, like instruction/chat datasets. A
tokenizer without an ``id`` is a byte-level BPE trained here with ``tokenizers`` and saved with
``save_pretrained``, so trials load it through the same ``AutoTokenizer.from_pretrained`` path
as a user's own tokenizer.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import os
import random
import sysconfig
from pathlib import Path
from typing import Any

from sweeper.errors import TrialError, json_line_error
from sweeper.job import CHATML, GeneratedCorpus, Workload, names_a_local_path
from sweeper.trial.protocol import DatasetFormat, PreparedData

SPECIAL_TOKENS = {"pad_token": "<|pad|>", "bos_token": "<|bos|>", "eos_token": "<|eos|>"}
# Enough text to learn merges; more only slows the prepare step.
_TOKENIZER_TRAIN_SAMPLES = 4000
_STATS_SAMPLES = 20000
_HASH_BYTES = 256 << 20  # hash at most this much of a user's file (plus its size)


def prepare(workload: Workload, cache_dir: Path) -> PreparedData:
    """Make the dataset and tokenizer every trial of the sweep will load. Everything a trial
    would trip over (a missing file, column or row, a tokenizer the model cannot take, a chat
    record the template refuses) stops the sweep here, before any trial, naming what to fix."""
    spec = workload.dataset
    fmt: DatasetFormat
    if spec.generate is not None:
        path = generate_corpus(spec.generate, spec.text_field, cache_dir / "corpora")
        fmt = "json"
    else:
        assert spec.path is not None
        path = Path(spec.path).expanduser().resolve()
        if not path.exists():
            raise TrialError(
                "error",
                f"workload.dataset.path: no such file or directory {path}; give a .jsonl, "
                ".json, .parquet, .csv or .txt file, or a save_to_disk directory",
            )
        fmt = dataset_format(path)
    dataset_hash = file_hash(path)
    rows = None  # an empty file: datasets says nothing useful about it
    if not (path.is_file() and path.stat().st_size == 0):
        rows = open_dataset(str(path), fmt, cache_dir, spec.split)
    if rows is None or len(rows) == 0:
        raise TrialError(
            "error", f"workload.dataset.path: {path} holds no rows; point it at the training data"
        )

    # plain text is read (and checked) once; chat records become text when rendered below
    texts = None if spec.messages_field is not None else checked_texts(rows, spec.text_field, path)
    trust = workload.model.trust_remote_code
    tokenizer_path = workload.tokenizer.id or workload.model.id
    if tokenizer_path is None:
        tokenizer_dir = (
            cache_dir / "tokenizers" / f"bpe-{dataset_hash[:16]}-{workload.tokenizer.vocab_size}"
        )
        if not (tokenizer_dir / "tokenizer.json").is_file():
            if texts is None:
                assert spec.messages_field is not None  # chat records: no plain text read
                sample = _chat_texts(rows, spec.messages_field)
            else:
                sample = texts[:_TOKENIZER_TRAIN_SAMPLES]
            train_tokenizer(sample, workload.tokenizer.vocab_size, tokenizer_dir)
        tokenizer_path = str(tokenizer_dir)
    tokenizer = open_tokenizer(tokenizer_path, trust)
    if workload.model.id is not None:
        check_model(workload.model.id, tokenizer, trust)

    chat_template = None
    text_field, data_path, data_fmt, split = spec.text_field, str(path), fmt, spec.split
    if texts is None:
        assert spec.messages_field is not None
        chat_template = resolve_chat_template(workload, tokenizer)
        rendered = render_chats(
            rows,
            spec.messages_field,
            spec.loss,
            tokenizer,
            chat_template,
            path,
            dataset_hash,
            cache_dir,
        )
        rows = open_dataset(str(rendered), "disk", cache_dir, "train")
        text_field, data_path, data_fmt, split = "text", str(rendered), "disk", "train"
        dataset_hash = hashlib.sha256(f"{dataset_hash}:{rendered.name}".encode()).hexdigest()
        texts = checked_texts(rows, text_field, path)

    stats = length_stats(texts, tokenizer)
    stats["dataset_rows"] = len(texts)
    pretokenized_path = None
    if workload.tokenize == "pretokenized":
        pretokenized_path = str(
            pretokenize(rows, text_field, tokenizer, tokenizer_path, dataset_hash, cache_dir)
        )
    return PreparedData(
        dataset_path=data_path,
        dataset_format=data_fmt,
        dataset_split=split,
        text_field=text_field,
        tokenizer_path=tokenizer_path,
        trust_remote_code=trust,
        chat_template=chat_template,
        completion_only=spec.loss == "completion",
        dataset_hash=dataset_hash,
        stats=stats,
        pretokenized_path=pretokenized_path,
    )


def dataset_format(path: Path) -> DatasetFormat:
    if path.is_dir():
        if any((path / name).is_file() for name in _SAVED_MARKERS):
            return "disk"
        raise TrialError(
            "error",
            f"workload.dataset.path: {path} is a directory but not one datasets' save_to_disk "
            f"wrote (no {' or '.join(_SAVED_MARKERS)}); point it at the file, or save the "
            "dataset with save_to_disk",
        )
    suffixes = "".join(path.suffixes).lower()
    if suffixes.endswith((".jsonl", ".json", ".jsonl.gz", ".json.gz")):
        return "json"
    if suffixes.endswith(".parquet"):
        return "parquet"
    if suffixes.endswith((".csv", ".csv.gz")):
        return "csv"
    if suffixes.endswith((".txt", ".txt.gz")):
        return "text"
    raise TrialError(
        "error",
        f"workload.dataset.path: cannot read {path.name}; use .jsonl, .json, .parquet, .csv or "
        ".txt, or a save_to_disk directory",
    )


_SAVED_MARKERS = ("dataset_info.json", "dataset_dict.json", "state.json")


def file_hash(path: Path) -> str:
    """sha256 of the file's size and its first 256 MiB (a directory: of each file's name, size
    and first MiB): a fingerprint, cheap on huge files."""
    digest = hashlib.sha256()
    files = sorted(f for f in path.rglob("*") if f.is_file()) if path.is_dir() else [path]
    budget = _HASH_BYTES if not path.is_dir() else 1 << 20
    for file in files:
        digest.update(
            f"{file.relative_to(path) if path.is_dir() else ''}:{file.stat().st_size}".encode()
        )
        with file.open("rb") as f:
            remaining = budget
            while remaining > 0 and (chunk := f.read(min(1 << 20, remaining))):
                digest.update(chunk)
                remaining -= len(chunk)
    return digest.hexdigest()


@functools.cache
def open_dataset(path: str, fmt: str, cache_dir: Path, split: str = "train") -> Any:
    """The rows: ``datasets.load_dataset`` on a local file or ``load_from_disk`` on a
    save_to_disk directory (the real loading paths); Arrow-cached under cache_dir and kept per
    process, so a fork server maps them once for every trial."""
    from datasets import DatasetDict, load_dataset, load_from_disk

    try:
        if fmt == "disk":
            rows = load_from_disk(path)
        else:
            rows = load_dataset(
                fmt, data_files=path, split="train", cache_dir=str(cache_dir / "hf-datasets")
            )
    except Exception as e:  # datasets wraps a parser's error; its cause says which line
        bad_line = _first_bad_json_line(Path(path)) if fmt == "json" else None
        if bad_line is not None:
            raise TrialError(
                "error",
                f"workload.dataset.path: {path}:{bad_line[0]}: not a JSON object ({bad_line[1]}); "
                "each .jsonl line holds one JSON object: fix or drop that line",
            ) from e
        cause = e.__cause__ or e.__context__
        detail = str(e) or type(e).__name__
        if cause is not None and str(cause) not in detail:
            detail += f" ({type(cause).__name__}: {cause})"
        raise TrialError(
            "error",
            f"workload.dataset.path: datasets could not read {path} as {fmt}: {detail}; fix "
            "the file (each .jsonl line one JSON object) or point at another",
        ) from e
    if isinstance(rows, DatasetDict):
        if split not in rows:
            raise TrialError(
                "error",
                f"workload.dataset.split: {path} has no split {split!r} (it has "
                f"{', '.join(rows)}); set dataset.split to one of them",
            )
        rows = rows[split]
    return rows


def _jsonl(path: Path) -> bool:
    return path.is_file() and path.suffix.lower() == ".jsonl"  # train.v2.jsonl is one too


def row_place(path: Path, index: int) -> str:
    """Where row ``index`` (0-based, as datasets counts) is, as the user's editor counts: the
    1-based line of a .jsonl file (blank lines hold no row), else the 1-based row."""
    if _jsonl(path):
        with path.open("rb") as lines:
            rows = -1
            for number, line in enumerate(lines, start=1):
                rows += bool(line.strip())
                if rows == index:
                    return f"{path}:{number} (row {index + 1})"
    return f"row {index + 1} of {path}"


def _first_bad_json_line(path: Path) -> tuple[int, str] | None:
    """The 1-based line of a .jsonl file that is not one JSON object, and why."""
    if not _jsonl(path):
        return None
    with path.open("rb") as lines:
        for number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except ValueError as e:
                return number, json_line_error(line, e)
            if not isinstance(record, dict):
                return number, f"a {type(record).__name__}, not an object"
    return None


def _first_bad_row(rows: Any, field: str) -> int | None:
    """The index of the first row whose ``field`` is null, else None (an Arrow scan)."""
    import pyarrow.compute as pc

    column = rows.data.column(field)
    if column.null_count == 0:
        return None
    nulls = pc.is_null(column).to_numpy(zero_copy_only=False)
    return int(nulls.argmax())


def checked_texts(rows: Any, field: str, path: Path) -> list[str]:
    """The text column, after checking it is there and every row holds a string."""
    if field not in rows.column_names:
        raise TrialError(
            "error",
            f"workload.dataset.text_field: {path} has no column {field!r} (columns: "
            f"{', '.join(rows.column_names)}); set text_field to the text column, or "
            "messages_field to a column of chat records",
        )
    feature = rows.features[field]
    if getattr(feature, "dtype", None) not in ("string", "large_string"):
        raise TrialError(
            "error",
            f"workload.dataset.text_field: column {field!r} of {path} holds {feature}, not "
            "text; for chat records set messages_field instead",
        )
    bad = _first_bad_row(rows, field)
    if bad is not None:
        raise TrialError(
            "error",
            f"workload.dataset: {row_place(path, bad)} has no {field!r} (null); fill or drop "
            "the row",
        )
    return list(rows[field])


def _chat_texts(rows: Any, field: str) -> list[str]:
    """The messages' contents, to train the stand-in tokenizer on (rows are checked later)."""
    texts: list[str] = []
    if field not in rows.column_names:
        return texts  # render_chats says which column is missing
    for record in rows.select(range(min(len(rows), _TOKENIZER_TRAIN_SAMPLES)))[field]:
        if isinstance(record, list):
            texts.append(
                "\n".join(str(m.get("content", "")) for m in record if isinstance(m, dict))
            )
    return texts or ["<empty>"]


def open_tokenizer(path: str, trust_remote_code: bool = False) -> Any:
    """``AutoTokenizer.from_pretrained``, its failure a clear error; a missing pad token is
    the EOS token (as Trainer's examples do)."""
    from transformers import AutoTokenizer

    local = names_a_local_path(path)
    if local and not Path(path).expanduser().is_dir():
        # a path, not a hub id: say so rather than the hub's "Repo id must be in the form"
        raise TrialError(
            "error",
            f"workload.model.id (or tokenizer.id): {path} is not a directory on this machine; "
            "give the directory save_pretrained wrote (check the path's spelling), or a hub id",
        )
    try:
        tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code)
    except Exception as e:
        raise TrialError(
            "error",
            f"workload.tokenizer: cannot load a tokenizer from {path!r}: {e}; give a local "
            "directory written by save_pretrained or a hub id this machine can reach (set "
            "tokenizer.id if the model's directory has no tokenizer)",
        ) from e
    if not tokenizer("Some text to train on.", add_special_tokens=False)["input_ids"]:
        # transformers 5 loads a directory without tokenizer files (config.json and weights
        # only) as an empty GPT-2 tokenizer: every sample became 0 tokens, and was measured so
        raise TrialError(
            "error",
            f"workload.model.id (or tokenizer.id): {path} has no tokenizer (AutoTokenizer made "
            f"an empty one of {len(tokenizer)} token(s) that turns text into no tokens); save "
            f"the run's tokenizer there (tokenizer.save_pretrained('{path}')), or set "
            "workload.tokenizer.id to the directory or hub id that holds it",
        )
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def check_model(model_id: str, tokenizer: Any, trust_remote_code: bool) -> None:
    """The model's config loads, and its embedding holds every token id of the tokenizer."""
    from transformers import AutoConfig

    directory = Path(model_id).expanduser()
    if directory.is_dir() and not (directory / "config.json").is_file():
        # as `sweeper init --model` says it, not transformers' "Unrecognized model ... Should
        # have a 'model_type' key in its config.json"
        raise TrialError(
            "error",
            f"workload.model.id: {model_id} has no config.json, so it is not a directory "
            "save_pretrained wrote; give the directory that holds the model's config.json "
            "and weights (model.save_pretrained(DIR) writes both)",
        )
    try:
        config = AutoConfig.from_pretrained(model_id, trust_remote_code=trust_remote_code)
    except Exception as e:
        raise TrialError(
            "error",
            f"workload.model.id: cannot load a model config from {model_id!r}: {e}; give a "
            "local directory written by save_pretrained or a hub id this machine can reach "
            "(offline: download it first), and trust_remote_code: true only if it needs it",
        ) from e
    vocab = getattr(config, "vocab_size", None)
    if vocab is not None and len(tokenizer) > vocab:
        raise TrialError(
            "error",
            f"workload.tokenizer: the tokenizer has {len(tokenizer)} tokens but {model_id}'s "
            f"embedding has {vocab}; use the model's own tokenizer (leave tokenizer.id out)",
        )


def resolve_chat_template(workload: Workload, tokenizer: Any) -> str:
    """The Jinja template chat records are rendered with: tokenizer.chat_template of the
    space, else the tokenizer's own, else ChatML for the stand-in tokenizer trained here."""
    named = workload.tokenizer.chat_template
    if named == "chatml":
        return CHATML
    if named is not None:
        return named
    own = getattr(tokenizer, "chat_template", None)
    if isinstance(own, str) and own:
        return own
    if workload.tokenizer.id is None and workload.model.id is None:
        return CHATML  # the BPE trained here has no template of its own
    raise TrialError(
        "error",
        "workload.dataset.messages_field: the tokenizer has no chat template; set "
        "workload.tokenizer.chat_template to the template the run uses ('chatml' for ChatML)",
    )


class RecordError(ValueError):
    """A chat record that is not one (its shape, not the template): the row is what to fix."""


def render_chat(
    messages: Any, tokenizer: Any, template: str, spans: bool
) -> tuple[str, list[list[int]]]:
    """One chat record as text, and the character spans of the assistant's replies: each
    reply is what rendering the record up to it adds to the prompt before it."""
    if not isinstance(messages, list) or not messages:
        raise RecordError(
            f"expected a non-empty list of {{role, content}} messages, got {messages!r:.80}"
        )
    for message in messages:
        if not (
            isinstance(message, dict)
            and isinstance(message.get("role"), str)
            and isinstance(message.get("content"), str)
        ):
            raise RecordError(f"a message is not {{role: str, content: str}}: {message!r:.80}")
    text = tokenizer.apply_chat_template(messages, chat_template=template, tokenize=False)
    found: list[list[int]] = []
    if spans:
        for i, message in enumerate(messages):
            if message["role"] != "assistant":
                continue
            before = (
                tokenizer.apply_chat_template(
                    messages[:i], chat_template=template, tokenize=False, add_generation_prompt=True
                )
                if i
                else ""
            )
            upto = tokenizer.apply_chat_template(
                messages[: i + 1], chat_template=template, tokenize=False
            )
            if not (upto.startswith(before) and text.startswith(upto)):
                raise ValueError(
                    "the chat template does not render the conversation up to a reply as a "
                    "prefix of the whole, so the replies cannot be told apart; use loss: all"
                )
            found.append([len(before), len(upto)])
        if not found:
            raise RecordError("the record has no assistant message, so nothing would be learnt")
    return text, found


def render_chats(
    rows: Any,
    field: str,
    loss: str,
    tokenizer: Any,
    template: str,
    path: Path,
    dataset_hash: str,
    cache_dir: Path,
) -> Path:
    """Every chat record rendered once (``text``, and ``completion_spans`` for loss:
    completion) into a save_to_disk directory, cached by content and template."""
    if field not in rows.column_names:
        raise TrialError(
            "error",
            f"workload.dataset.messages_field: {path} has no column {field!r} (columns: "
            f"{', '.join(rows.column_names)}); set messages_field to the column of chat records",
        )
    key = hashlib.sha256(f"{dataset_hash}:{field}:{loss}:{template}".encode()).hexdigest()
    out = cache_dir / "rendered" / key[:16]
    if (out / "dataset_info.json").is_file():
        return out

    def render(batch: dict[str, list[Any]], indices: list[int]) -> dict[str, list[Any]]:
        texts, spans = [], []
        for index, record in zip(indices, batch[field], strict=True):
            try:
                text, found = render_chat(record, tokenizer, template, loss == "completion")
            except Exception as e:  # noqa: BLE001 - the template's own error, named by row
                # the template is a fix only where it, not the record's shape, refused
                template_fix = (
                    "" if isinstance(e, RecordError) else " (or set tokenizer.chat_template)"
                )
                raise TrialError(
                    "error",
                    f"workload.dataset: {row_place(path, index)} cannot be rendered as a chat: "
                    f"{e}; fix or drop the row{template_fix}",
                ) from e
            texts.append(text)
            spans.append(found)
        if loss != "completion":
            return {"text": texts}
        return {"text": texts, "completion_spans": spans}

    rendered = rows.map(
        render, batched=True, with_indices=True, remove_columns=rows.column_names, desc=None
    )
    partial = out.with_name(f"{out.name}.{os.getpid()}.partial")
    rendered.save_to_disk(str(partial))
    if not out.exists():
        partial.rename(out)
    return out


def generate_corpus(spec: GeneratedCorpus, text_field: str, out_dir: Path) -> Path:
    """Write ``spec.samples`` JSONL records cut from the stdlib; cached by its parameters."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    key = json.dumps([spec.model_dump(), text_field, str(stdlib)], sort_keys=True)
    path = out_dir / f"stdlib-{hashlib.sha256(key.encode()).hexdigest()[:16]}.jsonl"
    if path.is_file():
        return path
    source = _stdlib_text(stdlib)
    rng = random.Random(spec.seed)
    mu = math.log(spec.median_chars)
    out_dir.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(f".{os.getpid()}.partial")
    with partial.open("w", encoding="utf-8") as f:
        for _ in range(spec.samples):
            cap = spec.max_chars or 64 * spec.median_chars
            length = int(min(max(rng.lognormvariate(mu, spec.sigma), 16), cap))
            start = source.find("\n", rng.randrange(0, max(1, len(source) - length))) + 1
            f.write(json.dumps({text_field: source[start : start + length]}) + "\n")
    partial.replace(path)  # atomic: a concurrent prepare never sees half a file
    return path


def _stdlib_text(stdlib: Path, limit_chars: int = 24_000_000) -> str:
    parts: list[str] = []
    total = 0
    for file in sorted(stdlib.rglob("*.py")):
        if "site-packages" in file.parts:
            continue
        try:
            text = file.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        parts.append(text)
        total += len(text)
        if total >= limit_chars:
            break
    if total < 100_000:
        raise TrialError("error", f"too little stdlib source text under {stdlib} to cut a corpus")
    return "\n".join(parts)


def train_tokenizer(texts: list[str], vocab_size: int, out_dir: Path) -> None:
    """Train a byte-level BPE on (a sample of) the corpus and save it for from_pretrained."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS.values()),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts[:_TOKENIZER_TRAIN_SAMPLES], trainer=trainer)
    wrapped = PreTrainedTokenizerFast(tokenizer_object=tokenizer, **SPECIAL_TOKENS)
    partial = out_dir.with_name(f"{out_dir.name}.{os.getpid()}.partial")
    wrapped.save_pretrained(str(partial))
    if out_dir.exists():  # another sweep finished first; theirs is identical
        return
    partial.rename(out_dir)


def pretokenize(
    rows: Any,
    text_field: str,
    tokenizer: Any,
    tokenizer_path: str,
    dataset_hash: str,
    cache_dir: Path,
) -> Path:
    """Tokenize the whole dataset once (untruncated ids) and save it; cached by content."""
    tokenizer_file = Path(tokenizer_path) / "tokenizer.json"
    tokenizer_id = (
        tokenizer_file.read_bytes() if tokenizer_file.is_file() else tokenizer_path.encode()
    )
    key = hashlib.sha256(dataset_hash.encode() + tokenizer_id + text_field.encode()).hexdigest()
    out = cache_dir / "pretokenized" / key[:16]
    if (out / "dataset_info.json").is_file():
        return out

    def tokenize(batch: dict[str, list[Any]]) -> dict[str, list[Any]]:
        ids, masks = encode(tokenizer, batch[text_field], batch.get("completion_spans"))
        return {"input_ids": ids} if masks is None else {"input_ids": ids, "label_mask": masks}

    tokenized = rows.map(tokenize, batched=True, remove_columns=rows.column_names, desc=None)
    partial = out.with_name(f"{out.name}.{os.getpid()}.partial")
    tokenized.save_to_disk(str(partial))
    if not out.exists():
        partial.rename(out)
    return out


def completion_mask(offsets: list[Any], spans: list[list[int]]) -> list[bool]:
    """Which tokens are labels under loss: completion: those starting inside a reply."""
    return [any(start <= begin < end for start, end in spans) for begin, _ in offsets]


def encode(
    tokenizer: Any, texts: list[str], spans: list[list[list[int]]] | None, **cut: Any
) -> tuple[list[list[int]], list[list[bool]] | None]:
    """Token ids of ``texts`` (no special tokens; ``cut``: truncation keywords) and, with the
    replies' character ``spans``, which ids are labels (loss: completion)."""
    encoded = tokenizer(
        texts, add_special_tokens=False, return_offsets_mapping=spans is not None, **cut
    )
    if spans is None:
        return encoded["input_ids"], None
    masks = [
        completion_mask(offsets, row_spans)
        for offsets, row_spans in zip(encoded["offset_mapping"], spans, strict=True)
    ]
    return encoded["input_ids"], masks


def length_stats(texts: list[str], tokenizer: Any) -> dict[str, Any]:
    """Token-length distribution (percentiles 0..100) of up to 20k samples."""
    sample = texts
    if len(texts) > _STATS_SAMPLES:
        sample = random.Random(0).sample(texts, _STATS_SAMPLES)
    lengths = sorted(len(ids) for ids in tokenizer(sample, add_special_tokens=False)["input_ids"])
    count = len(lengths)
    percentiles = [lengths[min(count - 1, int(round(q / 100 * (count - 1))))] for q in range(101)]
    return {
        "samples_measured": count,
        "tokens_mean": sum(lengths) / count,
        "tokens_p50": percentiles[50],
        "tokens_p90": percentiles[90],
        "tokens_p99": percentiles[99],
        "tokens_max": lengths[-1],
        "token_percentiles": percentiles,
    }
