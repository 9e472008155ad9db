"""A stand-in for your own fine-tune, to try the README's "Your own fine-tune" path with no
model or data at hand: a tiny Llama with random weights and its own tokenizer (with a ChatML
chat template, no generation markers, as most models ship), saved with ``save_pretrained``,
and chat records in JSONL whose lengths vary as real ones do (a few long replies).

    .venv/bin/python scripts/tiny_job.py --out my-job      # my-job/model, my-job/chats.jsonl

``--size small`` or ``--size 1b`` gives the model sweeper's preset shape of that name (~45M,
~1.1B parameters less the small vocabulary's embeddings): for a GPU, as
bench/spaces/script-parity-gpu.yaml uses it.

Nothing is downloaded. tests/test_journey.py uses it as a new user would.
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

CHATML = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{{ message['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
_PROSE = (
    "the model learns to answer short questions about python lists dictionaries loops "
    "functions classes files strings numbers errors tests and the standard library with "
    "examples that a reader can run at once"
)
_WORDS = _PROSE.split(" ")


def chats(records: int, seed: int = 0) -> list[dict[str, object]]:
    """Chat records: a system line, a question, a reply of log-normally spread length."""
    rng = random.Random(seed)
    out = []
    for i in range(records):
        question = " ".join(rng.choices(_WORDS, k=rng.randint(4, 16))) + "?"
        words = max(3, min(600, int(rng.lognormvariate(3.2, 0.9))))
        reply = " ".join(rng.choices(_WORDS, k=words)) + f". (answer {i})"
        out.append(
            {
                "messages": [
                    {"role": "system", "content": "You answer briefly."},
                    {"role": "user", "content": question},
                    {"role": "assistant", "content": reply},
                ]
            }
        )
    return out


def save_model(out: Path, texts: list[str], size: str = "2-layer") -> None:
    """A byte-level BPE trained on ``texts`` and a Llama (2 layers, or sweeper's preset
    ``size``), both in ``out``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    special = {"eos_token": "<|im_end|>", "pad_token": "<pad>", "bos_token": "<|im_start|>"}
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=512,
        special_tokens=list(special.values()),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer)
    wrapped = PreTrainedTokenizerFast(tokenizer_object=tokenizer, **special)
    wrapped.chat_template = CHATML
    wrapped.save_pretrained(str(out))
    shape: dict[str, object] = {
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
    }
    if size != "2-layer":
        from sweeper.presets import MODEL_SIZES

        shape = dict(MODEL_SIZES["llama"][size])
    config = LlamaConfig(
        vocab_size=len(wrapped),
        **shape,
        max_position_embeddings=4096,
        pad_token_id=wrapped.pad_token_id,
        eos_token_id=wrapped.eos_token_id,
        bos_token_id=wrapped.bos_token_id,
    )
    LlamaForCausalLM(config).save_pretrained(str(out))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="directory to write")
    parser.add_argument("--records", type=int, default=400, help="chat records")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--size", default="2-layer", choices=["2-layer", "small", "1b"],
        help="the model: 2 layers of width 64 (the default), or sweeper's preset of that name",
    )  # fmt: skip
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    records = chats(args.records, args.seed)
    with (args.out / "chats.jsonl").open("w") as f:
        for record in records:
            f.write(json.dumps(record) + "\n")
    texts = [m["content"] for r in records for m in r["messages"]]  # type: ignore[index, union-attr]
    save_model(args.out / "model", texts, args.size)
    print(f"wrote {args.out / 'model'} (save_pretrained) and {args.out / 'chats.jsonl'}")


if __name__ == "__main__":
    main()
