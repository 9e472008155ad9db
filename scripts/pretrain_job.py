"""Seed 004's job as files, for ``spaces/seed-004.yaml`` and ``examples/amp_loop/train.py``:
a model trained from scratch, pre-tokenized data packed into fixed-length rows.

    .venv/bin/python scripts/pretrain_job.py --out seed004-job

writes

- ``corpus.jsonl``: the text (``{"text": ...}`` per line), cut from this Python's stdlib sources
  with log-normal lengths, as sweeper's ``dataset.generate`` cuts it;
- ``model/``: a byte-level BPE trained on the corpus and a transformers ``config.json`` of the
  stand-in model (Llama, sweeper's ``tiny`` preset unless ``--size``/``--set`` say otherwise),
  no weights: the training script builds the model from the config, as a pre-training run does;
- ``tokens.npy``: the corpus tokenized once, each sample closed by EOS, end to end (what the
  seed's ``pretokenize_and_pack.py`` writes): the script cuts it into ``max_seq_length`` rows.

Nothing is downloaded.
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
from pathlib import Path

import numpy as np


def _setting(text: str) -> tuple[str, int | float | str]:
    key, _, value = text.partition("=")
    for kind in (int, float):
        try:
            return key, kind(value)
        except ValueError:
            pass
    return key, value


def main() -> None:
    from transformers import AutoConfig, AutoTokenizer

    from sweeper.job import GeneratedCorpus
    from sweeper.presets import MODEL_SIZES
    from sweeper.trial.corpus import generate_corpus, train_tokenizer

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="directory to write")
    parser.add_argument("--samples", type=int, default=2000)
    parser.add_argument("--median_chars", type=int, default=2000)
    parser.add_argument("--sigma", type=float, default=0.6)
    parser.add_argument("--vocab_size", type=int, default=4096)
    parser.add_argument("--size", default="tiny", choices=sorted(MODEL_SIZES["llama"]))
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a config override, e.g. --set hidden_size=1024 (seed 004's own model: "
        "hidden_size=1024 num_hidden_layers=8 intermediate_size=4096 num_attention_heads=16 "
        "num_key_value_heads=16)",
    )
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)

    spec = GeneratedCorpus(samples=args.samples, median_chars=args.median_chars, sigma=args.sigma)
    with tempfile.TemporaryDirectory() as scratch:
        shutil.copyfile(generate_corpus(spec, "text", Path(scratch)), args.out / "corpus.jsonl")
    with (args.out / "corpus.jsonl").open(encoding="utf-8") as f:
        texts = [json.loads(line)["text"] for line in f]

    model_dir = args.out / "model"
    shutil.rmtree(model_dir, ignore_errors=True)
    train_tokenizer(texts, args.vocab_size, model_dir)
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    config = AutoConfig.for_model(
        "llama",
        vocab_size=len(tokenizer),
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        **{
            "max_position_embeddings": 4096,
            **MODEL_SIZES["llama"][args.size],
            **dict(_setting(text) for text in args.set),
        },
    )
    config.save_pretrained(str(model_dir))

    ids = tokenizer(texts, add_special_tokens=False)["input_ids"]
    dtype = np.uint16 if len(tokenizer) <= np.iinfo(np.uint16).max + 1 else np.uint32
    tokens = np.fromiter(
        (token for row in ids for token in (*row, tokenizer.eos_token_id)), dtype=dtype
    )
    np.save(args.out / "tokens.npy", tokens)
    print(
        f"wrote {args.out / 'corpus.jsonl'} ({len(texts)} samples), {model_dir} (tokenizer, "
        f"config.json), {args.out / 'tokens.npy'} ({len(tokens):,} tokens)"
    )


if __name__ == "__main__":
    main()
