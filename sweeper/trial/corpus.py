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

from sweeper.errors import TrialError
from sweeper.space import GeneratedCorpus, Workload
from sweeper.trial.protocol import PreparedData

SPECIAL_TOKENS = {"pad_token": "<|pad|>", "bos_token": "<|bos|>", "eos_token": "<|eos|>"}
# Enough text to learn merges; more only slows the prepare step.
_TOKENIZER_TRAIN_SAMPLES = 4000
_STATS_SAMPLES = 20000
_HASH_BYTES = 256 << 20  # hash at most this much of a user's file (plus its size)


def prepare(workload: Workload, cache_dir: Path) -> PreparedData:
    """Make the dataset and tokenizer every trial of the sweep will load."""
    spec = workload.dataset
    if spec.generate is not None:
        path = generate_corpus(spec.generate, spec.text_field, cache_dir / "corpora")
        fmt = "json"
    else:
        assert spec.path is not None
        path = Path(spec.path).expanduser().resolve()
        if not path.is_file():
            raise TrialError(
                "error", f"workload.dataset.path: no such file {path}; give a .jsonl/.parquet/.txt"
            )
        fmt = dataset_format(path)
    dataset_hash = file_hash(path)
    texts = load_texts(path, fmt, spec.text_field, cache_dir)

    if workload.tokenizer.id is not None:
        tokenizer_path = workload.tokenizer.id
    else:
        tokenizer_dir = (
            cache_dir / "tokenizers" / f"bpe-{dataset_hash[:16]}-{workload.tokenizer.vocab_size}"
        )
        if not (tokenizer_dir / "tokenizer.json").is_file():
            train_tokenizer(texts, workload.tokenizer.vocab_size, tokenizer_dir)
        tokenizer_path = str(tokenizer_dir)

    stats = length_stats(texts, tokenizer_path)
    stats["dataset_rows"] = len(texts)
    pretokenized_path = None
    if workload.tokenize == "pretokenized":
        pretokenized_path = str(
            pretokenize(path, fmt, spec.text_field, tokenizer_path, dataset_hash, cache_dir)
        )
    return PreparedData(
        dataset_path=str(path),
        dataset_format=fmt,
        text_field=spec.text_field,
        tokenizer_path=tokenizer_path,
        dataset_hash=dataset_hash,
        stats=stats,
        pretokenized_path=pretokenized_path,
    )


def dataset_format(path: Path) -> str:
    suffixes = "".join(path.suffixes).lower()
    if suffixes.endswith((".jsonl", ".json", ".jsonl.gz", ".json.gz")):
        return "json"
    if suffixes.endswith(".parquet"):
        return "parquet"
    if suffixes.endswith((".txt", ".txt.gz")):
        return "text"
    raise TrialError(
        "error",
        f"workload.dataset.path: cannot read {path.name}; use .jsonl, .json, .parquet or .txt",
    )


def file_hash(path: Path) -> str:
    """sha256 of the file's size and its first 256 MiB: a fingerprint, cheap on huge files."""
    digest = hashlib.sha256(str(path.stat().st_size).encode())
    with path.open("rb") as f:
        remaining = _HASH_BYTES
        while remaining > 0 and (chunk := f.read(min(1 << 20, remaining))):
            digest.update(chunk)
            remaining -= len(chunk)
    return digest.hexdigest()


@functools.cache
def load_hf_dataset(path: str, fmt: str, cache_dir: Path) -> Any:
    """``datasets.load_dataset`` on a local file (the real loading path); Arrow-cached under
    cache_dir and kept per process, so a fork server maps it once for every trial."""
    from datasets import load_dataset

    return load_dataset(
        fmt, data_files=path, split="train", cache_dir=str(cache_dir / "hf-datasets")
    )


def load_texts(path: Path, fmt: str, text_field: str, cache_dir: Path) -> list[str]:
    dataset = load_hf_dataset(str(path), fmt, cache_dir)
    if text_field not in dataset.column_names:
        raise TrialError(
            "error",
            f"workload.dataset.text_field: the dataset has no column {text_field!r} "
            f"(columns: {', '.join(dataset.column_names)})",
        )
    return list(dataset[text_field])


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
    path: Path, fmt: str, text_field: str, tokenizer_path: str, dataset_hash: str, cache_dir: Path
) -> Path:
    """Tokenize the whole dataset once (untruncated ids) and save it; cached by content."""
    from transformers import AutoTokenizer

    tokenizer_file = Path(tokenizer_path) / "tokenizer.json"
    tokenizer_id = (
        tokenizer_file.read_bytes() if tokenizer_file.is_file() else tokenizer_path.encode()
    )
    key = hashlib.sha256(dataset_hash.encode() + tokenizer_id + text_field.encode()).hexdigest()
    out = cache_dir / "pretokenized" / key[:16]
    if (out / "dataset_info.json").is_file():
        return out
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_path)
    dataset = load_hf_dataset(str(path), fmt, cache_dir)
    tokenized = dataset.map(
        lambda rows: {
            "input_ids": tokenizer(rows[text_field], add_special_tokens=False)["input_ids"]
        },
        batched=True,
        remove_columns=dataset.column_names,
        desc=None,
    )
    partial = out.with_name(f"{out.name}.{os.getpid()}.partial")
    tokenized.save_to_disk(str(partial))
    if not out.exists():
        partial.rename(out)
    return out


def length_stats(texts: list[str], tokenizer_path: str) -> dict[str, Any]:
    """Token-length distribution (percentiles 0..100) of up to 20k samples."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_path)
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
