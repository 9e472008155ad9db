"""A chat fine-tune with ``transformers.Trainer``: the kind of train.py you already have, with
sweeper's one line (``callbacks=[sweeper.callback()]``). Run it yourself as usual:

    python examples/trainer/train.py --model_name_or_path my-job/model \\
        --data_file my-job/chats.jsonl --output_dir out --per_device_train_batch_size 8 --bf16 True

and sweep it with ``examples/trainer/space.yaml`` (``engine: script``): each trial runs this
file with the trial's knobs as the TrainingArguments flags above, and the knobs that are not
TrainingArguments (attention kernel, sequence length) come from ``sweeper.trial_config()``.
Outside a trial the callback does nothing and ``trial_config()`` is None.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from datasets import load_dataset
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    DataCollatorForLanguageModeling,
    HfArgumentParser,
    Trainer,
    TrainingArguments,
)

import sweeper


@dataclass
class ScriptArguments:
    model_name_or_path: str = field(metadata={"help": "a local model directory or hub id"})
    data_file: str = field(metadata={"help": "chat records, JSONL with a 'messages' column"})
    max_length: int = field(default=1024, metadata={"help": "tokens kept per record"})
    attn_implementation: str = field(default="sdpa")


def main() -> None:
    parser = HfArgumentParser((ScriptArguments, TrainingArguments))
    script, training = parser.parse_args_into_dataclasses()
    trial = sweeper.trial_config()  # None outside a sweeper trial
    if trial is not None:  # the knobs that are not TrainingArguments
        script.max_length = trial["max_seq_length"]
        script.attn_implementation = trial["attn_implementation"]

    tokenizer = AutoTokenizer.from_pretrained(script.model_name_or_path)
    model = AutoModelForCausalLM.from_pretrained(
        script.model_name_or_path, attn_implementation=script.attn_implementation
    )

    def tokenize(record: dict) -> dict:
        text = tokenizer.apply_chat_template(record["messages"], tokenize=False)
        return tokenizer(text, truncation=True, max_length=script.max_length)

    rows = load_dataset("json", data_files=script.data_file, split="train")
    rows = rows.map(tokenize, remove_columns=rows.column_names)
    trainer = Trainer(
        model=model,
        args=training,
        train_dataset=rows,
        data_collator=DataCollatorForLanguageModeling(tokenizer, mlm=False),
        callbacks=[sweeper.callback()],  # sweeper's one line
    )
    trainer.train()
    trainer.save_model()


if __name__ == "__main__":
    main()
